#!/usr/bin/env bash
# Fits the memory estimate's fitted constants (kolos/core/plugin_terms.h)
# for the heap a training run uses on this machine (malloc_tuning.h: glibc's
# defaults, or the tuned heap under KOLOS_MALLOC=tuned).
#
#   bench/run_memory_fit.sh [--heldout] [--build build]
#
# Builds nothing: it needs build/bin/kolos and its plugins (ninja -C build
# runtime) and OpenMPI's mpirun. It trains the sixteen runs of the fit set
# (memory_fit_runs in tests/e2e/memory/measure.sh: its states.toml and
# activations.toml under several layouts and a tiny model, 2 ranks, 5 steps
# each) and, for each, asks `kolos plan --memory --json` for the estimate's
# terms. The runtime (each run's resident memory before the model existed,
# as `kolos run` prints it) is taken out of both sides: the model's measured
# part is the peak RSS less the runtime. Its estimated part: under the tuned
# heap, the states' side S (every term but activations, temporaries, the
# allowance and the runtime) times 1 + a, the activations' side A
# (activations and temporaries) times 1 + c, plus b; b is the tiny run's
# measured part less its tensors, a and c make the rest of the fit set's
# largest relative error smallest (a grid of 0.01). Under glibc's defaults,
# (S + A) times 1 + a, plus b, a and b fitted together (a grid of 0.005 and
# 1 MiB). Printed: each run's sides, measured part and ratio, its error
# under the constants compiled in and under the fitted ones, and the fitted
# constants. --heldout: then the same for the held-out set (other shapes,
# and mixes the fit set lacks), with the constants fitted on the fit set
# alone.
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
SIDE = ("activations", "temporaries")
FITTED = ("allocator, buffers", "allocator, host", "runtime")
rows = []
for line in open(sys.argv[1]):
    tag, name, est, rt, peak, plan = line.split()
    plan = json.load(open(plan))
    terms = plan["terms"]
    active = sum(terms.get(k, 0) for k in SIDE)
    states = sum(v for k, v in terms.items() if k not in FITTED + SIDE)
    rows.append(dict(tag=tag, name=name, est=float(est), rt=float(rt), peak=float(peak),
                     states=states, active=active, tuned=plan.get("heap_tuned", False)))
tuned = rows[0]["tuned"]
fit = [r for r in rows if r["tag"] == "fit"]
def part(r):  # the measured model part: the peak less the runtime
    return r["peak"] - r["rt"]
if tuned:
    # The fixed part from the tiny run (its tensors are a few MiB), then the
    # two shares that make the rest of the fit set's largest error smallest.
    tiny = next(r for r in fit if r["name"] == "tiny")
    b = round((part(tiny) - tiny["states"] - tiny["active"]) / M)
    rest = [r for r in fit if r["name"] != "tiny"]
    def model(r, a, c):
        return r["states"] * (1 + a) + r["active"] * (1 + c) + b * M
    def worst(a, c):
        return max(abs(model(r, a, c) / part(r) - 1) for r in rest)
    best = min((worst(i * 0.01, j * 0.01), i * 0.01, j * 0.01)
               for i in range(-20, 61) for j in range(-60, 21))
    _, a, c = best
    fitted = f"states' side {a:+.2f}, activations' side {c:+.2f}, fixed {b} MiB (from the tiny run)"
else:
    def model(r, a, b):
        return (r["states"] + r["active"]) * (1 + a) + b * M
    def worst(a, b):
        return max(abs(model(r, a, b) / part(r) - 1) for r in fit)
    best = min((worst(i * 0.005, b), i * 0.005, b) for i in range(121) for b in range(257))
    _, a, c = best
    fitted = f"share {a:.3f} of the tensors + {c} MiB"
heap = "tuned (kHeapStatesShare, kHeapActivationsShare, kHeapBuffers)" if tuned else \
    "glibc's defaults (kAllocatorShare, kProcessBuffers)"
print(f"heap: {heap}")
print(f"{'set':7s} {'run':22s} {'states':>9s} {'act+tmp':>9s} {'peak - rt':>11s} {'ratio':>7s} "
      f"{'error now':>10s} {'fitted':>8s}")
for r in rows:
    t = r["states"] + r["active"]
    now = (r["est"] - r["rt"]) / part(r) - 1
    print(f"{r['tag']:7s} {r['name']:22s} {r['states'] / M:7.1f}Mi {r['active'] / M:7.1f}Mi "
          f"{part(r) / M:9.1f}Mi {part(r) / t:7.3f} {100 * now:+9.1f}% "
          f"{100 * (model(r, a, c) / part(r) - 1):+7.1f}%")
print(f"fitted on the fit set ({len(fit)} runs): {fitted}; the fit set's largest error "
      f"{100 * best[0]:.1f}%")
PY
