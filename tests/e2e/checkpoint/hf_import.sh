#!/usr/bin/env bash
# `kolos ckpt import --format hf` against the real transformers:
#   hf_import.sh CASE   (environment: KOLOS, MPIEXEC, KOLOS_VENV, GPT_LOGITS)
# gpt2:  a random tiny GPT2LMHeadModel saved by save_pretrained, as one file
#        and sharded (model.safetensors.index.json), and as the Hub stores
#        GPT-2 (no "transformer." prefix, the causal-mask buffers present);
#        each imported, kolos's forward (gpt_logits) against transformers'
#        logits within 1e-5; then training resumes from the import on 2 ranks
#        under tensor parallelism, and its export, loaded by transformers, gives
#        the trained model's logits.
# llama: the same for LlamaForCausalLM with grouped-query attention, a tied
#        and an untied head.
# mixtral: the same for MixtralForCausalLM (4 experts, top 2, GQA), and its
#        router jitter refused.
# bad:   a missing tensor, an extra tensor, a shard the index misplaces, a
#        truncated file, unsupported config.json keys: each refused, naming it.
set -uo pipefail
case_name=$1
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
use_venv safetensors transformers torch

TOKENS=$($PY -c "import random; r = random.Random(3); print(*[r.randrange(96) for _ in range(48)])")

# make_model KIND DIR PYTHON [KIND DIR PYTHON ...]: for each triple, a
# random tiny transformers model (vocab 96) of KIND, PYTHON run on `model`
# before saving (`shard`: save_pretrained's max_shard_size), saved to DIR,
# plus its logits for TOKENS (2 rows) in DIR.logits.safetensors. One Python
# process makes them all (importing torch and transformers costs seconds).
make_model() {
  "$PY" - "$TOKENS" "$@" <<'PYEOF' || fail "making the transformers model failed"
import sys, warnings
warnings.filterwarnings("ignore")
import torch, transformers
from safetensors.torch import save_file
tokens, specs = sys.argv[1], sys.argv[2:]
assert len(specs) % 3 == 0, specs
for kind, out, extra in zip(specs[0::3], specs[1::3], specs[2::3]):
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=96, n_positions=24, n_embd=48, n_layer=2, n_head=4,
                                      resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
        model = transformers.GPT2LMHeadModel(cfg)
    elif kind == "mixtral":
        cfg = transformers.MixtralConfig(vocab_size=96, hidden_size=64, intermediate_size=48,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         num_local_experts=4, num_experts_per_tok=2,
                                         max_position_embeddings=64, rope_theta=500000.0, rms_norm_eps=1e-6)
        model = transformers.MixtralForCausalLM(cfg)
    else:
        tied = kind == "llama_tied"
        cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96,
                                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                       max_position_embeddings=64, rope_theta=500000.0, rms_norm_eps=1e-6,
                                       tie_word_embeddings=tied)
        model = transformers.LlamaForCausalLM(cfg)
    # Random norms and biases too, so a layout mistake cannot hide behind ones and zeros.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    model.eval()
    shard = "5GB"
    exec(extra)
    model.save_pretrained(out, max_shard_size=shard)
    ids = torch.tensor([int(t) for t in tokens.split()]).view(2, -1)
    with torch.no_grad():
        logits = model(ids).logits
    save_file({"tokens": ids, "logits": logits.contiguous()}, out + ".logits.safetensors")
    print(f"{kind}: transformers {transformers.__version__}, {sum(p.numel() for p in model.parameters())} parameters")
PYEOF
}

# same_logits DIR: import DIR into DIR.ckpt, kolos's logits against transformers'.
same_logits() {
  local dir=$1
  "$KOLOS" ckpt import "$dir" --format hf -o "$dir.ckpt" >"$dir.import.txt" 2>&1 ||
    { cat "$dir.import.txt"; fail "import of $dir failed"; }
  # shellcheck disable=SC2086
  "$GPT_LOGITS" "$dir.ckpt" "$dir.kolos.safetensors" 2 $TOKENS >/dev/null ||
    fail "gpt_logits on the import of $dir failed"
  # numpy, not torch: importing torch costs a Python process seconds.
  "$PY" - "$dir" <<'PYEOF' || fail "kolos's logits differ from transformers' for $1"
import sys
import numpy as np
from safetensors.numpy import load_file
d = sys.argv[1]
hf, kolos = load_file(d + ".logits.safetensors"), load_file(d + ".kolos.safetensors")
assert (hf["tokens"] == kolos["tokens"]).all()
diff = float(np.abs(hf["logits"] - kolos["logits"]).max())
print(f"{d}: max |kolos - transformers| = {diff:.3g} (logits span "
      f"{hf['logits'].min():.2f}..{hf['logits'].max():.2f})")
assert diff < 1e-5, diff
PYEOF
}

