#!/usr/bin/env bash
# Fits the memory estimate's fitted constants, the allocator's share of the
# tensors and the process's fixed buffers (kAllocatorShare and
# kProcessBuffers, kolos/core/plugin_terms.h), on this machine.
#
#   bench/run_memory_fit.sh [--heldout] [--build build]
#
# Builds nothing: it needs build/bin/kolos and its plugins (ninja -C build
# runtime) and OpenMPI's mpirun. It trains the fifteen runs of the fit set
# (memory_fit_runs in tests/e2e/memory/measure.sh: its states.toml and
# activations.toml under several layouts, 2 ranks, 5 steps each) and, for
# each, asks `kolos plan --memory --json` for the estimate's terms. The runtime (each run's resident
# memory before the model existed, as `kolos run` prints it) is taken out of
# both sides: the model's measured part is the peak RSS less the runtime;
# its estimated part is the tensors T (every term but the allowance and the
# runtime) times 1 + a, plus b. Printed: each run's tensors, measured part
# and ratio, the a and b that make the largest relative error over the fit
# set smallest (a grid of 0.005 and 1 MiB), and each run's error under the
# constants compiled in and under the fitted ones. --heldout: then the same
# for the held-out set (other shapes, and mixes the fit set lacks), with the
# constants fitted on the fit set alone.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
build=build heldout=0
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_options "${BASH_SOURCE[0]}" "build heldout:heldout=1" "$@"
[[ $build = /* ]] || build=$root/$build
export KOLOS=$build/bin/kolos
[[ -x $KOLOS ]] || { echo "run_memory_fit.sh: no $KOLOS (ninja -C $build runtime)" >&2; exit 2; }
export KOLOS_PLUGIN_PATH=${KOLOS_PLUGIN_PATH:-$build/lib/kolos/plugins}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
set +e
# shellcheck source=../tests/e2e/lib.sh
source "$root/tests/e2e/lib.sh"
# shellcheck source=../tests/e2e/memory/measure.sh
source "$root/tests/e2e/memory/measure.sh"
write_memory_configs

: >fit.txt
measure_set() {  # SET RUN...: measures each run into fit.txt, tagged SET
  local set=$1 r name config extra line
  shift
  for r in "$@"; do
    IFS='|' read -r name config extra <<<"$r"
    # shellcheck disable=SC2086
    line=$(measure_memory "$name" 2 "$config" $extra) || exit 1
    # shellcheck disable=SC2086
    "$KOLOS" plan --memory "$config" -n 2 $extra --json >"$name.plan.json" ||
      [[ $? -eq 1 ]] || fail "$name: kolos plan --memory failed"
    echo "$set $line $name.plan.json" >>fit.txt
    echo "measured: $set $line" >&2
  done
}
measure_set fit "${memory_fit_runs[@]}"
((heldout)) && measure_set heldout "${memory_heldout_runs[@]}"
python3 - fit.txt <<'PY'
import json, sys
M = 2**20
rows = []
for line in open(sys.argv[1]):
    tag, name, est, rt, peak, plan = line.split()
    terms = json.load(open(plan))["terms"]
    tensors = sum(v for k, v in terms.items() if k not in ("allocator, buffers", "allocator, host", "runtime"))
    rows.append((tag, name, float(est), float(rt), float(peak), tensors, terms["allocator, buffers"]))
fit = [r for r in rows if r[0] == "fit"]
# The constants compiled in, from two runs' allowance terms (share x T + fixed).
(t1, c1), (t2, c2) = min((r[5], r[6]) for r in fit), max((r[5], r[6]) for r in fit)
share = (c2 - c1) / (t2 - t1)
fixed = c1 - share * t1
def worst(a, b):
    return max(abs((t * (1 + a) + b * M) / (p - r) - 1) for _, _, _, r, p, t, _ in fit)
best = min(((worst(i * 0.005, b), i * 0.005, b) for i in range(121) for b in range(257)))
_, a, b = best
print(f"{'set':7s} {'run':22s} {'tensors':>11s} {'peak - rt':>11s} {'ratio':>7s} {'error now':>10s} {'fitted':>8s}")
for tag, name, est, rt, peak, t, _ in rows:
    now = (est - rt) / (peak - rt) - 1
    fit_err = (t * (1 + a) + b * M) / (peak - rt) - 1
    print(f"{tag:7s} {name:22s} {t / M:9.1f}Mi {(peak - rt) / M:9.1f}Mi {(peak - rt) / t:7.3f} "
          f"{100 * now:+9.1f}% {100 * fit_err:+7.1f}%")
print(f"compiled in: share {share:.3f} of the tensors + {fixed / M:.1f} MiB; fitted on the fit set "
      f"({len(fit)} runs): share {a:.3f} + {b} MiB, the fit set's largest error {100 * best[0]:.1f}%")
PY
