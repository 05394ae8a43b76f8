#!/usr/bin/env bash
# Installs the Debian packages kolos needs to build, test and run.
# Idempotent: prints nothing and touches nothing when all are present.
set -euo pipefail

packages=(
  cmake ninja-build ccache g++ make pkg-config
  libopenblas0-pthread
  # OpenMPI brings UCX (libucx0) for its UCX transport; kolos does not link UCX
  libopenmpi-dev openmpi-bin
  libhdf5-openmpi-dev hdf5-tools
  libboost-program-options-dev libtoml11-dev
  libhwloc-dev  # libkolos_topology (hwloc 2.x through pkg-config)
  nlohmann-json3-dev  # safetensors headers and Hugging Face config.json (ckpt import)
  libcpp-httplib-dev  # kolos serve: the HTTP server (with nlohmann-json for its bodies)
  libpng-dev  # kolos sample: the PNG grid of a diffusion model's images; data prepare --images
  libjpeg-dev  # kolos data prepare --images: JPEG images (libjpeg62-turbo-dev on Debian 12)
  # libkolos_tokenizer: PCRE2 (UTF, JIT) for the tokenizer.json pre-tokenizer
  # regexes (GPT-2's needs lookahead); ICU for its Unicode normalizers (NFC,
  # ...); libsentencepiece for tokenizer.model
  libpcre2-dev libicu-dev libsentencepiece-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-torch python3-h5py python3-numpy
  # scripts/install-venv.sh: the virtual environment with LibTorch 2.x (the
  # torch wheel) and the interop packages, never installed system-wide
  python3-venv
  # fuzz targets (tests/fuzz): clang++ with libFuzzer and the sanitizers
  clang libclang-rt-14-dev
  # launch tests (tests/launch, k8s, spack, docker): a real Slurm, the MPIJob
  # schema check, the Dockerfile lint. kubectl is not here: Debian 12's
  # kubernetes-client is 1.20, whose kustomize predates `patches`; the k8s
  # test says it did not run when no newer kubectl is installed.
  slurm-wlm munge python3-jsonschema python3-yaml shellcheck
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "kolos: installing ${#missing[@]} missing package(s): ${missing[*]}"
sudo=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "kolos: need root or sudo to install packages" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >/dev/null
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "kolos: packages installed"
