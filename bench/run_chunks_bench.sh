#!/usr/bin/env bash
# The memory role's `chunks` plugin against the same run held in memory: one
# GPT, one rank, the same data, in this one invocation.
#
#   bench/run_chunks_bench.sh [--dir /tmp] [--layers 8] [--hidden 384]
#                             [--vocab 2048] [--seq 128] [--micro 4]
#                             [--steps 4] [--chunk-mib 3] [--overs "2 4 8"]
#                             [--tiers "host nvme"] [--build build]
#
# Builds nothing: it needs build/bin/kolos and its plugins (ninja -C build
# runtime). The in-memory run is the default (dp on one rank). Each chunked
# run sets memory.compute_budget to the fp32 states (16 B per parameter,
# counted from the model) divided by each factor of --overs, with auto
# placement, on each lower tier of --tiers (nvme: files in --dir). Printed
# per run: the median step time of the steps after the first (the first
# includes set-up work such as the bucket rebuild), its ratio to the
# in-memory run's, the peak RSS (metrics' peak_rss_bytes; for chunked runs
# counted from the end of set-up), and whether every step's loss equals the
# in-memory run's.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
dir=/tmp layers=8 hidden=384 vocab=2048 seq=128 micro=4 steps=4 chunk_mib=3 overs="2 4 8"
tiers="host nvme" build=build
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_options "${BASH_SOURCE[0]}" "dir layers hidden vocab seq micro steps chunk_mib overs tiers build" "$@"
kolos=$root/$build/bin/kolos
[[ -x $kolos ]] || { echo "no $kolos: ninja -C $build runtime" >&2; exit 2; }
work=$(mktemp -d)
nvme=$(mktemp -d "$dir/kolos-chunks-bench.XXXXXX")
trap 'rm -rf "$work" "$nvme"' EXIT
cd "$work"
cat >gpt.toml <<TOML
[model]
layers = $layers
hidden = $hidden
heads = 8
seq_len = $seq
vocab = $vocab
[data]
kind = "synthetic"
[train]
global_batch = $micro
micro_batch = $micro
steps = $steps
[log]
progress = "off"
TOML

# GPT's parameters: per block 12 h^2 + 13 h, the embeddings, the final norm.
params=$((layers * (12 * hidden * hidden + 13 * hidden) + vocab * hidden + seq * hidden + 2 * hidden))
states=$((16 * params))
echo "GPT: $layers blocks, hidden $hidden, vocab $vocab, seq $seq, micro-batch $micro;" \
  "$params parameters, fp32 states $((states / 1048576)) MiB; $(nproc) CPUs; nvme dir $dir" \
  "($(df --output=fstype,source "$dir" | tail -1 | tr -s ' '))"

run() {  # name, extra --set arguments...
  local name=$1; shift
  "$kolos" train gpt.toml --set log.metrics="$name.jsonl" "$@" >"$name.txt" 2>&1 ||
    { cat "$name.txt"; echo "run $name failed" >&2; exit 1; }
}
summary() {  # name, reference name
  /usr/bin/python3 - "$1.jsonl" "$2.jsonl" <<'PY'
import json, statistics, sys
rows = lambda f: [json.loads(l) for l in open(f)]
a, ref = rows(sys.argv[1]), rows(sys.argv[2])
t = statistics.median(r["step_time_s"] for r in a[1:])
t_ref = statistics.median(r["step_time_s"] for r in ref[1:])
same = [r["loss"] for r in a] == [r["loss"] for r in ref]
peak = max(r["peak_rss_bytes"] for r in a) / 2**20
print(f"{t:10.3f} {t / t_ref:8.2f} {peak:10.0f} {'yes' if same else 'NO':>8}")
PY
}

run memory
printf '%-22s %10s %8s %10s %8s\n' run "step s" ratio "peak MiB" "= loss"
printf '%-22s %s\n' "in memory" "$(summary memory memory)"
for tier in $tiers; do
  for over in $overs; do
    budget=$((states / over / 1048576))
    name="$tier-$over"
    extra=(--set memory.compute_budget=\"${budget}MiB\" --set memory.offload=\"$tier\"
           --set memory.chunk_size=\"${chunk_mib}MiB\")
    [[ $tier == nvme ]] && extra+=(--set memory.nvme_dir=\"$nvme\")
    run "$name" "${extra[@]}"
    printf '%-22s %s\n' "$tier, ${over}x (${budget} MiB)" "$(summary "$name" memory)"
  done
done
