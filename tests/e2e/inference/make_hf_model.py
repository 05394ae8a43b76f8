# A random tiny transformers model saved with save_pretrained, and
# transformers' own greedy continuation (eager attention, 64 new tokens) of
# each prompt: what `kolos generate` must reproduce token for token.
#   make_hf_model.py gpt2|llama|mixtral OUTDIR "PROMPT;PROMPT;..."
# Writes OUTDIR (config.json, model.safetensors) and OUTDIR.expected (one
# line of ids per prompt). gpt2 also gets a byte-level BPE tokenizer.json
# (320 ids, trained here by the tokenizers package) and OUTDIR.text.* : a
# text prompt, transformers' greedy continuation as text, and the same cut
# at a stop string (the text before its first occurrence, decoding token by
# token as a streaming server does). Weights are scaled up so that the next-token
# distributions are sharp (no near-ties for rounding to flip).
import sys
import warnings

warnings.filterwarnings("ignore")
import torch
import transformers

kind, out, prompts = sys.argv[1], sys.argv[2], sys.argv[3]
torch.manual_seed(0)
if kind == "gpt2":
    cfg = transformers.GPT2Config(vocab_size=320, n_positions=96, n_embd=48, n_layer=2, n_head=4,
                                  resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
    model = transformers.GPT2LMHeadModel(cfg)
elif kind == "mixtral":  # 4 SwiGLU experts, top 2, grouped-query attention as below
    cfg = transformers.MixtralConfig(vocab_size=96, hidden_size=64, intermediate_size=96,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, num_local_experts=4,
                                     num_experts_per_tok=2, max_position_embeddings=96,
                                     rope_theta=10000.0, rms_norm_eps=1e-6,
                                     router_jitter_noise=0.0, tie_word_embeddings=False)
    model = transformers.MixtralForCausalLM(cfg)
else:  # LLaMA with grouped-query attention: 4 query heads over 2 key/value heads
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=96,
                                   rope_theta=10000.0, rms_norm_eps=1e-6,
                                   tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg)
with torch.no_grad():
    for name, p in model.named_parameters():
        if p.dim() == 1:
            p.add_(torch.randn_like(p) * 0.1)
        else:
            p.mul_(10)
model.save_pretrained(out)
model = type(model).from_pretrained(out, attn_implementation="eager").eval()
with open(out + ".expected", "w") as f:
    for prompt in prompts.split(";"):
        ids = torch.tensor([[int(t) for t in prompt.split(",")]])
        with torch.no_grad():
            g = model.generate(ids, max_new_tokens=64, min_new_tokens=64, do_sample=False,
                               eos_token_id=None, pad_token_id=0)
        f.write(" ".join(str(t) for t in g[0, ids.size(1):].tolist()) + "\n")
print(f"{kind}: transformers {transformers.__version__}, "
      f"{sum(p.numel() for p in model.parameters())} parameters")

if kind == "gpt2":
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["the quick brown fox jumps over the lazy dog", "kolos serves the model it trained",
              "a paged cache of keys and values, block by block", "continuous batching: join, leave"] * 50
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    assert tok.get_vocab_size() <= 320, tok.get_vocab_size()
    tok.save(out + "/tokenizer.json")
    prompt = "the lazy fox serves"
    ids = torch.tensor([tok.encode(prompt).ids])
    with torch.no_grad():
        g = model.generate(ids, max_new_tokens=64, min_new_tokens=64, do_sample=False,
                           eos_token_id=None, pad_token_id=0)[0, ids.size(1):].tolist()
    text = tok.decode(g)
    # A stop string of three printable characters from the middle of the text.
    start = next(i for i in range(len(text) // 3, len(text) - 3)
                 if all(c.isprintable() and c not in "\ufffd\"\\'" for c in text[i:i + 3]))
    stop = text[start:start + 3]
    for k in range(1, len(g) + 1):
        partial = tok.decode(g[:k])
        if stop in partial:
            cut = partial[:partial.index(stop)]
            break
    for name, value in (("prompt", prompt), ("expected", text), ("stop", stop), ("cut", cut)):
        with open(out + ".text." + name, "w") as f:
            f.write(value)
