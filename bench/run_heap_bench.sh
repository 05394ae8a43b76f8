#!/usr/bin/env bash
# The training heap (kolos/core/malloc_tuning.h): peak memory and step time
# of the same runs under glibc's defaults (the default, KOLOS_MALLOC=system)
# and under kolos's tuned heap (KOLOS_MALLOC=tuned), alternating, on this
# machine.
#
#   bench/run_heap_bench.sh [--rounds 2] [--steps 8] [--runs NAME,...]
#                           [--ranks 2] [--build build]
#
# Builds nothing: it needs build/bin/kolos and its plugins (ninja -C build
# runtime) and OpenMPI's mpirun. The runs are those of the memory estimate's
# check (tests/e2e/memory/measure.sh, 2 ranks each; default: ten of them,
# states-heavy, activation-heavy, zero3, tp, the pipeline, sequence
# parallelism, experts and [memory] chunks) and `planner-gpt`, the planner
# check's small GPT (bench/planner/gpt-check.toml, data parallel over the
# ranks, micro-batch 4; hidden 256: short products between medium-sized
# tensors), each trained --steps steps on --ranks ranks (the memory check's
# runs are written for 2; planner-gpt takes any count)
# once per heap in every round, the two heaps alternating (which goes first
# alternates too). Printed per run: the peak RSS less the runtime (the
# process's resident memory before the model, as `kolos run` prints it),
# the largest over the rounds, and the median step over steps 3 to --steps,
# the median over the rounds, for each heap, and tuned / system.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
rounds=2 steps=8 ranks=2 build=build
runs=dp,zero3,tp1d,pp2-1f1b,act-dp,act-sp2,wide-zero3,long-mixtral-ep2,wide-chunks-nvme,small-dp,planner-gpt
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_options "${BASH_SOURCE[0]}" "rounds steps runs ranks build" "$@"
((steps >= 4)) || { echo "run_heap_bench.sh: --steps must be at least 4" >&2; exit 2; }
bench_kolos run_heap_bench.sh
bench_tmp heap-bench
bench_machine  # before OMP_NUM_THREADS, which nproc honours
echo "kernel's transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo absent)"
export KOLOS_PLUGIN_PATH=${KOLOS_PLUGIN_PATH:-$(dirname "$kolos")/../lib/kolos/plugins}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
cd "$tmp"
# shellcheck source=../tests/e2e/memory/measure.sh
source "$root/tests/e2e/memory/measure.sh"
write_memory_configs
declare -A spec=()
for r in "${memory_fit_runs[@]}" "${memory_heldout_runs[@]}"; do spec[${r%%|*}]=$r; done
spec[planner-gpt]="planner-gpt|$root/bench/planner/gpt-check.toml|--set train.micro_batch=4"
IFS=, read -r -a names <<<"$runs"
for name in "${names[@]}"; do
  [[ -n ${spec[$name]:-} ]] || { echo "run_heap_bench.sh: no run $name in measure.sh" >&2; exit 2; }
done
: >results.txt
for ((round = 1; round <= rounds; round++)); do
  for name in "${names[@]}"; do
    IFS='|' read -r _ config extra <<<"${spec[$name]}"
    heaps=(tuned system)
    ((round % 2)) || heaps=(system tuned)
    for heap in "${heaps[@]}"; do
      # shellcheck disable=SC2086
      KOLOS_MALLOC=$heap timeout 900 "$kolos" run -n "$ranks" "$config" $extra --set train.steps="$steps" \
        --set log.metrics="$name-$heap.jsonl" --set log.progress=off >"$name-$heap.out" 2>&1 ||
        { cat "$name-$heap.out" >&2; echo "run_heap_bench.sh: $name under $heap failed" >&2; exit 1; }
      python3 - "$name" "$heap" "$name-$heap.out" "$name-$heap.jsonl" >>results.txt <<'PY'
import json, re, statistics, sys
name, heap, out, metrics = sys.argv[1:]
m = re.search(r"of which runtime (\d+);.*heap: (tuned|glibc)", open(out).read())
assert m and (m.group(2) == "tuned") == (heap == "tuned"), f"{name}: the run's heap is not {heap}"
rows = [json.loads(line) for line in open(metrics)]
peak = max(r["peak_rss_bytes"] for r in rows) - int(m.group(1))
print(name, heap, peak, statistics.median(r["step_time_s"] for r in rows[2:]))
PY
      echo "round $round: $(tail -1 results.txt)" >&2
    done
  done
done
python3 - results.txt "$runs" <<'PY'
import statistics, sys
M = 2**20
got = {}
for line in open(sys.argv[1]):
    name, heap, peak, step = line.split()
    got.setdefault((name, heap), []).append((int(peak), float(step)))
print()
print("| run | peak - runtime, system | tuned | tuned / system | step, system (s) | tuned (s) | tuned / system |")
print("|---|---:|---:|---:|---:|---:|---:|")
for name in sys.argv[2].split(","):
    ps, ss = zip(*got[(name, "system")])
    pt, st = zip(*got[(name, "tuned")])
    print(f"| {name} | {max(ps) / M:.0f} MiB | {max(pt) / M:.0f} MiB | {max(pt) / max(ps):.2f} | "
          f"{statistics.median(ss):.3f} | {statistics.median(st):.3f} | "
          f"{statistics.median(st) / statistics.median(ss):.2f} |")
PY
