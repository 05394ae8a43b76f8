#!/usr/bin/env bash
# Sequence parallelism: activation memory per rank at one length, and the
# longest sequence that trains within a per-rank memory limit, for each
# sequence mode at sp = 1, 2 and 4, with tokens/s; all measured in this one
# invocation on the same model and data.
#
#   bench/run_sequence_bench.sh [--modes "ulysses ring hybrid megatron tp1d"]
#                               [--sizes "2 4"]
#                               [--limit-mib 1024] [--at 4096] [--base 512]
#                               [--step 1024] [--max 8192]
#                               [--layers 2] [--hidden 128] [--heads 4]
#                               [--vocab 1024] [--build build]
#
# Builds nothing: it needs build/bin/kolos and its plugins (ninja -C build
# runtime) and OpenMPI's mpirun. Every run is `kolos run -n SP` of a GPT with
# micro-batch 1 (the sp ranks share each sample; no data parallelism) for 2
# steps, with a metrics file; sp 1 is the serial run (no sequence plugin),
# the same for every mode. "megatron" runs sp = parallel.tensor.size with
# tensor mode "1d" (its sequence group is the tensor group); "tp1d" is that
# tensor parallelism without a sequence mode, megatron's reference.
# "hybrid" runs with parallel.sequence.ulysses = 2. A run's memory is its peak RSS per rank (the
# largest of every rank's ru_maxrss, which includes LibTorch's and MPI's
# own ~200-300 MiB) and its speed is tokens/s of the second step.
#
# 1. Activation memory: peak RSS at --at tokens minus peak RSS at --base
#    tokens, the same mode and sp (what the sequence adds: everything but
#    the activations is the same in both runs); printed with the ratio of
#    sp 1's to it.
# 2. Longest length within --limit-mib: lengths --step, 2 --step, 4 --step,
#    ... while the run's peak RSS per rank stays within the limit (up to
#    --max), then the midpoint between the last that fits and the first
#    that does not (rounded to --step). Printed: the length, its peak RSS,
#    tokens/s, and the length's ratio to sp 1's (sp would be ideal where
#    memory grows linearly with the length; more where sp 1 holds T x T
#    attention scores and the mode does not). A length that reaches --max
#    is printed as ">= max": on a CPU the ring's O(T/sp) memory outlasts
#    the time a bench may take.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
modes="ulysses ring hybrid megatron tp1d" sizes="2 4" limit_mib=1024 at=4096 base=512 step=1024 max=8192
layers=2 hidden=128 heads=4 vocab=1024 build=build
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_options "${BASH_SOURCE[0]}" "modes sizes limit_mib at base step max layers hidden heads vocab build" "$@"
bench_kolos run_sequence_bench.sh
bench_tmp sequence-bench

seq_len=$base bench_plain_toml "$tmp/run.toml" 1 1 2

# run MODE SP LEN: sets PEAK (bytes) and TPS (tokens/s) of one run (mode
# "-" for sp 1), memoised; exits on a failed run. Called in this shell,
# never in a subshell, so that the memo keeps.
declare -A memo
PEAK=0 TPS=0
run() {
  local mode=$1 sp=$2 len=$3 key="$1/$2/$3"
  if [[ -z ${memo[$key]:-} ]]; then
    local args=(--set model.seq_len="$len" --set log.metrics="$tmp/m.jsonl")
    if [[ $sp -gt 1 ]]; then
      case $mode in
        # megatron splits the sequence over the tensor group (tp1d); tp1d
        # alone is its reference.
        megatron) args+=(--set parallel.tensor.size="$sp" --set parallel.tensor.mode=\"1d\"
                         --set parallel.sequence.mode=\"megatron\") ;;
        tp1d) args+=(--set parallel.tensor.size="$sp" --set parallel.tensor.mode=\"1d\") ;;
        # hybrid: Ulysses degree 2 (sp 2: Ulysses alone; sp 4: 2 x ring 2).
        hybrid) args+=(--set parallel.sequence.size="$sp" --set parallel.sequence.mode=\"hybrid\"
                       --set parallel.sequence.ulysses=2) ;;
        *) args+=(--set parallel.sequence.size="$sp" --set parallel.sequence.mode=\""$mode"\") ;;
      esac
    fi
    rm -f "$tmp/m.jsonl"
    if ! "$kolos" run -n "$sp" "$tmp/run.toml" "${args[@]}" >"$tmp/run.log" 2>&1; then
      echo "run_sequence_bench.sh: $mode at sp $sp, length $len failed:" >&2
      cat "$tmp/run.log" >&2
      exit 1
    fi
    memo[$key]=$(python3 - "$tmp/m.jsonl" "$len" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(max(r["peak_rss_bytes"] for r in rows), f'{int(sys.argv[2]) / rows[-1]["step_time_s"]:.0f}')
PY
)
    echo "  [$mode sp $sp, $len tokens: ${memo[$key]}]" >&2
  fi
  read -r PEAK TPS <<<"${memo[$key]}"
}

