#!/usr/bin/env bash
# The NVMe store's throughput against dd's direct-I/O sequential bandwidth,
# on the same directory and size, in this one invocation.
#
#   bench/run_nvme_bench.sh [--dir D] [--mib N] [--slot-mib S] [--threads T]
#                           [--build build]
#
# Defaults: --dir ${TMPDIR:-/tmp}, --mib 1024, --slot-mib 16, --threads 4.
# Builds nothing: it needs build/bin/nvme_bench (ninja -C build nvme_bench).
# In a fresh folder under D it runs, in this order:
#   dd write   dd if=/dev/zero of=F bs=S MiB count=N/S oflag=direct conv=notrunc
#              into F allocated beforehand (fallocate -l N MiB), as the store
#              allocates its file before writing: neither pays for block
#              allocation during the timed writes
#   dd read    dd if=F of=/dev/null bs=S MiB iflag=direct
#   store      nvme_bench: N/S slots of S MiB, all written, then all read,
#              every slot in flight at once on T I/O threads
# and prints each one's MiB/s and the ratios store/dd (goal >= 0.7). dd has
# one request in flight (queue depth 1); the store has T.
set -euo pipefail
export LC_ALL=C

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
dir=${TMPDIR:-/tmp} mib=1024 slot_mib=16 threads=4 build=$root/build
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_options "${BASH_SOURCE[0]}" "dir mib slot_mib threads build" "$@"
bench=$build/bin/nvme_bench
[[ -x $bench ]] || { echo "run_nvme_bench.sh: $bench missing; ninja -C $build nvme_bench" >&2; exit 2; }
(( mib % slot_mib == 0 )) || { echo "run_nvme_bench.sh: --mib must be a multiple of --slot-mib" >&2; exit 2; }
count=$((mib / slot_mib))

work=$(mktemp -d "$dir/nvme-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT

# dd's seconds from its last line: "N bytes (...) copied, T s, R MB/s".
dd_seconds() { sed -n 's/.* copied, \([0-9.e+-]*\) s,.*/\1/p' | tail -1; }

echo "dir $dir ($(df -T "$dir" | awk 'NR==2 {print $2 " on " $1}')), $mib MiB, slots of $slot_mib MiB, $threads I/O threads"
fallocate -l "${mib}MiB" "$work/dd.bin"
dd_write_s=$(dd if=/dev/zero of="$work/dd.bin" bs="${slot_mib}M" count="$count" oflag=direct conv=notrunc 2>&1 | dd_seconds)
dd_read_s=$(dd if="$work/dd.bin" of=/dev/null bs="${slot_mib}M" iflag=direct 2>&1 | dd_seconds)
rm -f "$work/dd.bin"
store_out=$("$bench" --dir "$work" --mib "$mib" --slot-mib "$slot_mib" --threads "$threads")
echo "$store_out" | sed -n 's/^setup: /store: /p'
grep -q '^verify: ok$' <<<"$store_out" || { echo "$store_out"; echo "store data did not verify" >&2; exit 1; }
store_write=$(sed -n 's/^store write MiB\/s: //p' <<<"$store_out")
store_read=$(sed -n 's/^store read MiB\/s: //p' <<<"$store_out")

awk -v mib="$mib" -v dws="$dd_write_s" -v drs="$dd_read_s" -v sw="$store_write" -v sr="$store_read" 'BEGIN {
  dw = mib / dws; dr = mib / drs
  printf "%-6s %12s %12s %8s\n", "", "dd MiB/s", "store MiB/s", "store/dd"
  printf "%-6s %12.1f %12.1f %8.2f\n", "write", dw, sw, sw / dw
  printf "%-6s %12.1f %12.1f %8.2f\n", "read", dr, sr, sr / dr
}'
