# Shared by the e2e case scripts (source it): a fresh working directory
# removed on exit, OpenMPI allowed as root, the failure checks and the
# project's Python environment (use_venv).

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

fail() { echo "FAIL: $*" >&2; exit 1; }

# use_venv MODULE...: sets PY to the Python of the project's virtual
# environment ($KOLOS_VENV, made by scripts/install-venv.sh); fails unless
# it imports every MODULE.
use_venv() {
  local modules
  modules=$(printf '%s, ' "$@")
  modules=${modules%, }
  PY=${KOLOS_VENV:-}/bin/python
  "$PY" -c "import $modules" 2>/dev/null ||
    fail "no usable Python environment at '${KOLOS_VENV:-}' ($modules): run scripts/install-venv.sh (make test does)"
}

# expect_failure REGEX -- CMD...: CMD must fail cleanly: a non-zero exit, no
# signal or crash, no hang (it runs under `timeout`), and REGEX on stderr
# (matched against stderr joined into one line: messages may span lines).
expect_failure() {
  local regex=$1; shift; [[ $1 == -- ]] && shift
  timeout 120 "$@" >out.txt 2>err.txt
  local rc=$?
  cat out.txt err.txt
  [[ $rc -ne 124 ]] || fail "timed out (hang): $*"
  [[ $rc -ne 0 ]] || fail "exit code 0, expected a failure: $*"
  [[ $rc -lt 128 ]] || fail "killed by a signal (exit $rc): $*"
  ! grep -qi "core dumped\|segmentation fault\|terminate called" err.txt || fail "crashed: $*"
  tr '\n' ' ' <err.txt | grep -Eq -- "$regex" || fail "stderr does not match /$regex/: $*"
  echo "ok: exit $rc, message matches /$regex/"
}

# wait_for_lines FILE N [TRIES]: waits (0.1 s a try, 600 tries unless
# given) until FILE has at least N lines, such as a run's metrics after N
# steps; fails (returns 1) when it does not get there.
wait_for_lines() {
  local file=$1 n=$2 tries=${3:-600}
  for _ in $(seq 1 "$tries"); do
    [[ -s $file && $(wc -l <"$file") -ge $n ]] && return 0
    sleep 0.1
  done
  return 1
}

# tiny_gpt_model: the [model] table of the 2-layer GPT the e2e cases train,
# the harness's tiny_gpt_config (tests/support/tiny_gpt.toml).
tiny_gpt_model() { cat "$(dirname "${BASH_SOURCE[0]}")/../support/tiny_gpt.toml"; }
