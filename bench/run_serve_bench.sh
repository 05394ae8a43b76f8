#!/usr/bin/env bash
# Serving under load: `kolos serve` on 127.0.0.1 against transformers'
# `generate` in static batches, on the same random-weight GPT-2 and the same
# requests in the same run.
#
#   bench/run_serve_bench.sh [--concurrency 1,4,16,64] [--prompt-len 128]
#                            [--output-len 64] [--requests 8]
#                            [--hidden 768] [--layers 12] [--heads 12]
#                            [--vocab 32000] [--rounds 1] [--build build]
#
# Builds nothing: it needs build/bin/kolos (ninja -C build kolos) and the
# virtual environment with torch and transformers (scripts/install-venv.sh;
# KOLOS_VENV, default .cache/torch-venv). At each concurrency C, max(--requests,
# 2 C) requests of --prompt-len token ids asking for exactly --output-len
# greedy tokens: kolos from C client threads streaming /v1/completions in a
# closed loop, transformers in batches of C. Printed: request throughput,
# output tokens/s, TTFT, TPOT and ITL (median and p99, as vLLM's
# benchmark_serving defines them) for both, kolos/transformers output
# tokens/s per level, how many requests got the same tokens from both, and
# the single-stream decode rate against the memory-bandwidth bound (weight
# bytes per token over a read bandwidth measured in the same run).
# --rounds R runs every level R times on each, kolos and transformers back
# to back at each level (alternating which goes first), and reports the
# median of the rounds' ratios: this machine's speed drifts by a third
# within minutes, more than a single pair of runs can tell from the engines.
# bench/serve/bench.py says what exactly is timed. The default model has
# 110M parameters; the whole run takes minutes on a few cores.
# KOLOS_BENCH_SET="inference.KEY=V ..." passes --set options to kolos serve
# (e.g. inference.pack_weights=false).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
concurrency=1,4,16,64 prompt_len=128 output_len=64 requests=8 rounds=1
hidden=768 layers=12 heads=12 vocab=32000 build=build
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_options "${BASH_SOURCE[0]}" "concurrency prompt_len output_len requests hidden layers heads vocab rounds build" "$@"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "run_serve_bench.sh: --rounds must be a whole number >= 1, got '$rounds'" >&2; exit 2; }
cd "$root"
bench_kolos run_serve_bench.sh
bench_peer run_serve_bench.sh torch2 "torch, transformers"
bench_tmp serve-bench
export NO_PROXY=127.0.0.1 no_proxy=127.0.0.1
bench_machine
"$python" -W ignore "$here/serve/bench.py" "$kolos" "$tmp" "$concurrency" "$prompt_len" "$output_len" \
  "$requests" "$hidden" "$layers" "$heads" "$vocab" "$rounds"
