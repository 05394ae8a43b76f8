#!/usr/bin/env bash
# ZeRO benchmarks, all measured in this one invocation on one GPT shape:
#   1. per-rank model-state bytes (parameters + gradients + optimizer states,
#      as the gradients plugin reports them: at rest plus the step's peak of
#      transient buffers) of dp, zero1, zero2, zero3 at N = 2 and 4 ranks,
#      against the ideal 16·P/N of fp32 AdamW;
#   2. peak RSS per rank (max over ranks) of the same runs;
#   3. median step time of kolos zero1 vs PyTorch's ZeroRedundancyOptimizer
#      (DDP + ZeRO-1, gloo, bench/zero/gpt_zero_peer.py) on
#      the same model shape (the parameter counts are printed side by side),
#      the same data (kolos's synthetic samples, bit for bit, at the same
#      sample indices), the same bucket size (DDP's bucket_cap_mb =
#      --bucket-mb = kolos's parallel.bucket_mb) and the same ranks;
#   4. with --peer torch2 (PyTorch 2.x, the default): also kolos zero3 vs FSDP2
#      (fully_shard, bench/peers/gpt_fsdp2.py) on the same shape, data and
#      ranks: median step time and peak RSS (max over ranks), and their
#      ratios.
#
#   bench/zero/run_zero_bench.sh [--layers 8] [--hidden 512] [--heads 8] [--seq-len 64]
#       [--vocab 2048] [--global-batch 8] [--micro-batch 2] [--steps 8] [--warmup 3]
#       [--bucket-mb 4] [--ranks-time 2] [--sizes "2 4"] [--build build]
#       [--peer torch2|system]
#
# Builds nothing: needs build/bin/kolos and the dp, zero1, zero2, zero3
# plugins (kb kolos kolos_dp kolos_zero1 kolos_zero2 kolos_zero3), mpirun and
# a Python with torch: --peer torch2 (default) is the virtual environment of
# scripts/install-venv.sh ($KOLOS_VENV, default .cache/torch-venv; `make
# venv`), the wheel whose LibTorch the default build (build/) is built
# against, and also runs the FSDP2 peer; --peer system is /usr/bin/python3
# (or $PYTHON) with Debian's python3-torch 1.13, without FSDP2. --sizes: the
# rank counts of parts 1 and 2 (must hold --ranks-time). One thread per rank
# everywhere.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
layers=8 hidden=512 heads=8 seq_len=64 vocab=2048 global_batch=8 micro_batch=2
steps=8 warmup=3 bucket_mb=4 ranks_time=2 build=build peer=torch2 sizes="2 4"
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
bench_options "${BASH_SOURCE[0]}" "layers hidden heads seq_len vocab global_batch micro_batch steps warmup bucket_mb ranks_time build peer sizes" "$@"

bench_peer run_zero_bench.sh "$peer" torch.distributed.optim
[[ " $sizes " == *" $ranks_time "* ]] ||
  { echo "run_zero_bench.sh: --sizes '$sizes' must hold --ranks-time $ranks_time" >&2; exit 2; }

cd "$root"
kolos=$build/bin/kolos
[[ -x $kolos ]] || { echo "run_zero_bench.sh: $kolos not built" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 KOLOS_THREADS=1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kolos-zero-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cfg=$tmp/gpt.toml
bench_train_toml "$cfg" "$(bench_gpt_model)" "bucket_mb = $bucket_mb"
echo "shape: layers $layers, hidden $hidden, heads $heads, seq_len $seq_len, vocab $vocab, global_batch $global_batch, micro_batch $micro_batch, bucket_mb $bucket_mb, $steps steps (median of the last $((steps - warmup)))"
bench_machine
echo "peer: $python, torch $("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null); kolos: $("$kolos" version 2>/dev/null | tr -s ' \n' ' ')"

for n in $sizes; do
  for stage in 0 1 2 3; do
    name=s${stage}n$n
    echo "[kolos] zero stage $stage on $n ranks" >&2
    "$kolos" run -n "$n" "$cfg" --set parallel.zero.stage=$stage \
      --set log.metrics="$tmp/$name.jsonl" > "$tmp/$name.log" 2>&1 ||
      { cat "$tmp/$name.log" >&2; exit 1; }
  done
done
echo "[peer] ZeroRedundancyOptimizer on $ranks_time ranks" >&2
"$python" "$here/gpt_zero_peer.py" --ranks "$ranks_time" --threads 1 --layers "$layers" \
  --hidden "$hidden" --heads "$heads" --seq-len "$seq_len" --vocab "$vocab" \
  --global-batch "$global_batch" --micro-batch "$micro_batch" --steps "$steps" \
  --warmup "$warmup" --bucket-mb "$bucket_mb" > "$tmp/peer.json" 2> "$tmp/peer.log" ||
  { cat "$tmp/peer.log" >&2; exit 1; }
if [[ $peer == torch2 ]]; then
  echo "[peer] FSDP2 (fully_shard) on $ranks_time ranks" >&2
  "$python" "$root/bench/peers/gpt_fsdp2.py" --ranks "$ranks_time" --threads 1 --layers "$layers" \
    --hidden "$hidden" --heads "$heads" --seq-len "$seq_len" --vocab "$vocab" \
    --global-batch "$global_batch" --micro-batch "$micro_batch" --steps "$steps" \
    --warmup "$warmup" > "$tmp/fsdp2.json" 2> "$tmp/fsdp2.log" ||
    { cat "$tmp/fsdp2.log" >&2; exit 1; }
