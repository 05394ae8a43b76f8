#!/usr/bin/env bash
# `kolos ckpt import/export --format hf` for ViT against the real transformers:
#   hf_vit.sh CASE   (environment: KOLOS, MPIEXEC, KOLOS_VENV, GPT_LOGITS)
# import: random tiny ViTForImageClassification models (3 channels, random
#         biases, norms, class token and positions, a non-zero classifier
#         bias) saved by save_pretrained, one file, sharded, with
#         qkv_bias = false, with a pooler, and in ViTConfig's defaults
#         (exact GELU, LayerNorm eps 1e-12: model.activation = "gelu",
#         model.norm_eps = 1e-12); each imported, kolos's forward
#         (gpt_logits) on the same float pixels against transformers' logits
#         within 1e-5;
#         then 2 training steps from the import in ViTConfig's defaults on 2
#         ranks under tensor parallelism (tp1d) with a held-out evaluation:
#         its export, loaded by transformers, says "gelu" and 1e-12 and
#         gives the trained model's logits, and transformers' loss on the
#         held-out images equals the eval loss kolos computed under tp1d
#         (within 1e-5 relative).
# export: a fresh kolos vit (1 channel, mlp_ratio 4, 10 classes) trained 3
#         steps on 2 ranks from an image file, exported, loaded by
#         transformers: the same logits on normalised uint8 images.
# bad:    config.json values kolos's vit does not compute (hidden_act
#         "relu", layer_norm_eps 0, intermediate_size, patch_size, problem_type,
#         num_labels), a model without a classifier, an extra tensor, a
#         position table of another size, a classifier bias that cannot
#         be folded: each refused, naming it, and nothing written.
set -uo pipefail
case_name=$1
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
use_venv safetensors transformers torch h5py

# images FILE N SIZE CHANNELS CLASSES [SEED]: random uint8 images and
# labels in the layout of data.kind = "images" (SEED: 5).
images() {
  "$PY" - "$@" <<'PYEOF' || fail "writing $1 failed"
import sys
import h5py, numpy as np
path, n, size, channels, classes, *seed = sys.argv[1], *map(int, sys.argv[2:])
r = np.random.RandomState(seed[0] if seed else 5)
with h5py.File(path, "w") as f:
    f.create_dataset("images", data=r.randint(0, 256, (n, size, size, channels)).astype(np.uint8))
    f.create_dataset("labels", data=r.randint(0, classes, n).astype(np.int64))
PYEOF
}

# pixels OUT SIZE CHANNELS MEAN STD: 3 random uint8 images normalised as
# the image source does ((pixel / 255 - mean) / std, in float64, then
# float32) into OUT.safetensors ("pixels" [3, SIZE, SIZE, CHANNELS] float32)
# and their bits, as the source packs them, into OUT.txt (gpt_logits' tokens).
pixels() {
  "$PY" - "$@" <<'PYEOF' || fail "making the pixels failed"
import sys
import numpy as np, torch
from safetensors.torch import save_file
out, size, channels, mean, std = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
img = np.random.RandomState(11).randint(0, 256, (3, size, size, channels))
x = torch.tensor((img / 255.0 - mean) / std, dtype=torch.float64).float().contiguous()
save_file({"pixels": x}, out + ".safetensors")
bits = x.reshape(3, -1).view(torch.int32).to(torch.int64)
open(out + ".txt", "w").write(" ".join(map(str, bits.flatten().tolist())))
PYEOF
}

# make_model DIR PYTHON [DIR PYTHON ...]: for each pair, a random tiny
# ViTForImageClassification (8x8x3 images, 4x4 patches, hidden 32, 5
# classes), PYTHON run on `cfg` (a dict of ViTConfig's arguments) before it
# is made and on `model` after, saved to DIR (`shard`: save_pretrained's
# max_shard_size), with its logits on px.safetensors' pixels in
# DIR.logits.safetensors. One Python process makes them all (importing
# torch and transformers' ViT costs it over ten seconds).
make_model() {
  "$PY" - "$@" <<'PYEOF' || fail "making the transformers model failed"
import sys, warnings
warnings.filterwarnings("ignore")
import torch, transformers
from safetensors.torch import load_file, save_file
assert len(sys.argv) % 2 == 1, sys.argv
for out, extra in zip(sys.argv[1::2], sys.argv[2::2]):
    torch.manual_seed(0)
    cfg = dict(image_size=8, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
               num_attention_heads=4, intermediate_size=64, hidden_act="gelu_pytorch_tanh",
               layer_norm_eps=1e-5, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
               num_labels=5, initializer_range=0.1)
    model = None
    shard = "5GB"
    exec(extra)
    model = transformers.ViTForImageClassification(transformers.ViTConfig(**cfg))
    # Random norms, biases (the classifier's too), class token and positions, so
    # that a layout mistake cannot hide behind ones and zeros.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 or "cls_token" in name or "position" in name:
                p.add_(torch.randn_like(p) * 0.2)
    model.eval()
    exec(extra)
    model.save_pretrained(out, max_shard_size=shard)
    x = load_file("px.safetensors")["pixels"]
    with torch.no_grad():
        logits = model(x.permute(0, 3, 1, 2)).logits  # HWC -> the Conv2d's CHW
    save_file({"logits": logits.contiguous()}, out + ".logits.safetensors")
    print(f"{out}: transformers {transformers.__version__}, "
          f"{sum(p.numel() for p in model.parameters())} parameters")
PYEOF
}

