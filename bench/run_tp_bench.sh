#!/usr/bin/env bash
# Tensor parallelism: the four modes and serial on one GPT shape and one
# global batch, all measured in this one invocation.
#
#   bench/run_tp_bench.sh [--layers 4] [--hidden 256] [--heads 8] [--seq-len 64]
#                         [--vocab 4096] [--global-batch 8] [--micro-batch 8]
#                         [--steps 10] [--warmup 3] [--threads 1] [--threads-serial 1]
#                         [--no-1d8] [--build build]
#                         [--peer torch2 [--peer-ranks 2] [--peer-only]]
#
# Builds nothing: it needs build/bin/tp_bench and the plugins tp1d, tp2d,
# tp2p5d, tp3d (kb tp_bench kolos_tp1d kolos_tp2d kolos_tp2p5d kolos_tp3d) and
# OpenMPI's mpirun. Runs, in this order, each under
#   mpirun -np N --oversubscribe --mca mpi_yield_when_idle 1 --bind-to none:
#   serial  1 rank  (tensor size 1)
#   1d      4 ranks        2d    4 ranks (q = 2)
#   2.5d    8 ranks (q = 2, depth 2)   3d  8 ranks (q = 2)
#   1d      8 ranks (unless --no-1d8)
# with --threads LibTorch/OpenBLAS threads per rank (--threads-serial for the
# serial run), and prints one table:
# tp bytes sent per step (max over ranks), the analytic bytes per step of
# tests/support/tp_volume.h, measured / analytic and their difference, the
# median step time (a step's time is its slowest rank's; median over the
# steps after the first --warmup), and that time over the serial run's.
# More ranks than cores share the cores: the step-time ratios then measure
# the overheads of tensor parallelism, not a speed-up.
#
# --peer torch2 adds PyTorch 2.x's DTensor tensor parallelism
# (parallelize_module with ColwiseParallel/RowwiseParallel laid out as tp1d,
# bench/peers/gpt_dtensor_tp.py, gloo) on --peer-ranks ranks, run by the
# virtual environment of scripts/install-venv.sh ($KOLOS_VENV, default
# .cache/torch-venv) with the same shape, samples, batch and threads, and a
# kolos 1d run on as many ranks if the list lacks one; it prints kolos
# 1d / DTensor step time. --peer-only leaves out every run but serial,
# that 1d and the peer.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)

layers=4 hidden=256 heads=8 seq_len=64 vocab=4096
global_batch=8 micro_batch=8 steps=10 warmup=3 threads=1 threads_serial=1 with_1d8=1
build=build peer=none peer_ranks=2 peer_only=0

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_options "${BASH_SOURCE[0]}" "layers hidden heads seq_len vocab global_batch micro_batch steps warmup threads threads_serial build with_1d8:no-1d8=0 peer peer_ranks peer_only:peer-only=1" "$@"

case "$peer" in
  none) (( ! peer_only )) || { echo "run_tp_bench.sh: --peer-only needs --peer torch2" >&2; exit 2; } ;;
  torch2) python=${KOLOS_VENV:-$root/.cache/torch-venv}/bin/python
    [[ -x $python ]] || { echo "run_tp_bench.sh: $python missing (scripts/install-venv.sh)" >&2; exit 1; } ;;
  *) echo "run_tp_bench.sh: --peer is torch2, not '$peer'" >&2; exit 2 ;;
esac

cd "$root"
bench=$build/bin/tp_bench
[[ -x $bench ]] || {
  echo "run_tp_bench.sh: $bench not built (kb tp_bench kolos_tp1d kolos_tp2d kolos_tp2p5d kolos_tp3d)" >&2
  exit 1
}
command -v mpirun >/dev/null || { echo "run_tp_bench.sh: no mpirun on PATH (OpenMPI)" >&2; exit 1; }

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# GNU nproc honours OMP_NUM_THREADS; the cores are what we want.
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kolos-tp-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

echo "shape: layers $layers, hidden $hidden, heads $heads, seq_len $seq_len, vocab $vocab," \
  "global_batch $global_batch, micro_batch $micro_batch, $steps steps (median of the last $((steps - warmup)))"
echo "machine: $cores cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $threads thread(s) per rank ($threads_serial for serial), load average $(cut -d' ' -f1-3 /proc/loadavg) at start"

# name ranks mode depth
runs=("serial 1 serial 1" "1d 4 1d 1" "2d 4 2d 1" "2.5d 8 2.5d 2" "3d 8 3d 1")
(( with_1d8 )) && runs+=("1d 8 1d 1")
if [[ $peer == torch2 ]]; then
  (( peer_only )) && runs=("serial 1 serial 1")
  have=0
  for run in "${runs[@]}"; do [[ $run == "1d $peer_ranks 1d 1" ]] && have=1; done
  (( have )) || runs+=("1d $peer_ranks 1d 1")
fi

