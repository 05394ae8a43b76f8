#!/usr/bin/env bash
# Mixed precision and recomputation: tokens/s and peak memory per rank of
# GPT and LLaMA in fp32, bf16, bf16 + selective and bf16 + full
# recomputation, all on the same shape, data and batch, in this one
# invocation; each row's ratios are against the fp32 row of its model.
#
#   bench/run_precision_bench.sh [--layers 8] [--hidden 256] [--heads 8]
#                                [--seq-len 512] [--vocab 2048]
#                                [--micro-batch 8] [--steps 8] [--warmup 2]
#                                [--ranks 2] [--build build]
#
# Builds nothing: it needs build/bin/kolos and its plugins (ninja -C build
# runtime) and OpenMPI's mpirun. Each configuration trains --steps steps
# under `kolos run -n RANKS` (data parallelism, global batch = micro batch x
# ranks) with a metrics file; printed are the median step time of the steps
# after --warmup (each step's slowest rank), tokens/s from it, and the peak
# RSS (the largest of every rank's ru_maxrss, which includes LibTorch's and
# MPI's own ~200 MiB). LLaMA runs with kv_heads = heads / 2 and its default SwiGLU
# width.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
layers=8 hidden=256 heads=8 seq_len=512 vocab=2048 micro=8 steps=8 warmup=2 ranks=2 build=build
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_options "${BASH_SOURCE[0]}" "layers hidden heads seq_len vocab micro:micro-batch steps warmup ranks build" "$@"
bench_kolos run_precision_bench.sh
bench_tmp precision-bench

bench_plain_toml "$tmp/run.toml" $((micro * ranks)) "$micro" "$steps"

echo "shape: layers $layers, hidden $hidden, heads $heads, seq_len $seq_len, vocab $vocab, micro_batch $micro x $ranks ranks (dp), $steps steps (median of the last $((steps - warmup)))"
echo "kolos: $("$kolos" version 2>/dev/null | tr -s ' \n' ' ')"
printf '%-6s %-22s %12s %10s %12s %10s\n' model mode tokens/s "vs fp32" "peak RSS" "vs fp32"
for model in gpt llama; do
  model_args=(--set model.name=\""$model"\")
  [[ $model == llama ]] && model_args+=(--set model.kv_heads=$((heads / 2)))
  base_tps="" base_rss=""
  for mode in fp32 bf16 bf16+selective bf16+full; do
    args=("${model_args[@]}")
    case $mode in
      fp32) args+=(--set train.precision=\"fp32\") ;;
      bf16) args+=(--set train.precision=\"bf16\") ;;
      bf16+selective) args+=(--set train.precision=\"bf16\" --set train.recompute=\"selective\") ;;
      bf16+full) args+=(--set train.precision=\"bf16\" --set train.recompute=\"full\") ;;
    esac
    metrics="$tmp/$model-$mode.jsonl"
    "$kolos" run -n "$ranks" "$tmp/run.toml" "${args[@]}" --set log.metrics="$metrics" \
      >"$tmp/$model-$mode.log" 2>&1 || { cat "$tmp/$model-$mode.log"; exit 1; }
    read -r tps rss < <(python3 - "$metrics" "$warmup" "$seq_len" "$((micro * ranks))" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
warmup, seq, batch = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
t = statistics.median(r["step_time_s"] for r in rows[warmup:])
print(f"{seq * batch / t:.0f} {max(r['peak_rss_bytes'] for r in rows)}")
PYEOF
)
    [[ -n $base_tps ]] || { base_tps=$tps; base_rss=$rss; }
    printf '%-6s %-22s %12s %10s %9.1fMiB %10s\n' "$model" "$mode" "$tps" \
      "$(python3 -c "print(f'{$tps / $base_tps:.2f}')")" "$(python3 -c "print($rss / 2**20)")" \
      "$(python3 -c "print(f'{$rss / $base_rss:.2f}')")"
  done
done
