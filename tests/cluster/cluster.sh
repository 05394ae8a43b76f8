#!/usr/bin/env bash
# A test cluster on one Linux machine: N "nodes", each a network namespace
# with a hostname of its own (a UTS namespace made for every command run on
# it), one veth into a bridge, one address each; every node's link into the
# bridge is shaped with tbf to RATE, so traffic between nodes is limited
# while ranks on one node talk through shared memory (Open MPI's vader).
#
#   cluster.sh up STATE [--nodes N] [--rate RATE] [--prefix P] [--owner PID]
#       build it; STATE (a new directory) holds its description, the
#       hostfile and the rsh agent. A watchdog outside the caller's process
#       group tears it down once PID (default: the caller's parent) is gone.
#       A failure half-way tears down what was built.
#   cluster.sh down STATE       kill every process on the nodes, delete the
#                               namespaces and files; safe to repeat
#   cluster.sh exec STATE NODE CMD...    run CMD on node NODE (node0, node1, ...)
#   cluster.sh mpirun STATE ARGS...      Open MPI's mpirun on node0 with the
#                               cluster's hostfile and rsh agent (it reaches
#                               node1... through `ip netns exec`)
#   cluster.sh leftovers PREFIX exit 1, listing them, if anything of a
#                               cluster named PREFIX is left
#   cluster.sh sweep PREFIX     remove whatever a killed run of PREFIX left
#
# Layout (PREFIX defaults to kc<pid>; at most 8 characters):
#   namespace PREFIX-sw   the switch: bridge br0 and the veth ends n0, n1, ...
#   namespace PREFIX-nI   node I: lo, eth0 = 10.213.40.(I+1)/24, hostname nodeI,
#                         tbf on eth0's egress; /etc/netns/PREFIX-nI/hosts
#                         (ip netns exec mounts it over /etc/hosts) names
#                         every node
# Nothing is configured in the caller's own network namespace: all traffic
# stays between the namespaces made here. Needs root, iproute2 (ip, tc),
# unshare (util-linux) and a kernel with veth, bridge and sch_tbf.
# shellcheck disable=SC2016  # single-quoted scripts expand in their own shell
# shellcheck disable=SC2153  # PREFIX, NODES, STATE come from STATE/cluster.env
set -uo pipefail

kSubnet=10.213.40
kHere=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

log() { echo "cluster: $*" >&2; }
die() { log "$*"; exit 1; }

# The namespaces, /etc/netns entries and processes of PREFIX.
namespaces_of() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$1-(sw|n[0-9]+)\$"; }

sweep() {
  local prefix=$1 ns pid
  for ns in $(namespaces_of "$prefix"); do
    # Every process whose network namespace is this one (mpirun, orted, ranks).
    for _ in 1 2 3; do
      pids=$(ip netns pids "$ns" 2>/dev/null)
      [[ -z $pids ]] && break
      # shellcheck disable=SC2086
      kill -9 $pids 2>/dev/null
      sleep 0.2
    done
    ip netns delete "$ns" 2>/dev/null || log "could not delete namespace $ns"
    rm -rf "/etc/netns/$ns"
  done
  rmdir /etc/netns 2>/dev/null  # only when nothing else of anyone's is there
  for pid in $(pgrep -f "kolos-cluster-watchdog $prefix " 2>/dev/null); do
    [[ $pid != "$$" && $pid != "$PPID" ]] && kill "$pid" 2>/dev/null
  done
  return 0
}

leftovers() {
  local prefix=$1 found=0 ns
  for ns in $(namespaces_of "$prefix"); do
    log "left behind: namespace $ns (pids: $(ip netns pids "$ns" | tr '\n' ' '))"
    found=1
  done
  for ns in /etc/netns/"$prefix"-*; do
    [[ -e $ns ]] && { log "left behind: $ns"; found=1; }
  done
  if pgrep -f "kolos-cluster-watchdog $prefix " >/dev/null; then
    log "left behind: a watchdog of $prefix"
    found=1
  fi
  return $found
}

# STATE/cluster.env: PREFIX, NODES, RATE, STATE.
load() {
  local state=$1
  [[ -f $state/cluster.env ]] || die "$state is not a cluster (no cluster.env)"
  # shellcheck source=/dev/null
  source "$state/cluster.env"
}

