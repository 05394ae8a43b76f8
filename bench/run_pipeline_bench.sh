#!/usr/bin/env bash
# Pipeline schedules side by side: measured idle fraction vs the theoretical
# bubble and step time, for gpipe, 1f1b, interleaved (chunks = 2) and zb, on
# the same GPT and ranks, at P = 2 and P = 4.
#
#   bench/run_pipeline_bench.sh [--build build] [--steps 10] [--warmup 3] [--set key=value ...]
#
# Builds nothing: needs build/bin/bench_pipeline and the pipeline plugin
# (ninja -C build bench_pipeline). More ranks than cores run oversubscribed
# (mpi_yield_when_idle), which inflates idle time; on such a machine compare
# the schedules with each other rather than with the theory.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
build=build
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift ;;
    *) args+=("$1") ;;
  esac
  shift
done
bin="$root/$build/bin/bench_pipeline"
[[ -x "$bin" ]] || { echo "missing $bin: ninja -C $build bench_pipeline" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
for p in 2 4; do
  mpirun -np "$p" --oversubscribe --mca mpi_yield_when_idle 1 --bind-to none \
    "$bin" ${args[@]+"${args[@]}"}
done
