#!/usr/bin/env bash
# The planner's predictions against measured step times on this machine:
# at least 12 distinct plans of one GPT at 4 ranks (bench/planner/check.py
# lists them), Spearman's rank correlation, the median absolute error, and
# the planner's own choice (its finalists tried for a few steps, the
# fastest measured, as parallel.auto chooses) measured against the best
# measured plan, and the tuning's time.
#
#   bench/run_planner_check.sh [--build build] [--plans all|small]
#                              [--steps 8] [--warmup 3] [--rounds 1] [--out DIR]
#                              [--tune 3] [--tune-seconds S] [--final 0] [--recalibrate]
#                              [--set key=value ...]
#
# Builds nothing: it needs build/bin/kolos and its plugins (ninja -C build
# runtime) and OpenMPI's mpirun. The first `kolos plan` calibrates this
# machine for 4 ranks when no calibration is cached (KOLOS_CACHE_DIR, else
# ~/.cache/kolos); --recalibrate measures it again first. Each plan runs
# --steps steps; its time is the median step_time_s after --warmup steps,
# the fastest of --rounds passes over the plans. --tune K: the finalists
# `kolos plan --tune K` tries before choosing (0: the best prediction);
# --tune-seconds: their time bound (default: planner.tune_seconds's).
# --final R: after the passes, the choice and the two fastest other plans
# run R more rounds in turns (forward, then backward), and chosen/best is
# taken from these rounds (0: from the passes; both are printed).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
build=build plans=all steps=8 warmup=3 rounds=1 out="" recalibrate=0 tune=3 tune_seconds=0 final=0
sets=()
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_options "${BASH_SOURCE[0]}" "build plans steps warmup rounds tune tune_seconds final out recalibrate:recalibrate=1 sets:set+" "$@"
[[ $build == /* ]] || build=$root/$build
kolos=$build/bin/kolos
[[ -x $kolos ]] || { echo "run_planner_check.sh: no $kolos; build it: ninja -C $build runtime" >&2; exit 2; }
config=$root/bench/planner/gpt-check.toml
[[ -n $out ]] || out=$(mktemp -d)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if ((recalibrate)); then
  "$kolos" calibrate "$config" -n 4 "${sets[@]}"
fi
echo "run_planner_check.sh: $(date -u +%FT%TZ) on $(hostname), $(nproc) cores; results in $out"
echo "command: bench/run_planner_check.sh --plans $plans --steps $steps --warmup $warmup --rounds $rounds --tune $tune --tune-seconds $tune_seconds --final $final ${sets[*]}"
echo "load: $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min)"
/usr/bin/python3 "$here/planner/check.py" --kolos "$kolos" --config "$config" --ranks 4 \
  --plans "$plans" --steps "$steps" --warmup "$warmup" --rounds "$rounds" --tune "$tune" \
  --tune-seconds "$tune_seconds" --final "$final" --out "$out" "${sets[@]}"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min)"
