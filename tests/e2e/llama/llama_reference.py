#!/usr/bin/env python3
"""An independent LLaMA forward, checked against kolos's logits.

usage: llama_reference.py FILE   (FILE written by llama_logits)

The model below is written from the LLaMA paper (Touvron et al., 2023) and
Meta's reference code, not from kolos: RMSNorm, rotary embeddings in Meta's
layout (interleaved pairs of a head's features rotated as complex numbers),
grouped-query attention, a SwiGLU MLP and an untied output layer. kolos uses
Hugging Face's layout instead (a head's two halves rotated together), so the
q and k weights are permuted here from Hugging Face's layout back to Meta's,
the inverse of transformers' convert_llama_weights_to_hf. Matching logits
(1e-5) checks kolos's model and that claim about its layout at once.

Where `transformers` imports, LlamaForCausalLM with the same config and the
weights renamed to its names must give the same logits too.

Needs only torch (1.13 or 2.x); reads safetensors itself.
"""
import json
import math
import struct
import sys

import torch

TOLERANCE = 1e-5


def read_safetensors(path):
    dtypes = {"F32": torch.float32, "I64": torch.int64}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        raw = bytearray(data[begin:end])
        t = torch.frombuffer(raw, dtype=dtypes[info["dtype"]]) if raw else torch.empty(0)
        tensors[name] = t.reshape(info["shape"]).clone()
    return tensors, meta


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_meta(x, theta):
    """Meta's rotary embedding: features (2i, 2i+1) as one complex number,
    multiplied by exp(i * pos * theta^(-2i/d)). x: [B, T, h, d]."""
    b, t, h, d = x.shape
    freqs = 1.0 / (theta ** (torch.arange(0, d, 2)[: d // 2].float() / d))
    angles = torch.outer(torch.arange(t).float(), freqs)
    rot = torch.polar(torch.ones_like(angles), angles)  # [T, d/2]
    xc = torch.view_as_complex(x.float().reshape(b, t, h, d // 2, 2))
    out = torch.view_as_real(xc * rot[None, :, None, :]).reshape(b, t, h, d)
    return out.type_as(x)


def hf_to_meta(w, heads):
    """Undo transformers' permute (Meta -> HF) of a q/k weight [heads*d, in]."""
    rows, cols = w.shape
    return w.view(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def llama_forward(w, cfg, tokens):
    L, hidden, heads, kv = cfg["layers"], cfg["hidden"], cfg["heads"], cfg["kv_heads"]
    d = hidden // heads
    eps, theta = cfg["norm_eps"], cfg["rope_theta"]
    B, T = tokens.shape
    x = w["embed.wte.weight"][tokens]
    mask = torch.full((T, T), float("-inf")).triu(1)
    for i in range(L):
        p = "h.%d." % i
        h = rms_norm(x, w[p + "ln_1.weight"], eps)
        q = h @ hf_to_meta(w[p + "attn.q_proj.weight"], heads).t()
        k = h @ hf_to_meta(w[p + "attn.k_proj.weight"], kv).t()
        v = h @ w[p + "attn.v_proj.weight"].t()
        q = rope_meta(q.view(B, T, heads, d), theta)
        k = rope_meta(k.view(B, T, kv, d), theta)
        v = v.view(B, T, kv, d)
        # Query head j reads key/value head j // (heads / kv).
        k = k.repeat_interleave(heads // kv, dim=2)
        v = v.repeat_interleave(heads // kv, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, h, T, d]
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d) + mask, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, hidden)
        x = x + y @ w[p + "attn.o_proj.weight"].t()
        h = rms_norm(x, w[p + "ln_2.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].t()
        up = h @ w[p + "mlp.up_proj.weight"].t()
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].t()
    x = rms_norm(x, w["head.ln_f.weight"], eps)
    return x @ w["head.lm_head.weight"].t()


def hf_forward(w, cfg, tokens):
    try:
        import transformers
    except ImportError:
        print("llama_reference: transformers not importable; LlamaForCausalLM not checked")
        return None
    config = transformers.LlamaConfig(
        vocab_size=cfg["vocab"], hidden_size=cfg["hidden"], intermediate_size=cfg["ffn_hidden"],
        num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
        num_key_value_heads=cfg["kv_heads"], max_position_embeddings=cfg["seq_len"],
        rms_norm_eps=cfg["norm_eps"], rope_theta=cfg["rope_theta"], tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False)
    config._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(config).eval()
    state = {"model.embed_tokens.weight": w["embed.wte.weight"],
             "model.norm.weight": w["head.ln_f.weight"],
             "lm_head.weight": w["head.lm_head.weight"]}
    for i in range(cfg["layers"]):
        src, dst = "h.%d." % i, "model.layers.%d." % i
        state[dst + "input_layernorm.weight"] = w[src + "ln_1.weight"]
        state[dst + "post_attention_layernorm.weight"] = w[src + "ln_2.weight"]
        for n in ("q", "k", "v", "o"):
            state[dst + "self_attn.%s_proj.weight" % n] = w[src + "attn.%s_proj.weight" % n]
        for n in ("gate", "up", "down"):
            state[dst + "mlp.%s_proj.weight" % n] = w[src + "mlp.%s_proj.weight" % n]
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Buffers such as rotary inv_freq are not in kolos's weights.
    missing = [k for k in missing if "rotary_emb" not in k]
    assert not missing and not unexpected, (missing, unexpected)
    with torch.no_grad():
        return model(tokens).logits


def compare(name, got, want):
    diff = (got - want).abs().max().item()
    scale = want.abs().max().item()
    print("llama_reference: %s: max |difference| %.3g (logits up to %.3g)" % (name, diff, scale))
    return diff <= TOLERANCE


def main():
    tensors, meta = read_safetensors(sys.argv[1])
    cfg = {k: (float(v) if k in ("rope_theta", "norm_eps") else int(v)) for k, v in meta.items()}
    tokens, logits = tensors["tokens"], tensors["logits"]
    # The check must be able to fail: the weights are not at their init.
    assert (tensors["head.ln_f.weight"] != 1).any()
    ok = True
    with torch.no_grad():
        ok &= compare("paper LLaMA (Meta's rotary layout)", llama_forward(tensors, cfg, tokens), logits)
    hf = hf_forward(tensors, cfg, tokens)
    if hf is not None:
        ok &= compare("transformers LlamaForCausalLM", hf, logits)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
