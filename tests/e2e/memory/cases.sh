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
  *) fail "unknown case $case_name" ;;
esac
