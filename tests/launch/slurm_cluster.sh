# shellcheck shell=bash
# A real single-node Slurm (munged, slurmctld, slurmd) as plain processes,
# everything under one temporary directory. Source it, then:
#   slurm_up DIR [GONE [CPUS]]
#                       start; exports SLURM_CONF; returns when the node is idle.
#                       The node has CPUS CPUs (default: the machine's); more
#                       than the machine has are declared with config_overrides,
#                       so that a job gets CPUS tasks without --overcommit.
#   slurm_down          stop the daemons (safe to call twice, from a trap)
# A watchdog outside the caller's process group stops the daemons and removes
# GONE (default DIR) if the caller dies without running slurm_down (CTest's
# timeout kills with SIGKILL, which no trap sees).
# Facts it relies on: ../shared/OPS.md ("A real single-node Slurm").
# Ports are chosen free at start, and munged gets its own socket, so a
# developer's own Slurm or munge on the machine is left alone. TmpFS, where
# `srun --mpi=pmix` makes each step's directory spmix_appdir_<uid>_<job>.<step>,
# is under DIR too: every test cluster numbers its jobs from 1, and with the
# default /tmp a step 1.0 of a second cluster on the machine (another
# worktree's tests, or a directory left by a killed one) found that directory
# there ("pmixp_mkdir: File exists" in slurmd.log) and srun failed with "task 0
# launch failed: Unspecified error".

# shellcheck source-path=SCRIPTDIR source=../support/slurm_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/slurm_common.sh"

_slurm_pids=()
_slurm_dir=""
_slurm_watchdog=""

_slurm_log() { echo "slurm_cluster: $*" >&2; }

# Prints two free TCP ports on 127.0.0.1.
_slurm_free_ports() {
  python3 - <<'PY'
import socket
socks = []
for _ in range(2):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

slurm_up() {
  local dir=$1 gone=${2:-$1} want_cpus=${3:-}
  _slurm_dir=$dir
  slurm_find_tools _slurm_log || return 1
  mkdir -p "$dir"/{munge,state,spool,log,tmp}
  chmod 1777 "$dir/tmp"
  chmod 755 "$dir"
  slurm_start_munged "$dir" _slurm_log || return 1
  local ports cpus overrides=""
  read -r -a ports < <(_slurm_free_ports)
  cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc obeys OMP_NUM_THREADS
  if [[ -n $want_cpus && $want_cpus != "$cpus" ]]; then
    cpus=$want_cpus
    overrides="SlurmdParameters=config_overrides"  # slurmd takes CPUs= from here, not the hardware
  fi
  {
    cat <<CONF
ClusterName=kolostest
SlurmctldHost=localhost
SlurmctldPort=${ports[0]}
SlurmdPort=${ports[1]}
SlurmdSpoolDir=$dir/spool
SlurmdPidFile=$dir/slurmd.pid
SlurmdLogFile=$dir/log/slurmd.log
CONF
    slurm_conf_common "$dir"
    cat <<CONF
$overrides
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
  } >"$dir/slurm.conf"
  export SLURM_CONF=$dir/slurm.conf
  slurmctld -i -f "$SLURM_CONF" || { _slurm_log "slurmctld did not start"; return 1; }
  _slurm_wait_pidfile "$dir/slurmctld.pid" || { cat "$dir/log/slurmctld.log" >&2; return 1; }
  slurmd -N localhost -f "$SLURM_CONF" || { _slurm_log "slurmd did not start"; return 1; }
  _slurm_wait_pidfile "$dir/slurmd.pid" || { cat "$dir/log/slurmd.log" >&2; return 1; }
  local state=""
  for _ in $(seq 1 100); do
    state=$(sinfo -h -n localhost -o %T 2>/dev/null)
    if [[ $state == idle ]]; then
      _slurm_log "node idle ($cpus CPUs)"
      _slurm_start_watchdog "$gone"
      return 0
    fi
    sleep 0.2
  done
  _slurm_log "node not idle after 20 s (state: '$state')"
  cat "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2
  return 1
}

_slurm_wait_pidfile() {
  for _ in $(seq 1 50); do
    [[ -s $1 ]] && { _slurm_pids+=("$(cat "$1")"); return 0; }
    sleep 0.1
  done
  _slurm_log "no pid file $1 after 5 s"
  return 1
}

_slurm_start_watchdog() {
  local pids=("${_slurm_pids[@]}")
  [[ -s $_slurm_dir/munge/munged.pid ]] && pids+=("$(cat "$_slurm_dir/munge/munged.pid")")
  # shellcheck disable=SC2016  # expanded by the watchdog's shell
  setsid bash -c '
    parent=$1 gone=$2; shift 2
    while kill -0 "$parent" 2>/dev/null; do sleep 1; done
    scancel --quiet --signal=KILL --partition=debug 2>/dev/null
    sleep 2
    timeout 10 scontrol shutdown >/dev/null 2>&1
    sleep 2
    kill -9 "$@" 2>/dev/null
    rm -rf "$gone"
  ' slurm-watchdog $$ "$gone" "${pids[@]}" </dev/null >/dev/null 2>&1 &
  _slurm_watchdog=$!
}

slurm_down() {
  [[ -n $_slurm_dir ]] || return 0
  [[ -n $_slurm_watchdog ]] && kill "$_slurm_watchdog" 2>/dev/null
  if [[ -n ${SLURM_CONF:-} ]]; then
    scancel --quiet --signal=KILL --partition=debug 2>/dev/null
    for _ in $(seq 1 40); do
      [[ -z $(squeue -h -o %i 2>/dev/null) ]] && break
      sleep 0.25
    done
    timeout 10 scontrol shutdown >/dev/null 2>&1
  fi
  local pid
  for pid in "${_slurm_pids[@]}"; do
    timeout 10 tail --pid="$pid" -f /dev/null 2>/dev/null || kill -9 "$pid" 2>/dev/null
  done
  if [[ -s $_slurm_dir/munge/munged.pid ]]; then
    pid=$(cat "$_slurm_dir/munge/munged.pid")
    kill "$pid" 2>/dev/null
    timeout 5 tail --pid="$pid" -f /dev/null 2>/dev/null || kill -9 "$pid" 2>/dev/null
  fi
  _slurm_pids=()
  _slurm_dir=""
  _slurm_watchdog=""
}
