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
# A target's LeakSanitizer suppressions (leaks inside libraries it reads
# with, never kolos's own), when it has some.
if [[ -f $here/$target/lsan.supp ]]; then
  export LSAN_OPTIONS="suppressions=$here/$target/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
fi
crashes=("$here/$target"/crashes/*)
if [[ -e ${crashes[0]} ]]; then
  "$fuzzer" -runs=1 "${crashes[@]}" >"$build/$target-crashes.log" 2>&1 ||
    { cat "$build/$target-crashes.log"; echo "FAIL: a regression input crashes" >&2; exit 1; }
  echo "ok: ${#crashes[@]} regression inputs"
fi
corpus=$build/$target-corpus
mkdir -p "$corpus" "$build/$target-artifacts"

# A library the target reads through may crash on crafted input by a bug of
# its own (Debian's HDF5 does: docs/reliability.md, "Fuzzing"). A target
# names such libraries in tests/fuzz/TARGET/library_frames (an extended
# regex of their file names). A report is the library's, recorded and
# fuzzing going on for the time left, only when both
#   - the faulting access: its innermost frame that is either such a
#     library or kolos lies in the library, and
#   - the memory it touched, when the sanitizer says where it came from
#     ("allocated by" / "freed by" stacks): the innermost such frame of
#     each of those stacks lies in the library too.
# A buffer kolos allocated and handed to HDF5 with a wrong size is
# overrun inside HDF5, but was allocated by kolos: that report is kolos's,
# and any report of kolos's fails.
library=$(grep -v '^#' "$here/$target/library_frames" 2>/dev/null | paste -sd'|')
owner() {  # owner LOG -> library | kolos
  awk -v lib="$library" '
    function who(line) {  # library | kolos | "" (neither: libc, the sanitizer, std::)
      if (lib != "" && line ~ lib) return "library"
      if (line ~ / in kolos::/ || line ~ /LLVMFuzzerTestOneInput/) return "kolos"
      return ""
    }
    /^ *#[0-9]+ 0x/ {
      if (stack == "") { stack = "access"; first = "" }
      if (first == "") first = who($0)
      next
    }
    {
      if (stack == "access") access = first
      if (stack == "memory" && first == "kolos") memory_kolos = 1
      stack = ""
      if ($0 ~ /(allocated|freed) by thread/ && access != "") { stack = "memory"; first = "" }
    }
    END {
      if (stack == "access") access = first
      if (stack == "memory" && first == "kolos") memory_kolos = 1
      print (access == "library" && !memory_kolos) ? "library" : "kolos"
    }' "$1"
}
deadline=$((SECONDS + seconds)) runs=0 library_reports=0
while :; do
  left=$((deadline - SECONDS))
  ((left > 0)) || break
  runs=$((runs + 1))
  log=$build/$target-fuzz-$runs.log
  "$fuzzer" -max_total_time="$left" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$build/$target-artifacts/" "$corpus" "$here/$target/seeds" >"$log" 2>&1
  rc=$?
  grep -E "^(INFO: Seed|Done|stat::number_of_executed_units|stat::new_units_added)" "$log"
  [[ $rc -eq 0 ]] && break
  input=$(grep -o "Test unit written to .*" "$log" | sed 's/Test unit written to //')
  if [[ $(owner "$log") == library && $runs -lt 30 ]]; then
    library_reports=$((library_reports + 1))
    echo "library bug (not kolos): $(grep -m1 -E '^SUMMARY' "$log"); input $input"
    grep -m1 -E "^ *#[0-9]+ 0x.*($library)" "$log"
    # The input may be in the scratch corpus: a library that keeps state
    # between inputs (HDF5's caches) can pass an input once and crash on it
    # after another, and the restart would then stop on it at once, every
    # time. libFuzzer names both files by the SHA-1 of the bytes.
    name=${input##*/}
    [[ -n $input ]] && rm -f "$corpus/${name#*-}"
    continue
  fi
  tail -60 "$log"
  echo "FAIL: fuzz_$target found a crash (exit $rc); input $input" >&2
  exit 1
done
echo "PASS: fuzz_$target ran ${seconds} s in $runs run(s); $library_reports report(s) inside ${library:-no} libraries"
