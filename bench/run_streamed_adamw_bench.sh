#!/usr/bin/env bash
# AdamW streamed over optimizer states on the NVMe tier, against the same
# step in memory and the store's raw I/O on the same bytes, in one run.
#
#   bench/run_streamed_adamw_bench.sh [--dir D] [--mib N] [--chunk-mib C]
#                                     [--prefetch K] [--steps S] [--build build]
#
# Defaults: --dir ${TMPDIR:-/tmp}, --mib 256, --chunk-mib 16, --prefetch 1,
# --steps 3. Builds nothing: it needs build/bin/streamed_adamw_bench
# (ninja -C build streamed_adamw_bench). Host memory: 7 N MiB (four arrays
# for the in-memory step, three to download the streamed states into); disk:
# 3 N MiB in a private folder under D, removed at the end.
#
# Prints each step's seconds and two ratios:
#   streamed/memory   what streaming the states costs against keeping them
#                     in host memory
#   streamed/floor    against the slower of the in-memory step and the I/O
#                     floor (all 3N bytes written, then all read, every
#                     request queued at once): 1.0 is perfect overlap of
#                     compute with I/O
set -euo pipefail
export LC_ALL=C

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
dir=${TMPDIR:-/tmp} mib=256 chunk_mib=16 prefetch=1 steps=3 build=$root/build
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_options "${BASH_SOURCE[0]}" "dir mib chunk_mib prefetch steps build" "$@"
bench=$build/bin/streamed_adamw_bench
[[ -x $bench ]] || { echo "run_streamed_adamw_bench.sh: $bench missing; ninja -C $build streamed_adamw_bench" >&2; exit 2; }

echo "dir $dir ($(df -T "$dir" | awk 'NR==2 {print $2 " on " $1}')), $(nproc) CPUs"
out=$("$bench" --dir "$dir" --mib "$mib" --chunk-mib "$chunk_mib" --prefetch "$prefetch" --steps "$steps")
echo "$out" | grep -v '^verify: ok$'
grep -q '^verify: ok$' <<<"$out" || { echo "streamed states did not verify" >&2; exit 1; }
mem=$(sed -n 's/^memory step seconds: //p' <<<"$out")
str=$(sed -n 's/^streamed step seconds: //p' <<<"$out")
io=$(sed -n 's/^io floor seconds: //p' <<<"$out")
awk -v mem="$mem" -v str="$str" -v io="$io" 'BEGIN {
  slow = mem > io ? mem : io
  printf "streamed/memory %.2f   streamed/io-floor %.2f   streamed/max(memory, io-floor) %.2f\n", str / mem, str / io, str / slow
}'
