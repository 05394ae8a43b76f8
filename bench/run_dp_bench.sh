#!/usr/bin/env bash
# Data parallelism vs PyTorch DDP, and kolos on one rank vs a plain LibTorch
# loop, on one GPT shape, all measured in this one invocation.
#
#   bench/run_dp_bench.sh [--layers 4] [--hidden 256] [--heads 8] [--seq-len 64]
#                         [--vocab 2048] [--global-batch 8] [--micro-batch 4]
#                         [--steps 30] [--warmup 5] [--threads-1rank 1]
#                         [--threads-2rank 1] [--bucket-mb 25] [--build build]
#                         [--peer torch2|system]
#
# Builds nothing: it needs build/bin/kolos, build/bin/bench_plain_loop and
# plugins (ninja -C build kolos bench_plain_loop), OpenMPI's mpirun and a
# Python with torch for the DDP peer (--peer, below). It writes a temporary
# TOML for the shape, then runs, in this order:
#   kolos-1     build/bin/kolos train CFG          (1 rank, the dp plugin)
#   plain-1     build/bin/bench_plain_loop CFG     (same model, plain loop)
#   kolos-dp2   build/bin/kolos run -n 2 CFG       (dp over 2 ranks, mpirun)
#   ddp2        bench/peers/gpt_ddp.py --ranks 2   (PyTorch DDP, gloo)
# and prints the median step time of each (steps after the first --warmup;
# for the 2-rank runs a step's time is the slowest rank's), tokens/s from
# that median, and the ratios kolos-1 / plain-1 and kolos-dp2 / ddp2, the
# latter next to kolos-dp2's reduction overlap (median fraction of the
# gradient bytes launched while backward still ran, rank 0) and its median
# wait in finish_backward, and both models' parameter counts. --bucket-mb
# sets kolos's parallel.bucket_mb and DDP's bucket_cap_mb alike. All four
# train on the same samples (the DDP peer reimplements kolos's synthetic
# source bit for bit); DDP's initial weights differ.
# --peer picks the PyTorch of the DDP peer: `torch2` (default), the torch
# 2.x of the virtual environment scripts/install-venv.sh makes ($KOLOS_VENV,
# default .cache/torch-venv; `make venv`), the wheel whose LibTorch the
# default build (build/) is built against, so kolos and the peer run the
# same kernels; `system`, Debian's python3-torch 1.13 in /usr/bin/python3
# (or $PYTHON). The same peer script runs under either.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
peer=torch2

layers=4 hidden=256 heads=8 seq_len=64 vocab=2048
global_batch=8 micro_batch=4 steps=30 warmup=5
threads1=1 threads2=1 bucket_mb=25 build=build

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_options "${BASH_SOURCE[0]}" "layers hidden heads seq_len vocab global_batch micro_batch steps warmup threads1:threads-1rank threads2:threads-2rank bucket_mb build peer" "$@"

bench_peer run_dp_bench.sh "$peer" torch.distributed

cd "$root"
bench_kolos run_dp_bench.sh
plain=$(dirname "$kolos")/bench_plain_loop
[[ -x $plain ]] || { echo "run_dp_bench.sh: $plain not built (ninja -C $build bench_plain_loop)" >&2; exit 1; }
bench_tmp dp-bench
cfg=$tmp/gpt.toml
bench_train_toml "$cfg" "$(bench_gpt_model)" "bucket_mb = $bucket_mb"

shape="layers $layers, hidden $hidden, heads $heads, seq_len $seq_len, vocab $vocab, global_batch $global_batch, micro_batch $micro_batch, buckets $bucket_mb MB, $steps steps (median of the last $((steps - warmup)))"
echo "shape: $shape"
bench_machine
echo "BLAS: $(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3)"
echo "peer: $python, torch $("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null); kolos: $("$kolos" version 2>/dev/null | tr -s ' \n' ' ')"

echo "[1/4] kolos-1: $kolos train (1 rank, $threads1 thread)" >&2
KOLOS_THREADS=$threads1 OMP_NUM_THREADS=$threads1 OPENBLAS_NUM_THREADS=$threads1 \
  "$kolos" train "$cfg" --set log.metrics="$tmp/kolos1.jsonl" > "$tmp/kolos1.log" 2>&1 ||
  { cat "$tmp/kolos1.log" >&2; exit 1; }

