#!/usr/bin/env bash
# Slurm launch tests: a real single-node Slurm (slurm_cluster.sh) runs the
# sbatch template (launchers/slurm/kolos.sbatch) and scripts written by
# `kolos slurm gen`. One case per CTest test:
#   slurm_test.sh CASE      (environment: KOLOS, KOLOS_SOURCE_DIR)
# Every job is waited for under a timeout; the daemons are stopped and the
# temporary directory removed on any exit (trap), pass or fail.
set -uo pipefail
case_name=$1
here=$(cd "$(dirname "$0")" && pwd)
src=${KOLOS_SOURCE_DIR:-$(cd "$here/../.." && pwd)}
template=$src/launchers/slurm/kolos.sbatch
tiny=$src/examples/gpt-tiny.toml
work=$(mktemp -d /tmp/kolos-slurm-test.XXXXXX)
chmod 755 "$work"  # munged runs as user munge and needs to reach its directory
# shellcheck source-path=SCRIPTDIR source=slurm_cluster.sh
source "$here/slurm_cluster.sh"
slurm_test_in "$work" slurm_down

fail() {
  echo "FAIL: $*" >&2
  for f in "$work"/*.out; do [[ -f $f ]] && { echo "--- $f" >&2; cat "$f" >&2; }; done
  exit 1
}

# job_field JOBID FIELD: one field of `scontrol show job`.
job_field() { scontrol show job -o "$1" 2>/dev/null | grep -o "\b$2=[^ ]*" | cut -d= -f2-; }

# wait_job JOBID SECONDS: waits until the job has finished (polling faster
# than `sbatch --wait`); prints its final state.
wait_job() {
  local state=""
  for _ in $(seq 1 $(($2 * 4))); do
    state=$(job_field "$1" JobState)
    case $state in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | PREEMPTED | BOOT_FAIL | DEADLINE)
        echo "$state"; return 0 ;;
    esac
    sleep 0.25
  done
  scontrol show job "$1" >&2
  fail "job $1 not finished after $2 s (state ${state:-unknown})"
}

# wait_metrics FILE LINES SECONDS: until the metrics file has LINES lines.
wait_metrics() {
  for _ in $(seq 1 $(($3 * 10))); do
    [[ -f $1 && $(wc -l <"$1") -ge $2 ]] && return 0
    sleep 0.1
  done
  fail "$1 has not $2 lines after $3 s"
}

# check_trained OUTPUT METRICS STEPS: the run finished STEPS steps, its
# loss fell, and the metrics file has one row per step.
check_trained() {
  grep -q "kolos: done: $3 steps" "$1" || fail "no 'kolos: done: $3 steps' in $1"
  [[ $(wc -l <"$2") -eq $3 ]] || fail "$2 has $(wc -l <"$2") rows, expected $3"
  python3 - "$2" "$3" <<'PY' || fail "the metrics in $2 do not show training"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows] == list(range(1, int(sys.argv[2]) + 1)), "steps"
first, last = rows[0]["loss"], rows[-1]["loss"]
print(f"loss {first:.3f} -> {last:.3f} over {len(rows)} steps")
assert last < first - 0.5, "loss did not fall"
PY
}

# submit_and_stop: submits job.sbatch (its id in $jid) and, once it trains
# (3 rows in m.jsonl), sends its batch shell SIGUSR1: the stop request that
# --signal=B:USR1@N sends before the time limit.
submit_and_stop() {
  jid=$(submit job.sbatch)
  wait_metrics m.jsonl 3 60
  scancel --batch --signal=USR1 "$jid" || fail "scancel --signal=USR1"
}

# check_dp_job OUTPUT RANKS METRICS STEPS: the job ran RANKS data-parallel
# ranks and trained (check_trained).
check_dp_job() {
  grep -q "$2 ranks" "$1" || fail "the job did not run $2 ranks"
  grep -q "mesh pp=1 dp=$2" "$1" || fail "no dp=$2 mesh in $1"
  check_trained "$1" "$3" "$4"
}

# submit SBATCH-ARGS...: prints the job id.
submit() { sbatch --parsable "$@" || fail "sbatch $* refused the job"; }

# start_slurm [CPUS]: the node's CPUs (default: the machine's).
start_slurm() { slurm_up "$work/slurm" "$work" "${1:-}" || fail "could not start Slurm"; }

case "$case_name" in
  gen_2_tasks)
    # `kolos slurm gen` writes the script; sbatch --wait runs it to the end.
    start_slurm
    "$KOLOS" slurm gen "$tiny" --tasks-per-node 2 --job-name tiny --set train.steps=40 \
      --set "log.metrics=$work/m.jsonl" -o job.sbatch || fail "kolos slurm gen"
    jid=$(timeout 120 sbatch --parsable --wait job.sbatch)
    rc=$?
    [[ $rc -ne 124 ]] || fail "the job did not finish within 120 s"
    [[ $rc -eq 0 ]] || fail "sbatch --wait: exit $rc"
    [[ $(job_field "$jid" ExitCode) == 0:0 ]] || fail "job exit code $(job_field "$jid" ExitCode)"
    check_dp_job "kolos-tiny-$jid.out" 2 m.jsonl 40
    ;;
  template_4_tasks_overcommit)
    # The template itself, 4 ranks on 2 CPUs, options on the sbatch command line.
    start_slurm
    export KOLOS
    jid=$(submit --ntasks=4 --overcommit --job-name=four "$template" "$tiny" --set parallel.data=4 --set train.micro_batch=4 \
      --set train.steps=30 --set "log.metrics=$work/m.jsonl")
    state=$(wait_job "$jid" 120)
    [[ $state == COMPLETED && $(job_field "$jid" ExitCode) == 0:0 ]] ||
      fail "job $jid: $state, exit $(job_field "$jid" ExitCode)"
    check_dp_job "kolos-four-$jid.out" 4 m.jsonl 30
    ;;
  stop_not_requeued)
    # SIGUSR1 to the batch shell (what --signal=B:USR1@N sends before the
    # time limit): every rank stops at one step boundary, kolos exits 3, and
    # without a checkpoint to resume from the job is not requeued.
    start_slurm
    "$KOLOS" slurm gen "$tiny" --job-name stop --set train.steps=1000000 --set log.progress=off \
      --set "log.metrics=$work/m.jsonl" -o job.sbatch || fail "kolos slurm gen"
    submit_and_stop
    state=$(wait_job "$jid" 60)
    out=kolos-stop-$jid.out
    cat "$out"
    [[ $(job_field "$jid" ExitCode) == 3:0 ]] || fail "job exit code $(job_field "$jid" ExitCode), expected 3:0"
    [[ $(job_field "$jid" Restarts) == 0 ]] || fail "the job was requeued"
    grep -q "got SIGUSR1" "$out" || fail "the batch script did not see SIGUSR1"
    steps=$(wc -l <m.jsonl)
    grep -q "stopped on request after step $steps of" "$out" || fail "no stop message at step $steps"
    grep -q "not requeued: no checkpoint to resume from" "$out" || fail "no 'not requeued' reason"
    echo "stopped after step $steps, state $state, exit 3, not requeued"
    ;;
  stop_requeue)
    # As stop_not_requeued, with KOLOS_REQUEUE=always: the job is requeued,
    # runs again (SLURM_RESTART_COUNT=1, output appended), is stopped again
    # and then, at KOLOS_MAX_REQUEUES=1, left stopped with exit code 3.
    start_slurm
    "$KOLOS" slurm gen "$tiny" --job-name requeue --requeue always --max-requeues 1 \
      --set train.steps=1000000 --set log.progress=off --set "log.metrics=$work/m.jsonl" \
      -o job.sbatch || fail "kolos slurm gen"
    submit_and_stop
    for _ in $(seq 1 240); do
      [[ $(job_field "$jid" Restarts) == 1 && $(job_field "$jid" JobState) == RUNNING ]] && break
      sleep 0.25
    done
    [[ $(job_field "$jid" Restarts) == 1 ]] || fail "the job was not requeued"
    # Signal the requeued run once its ranks are up (the engine line printed).
    for _ in $(seq 1 600); do
      [[ $(grep -c "^kolos: gpt" kolos-requeue-"$jid".out) -ge 2 ]] && break
      sleep 0.1
    done
    grep -q "job $jid run 2" kolos-requeue-"$jid".out || fail "the requeued run did not start"
    scancel --batch --signal=USR1 "$jid" || fail "second scancel --signal=USR1"
    state=$(wait_job "$jid" 60)
    out=kolos-requeue-$jid.out
    cat "$out"
    [[ $(job_field "$jid" ExitCode) == 3:0 ]] || fail "job exit code $(job_field "$jid" ExitCode), expected 3:0"
    [[ $(grep -c "stopped on request after step" "$out") -eq 2 ]] || fail "expected two stops in $out"
    grep -q "requeueing job $jid" "$out" || fail "no requeue in $out"
    grep -q "not requeued: already restarted 1 times" "$out" || fail "the requeue limit was not applied"
    echo "requeued once, stopped twice, final state $state, exit 3"
    ;;
  stop_resume)
    # The whole story: a stop request before the time limit, a checkpoint,
    # the requeue (KOLOS_REQUEUE=auto: a checkpoint exists), and the requeued
    # run resuming from `latest` and finishing the run.
    "$KOLOS" train --help | grep -q -- "--resume" ||
      fail "kolos train has no --resume: the resume half of the requeue story cannot run"
    start_slurm
    steps=200
    "$KOLOS" slurm gen "$tiny" --job-name resume --checkpoint-dir ckpt --set train.steps=$steps \
      --set log.progress=off --set "log.metrics=$work/m.jsonl" -o job.sbatch || fail "kolos slurm gen"
    submit_and_stop
    state=$(wait_job "$jid" 120)
    out=kolos-resume-$jid.out
    cat "$out"
    [[ $state == COMPLETED && $(job_field "$jid" ExitCode) == 0:0 ]] ||
      fail "job $jid: $state, exit $(job_field "$jid" ExitCode), expected COMPLETED 0:0"
    [[ $(job_field "$jid" Restarts) == 1 ]] || fail "restarts: $(job_field "$jid" Restarts), expected 1"
    stop=$(sed -nE 's/^kolos: stopped on request after step ([0-9]+) of.*/\1/p' "$out")
    [[ -n $stop ]] || fail "the first run did not stop on request"
    [[ -e ckpt/latest ]] || fail "no checkpoint (ckpt/latest)"
    grep -q "requeueing job $jid (checkpoint: yes)" "$out" || fail "not requeued with a checkpoint"
    grep -q "resuming from $work/ckpt/latest" "$out" || fail "the requeued run was not given --resume"
    grep -q "resumed from .* at step $stop" "$out" || fail "kolos did not resume at step $stop"
    grep -q "kolos: done: " "$out" || fail "the resumed run did not finish"
    python3 - m.jsonl "$stop" "$steps" <<'PY' || fail "the metrics do not continue from step $stop to $steps"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
stop, steps = int(sys.argv[2]), int(sys.argv[3])
got = [r["step"] for r in rows]
# The resumed run writes steps stop+1..steps (after 1..stop when it appends).
assert got in (list(range(stop + 1, steps + 1)), list(range(1, steps + 1))), got[:3] + got[-3:]
print(f"stopped at step {stop}, resumed, finished step {got[-1]}; loss {rows[-1]['loss']:.3f}")
assert rows[-1]["loss"] < 3.5, "the resumed run did not keep training"
PY
    ;;
  requeue_fewer_tasks | requeuehold_fewer_tasks)
    # A requeued job that comes back with fewer tasks: a `kolos slurm gen`
    # script runs 4 ranks (4 CPUs, no --overcommit) and is requeued after a
    # checkpoint, either
    #   requeue_fewer_tasks: by itself (SIGUSR1, the stop before the time
    #     limit: checkpoint, exit 3, `scontrol requeue` in the script), or
    #   requeuehold_fewer_tasks: by `scontrol requeuehold` (SIGTERM:
    #     checkpoint, exit 3, Slurm requeues it held);
    # while it is pending it is changed to 2 tasks on 2 CPUs. The next run
    # must take its rank count from that allocation (SLURM_NTASKS still says
    # 4), resume from `latest` at 2 ranks and finish with the losses of an
    # uninterrupted 2-rank run.
    { cat "$src/tests/support/tiny_gpt.toml"; cat <<'TOML'
[data]
kind = "synthetic"
[optim]
lr = 3e-3
warmup_steps = 3
[train]
global_batch = 16
micro_batch = 4
seed = 7
[log]
progress = "off"
[parallel]
data = 0  # derived from the rank count: the job changes size
TOML
    } >run.toml
    # Long enough that the stop lands well before the end on any machine:
    # about 10 s of 2-rank training, sized from 200 steps of it here (1000
    # steps took 20 s at 4 ranks on one 2-core machine, 4.4 s on another,
    # where Slurm's requeue came after the end).
    timeout 60 "$KOLOS" run -n 2 run.toml --set train.steps=200 >probe.txt 2>&1 ||
      { cat probe.txt; fail "the 200-step probe failed"; }
    probe_s=$(sed -n 's/.*done: 200 steps in \([0-9.]*\) s.*/\1/p' probe.txt)
    steps=$(python3 -c "print(max(1000, min(20000, int(2000 / max(float('${probe_s:-1}'), 0.1)))))")
    echo "probe: 200 steps in ${probe_s:-?} s at 2 ranks; the job runs $steps steps"
    timeout 300 "$KOLOS" run -n 2 run.toml --set train.steps=$steps --set log.metrics=straight.jsonl \
      >straight.txt 2>&1 || { cat straight.txt; fail "the uninterrupted 2-rank run failed"; }
    start_slurm 4
    "$KOLOS" slurm gen run.toml --tasks-per-node 4 --job-name shrink --checkpoint-dir ckpt \
      --set train.steps=$steps --set "log.metrics=$work/m.jsonl" -o job.sbatch || fail "kolos slurm gen"
    jid=$(submit job.sbatch)
    out=kolos-shrink-$jid.out
    wait_metrics m.jsonl 20 60
    if [[ $case_name == requeue_fewer_tasks ]]; then
      # Nothing starts while the partition is down, so the requeued job stays
      # pending until it has been changed (a requeued job waits only
      # cred_expire, 5 s, before it may start again).
      scontrol update PartitionName=debug State=DOWN || fail "scontrol update PartitionName=debug State=DOWN"
      scancel --batch --signal=USR1 "$jid" || fail "scancel --signal=USR1"
    else
      scontrol requeuehold "$jid" || fail "scontrol requeuehold $jid"
    fi
    for _ in $(seq 1 240); do
      [[ $(job_field "$jid" Restarts) == 1 && $(job_field "$jid" JobState) == PENDING ]] && break
      sleep 0.25
    done
    [[ $(job_field "$jid" Restarts) == 1 && $(job_field "$jid" JobState) == PENDING ]] ||
      fail "job $jid was not requeued: $(job_field "$jid" JobState), restarts $(job_field "$jid" Restarts)"
    scontrol update JobId="$jid" NumTasks=2 NumCPUs=2 || fail "scontrol update JobId=$jid NumTasks=2 NumCPUs=2"
    [[ $(job_field "$jid" NumTasks) == 2 && $(job_field "$jid" NumCPUs) == 2 ]] ||
      fail "job $jid was not changed: NumTasks=$(job_field "$jid" NumTasks) NumCPUs=$(job_field "$jid" NumCPUs)"
    if [[ $case_name == requeue_fewer_tasks ]]; then
      scontrol update PartitionName=debug State=UP || fail "scontrol update PartitionName=debug State=UP"
    else
      scontrol release "$jid" || fail "scontrol release $jid"
    fi
    state=$(wait_job "$jid" 120)
    cat "$out"
    [[ $state == COMPLETED && $(job_field "$jid" ExitCode) == 0:0 ]] ||
      fail "job $jid: $state, exit $(job_field "$jid" ExitCode), expected COMPLETED 0:0"
    [[ $(job_field "$jid" Restarts) == 1 ]] || fail "restarts: $(job_field "$jid" Restarts), expected 1"
    sed -n "1,/job $jid run 2:/p" "$out" >run1.txt
    sed -n "/job $jid run 2:/,\$p" "$out" >run2.txt
    grep -q "job $jid run 1: 1 node(s), 4 ranks" run1.txt || fail "the first run did not have 4 ranks"
    grep -q "mesh pp=1 dp=4" run1.txt || fail "no dp=4 mesh in the first run"
    stop=$(sed -nE 's/^kolos: stopped on request after step ([0-9]+) of.*/\1/p' run1.txt)
    [[ -n $stop ]] || fail "the first run did not stop on request"
    [[ -e ckpt/step-$(printf %08d "$stop") ]] || fail "no checkpoint of step $stop"
    if [[ $case_name == requeue_fewer_tasks ]]; then
      grep -q "requeueing job $jid (checkpoint: yes)" run1.txt || fail "the script did not requeue the job"
    else
      grep -q "not requeued: the job was terminated" run1.txt || fail "the script did not leave the requeue to Slurm"
    fi
    grep -q "job $jid run 2: 1 node(s), 2 ranks" run2.txt || fail "the requeued run did not have 2 ranks"
    grep -q "submitted with 4 tasks and this run's allocation has 2" run2.txt ||
      fail "the requeued run did not say that its allocation has 2 tasks"
    grep -q "resuming from $work/ckpt/latest" run2.txt || fail "the requeued run was not given --resume"
    grep -q "resumed from .* at step $stop" run2.txt || fail "kolos did not resume at step $stop"
    grep -q "mesh pp=1 dp=2" run2.txt || fail "no dp=2 mesh in the requeued run"
    grep -q "kolos: done: " run2.txt || fail "the requeued run did not finish"
    # As e2e_checkpoint_restart_smaller: the losses after the restart are
    # those of the uninterrupted 2-rank run, up to the order of sums, over
    # the first 200 steps after it (further on, on a loss near 0.1 after
    # a few thousand steps, the different order of sums grows past 1e-4
    # as in any two runs that reduce in different orders).
    python3 - straight.jsonl m.jsonl "$stop" "$steps" <<'PY' ||
