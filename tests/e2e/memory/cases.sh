#!/usr/bin/env bash
# Memory estimate cases (see CMakeLists.txt):  cases.sh CASE
set -uo pipefail
case_name=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../lib.sh
source "$here/../lib.sh"
# shellcheck source=measure.sh
source "$here/measure.sh"
write_memory_configs

case "$case_name" in
  accuracy-states | accuracy-activations)
    # Twelve of the fit set's fifteen runs (measure.sh; zero2, full
    # recomputation and the activation-heavy LLaMA are left to the fit).
    case "$case_name" in
      accuracy-states) names="dp zero1 zero3 tp1d pp2-1f1b bf16 llama" ;;
      accuracy-activations) names="act-dp act-sel act-sp2 act-ring2 act-meg2" ;;
    esac
    failed=0
    memory_header
    for r in "${memory_fit_runs[@]}"; do
      IFS='|' read -r name config extra <<<"$r"
      [[ " $names " == *" $name "* ]] || continue
      # shellcheck disable=SC2086
      line=$(measure_memory "$name" 2 "$config" $extra) || exit 1
      # shellcheck disable=SC2086
      memory_row $line || failed=$((failed + 1))
    done
    [[ $failed -eq 0 ]] || fail "$failed estimate(s) more than 15% from the measured peak (runtime out of both)"
    ;;
  refusals)
    # Refused before allocating: a message with the numbers and what would
    # fit, no crash. (Allocating first would end otherwise: out of memory,
    # or past expect_failure's 120 s timeout for 1e11 layers.)
    expect_failure "does not fit: .*parameters need about .* per rank .*Largest: " -- \
      "$KOLOS" check states.toml --set model.layers=99999999999
    expect_failure "does not fit: .*Largest: parameters|does not fit: .*Largest: optimizer" -- \
      "$KOLOS" train states.toml --set model.hidden=1048576
    expect_failure "does not fit: .* on 2 ranks, .*(Nothing tried fits|Would fit)" -- \
      "$KOLOS" run -n 2 states.toml --set model.layers=99999999999
    # A budget that the states model exceeds on 2 dp ranks but fits with
    # zero3 or 4-way tensor parallelism: named as alternatives.
    expect_failure "does not fit: .*\\[runtime\\] memory_limit.*Would fit: parallel.zero.stage = 3" -- \
      "$KOLOS" run -n 2 states.toml --set runtime.memory_limit=\"1200MiB\"
    # plan prints the table and says no.
    timeout 60 "$KOLOS" plan --memory states.toml -n 2 --set runtime.memory_limit=\"1200MiB\" >plan.txt
    rc=$?
    cat plan.txt
    [[ $rc -eq 1 ]] || fail "kolos plan --memory exit $rc for a config that does not fit, expected 1"
    grep -q "optimizer states" plan.txt && grep -q "does not fit" plan.txt ||
      fail "the table lacks its rows or verdict"
    expect_failure "runtime.memory_limit: \"12 parsecs\": unknown unit \"parsecs\"; valid: B, KiB" -- \
      "$KOLOS" check states.toml --set 'runtime.memory_limit="12 parsecs"'
    ;;
  heap)
    # The training heap (kolos/core/malloc_tuning.h). By default glibc's
    # malloc as it comes; under KOLOS_MALLOC=tuned each rank restarts once
    # with kolos's glibc tunables, which keep the activation-heavy model's
    # peak near its live tensors, where glibc's defaults keep much of what
    # the steps free (228-241 MiB against 368-507 MiB in every run measured;
    # docs/reliability.md). Where the kernel's transparent huge pages are
    # off, a run asked for the tuned heap keeps glibc's defaults and must
    # say why.
    small=(activations.toml --set train.micro_batch=2 --set train.global_batch=4)
    system=$(measure_memory heap-system 2 "${small[@]}") || exit 1
    grep -q "heap: glibc's defaults)" heap-system.out || fail "the default run does not say it keeps glibc's defaults"
    if grep -qsE '\[(always|madvise)\]' /sys/kernel/mm/transparent_hugepage/enabled; then
      tuned=$(KOLOS_MALLOC=tuned measure_memory heap-tuned 2 "${small[@]}") || exit 1
      grep -q "heap: tuned)" heap-tuned.out || fail "the KOLOS_MALLOC=tuned run is not on the tuned heap"
      # Its peak, and its estimate (made for the tuned heap) within 15% of it.
      python3 - $tuned $system <<'PY' || fail "the tuned heap's peak is not below 0.8 x glibc's defaults', or its estimate misses it"
import sys
_, est_t, rt_t, peak_t, _, _, rt_s, peak_s = sys.argv[1:]
t, s = int(peak_t) - int(rt_t), int(peak_s) - int(rt_s)
e = int(est_t) - int(rt_t)
print(f"peak less runtime: tuned {t / 2**20:.1f} MiB (estimated {e / 2**20:.1f}), "
      f"glibc's defaults {s / 2**20:.1f} MiB ({t / s:.2f})")
sys.exit(t > 0.8 * s or abs(e / t - 1) > 0.15)
PY
      # A budget between the two heaps' estimates (about 470 and 351 MiB):
      # refused with the tuned heap named as what would fit, which it does.
      expect_failure "does not fit: .*Would fit: KOLOS_MALLOC=tuned in the environment" -- \
        "$KOLOS" check "${small[@]}" --set 'runtime.memory_limit="420MiB"'
      KOLOS_MALLOC=tuned "$KOLOS" check "${small[@]}" --set 'runtime.memory_limit="420MiB"' ||
        fail "the run the refusal named does not fit under KOLOS_MALLOC=tuned"
    else
      KOLOS_MALLOC=tuned measure_memory heap-tuned 2 "${small[@]}" >/dev/null || exit 1
      grep -q "heap: glibc's defaults, transparent huge pages .* here)" heap-tuned.out ||
        fail "with transparent huge pages off, the tuned run does not say it keeps glibc's defaults"
    fi
    grep -q "heap: glibc's defaults, KOLOS_MALLOC=system)" <(KOLOS_MALLOC=system "$KOLOS" train "${small[@]}" \
      --set train.steps=1 --set log.progress=off 2>&1) || fail "a KOLOS_MALLOC=system run does not say so"
    expect_failure "KOLOS_MALLOC=jemalloc: the training heap is .system. \\(glibc's defaults, the default\\) or .tuned." -- \
      env KOLOS_MALLOC=jemalloc "$KOLOS" run -n 2 states.toml
    ;;
  *) fail "unknown case $case_name" ;;
esac
