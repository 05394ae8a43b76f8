# shellcheck shell=bash
# What the bench/run_*.sh scripts share (sourced): their options, the
# peer's interpreter, the training config they write, the machine line.

# bench_options SCRIPT SPEC "$@"
#
# sets the script's variables from its arguments. SPEC lists the options,
# space-separated:
#   name        --name VALUE sets $name ('_' in the name is '-' in the flag:
#               seq_len is --seq-len)
#   var:flag    --flag VALUE sets $var
#   var:flag=V  --flag, without a value, sets $var to V
#   var:flag+   --flag VALUE appends "--flag VALUE" to the array $var
# -h or --help prints SCRIPT's opening comment (after the #! line) and exits
# 0; an argument SPEC does not list, or an option without its value, exits
# 2 naming it. When SPEC has both steps and warmup, a --warmup that leaves
# no step after it (warmup >= steps) exits 2: the scripts time the steps
# after the warm-up.
bench_options() {
  local _bo_script=$1 _bo_spec=$2 _bo_item _bo_var _bo_flag
  shift 2
  local -A _bo_kind=() _bo_target=() _bo_value=()
  for _bo_item in $_bo_spec; do
    if [[ $_bo_item == *:* ]]; then
      _bo_var=${_bo_item%%:*} _bo_flag=${_bo_item#*:}
    else
      _bo_var=$_bo_item _bo_flag=${_bo_item//_/-}
    fi
    case "$_bo_flag" in
      *=*) _bo_kind[--${_bo_flag%%=*}]=switch _bo_value[--${_bo_flag%%=*}]=${_bo_flag#*=}
           _bo_flag=${_bo_flag%%=*} ;;
      *+) _bo_flag=${_bo_flag%+} _bo_kind[--$_bo_flag]=append ;;
      *) _bo_kind[--$_bo_flag]=value ;;
    esac
    _bo_target[--$_bo_flag]=$_bo_var
  done
  local _bo_name
  _bo_name=$(basename "$_bo_script")
  while [[ $# -gt 0 ]]; do
    if [[ $1 == -h || $1 == --help ]]; then
      sed -n '2,/^[^#]/p' "$_bo_script" | sed '/^[^#]/d; s/^# \{0,1\}//; s/^#$//'
      exit 0
    fi
    case "${_bo_kind[$1]:-}" in
      switch) printf -v "${_bo_target[$1]}" '%s' "${_bo_value[$1]}"; shift; continue ;;
      value | append) ;;
      *) echo "$_bo_name: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    [[ $# -ge 2 ]] || { echo "$_bo_name: $1 needs a value (see --help)" >&2; exit 2; }
    if [[ ${_bo_kind[$1]} == value ]]; then
      printf -v "${_bo_target[$1]}" '%s' "$2"
    else
      local -n _bo_array=${_bo_target[$1]}
      _bo_array+=("$1" "$2")
      unset -n _bo_array
    fi
    shift 2
  done
  if [[ " $_bo_spec " == *" steps "* && " $_bo_spec " == *" warmup "* ]] &&
    (( ${!_bo_target[--warmup]} >= ${!_bo_target[--steps]} )); then
    echo "$_bo_name: --warmup (${!_bo_target[--warmup]}) must be below --steps (${!_bo_target[--steps]})" >&2
    exit 2
  fi
}

# bench_peer NAME PEER MODULE: sets python, the peer's interpreter, and
# install, how to get it: PEER torch2 is the project's environment
# (KOLOS_VENV, default .cache/torch-venv, from $root), system is Debian's
# python3-torch (PYTHON, default /usr/bin/python3). Exits 1 when that
# interpreter cannot import MODULE, 2 for another PEER; NAME is the script's.
bench_peer() {
  case "$2" in
    torch2) python=${KOLOS_VENV:-$root/.cache/torch-venv}/bin/python install="scripts/install-venv.sh" ;;
    system) python=${PYTHON:-/usr/bin/python3} install="apt-get install python3-torch" ;;
    *) echo "$1: --peer is torch2 or system, not '$2'" >&2; exit 2 ;;
  esac
  "$python" -c "import $3" 2>/dev/null ||
    { echo "$1: $python has no working torch ($install)" >&2; exit 1; }
}

# bench_kolos NAME: sets kolos, the built kolos under $build (relative to
# $root unless absolute), and allows OpenMPI as root; exits 1 naming the
# target to build when it is missing. NAME is the script's.
bench_kolos() {
  if [[ $build == /* ]]; then kolos=$build/bin/kolos; else kolos=$root/$build/bin/kolos; fi
  [[ -x $kolos ]] || { echo "$1: $kolos not built (ninja -C $build runtime)" >&2; exit 1; }
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
}

# bench_tmp TAG: sets tmp, a fresh directory kolos-TAG.* removed on exit.
bench_tmp() {
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/kolos-$1.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
}

# bench_train_toml FILE MODEL PARALLEL: writes the training run the
# benchmarks share to FILE: [model] with the lines MODEL, synthetic data,
# AdamW at 3e-3 warmed up over 10 steps to a cosine floor of 3e-4 with
# clipping at 1.0, the caller's global_batch, micro_batch and steps with
# seed 1234, [parallel] with the lines PARALLEL, no progress lines.
# shellcheck disable=SC2154  # global_batch, micro_batch, steps: the caller's
bench_train_toml() {
  cat >"$1" <<TOML
[model]
$2

[data]
kind = "synthetic"

[optim]
lr = 3e-3
min_lr = 3e-4
warmup_steps = 10
grad_clip = 1.0

[train]
global_batch = $global_batch
micro_batch = $micro_batch
steps = $steps
seed = 1234

[parallel]
$3

[log]
progress = "off"
TOML
}

# bench_plain_toml FILE GLOBAL MICRO STEPS: a run with the [model] of
# bench_gpt_model, GLOBAL samples a step in micro-batches of MICRO, STEPS
# steps, AdamW at lr 1e-3 with its other keys at their defaults, synthetic
# data, no progress lines.
bench_plain_toml() {
  {
    echo "[model]"
    bench_gpt_model
    cat <<TOML
[train]
global_batch = $2
micro_batch = $3
steps = $4
[optim]
lr = 1e-3
[log]
progress = "off"
TOML
  } >"$1"
}

# bench_gpt_model: the [model] lines of a GPT from the caller's layers,
# hidden, heads, seq_len and vocab.
# shellcheck disable=SC2154  # layers ... vocab: the caller's
bench_gpt_model() {
  printf 'name = "gpt"\nlayers = %s\nhidden = %s\nheads = %s\nseq_len = %s\nvocab = %s\n' \
    "$layers" "$hidden" "$heads" "$seq_len" "$vocab"
}

# bench_machine: "machine: N CPUs (model), load average A B C at start".
bench_machine() {
  echo "machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), load average $(cut -d' ' -f1-3 /proc/loadavg) at start"
}