import json, sys
def losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, open(path)) if "loss" in r}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
stop, steps = int(sys.argv[3]), int(sys.argv[4])
assert stop < steps, f"stopped at {stop} of {steps}"
after = [s for s in sorted(b) if s > stop]
assert after == list(range(stop + 1, steps + 1)), (after[:3], after[-3:])
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in after[:200])
overall = max(abs(a[s] - b[s]) / abs(a[s]) for s in after)
print(f"4 ranks to step {stop}, requeued at 2 ranks: {len(after)} steps to {steps},"
      f" largest relative loss difference {worst:.2e} over the first 200 ({overall:.2e} over all)")
sys.exit(0 if worst <= 1e-4 else 1)
PY
      fail "the resumed losses differ from the uninterrupted 2-rank run's"
    ;;
  gen_script)
    # has_line FILE LINE: LINE whole, or followed by a comment.
    has_line() {
      local l
      while IFS= read -r l; do [[ $l == "$2" || ${l%%  *} == "$2" ]] && return 0; done <"$1"
      fail "$1 lacks the line: $2"
    }
    "$KOLOS" slurm gen --help | grep -q "usage: kolos slurm gen" || fail "no gen --help"
    "$KOLOS" slurm gen "$tiny" -o one.sbatch 2>err.txt || { cat err.txt; fail "gen with defaults"; }
    grep -q "submit it with: sbatch one.sbatch" err.txt || fail "gen does not say how to submit"
    for line in "#SBATCH --nodes=1" "#SBATCH --ntasks=2" "#SBATCH --signal=B:USR1@300" "#SBATCH --requeue" \
      "#SBATCH --open-mode=append" "KOLOS_CONFIG=\${KOLOS_CONFIG:-$tiny}" "KOLOS=\${KOLOS:-$KOLOS}"; do
      has_line one.sbatch "$line"
    done
    "$KOLOS" slurm gen "$tiny" --nodes 2 --gpus-per-node 4 --cpus-per-task 8 --time 12:00:00 \
      --partition gpu --signal-seconds 600 --checkpoint-dir ckpt --set parallel.data=8 \
      --set 'log.metrics=m e.jsonl' --sbatch=--exclusive -o gpu.sbatch || fail "gen for GPUs"
    for line in "#SBATCH --nodes=2" "#SBATCH --ntasks=8" "#SBATCH --ntasks-per-node=4" \
      "#SBATCH --gpus-per-task=1" "#SBATCH --gpu-bind=none" "#SBATCH --cpus-per-task=8" \
      "#SBATCH --time=12:00:00" "#SBATCH --partition=gpu" "#SBATCH --signal=B:USR1@600" \
      "#SBATCH --exclusive" "KOLOS_CHECKPOINT_DIR=\${KOLOS_CHECKPOINT_DIR:-$work/ckpt}" \
      "train_options=(--set parallel.data=8 --set 'log.metrics=m e.jsonl')"; do
      has_line gpu.sbatch "$line"
    done
    ! grep -q "^##SBATCH --gpus-per-task" gpu.sbatch || fail "the disabled GPU line stayed"
    "$KOLOS" slurm gen "$tiny" --tasks-per-node 3 >/dev/null 2>err.txt && fail "a mesh of 2 on 3 ranks was accepted"
    grep -q "world size is 3" err.txt || { cat err.txt; fail "no world-size message"; }
    printf '[model]\nlayrs = 2\n' >typo.toml
    "$KOLOS" slurm gen typo.toml >/dev/null 2>err.txt && fail "a config typo was accepted"
    grep -q "typo.toml:2" err.txt || { cat err.txt; fail "the config error does not name typo.toml:2"; }
    "$KOLOS" slurm gen "$tiny" --tasks-per-node 2 --gpus-per-node 4 >/dev/null 2>err.txt && fail "2 ranks on 4 GPUs accepted"
    grep -q "one rank per GPU" err.txt || fail "no one-rank-per-GPU message"
    "$KOLOS" slurm gne 2>err.txt && fail "a misspelt subcommand was accepted"
    grep -q "did you mean .gen." err.txt || fail "no did-you-mean for gne"
    # The committed templates: what gen writes with the arguments they record.
    for t in "$src"/launchers/slurm/*.sbatch; do
      bash -n "$t" || fail "$t does not parse"
      args=$(sed -n 's/^# Written by: kolos slurm gen //p' "$t")
      [[ -z $args ]] && continue
      (cd "$src" && eval "\"\$KOLOS\" slurm gen $args") >regen.sbatch || fail "regenerating $t"
      diff -u "$t" regen.sbatch || fail "$t is stale: regenerate it with: kolos slurm gen $args"
    done
    for f in one.sbatch gpu.sbatch "$src"/launchers/slurm/*.sbatch; do
      bash -n "$f" || fail "$f does not parse"
      if command -v shellcheck >/dev/null; then shellcheck "$f" || fail "shellcheck $f"; fi
    done
    ;;
  script_decisions)
    # The template's own logic, with srun and scontrol replaced by stand-ins
    # that record their arguments: --resume when `latest` exists, and the
    # requeue decision after each exit code.
    mkdir -p bin ckpt
    cat >bin/srun <<'SH'
#!/bin/bash
echo "srun $*" >>"$FAKE_LOG"
echo "srun's SLURM_NTASKS=${SLURM_NTASKS:-} SLURM_NPROCS=${SLURM_NPROCS:-}" >>"$FAKE_LOG"
exit "${FAKE_RC:-0}"
SH
    cat >bin/scontrol <<'SH'
#!/bin/bash
echo "scontrol $*" >>"$FAKE_LOG"
case "$1 $2" in
  "show hostnames") [[ $3 == "node[0-1]" ]] && printf 'node0\nnode1\n' || echo "$3" ;;
  "show job") echo "JobId=42 JobState=RUNNING NodeList=${FAKE_JOB_NODES:-node[0-1]} NumNodes=1" ;;
esac
SH
    cat >bin/sinfo <<'SH'
#!/bin/bash
printf 'node0 idle\nnode1 %s\n' "${FAKE_NODE1:-idle}"
SH
    chmod +x bin/srun bin/scontrol bin/sinfo
    "$KOLOS" slurm gen "$tiny" --checkpoint-dir ckpt -o job.sbatch 2>/dev/null || fail "gen"
    export FAKE_LOG=$work/log.txt SLURM_JOB_ID=42
    unset SLURM_NTASKS SLURM_NPROCS SLURM_TASKS_PER_NODE SLURM_RESTART_COUNT  # ctest inside a job
    # run_job EXPECTED_RC [VAR=value ...]: runs the script, leaves its calls in log.txt.
    run_job() {
      local want=$1; shift
      : >"$FAKE_LOG"
      env PATH="$work/bin:$PATH" "$@" bash job.sbatch >job.out 2>&1
      local rc=$?
      [[ $rc -eq $want ]] || { cat job.out; fail "job.sbatch ($*) exited $rc, expected $want"; }
    }
    run_job 0 FAKE_RC=0
    grep -q "srun --mpi=pmix --cpu-bind=cores --distribution=block:block --mem-bind=local $KOLOS train $tiny --set checkpoint.dir=$work/ckpt$" log.txt ||
      { cat log.txt; fail "unexpected srun command"; }
    ! grep -q scontrol log.txt || fail "requeued after success"
    run_job 3 FAKE_RC=3
    ! grep -q "requeue" log.txt || fail "requeued with no checkpoint (KOLOS_REQUEUE=auto)"
    grep -q "not requeued: no checkpoint" job.out || fail "no reason given"
    touch ckpt/latest
    run_job 3 FAKE_RC=3
    grep -q -- "--set checkpoint.dir=$work/ckpt --resume$" log.txt || { cat log.txt; fail "no --resume with ckpt/latest"; }
    grep -qx "scontrol requeue 42" log.txt || { cat job.out; fail "not requeued with a checkpoint"; }
    run_job 3 FAKE_RC=3 SLURM_RESTART_COUNT=20
    ! grep -q "scontrol requeue" log.txt || fail "requeued past KOLOS_MAX_REQUEUES"
    grep -q "already restarted 20 times" job.out || fail "no requeue-limit reason"
    run_job 3 FAKE_RC=3 KOLOS_REQUEUE=never
    ! grep -q "scontrol requeue" log.txt || fail "requeued with KOLOS_REQUEUE=never"
    run_job 1 FAKE_RC=1
    ! grep -q "scontrol requeue" log.txt || fail "requeued after a failure"
    rm ckpt/latest
    run_job 3 FAKE_RC=3 KOLOS_REQUEUE=always
    grep -qx "scontrol requeue 42" log.txt || fail "KOLOS_REQUEUE=always did not requeue"
    run_job 0 FAKE_RC=0 KOLOS_CONFIG=other.toml
    grep -q "train other.toml --set checkpoint.dir=$work/ckpt$" log.txt ||
      { cat log.txt; fail "KOLOS_CONFIG from the environment not used"; }
    # The ranks are the allocation's tasks (SLURM_TASKS_PER_NODE), not the
    # submission's SLURM_NTASKS: a requeued job may have been made smaller.
    run_job 0 FAKE_RC=0 SLURM_NTASKS=4 SLURM_NPROCS=4 SLURM_TASKS_PER_NODE=2
    grep -q "srun --mpi=pmix --cpu-bind=cores --distribution=block:block --mem-bind=local --ntasks=2 $KOLOS train $tiny " log.txt ||
      { cat log.txt; fail "srun not given --ntasks=2 for SLURM_TASKS_PER_NODE=2"; }
    grep -qx "srun's SLURM_NTASKS=2 SLURM_NPROCS=2" log.txt || { cat log.txt; fail "SLURM_NTASKS not set to 2"; }
    grep -q ": 1 node(s), 2 ranks" job.out || { cat job.out; fail "the job line does not say 2 ranks"; }
    grep -q "submitted with 4 tasks and this run's allocation has 2" job.out ||
      { cat job.out; fail "no word of the changed size"; }
    run_job 0 FAKE_RC=0 SLURM_NTASKS=8 'SLURM_TASKS_PER_NODE=2(x3),1'
    grep -q -- "--ntasks=7 " log.txt || { cat log.txt; fail "2(x3),1 is not 7 tasks"; }
    run_job 0 FAKE_RC=0 SLURM_NTASKS=2 SLURM_TASKS_PER_NODE=2
    ! grep -q "submitted with" job.out || fail "a size change reported when there was none"
    run_job 2 FAKE_RC=0 SLURM_TASKS_PER_NODE=two
    grep -q "cannot read SLURM_TASKS_PER_NODE='two'" job.out || { cat job.out; fail "no message for a bad SLURM_TASKS_PER_NODE"; }
    ! grep -q "^srun" log.txt || fail "srun ran with an unreadable SLURM_TASKS_PER_NODE"
    # A node lost (--no-kill): the first srun fails, node1 is down and out
    # of the job; the script runs srun again on node0 with its 2 tasks and
    # --resume; the second run's exit code is the job's.
    grep -qx "#SBATCH --no-kill" job.sbatch || fail "no #SBATCH --no-kill"
    cat >bin/srun <<'SH'
#!/bin/bash
echo "srun $*" >>"$FAKE_LOG"
n=$(grep -c '^srun ' "$FAKE_LOG")
[[ $n -eq 1 ]] && exit 1
exit "${FAKE_RC:-0}"
SH
    echo step-00000020 >ckpt/latest
    lost=(SLURM_JOB_NUM_NODES=2 'SLURM_JOB_NODELIST=node[0-1]' 'SLURM_TASKS_PER_NODE=2(x2)' SLURM_NTASKS=4)
    run_job 0 "${lost[@]}" FAKE_JOB_NODES=node0 'FAKE_NODE1=down*'
    grep -q "kolos.sbatch: node(s) node1 lost; restarting on node0 with 2 ranks from $work/ckpt/step-00000020$" job.out ||
      { cat job.out; fail "no restart line after a node loss"; }
    [[ $(grep -c '^srun ' log.txt) -eq 2 ]] || { cat log.txt; fail "not two sruns after a node loss"; }
    grep '^srun ' log.txt | tail -n 1 |
      grep -q -- "--overlap --nodes=1 --nodelist=node0 --ntasks=2 $KOLOS train .* --resume$" ||
      { cat log.txt; fail "the second srun is not 2 tasks on node0 with --resume"; }
    run_job 1 "${lost[@]}" FAKE_JOB_NODES=node0 'FAKE_NODE1=down*' KOLOS_MAX_REQUEUES=0
    grep -q "node(s) node1 lost; not restarted: already restarted 0 times" job.out || { cat job.out; fail "restarted past KOLOS_MAX_REQUEUES"; }
    # A failure with every node up: no restart once KOLOS_NODE_WAIT is over.
    run_job 1 "${lost[@]}" KOLOS_NODE_WAIT=0
    [[ $(grep -c '^srun ' log.txt) -eq 1 ]] || { cat log.txt; fail "restarted with no node lost"; }
    rm ckpt/latest
    : >"$FAKE_LOG"
    env PATH="$work/bin:$PATH" bash job.sbatch third.toml --set train.steps=5 >/dev/null 2>&1
    grep -q "train third.toml --set checkpoint.dir=$work/ckpt --set train.steps=5$" log.txt ||
      { cat log.txt; fail "the config argument and options not passed"; }
    ;;
  *)
    fail "unknown case $case_name"
    ;;
esac
echo "PASS $case_name"