# train_from CKPT TOML: 2 ranks, tensor = 2, 2 steps from the import.
train_from() {
  local ckpt=$1 toml=$2
  cat >>"$toml" <<'TOML'
[data]
kind = "synthetic"
[train]
global_batch = 4
micro_batch = 2
steps = 2
[parallel]
tensor = 2
[log]
progress = "off"
TOML
  echo "dir = \"$ckpt\"" | sed '1i [checkpoint]' >>"$toml"
  timeout 300 "$MPIEXEC" -np 2 --oversubscribe --mca mpi_yield_when_idle 1 --bind-to none \
    "$KOLOS" train "$toml" --resume "$ckpt" >"$toml.log" 2>&1 ||
    { cat "$toml.log"; fail "training from the import failed"; }
  grep -q "resumed from .*step-00000000 at step 0" "$toml.log" ||
    { cat "$toml.log"; fail "the run did not start from the import"; }
  [[ -d $ckpt/step-00000002 ]] || fail "no checkpoint of step 2 in $ckpt"
}

# export_matches CKPT: `ckpt export --format hf` of CKPT, loaded by transformers
# (AutoModelForCausalLM, nothing missing or unexpected), gives kolos's logits.
export_matches() {
  local ckpt=$1
  "$KOLOS" ckpt export "$ckpt" --format hf -o "$ckpt.hf" >/dev/null || fail "export of $ckpt failed"
  # shellcheck disable=SC2086
  "$GPT_LOGITS" "$ckpt" "$ckpt.kolos.safetensors" 2 $TOKENS >/dev/null || fail "gpt_logits on $ckpt failed"
  "$PY" - "$ckpt" <<'PYEOF' || fail "transformers disagrees with kolos on the export of $1"
import sys, warnings
warnings.filterwarnings("ignore")
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
ckpt = sys.argv[1]
model, info = AutoModelForCausalLM.from_pretrained(ckpt + ".hf", output_loading_info=True)
assert not any(info.values()), info
model.eval()
ref = load_file(ckpt + ".kolos.safetensors")
with torch.no_grad():
    logits = model(ref["tokens"]).logits
diff = (logits - ref["logits"]).abs().max().item()
print(f"{ckpt}: export loads as {type(model).__name__}; max |transformers - kolos| = {diff:.3g}")
assert diff < 1e-5, diff
PYEOF
}

case "$case_name" in
  gpt2)
    make_model gpt2 one "" gpt2 sharded "shard = '40KB'" gpt2 hub ""
    same_logits one
    [[ -f sharded/model.safetensors.index.json ]] || fail "transformers wrote no sharded model"
    same_logits sharded
    # The Hub's layout: no "transformer." prefix, causal-mask buffers kept.
    "$PY" - <<'PYEOF' || fail "rewriting to the Hub layout failed"
