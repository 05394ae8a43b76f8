#!/usr/bin/env bash
# ViT on scikit-learn's digits: kolos against a plain PyTorch DDP ViT of the
# same shape, data, batch and steps, both measured in this one invocation.
#
#   bench/run_vit_bench.sh [--steps 300] [--warmup 20] [--threads 1] [--build build]
#
# Builds nothing: it needs build/bin/kolos and its plugins, OpenMPI's mpirun
# and the virtual environment of scripts/install-venv.sh ($KOLOS_VENV,
# default .cache/torch-venv; `make venv`) with scikit-learn and h5py. It
# writes the digits as image files (scripts/digits-to-h5.py: 1438 training,
# 359 held-out images), then runs
#   kolos  kolos run -n 2 examples/vit-digits.toml  (data parallel, 2 ranks)
#   torch  bench/peers/vit_ddp.py --ranks 2          (DDP over gloo, 2 processes)
# with examples/vit-digits.toml's model, batch, optimizer and schedule, and
# prints each run's median step time (steps after the first --warmup; a
# step's time is the slowest rank's), first and last training loss, held-out
# accuracy after the last step (kolos: its [eval] of the whole test file),
# parameter counts, and the ratio kolos / torch of the median step times.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)

steps=300 warmup=20 threads=1 build=build
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_options "${BASH_SOURCE[0]}" "steps warmup threads build" "$@"

cd "$root"
bench_peer run_vit_bench.sh torch2 torch
bench_kolos run_vit_bench.sh
bench_tmp vit-bench
"$python" scripts/digits-to-h5.py -o "$tmp/digits" >&2

# The shape, batch and optimizer the peer gets: examples/vit-digits.toml's,
# read back through `kolos check --effective` (every default written out).
cfg=examples/vit-digits.toml
paths=(--set data.path=\""$tmp/digits/digits-train.h5"\"
       --set eval.path=\""$tmp/digits/digits-test.h5"\")
"$kolos" check "$cfg" -n 2 "${paths[@]}" --effective | sed '1,/^$/d' > "$tmp/resolved.toml"
read -r layers hidden heads image patch channels classes eps mlp std gb mb lr min_lr \
  warm wd clip b1 b2 adam_eps mean sd < <("$python" - "$tmp/resolved.toml" <<'PY'
import sys, tomllib
c = tomllib.load(open(sys.argv[1], "rb"))
m, t, o, d = c["model"], c["train"], c["optim"], c["data"]
print(m["layers"], m["hidden"], m["heads"], m["image_size"], m["patch_size"], m["channels"],
      m["classes"], m["norm_eps"], m["mlp_ratio"], m["init_std"], t["global_batch"],
      t["micro_batch"], o["lr"], o["min_lr"], o["warmup_steps"], o["weight_decay"],
      o["grad_clip"], o["beta1"], o["beta2"], o["eps"], d["mean"], d["std"])
PY
)

echo "shape: vit layers $layers, hidden $hidden, heads $heads, ${image}x${image}x$channels images in ${patch}x$patch patches, $classes classes, global_batch $gb, micro_batch $mb, $steps steps (median of the last $((steps - warmup)))"
bench_machine
echo "peer: $python, torch $("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null); kolos: $("$kolos" version 2>/dev/null | tr -s ' \n' ' ')"

echo "[1/2] kolos: $kolos run -n 2 $cfg ($threads thread per rank)" >&2
KOLOS_THREADS=$threads "$kolos" run -n 2 "$cfg" --set train.steps="$steps" "${paths[@]}" \
  --set eval.every=0 \
  --set log.metrics=\""$tmp/kolos.jsonl"\" --set log.progress=\"off\" \
  > "$tmp/kolos.log" 2>&1 || { cat "$tmp/kolos.log" >&2; exit 1; }
echo "[2/2] torch: $python bench/peers/vit_ddp.py --ranks 2" >&2
"$python" "$here/peers/vit_ddp.py" --ranks 2 --threads "$threads" \
  --train "$tmp/digits/digits-train.h5" --test "$tmp/digits/digits-test.h5" \
  --layers "$layers" --hidden "$hidden" --heads "$heads" --image-size "$image" \
  --patch-size "$patch" --channels "$channels" --classes "$classes" --norm-eps "$eps" \
  --mlp-ratio "$mlp" --init-std "$std" --global-batch "$gb" --micro-batch "$mb" \
  --steps "$steps" --warmup "$warmup" --lr "$lr" --min-lr "$min_lr" --warmup-steps "$warm" \
  --weight-decay "$wd" --grad-clip "$clip" --beta1 "$b1" --beta2 "$b2" --eps "$adam_eps" \
  --mean "$mean" --std "$sd" > "$tmp/torch.json" 2> "$tmp/torch.log" ||
  { cat "$tmp/torch.log" >&2; exit 1; }

echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
"$python" - "$tmp" "$warmup" <<'PY'
import json, statistics, sys
tmp, warmup = sys.argv[1], int(sys.argv[2])
rows = [json.loads(l) for l in open(f"{tmp}/kolos.jsonl") if l.strip()]
steps = [r for r in rows if "step_time_s" in r]
evals = [r for r in rows if "eval_accuracy" in r]
kolos = (statistics.median(r["step_time_s"] for r in steps if r["step"] > warmup),
         steps[0]["loss"], steps[-1]["loss"], evals[-1]["eval_accuracy"])
peer = json.loads(open(f"{tmp}/torch.json").read().strip().splitlines()[-1])
torch = (peer["step_time_s_median"], peer["first_loss"], peer["final_loss"], peer["test_accuracy"])
print()
print(f"{'run':<6} {'median step ms':>15} {'loss first -> last':>20} {'held-out accuracy':>18}")
for name, (med, first, last, acc) in (("kolos", kolos), ("torch", torch)):
    print(f"{name:<6} {med * 1e3:>15.2f} {first:>9.4f} -> {last:<8.4f} {100 * acc:>17.2f}%")
print()
print(f"kolos / torch (median step time, the same ViT): {kolos[0] / torch[0]:.3f}")
kolos_p = steps[-1]["param_bytes"] // 4
print(f"parameters: kolos {kolos_p}, torch {peer['parameters']}"
      + ("" if kolos_p == peer["parameters"] else "  ** DIFFERENT MODEL SHAPES **"))
PY
