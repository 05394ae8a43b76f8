#!/usr/bin/env bash
# Runs one libFuzzer target of tests/fuzz/project:
#   run.sh BUILD_DIR TARGET SECONDS
# First every input of tests/fuzz/TARGET/crashes (inputs that once crashed,
# now regression tests) once, then the fuzzer from the committed seeds for
# SECONDS into a scratch corpus. Any crash, leak, sanitizer report or input
# slower than 10 s fails the test; the input is kept next to the log.
set -uo pipefail
build=$1 target=$2 seconds=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
fuzzer=$build/fuzz_$target
[[ -x $fuzzer ]] || { echo "FAIL: $fuzzer was not built" >&2; exit 1; }
crashes=("$here/$target"/crashes/*)
if [[ -e ${crashes[0]} ]]; then
  "$fuzzer" -runs=1 "${crashes[@]}" >"$build/$target-crashes.log" 2>&1 ||
    { cat "$build/$target-crashes.log"; echo "FAIL: a regression input crashes" >&2; exit 1; }
  echo "ok: ${#crashes[@]} regression inputs"
fi
corpus=$build/$target-corpus
mkdir -p "$corpus" "$build/$target-artifacts"
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$build/$target-artifacts/" "$corpus" "$here/$target/seeds" \
  >"$build/$target-fuzz.log" 2>&1
rc=$?
grep -E "^(INFO: Seed|Done|stat::)" "$build/$target-fuzz.log"
if [[ $rc -ne 0 ]]; then
  tail -60 "$build/$target-fuzz.log"
  echo "FAIL: fuzz_$target found a crash (exit $rc); input in $build/$target-artifacts" >&2
  exit 1
fi
echo "PASS: fuzz_$target ran ${seconds} s"