# compare A B WHAT: the "logits" of two safetensors files within 1e-5.
compare() {
  "$PY" - "$@" <<'PYEOF' || fail "kolos's logits differ from transformers' for $3"
import sys
import numpy as np
from safetensors.numpy import load_file  # not torch: its import costs seconds
a, b = load_file(sys.argv[1])["logits"], load_file(sys.argv[2])["logits"]
assert a.shape == b.shape, (a.shape, b.shape)
diff = float(np.abs(a - b).max())
print(f"{sys.argv[3]}: max |kolos - transformers| = {diff:.3g} (logits span "
      f"{a.min():.2f}..{a.max():.2f})")
assert diff < 1e-5, diff
PYEOF
}

# same_logits DIR: import DIR into DIR.ckpt, kolos's logits against transformers'.
same_logits() {
  local dir=$1
  "$KOLOS" ckpt import "$dir" --format hf -o "$dir.ckpt" >"$dir.import.txt" 2>&1 ||
    { cat "$dir.import.txt"; fail "import of $dir failed"; }
  # shellcheck disable=SC2046
  "$GPT_LOGITS" "$dir.ckpt" "$dir.kolos.safetensors" 3 $(cat px.txt) >/dev/null ||
    fail "gpt_logits on the import of $dir failed"
  compare "$dir.logits.safetensors" "$dir.kolos.safetensors" "$dir"
}

# export_matches CKPT: `ckpt export --format hf` of CKPT, loaded by
# transformers (AutoModelForImageClassification, nothing missing or
# unexpected), gives kolos's logits on px's pixels.
export_matches() {
  local ckpt=$1
  "$KOLOS" ckpt export "$ckpt" --format hf -o "$ckpt.hf" || fail "export of $ckpt failed"
  # shellcheck disable=SC2046
  "$GPT_LOGITS" "$ckpt" "$ckpt.kolos.safetensors" 3 $(cat px.txt) >/dev/null ||
    fail "gpt_logits on $ckpt failed"
  "$PY" - "$ckpt" <<'PYEOF' || fail "transformers could not run the export of $1"
import sys, warnings
warnings.filterwarnings("ignore")
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForImageClassification
ckpt = sys.argv[1]
model, info = AutoModelForImageClassification.from_pretrained(ckpt + ".hf", output_loading_info=True)
assert not any(info.values()), info
assert type(model).__name__ == "ViTForImageClassification", type(model)
model.eval()
x = load_file("px.safetensors")["pixels"]
with torch.no_grad():
    logits = model(x.permute(0, 3, 1, 2)).logits
save_file({"logits": logits.contiguous()}, ckpt + ".hf.logits.safetensors")
PYEOF
  compare "$ckpt.hf.logits.safetensors" "$ckpt.kolos.safetensors" "export of $ckpt"
}

# train TOML CKPT STEPS [ARGS...]: STEPS steps on 2 ranks, checkpoints in CKPT.
train() {
  local toml=$1 ckpt=$2 steps=$3
  shift 3
  cat >>"$toml" <<TOML
[data]
kind = "images"
path = "images.h5"
mean = 0.3
std = 0.4
[train]
global_batch = 8
micro_batch = 4
steps = $steps
[log]
progress = "off"
[checkpoint]
dir = "$ckpt"
TOML
  timeout 300 "$MPIEXEC" -np 2 --oversubscribe --mca mpi_yield_when_idle 1 --bind-to none \
    "$KOLOS" train "$toml" "$@" >"$toml.log" 2>&1 ||
    { cat "$toml.log"; fail "training ($toml) failed"; }
  [[ -d $ckpt/$(printf 'step-%08d' "$steps") ]] || { cat "$toml.log"; fail "no checkpoint of step $steps in $ckpt"; }
}

