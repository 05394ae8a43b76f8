#!/usr/bin/env bash
# Prints the Debian packages that hold the shared libraries the given
# executables and libraries load (ldd), one per line, sorted: what a runtime
# image must install next to the copied install tree. Libraries inside the
# tree itself are skipped. Usage: runtime-packages.sh PREFIX
set -euo pipefail
prefix=$(realpath "$1")
mapfile -t files < <(find "$prefix" -type f \( -perm -u+x -o -name '*.so*' \) -print)
declare -A packages=()
for f in "${files[@]}"; do
  file -b "$f" | grep -q ELF || continue
  while read -r lib; do
    [[ -n $lib ]] || continue
    real=$(realpath "$lib")
    [[ $real == "$prefix"/* ]] && continue
    # bookworm's merged /usr: dpkg may record either path.
    pkg=""
    for candidate in "$lib" "$real" "/usr$lib" "/usr$real" "${real#/usr}"; do
      pkg=$(dpkg-query -S "$candidate" 2>/dev/null | head -n 1 | cut -d: -f1) && [[ -n $pkg ]] && break
    done
    if [[ -z $pkg ]]; then
      echo "runtime-packages.sh: no package holds $lib (needed by $f)" >&2
      exit 1
    fi
    packages[$pkg]=1
  done < <(ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')
done
printf '%s\n' "${!packages[@]}" | sort