fi
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"

"$python" - "$tmp" "$warmup" "$ranks_time" "$bucket_mb" "$sizes" <<'PY'
import json, os, statistics, sys
tmp, warmup, rt, bucket_mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
sizes = [int(n) for n in sys.argv[5].split()]
def rows(name):
    return [json.loads(l) for l in open(f"{tmp}/{name}.jsonl") if l.strip()]
P = rows(f"s0n{sizes[0]}")[-1]["param_bytes"] // 4  # dp holds every parameter whole, fp32
print(f"\nP = {P} parameters ({P / 1e6:.2f} M); fp32 AdamW ideal per rank = 16*P/N bytes")
print(f"{'run':<7} {'N':>2} {'params MiB':>10} {'grads MiB':>9} {'optim MiB':>9} {'states MiB':>10} "
      f"{'16P/N MiB':>9} {'states/ideal':>12} {'peak RSS MiB':>12} {'median step s':>13}")
MiB = 2.0 ** 20
med = {}
for n in sizes:
    for s in (0, 1, 2, 3):
        r = rows(f"s{s}n{n}")
        last = r[-1]
        states = last["param_bytes"] + last["grad_bytes"] + last["optimizer_bytes"]
        ideal = 16 * P / n
        t = statistics.median(x["step_time_s"] for x in r if x["step"] > warmup)
        med[(s, n)] = t
        name = "dp" if s == 0 else f"zero{s}"
        print(f"{name:<7} {n:>2} {last['param_bytes'] / MiB:>10.1f} {last['grad_bytes'] / MiB:>9.1f} "
              f"{last['optimizer_bytes'] / MiB:>9.1f} {states / MiB:>10.1f} {ideal / MiB:>9.1f} "
              f"{states / ideal:>12.3f} {last['peak_rss_bytes'] / MiB:>12.1f} {t:>13.3f}")
peer = json.loads(open(f"{tmp}/peer.json").read().strip().splitlines()[-1])
print()
print(f"PyTorch ZeroRedundancyOptimizer (DDP + ZeRO-1, gloo) on {rt} ranks: median step "
      f"{peer['step_time_s_median']:.3f} s, peak RSS {peer['peak_rss_bytes'] / MiB:.1f} MiB, "
      f"loss {peer['first_loss']:.4f} -> {peer['final_loss']:.4f}")
z1 = rows(f"s1n{rt}")
print(f"kolos zero1 on {rt} ranks:                                 median step "
      f"{med[(1, rt)]:.3f} s, peak RSS {z1[-1]['peak_rss_bytes'] / MiB:.1f} MiB, "
      f"loss {z1[0]['loss']:.4f} -> {z1[-1]['loss']:.4f}")
print(f"parameters: kolos {P}, peer {peer['parameters']}"
      + ("" if P == peer["parameters"] else "  ** DIFFERENT MODEL SHAPES **")
      + f"; buckets: kolos bucket_mb {bucket_mb}, peer bucket_cap_mb {peer['bucket_cap_mb']:g}")
print(f"kolos zero1 / ZeroRedundancyOptimizer (step time, {rt} ranks): "
      f"{med[(1, rt)] / peer['step_time_s_median']:.3f}")
for n in sizes:
    print(f"N={n}: zero3 states / 16P/N = "
          f"{(lambda l: (l['param_bytes'] + l['grad_bytes'] + l['optimizer_bytes']) / (16 * P / n))(rows(f's3n{n}')[-1]):.3f}; "
          f"peak RSS zero3 / dp = {rows(f's3n{n}')[-1]['peak_rss_bytes'] / rows(f's0n{n}')[-1]['peak_rss_bytes']:.3f}; "
          f"step time zero1/2/3 / dp = " + ", ".join(f"{med[(s, n)] / med[(0, n)]:.2f}" for s in (1, 2, 3)))
if os.path.exists(f"{tmp}/fsdp2.json"):
    f = json.loads(open(f"{tmp}/fsdp2.json").read().strip().splitlines()[-1])
    z3 = rows(f"s3n{rt}")
    z3_rss = max(x["peak_rss_bytes"] for x in z3)
    print()
    print(f"PyTorch FSDP2 (fully_shard, torch {f['torch']}, gloo) on {rt} ranks: median step "
          f"{f['step_time_s_median']:.3f} s, peak RSS {f['peak_rss_bytes'] / MiB:.1f} MiB "
          f"(of which {f['baseline_rss_bytes'] / MiB:.1f} MiB before the model: Python + torch), "
          f"loss {f['first_loss']:.4f} -> {f['final_loss']:.4f}, parameters {f['parameters']}"
          + ("" if P == f["parameters"] else "  ** DIFFERENT MODEL SHAPES **"))
    print(f"kolos zero3 on {rt} ranks: median step {med[(3, rt)]:.3f} s, peak RSS "
          f"{z3_rss / MiB:.1f} MiB, loss {z3[0]['loss']:.4f} -> {z3[-1]['loss']:.4f}")
    print(f"kolos zero3 / FSDP2 (step time, {rt} ranks): {med[(3, rt)] / f['step_time_s_median']:.3f}")
    print(f"kolos zero3 / FSDP2 (peak RSS, {rt} ranks):  {z3_rss / f['peak_rss_bytes']:.3f}"
          f"   (peak RSS above the pre-model baseline: FSDP2 "
          f"{(f['peak_rss_bytes'] - f['baseline_rss_bytes']) / MiB:.1f} MiB)")
PY