echo "[2/4] plain-1: $plain (1 process, $threads1 thread)" >&2
OMP_NUM_THREADS=$threads1 OPENBLAS_NUM_THREADS=$threads1 \
  "$plain" "$cfg" --threads "$threads1" --warmup "$warmup" > "$tmp/plain1.json" 2> "$tmp/plain1.log" ||
  { cat "$tmp/plain1.log" >&2; exit 1; }

echo "[3/4] kolos-dp2: $kolos run -n 2 ($threads2 thread per rank)" >&2
KOLOS_THREADS=$threads2 \
  "$kolos" run -n 2 "$cfg" --set log.metrics="$tmp/kolosdp2.jsonl" > "$tmp/kolosdp2.log" 2>&1 ||
  { cat "$tmp/kolosdp2.log" >&2; exit 1; }

echo "[4/4] ddp2: $python bench/peers/gpt_ddp.py --ranks 2 ($threads2 thread per rank)" >&2
"$python" "$here/peers/gpt_ddp.py" --ranks 2 --threads "$threads2" --layers "$layers" \
  --hidden "$hidden" --heads "$heads" --seq-len "$seq_len" --vocab "$vocab" \
  --global-batch "$global_batch" --micro-batch "$micro_batch" --steps "$steps" \
  --warmup "$warmup" --bucket-mb "$bucket_mb" > "$tmp/ddp2.json" 2> "$tmp/ddp2.log" ||
  { cat "$tmp/ddp2.log" >&2; exit 1; }

echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
"$python" - "$tmp" "$warmup" "$global_batch" "$seq_len" "$threads1" "$threads2" <<'PY'
import json, statistics, sys
tmp, warmup, batch, seq, t1, t2 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]

def kolos(name):
    rows = [json.loads(l) for l in open(f"{tmp}/{name}.jsonl") if l.strip()]
    times = [r["step_time_s"] for r in rows if r["step"] > warmup]
    return statistics.median(times), rows[0]["loss"], rows[-1]["loss"]

def reduction(name):
    rows = [json.loads(l) for l in open(f"{tmp}/{name}.jsonl") if l.strip()]
    rows = [r for r in rows if r["step"] > warmup]
    return (statistics.median(r["reduction_overlap"] for r in rows),
            statistics.median(r["reduction_wait_s"] for r in rows))

def peer(name):
    r = json.loads(open(f"{tmp}/{name}.json").read().strip().splitlines()[-1])
    return r["step_time_s_median"], r["first_loss"], r["final_loss"]

runs = [("kolos-1", "1", t1, kolos("kolos1")), ("plain-1", "1", t1, peer("plain1")),
        ("kolos-dp2", "2", t2, kolos("kolosdp2")), ("ddp2", "2", t2, peer("ddp2"))]
print()
print(f"{'run':<10} {'ranks':>5} {'thr/rank':>8} {'median step ms':>15} {'tokens/s':>10} {'loss first -> last':>20}")
for name, ranks, thr, (med, first, last) in runs:
    print(f"{name:<10} {ranks:>5} {thr:>8} {med * 1e3:>15.1f} {batch * seq / med:>10.0f} {first:>9.4f} -> {last:<8.4f}")
m = {name: v[0] for name, _, _, v in runs}
print()
print(f"kolos-1 / plain-1   (overhead of the engine on 1 rank): {m['kolos-1'] / m['plain-1']:.3f}")
overlap, wait = reduction("kolosdp2")
print(f"kolos-dp2 / ddp2    (step time, 2 ranks):               {m['kolos-dp2'] / m['ddp2']:.3f}"
      f"   kolos-dp2 reduction overlap {overlap:.3f}, finish_backward wait {wait * 1e3:.1f} ms")
print(f"kolos-1 / kolos-dp2 (speed-up from 2 ranks):          {m['kolos-1'] / m['kolos-dp2']:.2f}x")
kolos_p = [json.loads(l) for l in open(f"{tmp}/kolosdp2.jsonl") if l.strip()][-1]["param_bytes"] // 4
ddp_p = json.loads(open(f"{tmp}/ddp2.json").read().strip().splitlines()[-1])["parameters"]
print(f"parameters: kolos {kolos_p} ({kolos_p / 1e6:.2f} M), ddp2 {ddp_p}"
      + ("" if kolos_p == ddp_p else "  ** DIFFERENT MODEL SHAPES **"))
PY
