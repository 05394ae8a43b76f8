# shellcheck shell=bash
# What the two test Slurms share: tests/launch/slurm_cluster.sh (one node
# on 127.0.0.1, plain processes) and tests/cluster/slurm.sh (one node per
# network namespace). Source it, then:
#   slurm_find_tools LOG         munged, slurmctld, slurmd and sbatch on PATH
#                                (adds /usr/sbin); LOG FUNCTION reports
#                                what is missing
#   slurm_start_munged DIR LOG [RUN...]
#                                munged as user munge with its own socket,
#                                pid, log and seed files under DIR/munge,
#                                started through RUN (e.g. a namespace's exec)
#   slurm_conf_common DIR        the slurm.conf lines both write: munge
#                                authentication on that socket, PMIx, no
#                                cgroups or accounting, a 2 s backfill,
#                                requeue, state, TmpFS and logs under DIR
#   slurm_test_in WORK DOWN      a test script's working directory: cd into
#                                WORK; on exit run DOWN (the Slurm's stop)
#                                and remove WORK, keeping the exit status
# Facts they rely on: ../shared/OPS.md ("A real single-node Slurm").

slurm_find_tools() {
  local log=$1 tool
  for tool in munged slurmctld slurmd sbatch; do
    command -v "$tool" >/dev/null || PATH=$PATH:/usr/sbin
    command -v "$tool" >/dev/null || {
      "$log" "$tool not found: install slurm-wlm and munge (scripts/install-deps.sh)"
      return 1
    }
  done
}

slurm_start_munged() {
  local dir=$1 log=$2; shift 2
  runuser -u munge -- test -x "$dir" || {
    "$log" "user munge cannot reach $dir (make its parent directories searchable)"
    return 1
  }
  # munged wants its socket directory searchable by all.
  chown munge:munge "$dir/munge" && chmod 755 "$dir/munge" || return 1
  "$@" runuser -u munge -- munged --key-file=/etc/munge/munge.key \
    --socket="$dir/munge/munge.socket" --pid-file="$dir/munge/munged.pid" \
    --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed" ||
    { "$log" "munged did not start"; cat "$dir/munge/munged.log" >&2; return 1; }
}

slurm_conf_common() {
  local dir=$1
  cat <<CONF
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=5
MpiDefault=pmix
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
ReturnToService=2
JobRequeue=1
StateSaveLocation=$dir/state
TmpFS=$dir/tmp
SlurmctldPidFile=$dir/slurmctld.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmctldDebug=info
SlurmdDebug=info
CONF
}

slurm_test_in() {
  _slurm_test_work=$1
  _slurm_test_down=$2
  trap _slurm_test_cleanup EXIT
  trap 'exit 130' INT TERM
  cd "$1" || exit 1
}

_slurm_test_cleanup() {
  local rc=$?
  "$_slurm_test_down"
  rm -rf "$_slurm_test_work"
  exit $rc
}