import torch
from safetensors.torch import load_file, save_file
t = load_file("hub/model.safetensors")
t = {k.removeprefix("transformer."): v for k, v in t.items()}
t["h.0.attn.bias"] = torch.tril(torch.ones(1, 1, 24, 24))
save_file(t, "hub/model.safetensors", metadata={"format": "pt"})
PYEOF
    same_logits hub
    sed -n '/^\[model\]/,$p' one.import.txt >train.toml
    grep -q '^name = "gpt"' train.toml || { cat one.import.txt; fail "import printed no [model] table"; }
    cp -r one.ckpt run.ckpt
    train_from run.ckpt train.toml
    export_matches run.ckpt
    ;;
  llama)
    make_model llama one "" llama sharded "shard = '40KB'" llama_tied tied ""
    same_logits one
    [[ -f sharded/model.safetensors.index.json ]] || fail "transformers wrote no sharded model"
    same_logits sharded
    same_logits tied
    grep -q "tie_word_embeddings" tied.import.txt || { cat tied.import.txt; fail "a tied head was imported without a note"; }
    sed -n '/^\[model\]/,$p' one.import.txt >train.toml
    cp -r one.ckpt run.ckpt
    train_from run.ckpt train.toml
    export_matches run.ckpt
    ;;
  mixtral)
    # Experts routed top-2 of 4 in both blocks: the same logits means the
    # same routing, weights and experts (and the same first-step loss).
    make_model mixtral one "" mixtral jitter "model.config.router_jitter_noise = 0.1"
    same_logits one
    grep -q '^name = "mixtral"' one.import.txt && grep -q '^experts = 4' one.import.txt ||
      { cat one.import.txt; fail "the import's [model] table is not a mixtral with 4 experts"; }
    sed -n '/^\[model\]/,$p' one.import.txt >train.toml
    cp -r one.ckpt run.ckpt
    train_from run.ckpt train.toml
    export_matches run.ckpt
    expect_failure "\`router_jitter_noise\` = 0.1" "$KOLOS" ckpt import jitter --format hf -o j.ckpt
    ;;
  bad)
    make_model gpt2 good "" llama lgood "" gpt2 sharded "shard = '40KB'"
    # edit NAME PYTHON: a copy of $SRC (default good/) as NAME, changed by
    # PYTHON (edit_hf_model.py: t the tensors, cfg config.json).
    edit() {
      "$PY" "$(dirname "${BASH_SOURCE[0]}")/edit_hf_model.py" "${SRC:-good}" "$1" "$2" ||
        fail "making $1 failed"
    }
    edit missing 'del t["transformer.h.1.mlp.c_fc.weight"]'
    expect_failure "has no tensor \`h.1.mlp.c_fc.weight\`" "$KOLOS" ckpt import missing --format hf -o m.ckpt
    edit extra 't["transformer.h.1.adapter.weight"] = torch.zeros(3)'
    expect_failure "tensor \`h.1.adapter.weight\` has no kolos gpt counterpart" "$KOLOS" ckpt import extra --format hf -o e.ckpt
    edit shape 't["transformer.wpe.weight"] = torch.zeros(25, 48)'
    expect_failure "tensor \`wpe.weight\` has shape \[25, 48\]" "$KOLOS" ckpt import shape --format hf -o s.ckpt
    edit act 'cfg["activation_function"] = "relu"'
    expect_failure "\`activation_function\` = \"relu\"" "$KOLOS" ckpt import act --format hf -o a.ckpt
    edit arch 'cfg["model_type"] = "bert"'
    expect_failure "\`model_type\` = \"bert\"" "$KOLOS" ckpt import arch --format hf -o b.ckpt
    SRC=lgood edit rope 'cfg["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}'
    expect_failure "\`rope_parameters.rope_type\` = \"llama3\"" "$KOLOS" ckpt import rope --format hf -o r.ckpt
    SRC=lgood edit bias 'cfg["attention_bias"] = True'
    expect_failure "\`attention_bias\` = true" "$KOLOS" ckpt import bias --format hf -o ab.ckpt
    # A truncated file, and an index that places a tensor in the wrong shard.
    rm -rf cut && cp -r good cut && truncate -s -100 cut/model.safetensors
    expect_failure "cut/model.safetensors" "$KOLOS" ckpt import cut --format hf -o c.ckpt
    "$PY" - <<'PYEOF' || fail "misplacing a tensor in the index failed"
import json
p = "sharded/model.safetensors.index.json"
idx = json.load(open(p))
files = sorted(set(idx["weight_map"].values()))
name = next(k for k, v in idx["weight_map"].items() if v == files[0])
idx["weight_map"][name] = files[1]
json.dump(idx, open(p, "w"))
print("moved", name, "to", files[1])
PYEOF
    expect_failure "places it in" "$KOLOS" ckpt import sharded --format hf -o sh.ckpt
    # Nothing is written where an import failed.
    for d in m.ckpt e.ckpt s.ckpt a.ckpt b.ckpt r.ckpt ab.ckpt c.ckpt sh.ckpt; do
      [[ ! -e $d/latest ]] || fail "a failed import left $d/latest"
    done
    # An import never overwrites a checkpoint.
    "$KOLOS" ckpt import good --format hf -o g.ckpt >/dev/null || fail "import of good failed"
    expect_failure "exists already" "$KOLOS" ckpt import good --format hf -o g.ckpt
    ;;
  *) fail "unknown case $case_name" ;;
esac
echo "PASS: $case_name"
