#!/usr/bin/env bash
# Creates (or completes) the Python virtual environment with LibTorch 2.x
# from the PyPI torch wheel. Never touches the system Python.
#
#   scripts/install-venv.sh [build|python]
#
#   build   what `make build` needs: the torch wheel installed
#           with --no-deps, its pure-Python requirements, and the two CUDA
#           runtime wheels that libtorch_cpu.so needs to load
#           (nvidia-cuda-runtime, nvidia-cuda-cupti: libcudart.so.13 and
#           libcupti.so.13, about 70 MB; see cmake/KolosTorch.cmake).
#   python  (default) build, plus a working `import torch` and the
#           interoperability packages: torch's remaining requirements (the
#           CUDA libraries that libtorch_python.so links through
#           libtorch_cuda.so, several GB), safetensors, transformers, h5py,
#           numpy, tokenizers, sentencepiece, scikit-learn (its bundled digits:
#           scripts/digits-to-h5.py), openai (its client drives `kolos serve`
#           in e2e_inference_openai). The interop tests and the
#           Python peers in bench/ use it.
#
# Environment: KOLOS_VENV (default <repo>/.cache/torch-venv; point several
# checkouts at one), KOLOS_PYTHON (the interpreter that creates it; default
# python3, 3.10 or newer). Idempotent: prints nothing when the environment
# already has what was asked for.
set -euo pipefail

level=${1:-python}
[[ $level == build || $level == python ]] || { echo "usage: $0 [build|python]" >&2; exit 2; }

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${KOLOS_VENV:-$root/.cache/torch-venv}
python=${KOLOS_PYTHON:-python3}

# The newest 2.x on PyPI when this was written; change together with the
# docs (docs/building.md) and rerun the suite.
torch_version=2.15.0
# tokenizers: what transformers 5.24 requires (>=0.23.1,<0.24). sentencepiece:
# the 0.1 series, whose encoder matches Debian's libsentencepiece (0.1.97)
# that libkolos_tokenizer links; 0.2.x segments some unigram inputs
# differently (docs/tokenizers.md). 0.1.99's wheels stop at CPython 3.11
# (Debian 12's python3).
interop=(safetensors==0.8.0 transformers==5.24.0 h5py==3.16.0 numpy==2.4.6 tokenizers==0.23.3
  sentencepiece==0.1.99 scikit-learn==1.9.1 openai==3.51.0)

stamp=$venv/.kolos-$level-torch-$torch_version
if [[ $level == python ]]; then
  # The interop list is part of the stamp, so that an environment made from
  # an older list gets the packages added or re-pinned since.
  stamp=$stamp-$(printf '%s\n' "${interop[@]}" | cksum | cut -d' ' -f1)
fi
[[ -f $stamp ]] && exit 0

say() { echo "kolos: venv: $*"; }
pip() { "$venv/bin/python" -m pip --disable-pip-version-check -q "$@"; }
start=$SECONDS

if [[ ! -x $venv/bin/python ]]; then
  say "creating $venv with $($python --version 2>&1)"
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv" || {
    echo "kolos: '$python -m venv' failed; on Debian install python3-venv (scripts/install-deps.sh does)" >&2
    exit 1
  }
fi

site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [[ ! -f $venv/.kolos-build-torch-$torch_version ]]; then
  say "torch $torch_version (--no-deps, CPU libraries for LibTorch)"
  pip install --no-deps "torch==$torch_version"
  # Its requirements without an environment marker are the pure-Python ones
  # (filelock, sympy, ...); the marked ones are the CUDA libraries and triton.
  mapfile -t pure < <("$venv/bin/python" - <<'PY'
import importlib.metadata as m
for r in m.requires("torch") or []:
    if ";" not in r:
        print(r)
PY
)
  # libtorch_cpu.so's DT_NEEDED libcudart.so.13 and libcupti.so.13, at the
  # versions torch's own requirement (cuda-toolkit==X, Linux) pins: the
  # `python` level then finds them installed and replaces nothing, so it can
  # run while a build links against them (the Makefile's test-suite).
  toolkit=$("$venv/bin/python" - <<'PY'
import importlib.metadata as m, re
for r in m.requires("torch") or []:
    hit = re.match(r"cuda-toolkit\[[^\]]*\]\s*==\s*([0-9.]+)\s*;.*Linux", r)
    if hit:
        print(hit.group(1))
PY
)
  [[ -n $toolkit ]] || { echo "kolos: torch $torch_version names no cuda-toolkit for Linux" >&2; exit 1; }
  # --no-warn-conflicts: torch's other CUDA requirements are left out on purpose.
  pip install --no-warn-conflicts "${pure[@]}" "cuda-toolkit[cudart,cupti]==$toolkit"
  touch "$venv/.kolos-build-torch-$torch_version"
fi

if [[ $level == python ]]; then
  say "torch's CUDA runtime libraries (for import torch) and ${interop[*]}"
  # pip completes the requirements of the installed torch; it keeps the wheel.
  pip install "torch==$torch_version" "${interop[@]}"
  "$venv/bin/python" - <<'PY'
import warnings
warnings.filterwarnings("ignore")
import h5py, numpy, openai, safetensors, sentencepiece, tokenizers, torch, transformers
assert torch._C._GLIBCXX_USE_CXX11_ABI, "kolos builds with the C++11 ABI; this torch does not use it"
print(f"kolos: venv: torch {torch.__version__} (C++11 ABI), safetensors {safetensors.__version__}, "
      f"transformers {transformers.__version__}, h5py {h5py.__version__} (HDF5 {h5py.version.hdf5_version}), "
      f"tokenizers {tokenizers.__version__}, sentencepiece {sentencepiece.__version__}, openai {openai.__version__}")
PY
fi
touch "$stamp"
say "ready in $((SECONDS - start)) s: $venv"