up() {
  local state=$1; shift
  local nodes=2 rate=1gbit prefix="kc$$" owner=$PPID
  while (($#)); do
    case $1 in
      --nodes) nodes=$2; shift 2 ;;
      --rate) rate=$2; shift 2 ;;
      --prefix) prefix=$2; shift 2 ;;
      --owner) owner=$2; shift 2 ;;
      *) die "up: unknown option $1" ;;
    esac
  done
  [[ $(id -u) == 0 ]] || die "needs root (network namespaces); run the cluster tests as root"
  local tool
  for tool in ip tc unshare; do
    command -v "$tool" >/dev/null || PATH=$PATH:/usr/sbin:/sbin
    command -v "$tool" >/dev/null || die "$tool not found (iproute2, util-linux)"
  done
  if ! [[ $nodes =~ ^[0-9]+$ ]] || ((nodes < 1 || nodes > 16)); then
    die "--nodes $nodes: 1 to 16"
  fi
  ((${#prefix} <= 8)) || die "--prefix $prefix: at most 8 characters"
  [[ -e $state ]] && die "$state exists"
  sweep "$prefix"  # what a killed run of the same prefix left
  mkdir -p "$state/tmp" || die "cannot make $state"
  state=$(cd "$state" && pwd)
  cat >"$state/cluster.env" <<ENV
PREFIX=$prefix
NODES=$nodes
RATE=$rate
STATE=$state
ENV
  # From here on a failure removes what was built.
  trap 'log "set-up failed; tearing down"; sweep "$prefix"; rm -rf "$state"; exit 1' ERR
  set -E
  local sw=$prefix-sw i ns
  ip netns add "$sw"
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  : >"$state/hostfile"
  for ((i = 0; i < nodes; ++i)); do
    ns=$prefix-n$i
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$ns" link add eth0 type veth peer name "n$i" netns "$sw"
    ip -n "$ns" addr add "$kSubnet.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$sw" link set "n$i" master br0
    ip -n "$sw" link set "n$i" up
    # The shaped link: everything a node sends to another passes this tbf.
    # The burst (1 MiB) holds the 64 KiB segments veth passes with GSO.
    tc -n "$ns" qdisc add dev eth0 root tbf rate "$rate" burst 1mb latency 100ms
    echo "node$i slots=2" >>"$state/hostfile"
  done
  for ((i = 0; i < nodes; ++i)); do
    mkdir -p "/etc/netns/$prefix-n$i"
    {
      echo "127.0.0.1 localhost"
      for ((j = 0; j < nodes; ++j)); do echo "$kSubnet.$((j + 1)) node$j"; done
    } >"/etc/netns/$prefix-n$i/hosts"
  done
  # Open MPI's rsh agent: `agent HOST COMMAND...` as ssh would run it.
  cat >"$state/rsh-agent" <<AGENT
#!/bin/bash
# mpirun's plm_rsh_agent for this cluster: HOST is nodeI, run the rest (shell
# words, as ssh would pass them) in node I's namespace with its hostname.
host=\$1; shift
[[ \$host =~ ^node([0-9]+)\$ ]] || { echo "rsh-agent: unknown host \$host" >&2; exit 255; }
exec "$kHere/cluster.sh" exec "$state" "\$host" bash -c "\$*"
AGENT
  chmod 755 "$state/rsh-agent"
  trap - ERR
  set +E
  # The watchdog: once the owner is gone, tear down (a trap cannot run after
  # SIGKILL, which is how CTest ends a test past its timeout).
  setsid bash -c '
    prefix=$1 owner=$2 state=$3 script=$4
    while kill -0 "$owner" 2>/dev/null; do sleep 1; done
    "$script" down "$state" >/dev/null 2>&1
  ' "kolos-cluster-watchdog $prefix " "$prefix" "$owner" "$state" "$kHere/cluster.sh" \
    </dev/null >/dev/null 2>&1 &
  echo "WATCHDOG=$!" >>"$state/cluster.env"
  log "up: $nodes node(s) (${prefix}-n0..), link $rate, state $state, owner pid $owner"
}

down() {
  local state=$1
  [[ -f $state/cluster.env ]] || return 0
  load "$state"
  [[ -n ${WATCHDOG:-} && $WATCHDOG != "$PPID" ]] && kill "$WATCHDOG" 2>/dev/null
  sweep "$PREFIX"
  rm -rf "$STATE"
  log "down: $PREFIX"
}

node_exec() {
  local state=$1 node=$2; shift 2
  load "$state"
  if ! [[ $node =~ ^node([0-9]+)$ ]] || ((BASH_REMATCH[1] >= NODES)); then
    die "no node $node in $PREFIX"
  fi
  # A UTS namespace per command, named like the node: gethostname() there is
  # the node's name, which is what MPI and kolos take for "the node".
  exec ip netns exec "$PREFIX-n${BASH_REMATCH[1]}" unshare --uts \
    bash -c 'hostname "$1" && shift && exec "$@"' cluster-exec "$node" "$@"
}

cluster_mpirun() {
  local state=$1; shift
  load "$state"
  # Session directories under STATE (removed with it); TCP only on the
  # cluster's subnet (ranks on one node use vader, shared memory).
  export OMPI_MCA_plm_rsh_agent=$STATE/rsh-agent
  export OMPI_MCA_orte_tmpdir_base=$STATE/tmp
  export OMPI_MCA_oob_tcp_if_include=$kSubnet.0/24
  export OMPI_MCA_btl_tcp_if_include=$kSubnet.0/24
  export OMPI_MCA_pml=ob1
  export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader,tcp}
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  node_exec "$state" node0 mpirun --hostfile "$STATE/hostfile" "$@"
}

cmd=${1:-}
shift || true
case $cmd in
  up) up "$@" ;;
  down) down "$@" ;;
  exec) node_exec "$@" ;;
  mpirun) cluster_mpirun "$@" ;;
  leftovers) leftovers "$@" ;;
  sweep) sweep "$@" ;;
  *) die "usage: cluster.sh up|down|exec|mpirun|leftovers|sweep ..." ;;
esac
