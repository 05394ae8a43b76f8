#!/usr/bin/env bash
# Rank binding on this machine: the same training run under
# `kolos run --bind cores` and `--bind none`, alternated, and the ratio of
# their step times.
#
#   bench/run_binding_bench.sh [--config examples/gpt-demo.toml] [--ranks 2]
#                              [--steps 60] [--warmup 10] [--reps 3]
#                              [--build build] [--set key=value ...]
#
# Builds nothing: it needs build/bin/kolos and its plugins (ninja -C build
# runtime) and OpenMPI's mpirun. Each repetition runs the config once with
# each policy, alternating which goes first (rep 1: cores, none; rep 2:
# none, cores; ...), so that a drift in the machine's load falls on both.
# Every run trains --steps steps with a metrics file; a run's time is the
# median step_time_s (each step's slowest rank) of the steps after
# --warmup. Printed: the mpirun command and binding line of each policy
# (from --dry-run), every run's median, each policy's median over its runs
# and their spread (max/min), and none/cores (above 1: binding is faster).
# --set options reach every run (the config's mesh must fit --ranks).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
config=examples/gpt-demo.toml ranks=2 steps=60 warmup=10 reps=3 build=build
sets=()
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_options "${BASH_SOURCE[0]}" "config ranks steps warmup reps build sets:set+" "$@"
cd "$root"
bench_kolos run_binding_bench.sh
[[ -f $config ]] || { echo "run_binding_bench.sh: no config $config" >&2; exit 2; }
bench_tmp binding-bench
common=(--set "train.steps=$steps" --set log.progress=off "${sets[@]}")

echo "config: $config, $ranks ranks, $steps steps (median of the last $((steps - warmup))), $reps repetitions per policy"
bench_machine
"$kolos" topo | sed 's/^/  /'
for bind in cores none; do
  "$kolos" run -n "$ranks" "$config" "${common[@]}" --bind "$bind" --dry-run >"$tmp/cmd-$bind.txt" 2>"$tmp/desc-$bind.txt" ||
    { cat "$tmp/desc-$bind.txt" >&2; exit 1; }
  echo "$bind: $(grep 'binding' "$tmp/desc-$bind.txt" | sed 's/^kolos run: //')"
  echo "  $(cat "$tmp/cmd-$bind.txt")"
done

for rep in $(seq 1 "$reps"); do
  if ((rep % 2 == 1)); then order=(cores none); else order=(none cores); fi
  for bind in "${order[@]}"; do
    echo "[rep $rep] kolos run -n $ranks --bind $bind" >&2
    metrics=$tmp/$bind-$rep.jsonl
    "$kolos" run -n "$ranks" "$config" "${common[@]}" --set "log.metrics=$metrics" --bind "$bind" \
      >"$tmp/$bind-$rep.log" 2>&1 || { cat "$tmp/$bind-$rep.log" >&2; exit 1; }
  done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"

/usr/bin/python3 - "$tmp" "$warmup" "$reps" "$steps" <<'PY'
import json, statistics, sys
tmp, warmup, reps, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
medians = {"cores": [], "none": []}
for bind in medians:
    for rep in range(1, reps + 1):
        rows = [json.loads(l) for l in open(f"{tmp}/{bind}-{rep}.jsonl") if l.strip()]
        assert [r["step"] for r in rows] == list(range(1, steps + 1)), f"{bind} rep {rep}: steps missing"
        medians[bind].append(statistics.median(r["step_time_s"] for r in rows if r["step"] > warmup))
print()
print(f"{'policy':<7} " + " ".join(f"{'rep ' + str(i + 1) + ' ms':>10}" for i in range(reps))
      + f" {'median ms':>10} {'max/min':>8}")
for bind, values in medians.items():
    print(f"{bind:<7} " + " ".join(f"{v * 1e3:>10.1f}" for v in values)
          + f" {statistics.median(values) * 1e3:>10.1f} {max(values) / min(values):>8.2f}")
ratio = statistics.median(medians["none"]) / statistics.median(medians["cores"])
print(f"\nnone/cores step time: {ratio:.3f} ({'binding faster' if ratio > 1 else 'binding not faster'})")
PY
