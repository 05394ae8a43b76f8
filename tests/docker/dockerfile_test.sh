#!/usr/bin/env bash
# Lints docker/Dockerfile (lint_dockerfile.py), then checks that each
# deliberately broken Dockerfile in broken/ is refused with the message its
# `# expect:` line names. Environment: KOLOS_SOURCE_DIR (the repository).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${KOLOS_SOURCE_DIR:-$(cd "$here/../.." && pwd)}
py=/usr/bin/python3
[[ -x $py ]] || py=python3
status=0
"$py" "$here/lint_dockerfile.py" "$src" || status=1
for broken in "$here"/broken/*.Dockerfile; do
  name=broken/$(basename "$broken")
  expect=$(sed -n 's/^# expect: //p' "$broken")
  out=$("$py" "$here/lint_dockerfile.py" "$src" "$broken")
  rc=$?
  if [[ $rc -eq 0 ]]; then
    echo "FAIL: $name passed the lint" >&2; status=1
  elif ! grep -Eq -- "$expect" <<<"$out"; then
    echo "$out" >&2; echo "FAIL: $name refused, but not with /$expect/" >&2; status=1
  else
    echo "$name: refused as expected"
  fi
done
# docker/runtime-packages.sh, which picks the final image's packages, on a
# stand-in install tree: OpenMPI's orted must bring libopenmpi3.
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir -p "$tree/bin" && cp "$(command -v orted)" "$tree/bin/"
if packages=$(bash "$src/docker/runtime-packages.sh" "$tree") && grep -qx libopenmpi3 <<<"$packages"; then
  echo "docker/runtime-packages.sh: $(wc -l <<<"$packages") packages for orted, libopenmpi3 among them"
else
  echo "FAIL: docker/runtime-packages.sh did not find libopenmpi3 for orted: $packages" >&2; status=1
fi
exit $status
