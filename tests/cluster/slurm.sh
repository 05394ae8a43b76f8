# shellcheck shell=bash disable=SC2016,SC2153
# Slurm on the namespace cluster of cluster.sh: munged and slurmctld on
# node0, one slurmd per node (`slurmd -N nodeI` in node I's namespace), so a
# job of `-N 2` runs its tasks on two hosts with their own host names and
# addresses. Source it, then:
#   cslurm_up CLUSTER_STATE DIR   start; exports SLURM_CONF; returns once
#                                 every node is idle. CSLURM_CONF_EXTRA, when
#                                 set, is added to slurm.conf (e.g. a short
#                                 SlurmdTimeout for the node-loss drill)
#   cslurm DIR COMMAND...         a Slurm client command, run on node0
#                                 (slurmctld listens on node0's address)
#   cslurm_down                   stop the daemons (safe to call twice)
# Every daemon runs inside a node's namespace, so `cluster.sh down` ends
# them too. Each slurmd gets its own TmpFS: the same path DIR/tmp, with
# DIR/tmp-nodeI bind-mounted over it in the mount namespace `ip netns exec`
# gives the daemon, because `srun --mpi=pmix` makes
# $TmpFS/spmix_appdir_<uid>_<job>.<step> on every node with a plain mkdir
# (shared, the second node's failed with "File exists"). Facts:
# ../shared/OPS.md ("A real single-node Slurm"); tests/launch/slurm_cluster.sh
# does the same for one node on 127.0.0.1.

# shellcheck source-path=SCRIPTDIR source=../support/slurm_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/slurm_common.sh"

_cslurm_cluster=""
_cslurm_state=""
_cslurm_dir=""

_cslurm_log() { echo "cluster slurm: $*" >&2; }

cslurm() {
  local dir=$1; shift
  "$_cslurm_cluster" exec "$_cslurm_state" node0 env SLURM_CONF="$dir/slurm.conf" "$@"
}

cslurm_up() {
  local state=$1 dir=$2
  _cslurm_cluster=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/cluster.sh
  _cslurm_state=$state
  _cslurm_dir=$dir
  slurm_find_tools _cslurm_log || return 1
  # shellcheck source=/dev/null
  source "$state/cluster.env"
  local nodes=$NODES i
  mkdir -p "$dir"/{munge,state,log,tmp} || return 1
  chmod 755 "$dir"
  for ((i = 0; i < nodes; ++i)); do
    mkdir -p "$dir/spool-node$i" "$dir/tmp-node$i"
    chmod 1777 "$dir/tmp-node$i"
  done
  slurm_start_munged "$dir" _cslurm_log "$_cslurm_cluster" exec "$state" node0 || return 1
  local node_lines="" cpus
  cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
  for ((i = 0; i < nodes; ++i)); do
    node_lines+="NodeName=node$i NodeAddr=10.213.40.$((i + 1)) CPUs=$cpus State=UNKNOWN"$'\n'
  done
  # The ports are the namespaces' own: nothing else listens there.
  {
    cat <<CONF
ClusterName=kolosnodes
SlurmctldHost=node0(10.213.40.1)
SlurmctldPort=6817
SlurmdPort=6818
SlurmdSpoolDir=$dir/spool-%n
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmdLogFile=$dir/log/slurmd-%n.log
CONF
    slurm_conf_common "$dir"
    cat <<CONF
${CSLURM_CONF_EXTRA:+$CSLURM_CONF_EXTRA
}${node_lines}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
  } >"$dir/slurm.conf"
  export SLURM_CONF=$dir/slurm.conf
  "$_cslurm_cluster" exec "$state" node0 slurmctld -i -f "$SLURM_CONF" ||
    { _cslurm_log "slurmctld did not start"; cat "$dir/log/slurmctld.log" >&2; return 1; }
  # slurmd enters the node's network namespace with nsenter, not `ip netns
  # exec`: that mounts a sysfs of its own, without /sys/fs/cgroup, and
  # slurmd 22.05 refuses to start without it ("Unable to initialize cgroup
  # plugin"). Its own mount namespace holds what `ip netns exec` would give
  # (the node's /etc/hosts) and its own TmpFS.
  for ((i = 0; i < nodes; ++i)); do
    nsenter --net="/run/netns/$PREFIX-n$i" unshare --mount --propagation slave --uts bash -c \
      'hostname "$2" && mount --bind "/etc/netns/$3/hosts" /etc/hosts &&
       mount --bind "$1/tmp-$2" "$1/tmp" && exec slurmd -N "$2" -f "$1/slurm.conf"' \
      slurmd "$dir" "node$i" "$PREFIX-n$i" ||
      { _cslurm_log "slurmd on node$i did not start"; cat "$dir/log/slurmd-node$i.log" >&2; return 1; }
  done
  local idle=""
  for _ in $(seq 1 150); do
    idle=$(cslurm "$dir" sinfo -h -o '%T %D' 2>/dev/null)
    if [[ $idle == "idle $nodes" ]]; then
      _cslurm_log "$nodes node(s) idle ($cpus CPUs each)"
      return 0
    fi
    sleep 0.2
  done
  _cslurm_log "nodes not idle after 30 s (sinfo: '$idle')"
  cat "$dir/log/slurmctld.log" "$dir"/log/slurmd-*.log >&2
  return 1
}

cslurm_down() {
  [[ -n $_cslurm_dir ]] || return 0
  local dir=$_cslurm_dir pid f
  cslurm "$dir" scancel --quiet --signal=KILL --partition=debug 2>/dev/null
  for _ in $(seq 1 40); do
    [[ -z $(cslurm "$dir" squeue -h -o %i 2>/dev/null) ]] && break
    sleep 0.25
  done
  timeout 10 "$_cslurm_cluster" exec "$_cslurm_state" node0 env SLURM_CONF="$dir/slurm.conf" \
    scontrol shutdown >/dev/null 2>&1
  for f in "$dir"/slurmctld.pid "$dir"/slurmd-*.pid "$dir"/munge/munged.pid; do
    [[ -s $f ]] || continue
    pid=$(cat "$f")
    [[ $f == */munged.pid ]] && kill "$pid" 2>/dev/null
    timeout 10 tail --pid="$pid" -f /dev/null 2>/dev/null || kill -9 "$pid" 2>/dev/null
  done
  _cslurm_dir=""
}