case "$case_name" in
  import)
    pixels px 8 3 0.3 0.4
    make_model one "" sharded "shard = '20KB'" noqkv "cfg['qkv_bias'] = False" \
      defaults "cfg.pop('hidden_act', None); cfg.pop('layer_norm_eps', None)"
    same_logits one
    grep -q "classifier.bias is not zero" one.import.txt ||
      { cat one.import.txt; fail "the classifier bias was folded without a note"; }
    [[ -f sharded/model.safetensors.index.json ]] || fail "transformers wrote no sharded model"
    same_logits sharded
    same_logits noqkv
    grep -q "qkv_bias = false" noqkv.import.txt || { cat noqkv.import.txt; fail "qkv_bias = false imported without a note"; }
    # A pooler (ViTModel's; the classifier does not use it) is dropped, saying so.
    rm -rf pooled && cp -r one pooled && cp one.logits.safetensors pooled.logits.safetensors
    "$PY" - <<'PYEOF' || fail "adding a pooler failed"
import torch
from safetensors.torch import load_file, save_file
t = load_file("pooled/model.safetensors")
t["vit.pooler.dense.weight"], t["vit.pooler.dense.bias"] = torch.randn(32, 32), torch.randn(32)
save_file(t, "pooled/model.safetensors", metadata={"format": "pt"})
PYEOF
    same_logits pooled
    grep -q "dropped vit.pooler.dense" pooled.import.txt || { cat pooled.import.txt; fail "a pooler was dropped without a note"; }
    # ViTConfig's own defaults, as published ViTs have them: exact GELU
    # (hidden_act "gelu") and LayerNorm eps 1e-12.
    "$PY" - <<'PYEOF' || fail "transformers did not write ViTConfig's defaults"
import json
c = json.load(open("defaults/config.json"))
assert c["hidden_act"] == "gelu" and c["layer_norm_eps"] == 1e-12, (c["hidden_act"], c["layer_norm_eps"])
PYEOF
    same_logits defaults
    # The same weights as `one` (same seed): exact GELU and eps 1e-12 move
    # its logits (by 8.9e-5 here) well past twice the 1e-5 bound, so a kolos
    # that still computed `one`'s function would fail the match above.
    "$PY" - <<'PYEOF' || fail "ViTConfig's defaults give the tanh model's logits: the check above cannot tell them apart"
import numpy as np
from safetensors.numpy import load_file
a, b = load_file("one.logits.safetensors")["logits"], load_file("defaults.logits.safetensors")["logits"]
diff = float(np.abs(a - b).max())
print(f"exact GELU, eps 1e-12 against tanh GELU, eps 1e-5: max |difference| = {diff:.3g}")
assert diff > 3e-5, diff
PYEOF
    grep -q '^activation = "gelu"$' defaults.import.txt && grep -q '^norm_eps = 1e-12$' defaults.import.txt ||
      { cat defaults.import.txt; fail "the import of ViTConfig's defaults printed no activation = \"gelu\", norm_eps = 1e-12"; }
    # Train it on 2 ranks, tensor = 2, evaluating held-out images, then export.
    sed -n '/^\[model\]/,$p' defaults.import.txt | sed '/^kolos: note/d' >train.toml
    grep -q '^name = "vit"' train.toml || { cat defaults.import.txt; fail "import printed no [model] table"; }
    printf '[parallel]\ntensor = 2\n[eval]\npath = "held.h5"\n' >>train.toml
    images images.h5 64 8 3 5
    images held.h5 24 8 3 5 9
    cp -r defaults.ckpt run.ckpt
    train train.toml run.ckpt 2 --resume run.ckpt --set log.metrics=metrics.jsonl
    grep -q "resumed from .*step-00000000 at step 0" train.toml.log ||
      { cat train.toml.log; fail "the run did not start from the import"; }
    export_matches run.ckpt
    grep -q '"hidden_act": "gelu"' run.ckpt.hf/config.json && grep -q '"layer_norm_eps": 1e-12' run.ckpt.hf/config.json ||
      { cat run.ckpt.hf/config.json; fail "the export's config.json does not say hidden_act \"gelu\", layer_norm_eps 1e-12"; }
    # The held-out loss kolos computed under tp1d against transformers' on the export.
    "$PY" - <<'PYEOF' || fail "kolos's held-out loss under tp1d differs from transformers'"
import json, warnings
warnings.filterwarnings("ignore")
import h5py, numpy as np, torch
from transformers import AutoModelForImageClassification
evals = [m["eval_loss"] for m in map(json.loads, open("metrics.jsonl")) if "eval_loss" in m]
assert evals, "no eval_loss in metrics.jsonl"
with h5py.File("held.h5") as f:
    img, labels = f["images"][:], torch.tensor(f["labels"][:])
x = torch.tensor((img / 255.0 - 0.3) / 0.4, dtype=torch.float64).float()
model = AutoModelForImageClassification.from_pretrained("run.ckpt.hf").eval()
with torch.no_grad():
    loss = torch.nn.functional.cross_entropy(model(x.permute(0, 3, 1, 2)).logits, labels).item()