limit=$((limit_mib * 1048576))
fits() { run "$@"; [[ $PEAK -le $limit ]]; }

# longest MODE SP: sets LONGEST to the longest length that fits (see the top).
LONGEST=0
longest() {
  local mode=$1 sp=$2 len=$step good=0
  while [[ $len -le $max ]] && fits "$mode" "$sp" "$len"; do good=$len; len=$((len * 2)); done
  if [[ $good -gt 0 && $len -le $max ]]; then
    local mid=$(((good + len) / 2 / step * step))
    if [[ $mid -gt $good ]] && fits "$mode" "$sp" "$mid"; then good=$mid; fi
  fi
  LONGEST=$good
}

mib() { python3 -c "print(f'{$1 / 2**20:.0f}')"; }
ratio() { python3 -c "print(f'{$1 / $2:.2f}' if $2 else '-')"; }

echo "model: GPT, layers $layers, hidden $hidden, heads $heads, vocab $vocab, micro-batch 1; per-rank limit $limit_mib MiB"
echo "kolos: $("$kolos" version 2>/dev/null | tr -s ' \n' ' ')"
echo
echo "activation memory per rank at $at tokens (peak RSS at $at minus at $base)"
printf '%-8s %3s %12s %12s %14s %12s\n' mode sp "peak@$at" "peak@$base" "activations" "sp1 / this"
run - 1 "$at"; p1=$PEAK
run - 1 "$base"; b1=$PEAK
act1=$((p1 - b1))
printf '%-8s %3s %9sMiB %9sMiB %11sMiB %12s\n' serial 1 "$(mib "$p1")" "$(mib "$b1")" "$(mib "$act1")" 1.00
for mode in $modes; do
  for sp in $sizes; do
    run "$mode" "$sp" "$at"; p=$PEAK
    run "$mode" "$sp" "$base"; b=$PEAK
    printf '%-8s %3s %9sMiB %9sMiB %11sMiB %12s\n' "$mode" "$sp" "$(mib "$p")" "$(mib "$b")" \
      "$(mib $((p - b)))" "$(ratio "$act1" $((p - b)))"
  done
done

echo
echo "longest length within $limit_mib MiB per rank (lengths $step, $((2 * step)), ... up to $max)"
printf '%-8s %3s %8s %12s %10s %12s\n' mode sp length "peak RSS" tokens/s "vs sp 1"
longest - 1; len1=$LONGEST
show() {
  local mode=$1 sp=$2 len=$3 shown=$3
  if [[ $len -eq 0 ]]; then printf '%-8s %3s %8s\n' "$mode" "$sp" "none"; return; fi
  run "${4:-$mode}" "$sp" "$len"
  [[ $len -ge $max ]] && shown=">=$len"
  printf '%-8s %3s %8s %9sMiB %10s %12s\n' "$mode" "$sp" "$shown" "$(mib "$PEAK")" "$TPS" "$(ratio "$len" "$len1")"
}
show serial 1 "$len1" -
for mode in $modes; do
  for sp in $sizes; do longest "$mode" "$sp"; show "$mode" "$sp" "$LONGEST"; done
done
