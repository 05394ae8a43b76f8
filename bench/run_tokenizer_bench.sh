#!/usr/bin/env bash
# Tokenizer throughput: `kolos data prepare --tokenizer` against the Python
# `tokenizers` package (its encode_batch) on the same files in the same run.
#
#   bench/run_tokenizer_bench.sh [--megabytes 20] [--documents 8] [--reps 3]
#                                [--build build]
#
# Builds nothing: it needs build/bin/kolos (ninja -C build kolos) and the
# virtual environment with `tokenizers` (scripts/install-venv.sh; KOLOS_VENV,
# default .cache/torch-venv). Writes --documents files of --megabytes in
# all, trains a GPT-2-style byte-level BPE on the first, then runs, --reps
# times each and alternating the order: kolos on the documents, the package
# on the same documents (the ids must be identical), and the package on the
# same text split into lines (its fast case; throughput only). Printed: the
# corpus, each one's read-and-encode time (median, and every run), tokens/s
# and MB/s, and kolos/tokenizers for both (above 1: kolos is faster).
# bench/tokenizer/bench.py says what exactly is timed.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
megabytes=20 documents=8 reps=3 build=build
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_options "${BASH_SOURCE[0]}" "megabytes documents reps build" "$@"
cd "$root"
bench_kolos run_tokenizer_bench.sh
bench_peer run_tokenizer_bench.sh torch2 tokenizers
bench_tmp tokenizer-bench
bench_machine
"$python" "$here/tokenizer/bench.py" "$kolos" "$tmp" "$megabytes" "$documents" "$reps"