print(f"held-out loss: kolos (tp1d) {evals[-1]:.9f}, transformers {loss:.9f}")
assert abs(evals[-1] - loss) <= 1e-5 * abs(loss), (evals[-1], loss)
PYEOF
    ;;
  export)
    pixels px 8 1 0.3 0.4
    images images.h5 64 8 1 10
    cat >fresh.toml <<'TOML'
[model]
name = "vit"
layers = 2
hidden = 32
heads = 4
mlp_ratio = 4
image_size = 8
patch_size = 2
channels = 1
classes = 10
TOML
    train fresh.toml fresh.ckpt 3
    export_matches fresh.ckpt
    grep -q '"hidden_act": "gelu_pytorch_tanh"' fresh.ckpt.hf/config.json || fail "config.json names no tanh GELU"
    # And back: the export imports as the same model.
    "$KOLOS" ckpt import fresh.ckpt.hf --format hf -o back.ckpt >back.txt 2>&1 || { cat back.txt; fail "re-import failed"; }
    ! grep -q "note:" back.txt || { cat back.txt; fail "re-importing the export changed something"; }
    # shellcheck disable=SC2046
    "$GPT_LOGITS" back.ckpt back.kolos.safetensors 3 $(cat px.txt) >/dev/null || fail "gpt_logits on back.ckpt failed"
    compare fresh.ckpt.kolos.safetensors back.kolos.safetensors "re-import"
    ;;
  bad)
    pixels px 8 3 0.3 0.4
    make_model good ""
    # edit NAME PYTHON: a copy of good/ as NAME, changed by PYTHON
    # (edit_hf_model.py: t the tensors, cfg config.json).
    edit() {
      "$PY" "$(dirname "${BASH_SOURCE[0]}")/edit_hf_model.py" good "$1" "$2" || fail "making $1 failed"
    }
    edit act 'cfg["hidden_act"] = "relu"'
    expect_failure "\`hidden_act\` = \"relu\": kolos's vit computes exact GELU" "$KOLOS" ckpt import act --format hf -o act.ckpt
    edit eps 'cfg["layer_norm_eps"] = 0'
    expect_failure "\`layer_norm_eps\` = 0: kolos's vit needs a LayerNorm eps > 0" "$KOLOS" ckpt import eps --format hf -o eps.ckpt
    edit inner 'cfg["intermediate_size"] = 40'
    expect_failure "\`intermediate_size\` = 40: kolos's vit has an MLP of model.mlp_ratio x hidden" "$KOLOS" ckpt import inner --format hf -o inner.ckpt
    edit patch 'cfg["patch_size"] = 3'
    expect_failure "\`patch_size\` = 3" "$KOLOS" ckpt import patch --format hf -o patch.ckpt
    edit multi 'cfg["problem_type"] = "multi_label_classification"'
    expect_failure "\`problem_type\` = \"multi_label_classification\"" "$KOLOS" ckpt import multi --format hf -o multi.ckpt
    edit one_label 'del cfg["id2label"]; del cfg["label2id"]; cfg["num_labels"] = 1'
    expect_failure "\`num_labels\` = 1: kolos's vit is a classifier" "$KOLOS" ckpt import one_label --format hf -o one_label.ckpt
    edit headless 'del t["classifier.weight"]; del t["classifier.bias"]'
    expect_failure "no tensor \`classifier.weight\`: kolos imports ViTForImageClassification" "$KOLOS" ckpt import headless --format hf -o headless.ckpt
    edit extra 't["vit.embeddings.mask_token"] = torch.zeros(1, 1, 32)'
    expect_failure "tensor \`vit.embeddings.mask_token\` has no kolos vit counterpart" "$KOLOS" ckpt import extra --format hf -o extra.ckpt
    edit pos 't["vit.embeddings.position_embeddings"] = torch.zeros(1, 17, 32)'
    expect_failure "tensor \`vit.embeddings.position_embeddings\` has shape \[1, 17, 32\]" "$KOLOS" ckpt import pos --format hf -o pos.ckpt
    # 40 classes over hidden 32: a classifier bias no LayerNorm bias can carry.
    edit wide 'cfg["id2label"] = {str(i): f"L{i}" for i in range(40)}; cfg["label2id"] = {f"L{i}": i for i in range(40)}; t["classifier.weight"] = torch.randn(40, 32); t["classifier.bias"] = torch.randn(40)'
    expect_failure "tensor \`classifier.bias\` is not zero, and kolos's vit head has no bias" "$KOLOS" ckpt import wide --format hf -o wide.ckpt
    for d in act eps inner patch multi one_label headless extra pos wide; do
      [[ ! -e $d.ckpt/latest ]] || fail "a failed import left $d.ckpt/latest"
    done
    ;;
  *) fail "unknown case $case_name" ;;
esac
echo "PASS: $case_name"