i=0
for run in "${runs[@]}"; do
  read -r name ranks mode depth <<< "$run"
  i=$((i + 1))
  log=$tmp/run$i.log
  t=$threads
  [[ $mode == serial ]] && t=$threads_serial
  export KOLOS_THREADS=$t OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t
  echo "[$i/${#runs[@]}] $name: $ranks rank(s)$( (( ranks > cores )) && echo ", oversubscribed: $ranks ranks on $cores cores")" >&2
  mpirun -np "$ranks" --oversubscribe --mca mpi_yield_when_idle 1 --bind-to none \
    -x KOLOS_THREADS -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS \
    "$bench" --mode "$mode" --depth "$depth" --layers "$layers" --hidden "$hidden" \
    --heads "$heads" --seq-len "$seq_len" --vocab "$vocab" --micro-batch "$micro_batch" \
    --global-batch "$global_batch" --steps "$steps" --warmup "$warmup" > "$log" 2>&1 ||
    { cat "$log" >&2; exit 1; }
  grep '^result ' "$log" | sed 's/^result //' >> "$tmp/results"
done
if [[ $peer == torch2 ]]; then
  echo "[peer] DTensor parallelize_module (colwise/rowwise) on $peer_ranks ranks ($python)" >&2
  "$python" "$here/peers/gpt_dtensor_tp.py" --ranks "$peer_ranks" --threads "$threads" \
    --layers "$layers" --hidden "$hidden" --heads "$heads" --seq-len "$seq_len" \
    --vocab "$vocab" --global-batch "$global_batch" --micro-batch "$micro_batch" \
    --steps "$steps" --warmup "$warmup" > "$tmp/peer.json" 2> "$tmp/peer.log" ||
    { cat "$tmp/peer.log" >&2; exit 1; }
fi
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"

echo
awk -v cores="$cores" '
  function field(key,   i, kv) {
    for (i = 1; i <= NF; ++i) { split($i, kv, "="); if (kv[1] == key) return kv[2] }
    return ""
  }
  {
    mode[NR] = field("mode"); ranks[NR] = field("ranks"); bytes[NR] = field("bytes_max")
    mean[NR] = field("bytes_mean"); analytic[NR] = field("analytic"); ms[NR] = field("step_ms")
    loss[NR] = field("loss_last"); varied[NR] = field("varied")
    if (mode[NR] == "serial") serial = ms[NR]
  }
  END {
    printf "%-7s %5s %16s %16s %10s %10s %9s %9s %10s\n", "mode", "ranks", "tp B/step meas.",
           "tp B/step anal.", "meas/anal", "diff B", "step ms", "vs serial", "last loss"
    for (r = 1; r <= NR; ++r) {
      ratio = analytic[r] > 0 ? sprintf("%.6f", bytes[r] / analytic[r]) : "-"
      diff = analytic[r] > 0 ? sprintf("%+d", bytes[r] - analytic[r]) : "-"
      vs = serial > 0 ? sprintf("%.2f", ms[r] / serial) : "-"
      note = (ranks[r] + 0 > cores + 0 ? " *" : "") (mean[r] + 0 != bytes[r] + 0 || varied[r] + 0 != 0 ? " (ranks differ)" : "")
      printf "%-7s %5d %16d %16d %10s %10s %9.1f %9s %10.6f%s\n", mode[r], ranks[r], bytes[r],
             analytic[r], ratio, diff, ms[r], vs, loss[r], note
    }
    printf "\n* more ranks than the %d cores: ranks share cores, so \"vs serial\" (step time over\n", cores
    printf "  the serial run'"'"'s, > 1 is slower) measures the overheads of tensor parallelism\n"
    printf "  (collectives, waits, smaller matmuls, oversubscription), not a speed-up.\n"
  }' "$tmp/results"
if [[ $peer == torch2 ]]; then
  kolos_ms=$(awk -v n="$peer_ranks" '{ m = ""; r = ""; t = ""
      for (i = 1; i <= NF; ++i) { split($i, kv, "="); if (kv[1] == "mode") m = kv[2]
        if (kv[1] == "ranks") r = kv[2]; if (kv[1] == "step_ms") t = kv[2] }
      if (m == "1d" && r == n) print t }' "$tmp/results" | tail -1)
  "$python" - "$tmp/peer.json" "$kolos_ms" "$peer_ranks" <<'PY'
import json, sys
peer = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
kolos_ms, n = float(sys.argv[2]), sys.argv[3]
torch_ms = peer["step_time_s_median"] * 1e3
print(f"\nkolos tp1d vs DTensor parallelize_module (torch {peer['torch']}, gloo), {n} ranks, "
      f"{peer['threads']} thread(s) per rank, {peer['parameters']} parameters")
print(f"kolos 1d {kolos_ms:.1f} ms, DTensor {torch_ms:.1f} ms (loss {peer['first_loss']:.4f} -> "
      f"{peer['final_loss']:.4f}); kolos tp1d / DTensor (step time): {kolos_ms / torch_ms:.3f}")
PY
fi
