#!/usr/bin/env bash
# End-to-end cases for the `kolos` command, one per CTest test:
#   cases.sh CASE       (environment: KOLOS, KOLOS_SOURCE_DIR, KOLOS_BINARY_DIR)
# Failure cases check four things: a non-zero exit, no signal or core dump,
# no hang (every command runs under `timeout`), and a message on stderr that
# names what is wrong.
set -uo pipefail
case_name=$1
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
tiny="$KOLOS_SOURCE_DIR/examples/gpt-tiny.toml"



expect_success() {
  timeout 300 "$@" >out.txt 2>err.txt
  local rc=$?
  cat out.txt err.txt
  [[ $rc -eq 0 ]] || fail "exit $rc: $*"
}

# The summary line of err.txt shows the loss falling by more than 0.3.
expect_loss_fell() {
  local line first last
  line=$(grep "kolos: done:" err.txt) || fail "no summary line ($1)"
  read -r first last < <(sed -E 's/.*loss ([0-9.]+) -> ([0-9.]+).*/\1 \2/' <<<"$line")
  python3 -c "import sys; sys.exit(0 if $last < $first - 0.3 else 1)" ||
    fail "$1: loss did not fall visibly: $first -> $last"
}

# Writes N uint16 tokens 0,1,2,... (mod 200) to FILE, with token BAD at index AT (optional).
write_tokens() {
  python3 - "$@" <<'PY'
import struct, sys
path, n = sys.argv[1], int(sys.argv[2])
bad_at = int(sys.argv[3]) if len(sys.argv) > 3 else -1
bad = int(sys.argv[4]) if len(sys.argv) > 4 else 0
ids = [i % 200 for i in range(n)]
if bad_at >= 0: ids[bad_at] = bad
open(path, "wb").write(struct.pack("<%dH" % n, *ids))
PY
}


# job_failed_within SECONDS MARKER WHAT: the job started in the background
# as $pid, its ranks marked by train.seed=MARKER, ends within SECONDS of
# WHAT, non-zero, and leaves no rank behind.
job_failed_within() {
  local seconds=$1 marker=$2 what=$3 rc
  timeout "$seconds" tail --pid="$pid" -f /dev/null ||
    { pkill -9 -f "train.seed=$marker"; kill -9 "$pid"; fail "still running $seconds s after $what"; }
  wait "$pid"
  rc=$?
  cat err.txt
  [[ $rc -ne 0 ]] || fail "exit code 0 after $what"
  sleep 1
  ! pgrep -f "train.seed=$marker" >/dev/null || { pkill -9 -f "train.seed=$marker"; fail "ranks left behind"; }
}

# stopped_rank N VICTIM [--set ...]: a training job of N ranks with an 8 s
# communication deadline (KOLOS_COMM_TIMEOUT_S=$timeout_env, default 8, unless
# the --set arguments give runtime.comm_timeout_s); once it trains, rank
# VICTIM is frozen (SIGSTOP).
# The job must end non-zero within the deadline + 10 s, a rank must report
# the timeout, the report must name VICTIM as the rank that stopped
# answering, and no process may be left.
stopped_rank() {
  local n=$1 victim=$2 marker=$((4300000 + RANDOM)) metrics="m-$1-$2.jsonl"
  shift 2
  KOLOS_COMM_TIMEOUT_S=${timeout_env:-8} "$KOLOS" run -n "$n" "$tiny" --set train.steps=1000000 \
    --set log.progress=off --set "log.metrics=$metrics" --set train.seed=$marker "$@" \
    >out.txt 2>err.txt &
  local pid=$! vpid="" p
  wait_for_lines "$metrics" 3 1200
  [[ -s $metrics ]] || { kill -9 $pid; cat err.txt; fail "n=$n: the run wrote no metrics"; }
  # The victim, by its rank in the launcher's environment (a few tries: a
  # loaded machine may show the process before /proc has its environment).
  for _ in $(seq 1 50); do
    for p in $(pgrep -f "train.seed=$marker"); do
      if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$victim"; then
        vpid=$p
      fi
    done
    [[ -n $vpid ]] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  if [[ -z $vpid ]]; then
    kill -9 $pid 2>/dev/null
    echo "--- the job's processes:"; pgrep -af "train.seed=$marker"
    echo "--- its metrics:"; cat "$metrics"; echo "--- its output:"; cat out.txt err.txt
    fail "n=$n: rank $victim not found"
  fi
  kill -STOP "$vpid"
  local start=$SECONDS
  if ! timeout 40 tail --pid=$pid -f /dev/null; then
    pkill -9 -f "train.seed=$marker"
    fail "n=$n: still running 40 s after rank $victim was stopped (deadline 8 s)"
  fi
  local elapsed=$((SECONDS - start))
  wait $pid
  local rc=$?
  cat err.txt
  sleep 1
  if pgrep -f "train.seed=$marker" >/dev/null; then
    pkill -9 -f "train.seed=$marker"
    fail "n=$n: processes left after the job ended"
  fi
  [[ $rc -ne 0 ]] || fail "n=$n: exit code 0 with rank $victim stopped"
  ((elapsed <= 19)) || fail "n=$n: ended $elapsed s after the stop; the deadline is 8 s (+10 s allowed)"
  grep -q "kolos: communication timeout on rank [0-9]* (.*): .* has not completed after" err.txt ||
    fail "n=$n: no timeout report"
  grep -q "rank $victim (.*) stopped answering" err.txt ||
    fail "n=$n: the report does not name rank $victim as stopped"
  echo "ok: n=$n, rank $victim stopped: job ended after $elapsed s, exit $rc"
}

case "$case_name" in
  help)
    for cmd in train run plugins version "data prepare"; do
      # shellcheck disable=SC2086
      out=$(timeout 30 "$KOLOS" $cmd --help) || fail "kolos $cmd --help failed"
      grep -q "usage: kolos $cmd" <<<"$out" || fail "kolos $cmd --help prints no usage"
    done
    out=$(timeout 30 "$KOLOS" --help) || fail "kolos --help"
    grep -q "commands:" <<<"$out" || fail "kolos --help lists no commands"
    expect_failure "unknown command .trian. \(did you mean .train.\?\)" -- "$KOLOS" trian x.toml
    ;;
  version)
    expect_success "$KOLOS" version
    grep -q "kolos [0-9]" out.txt && grep -q "LibTorch" out.txt && grep -q "Open MPI" out.txt ||
      fail "version output incomplete"
    ;;
  plugins)
    expect_success "$KOLOS" plugins
    grep -Eq "^dp +gradients" out.txt || fail "dp plugin not listed"
    for tp in tp1d tp2d tp2p5d tp3d; do
      grep -Eq "^$tp +layers" out.txt || fail "$tp plugin not listed"
    done
    ;;
  malformed_toml)
    printf '[model]\nlayers = 2\nhidden = = 3\n' >bad.toml
    expect_failure "bad\.toml:3" -- "$KOLOS" train bad.toml
    ;;
  unknown_key)
    printf '[model]\nhiden = 64\n' >typo.toml
    expect_failure "typo\.toml:2.*model\.hiden.*[Dd]id you mean .hidden." -- "$KOLOS" train typo.toml
    ;;
  unknown_plugin)
    expect_failure "no plugin named .zero7." -- \
      "$KOLOS" run -n 2 "$tiny" --set plugins.gradients=zero7
    ;;
  train_zero)
    # Each ZeRO stage is its own plugin; each trains the tiny GPT on 2 ranks.
    for stage in 1 2 3; do
      expect_success "$KOLOS" run -n 2 "$tiny" --set parallel.zero.stage=$stage --set train.steps=30
      grep -q "gradients zero$stage" err.txt || fail "zero$stage not used"
      expect_loss_fell "zero$stage"
    done
    ;;
  train_tp)
    # Each tensor-parallel mode is its own plugin; 1d x dp and 2d train the
    # tiny GPT on 4 ranks and the loss falls as under dp.
    for mode in "1d --set parallel.tensor.size=2" "2d --set parallel.tensor.size=4"; do
      name=${mode%% *}
      # shellcheck disable=SC2086
      expect_success "$KOLOS" run -n 4 "$tiny" --set parallel.data=0 --set train.steps=30 \
        --set parallel.tensor.mode=${mode}
      grep -q "layers tp$name" err.txt || fail "tp$name not used"
      expect_loss_fell "tp$name"
    done
    expect_failure "model.heads = 4 does not divide into the 8 attention-head groups" -- \
      "$KOLOS" run -n 8 "$tiny" --set parallel.data=1 --set parallel.tensor.size=8
    ;;
  train_sequence)
    # Sequence parallelism (ulysses) x dp trains the tiny GPT on 4 ranks
    # through the launcher, and the loss falls as under dp.
    expect_success "$KOLOS" run -n 4 "$tiny" --set parallel.data=0 --set train.steps=30 \
      --set parallel.sequence.size=2
    grep -q "sp=2 .*sequence ulysses" err.txt || fail "ulysses not used"
    expect_loss_fell "ulysses"
    ;;
  mesh_mismatch)
    expect_failure "world size is 3" -- "$KOLOS" run -n 3 "$tiny" --set parallel.data=2
    ;;
  device_cuda_without_gpu)
    # On a machine without a GPU: one message, exit 2 (every rank agreed),
    # from a kolos with its CUDA backend (no GPU) or without it.
    if [[ -e /dev/nvidia0 ]]; then
      fail "this machine has a GPU; the case checks the refusal where there is none"
    fi
    why='runtime\.device = "cuda" on [^ ]+: no usable GPU|device = "cuda": this kolos was built without its CUDA backend'
    expect_failure "$why" -- "$KOLOS" run -n 2 "$tiny" --set runtime.device=cuda
    [[ $(grep -Ec "$why" err.txt) -eq 1 ]] || fail "the refusal was not printed exactly once"
    "$KOLOS" run -n 2 "$tiny" --set runtime.device=cuda >/dev/null 2>&1
    rc=$?
    [[ $rc -eq 2 ]] || fail "exit code $rc, expected 2 (an agreed set-up error)"
    ;;
  data_missing)
    expect_failure "/nonexistent/train\.bin" -- "$KOLOS" run -n 2 "$tiny" \
      --set data.kind=tokens --set data.path=/nonexistent/train.bin
    ;;
  data_too_short)
    write_tokens short.bin 10
    expect_failure "short\.bin.*needs at least 33 tokens" -- "$KOLOS" train "$tiny" \
      --set parallel.data=1 --set data.kind=tokens --set data.path=short.bin
    ;;
  run_zero_ranks)
    expect_failure "-n must be at least 1" -- "$KOLOS" run -n 0 "$tiny"
    ;;
  rank_failure_ends_job)
    # One token out of the vocabulary deep in the file: the rank that reads
    # it mid-run raises; the whole job must end promptly, naming the rank.
    write_tokens tokens.bin 20000 15000 500
    expect_failure "rank [01].*500" -- "$KOLOS" run -n 2 "$tiny" \
      --set data.kind=tokens --set data.path=tokens.bin --set model.vocab=256 \
      --set train.steps=100000 --set log.progress=off
    ;;
  train_dp2)
    expect_success "$KOLOS" run -n 2 "$tiny" --set train.steps=40 --set log.metrics=m.jsonl
    line=$(grep "kolos: done:" err.txt) || fail "no summary line"
    read -r first last < <(sed -E 's/.*loss ([0-9.]+) -> ([0-9.]+).*/\1 \2/' <<<"$line")
    python3 -c "import sys; sys.exit(0 if $last < $first - 0.5 else 1)" ||
      fail "loss did not fall visibly: $first -> $last"
    [[ $(wc -l <m.jsonl) -eq 40 ]] || fail "metrics file has $(wc -l <m.jsonl) lines, expected 40"
    python3 -c "
import json
rows = [json.loads(l) for l in open('m.jsonl')]
need = {'step','loss','lr','grad_norm','step_time_s','tokens_per_s','peak_rss_bytes'}
assert all(need <= set(r) for r in rows), 'missing fields'
assert [r['step'] for r in rows] == list(range(1, 41))
" || fail "metrics file malformed"
    ;;
  text_data)
    expect_success "$KOLOS" data prepare "$KOLOS_SOURCE_DIR/README.md" "$KOLOS_SOURCE_DIR/docs/configuration.md" -o text.bin
    [[ -s text.bin ]] || fail "no token file written"
    expect_success "$KOLOS" run -n 2 "$tiny" --set data.kind=tokens --set data.path=text.bin \
      --set model.vocab=256 --set train.steps=10
    grep -q "kolos: done: 10 steps" err.txt || fail "no summary"
    ;;
  stop_signal)
    # SIGUSR1 (Slurm's warning before a time limit) reaches the ranks through
    # mpirun; every rank stops after the same step and the job exits with 3.
    "$KOLOS" run -n 2 "$tiny" --set train.steps=100000 --set log.metrics=m.jsonl \
      --set log.progress=off >out.txt 2>err.txt &
    pid=$!
    wait_for_lines m.jsonl 3
    [[ -s m.jsonl ]] || { kill -9 $pid; fail "the run wrote no metrics"; }
    kill -USR1 $pid
    timeout 60 tail --pid=$pid -f /dev/null || { kill -9 $pid; fail "did not stop within 60 s"; }
    wait $pid
    rc=$?
    cat err.txt
    [[ $rc -eq 3 ]] || fail "exit code $rc, expected 3 (stopped, resumable)"
    grep -q "stopped on request after step" err.txt || fail "no stop message"
    steps=$(wc -l <m.jsonl)
    grep -q "after step $steps of" err.txt || fail "the stop step differs from the metrics file ($steps lines)"
    ;;
  signal_during_setup)
    # Set-up that blocks (token data on a FIFO nobody writes, as on a hung
    # file system): SIGTERM to the ranks ends each within 5 s with a message
    # naming the signal and the rank; SIGINT to mpirun (Ctrl-C) ends the job
    # within 5 s too; kill -9 of one rank ends it within 10 s. Nothing is
    # left running in any case.
    mkfifo stuck.bin
    marker=4242019
    setup_job() {
      "$KOLOS" run -n 2 "$tiny" --set data.kind=tokens --set data.path=stuck.bin \
        --set train.seed=$marker >out.txt 2>err.txt &
      pid=$!
      # Until both ranks block opening the FIFO (past MPI's start-up).
      local blocked=0 p
      for _ in $(seq 1 600); do
        blocked=0
        for p in $(ps -o pid= --ppid $pid); do
          [[ $(cat "/proc/$p/wchan" 2>/dev/null) == wait_for_partner ]] && blocked=$((blocked + 1))
        done
        ((blocked >= 2)) && break
        sleep 0.1
      done
      ((blocked >= 2)) || { kill -9 $pid; cat err.txt; fail "the ranks never reached the data file"; }
    }
    setup_job
    ranks=$(ps -o pid= --ppid $pid)
    [[ -n $ranks ]] || fail "no rank processes under mpirun ($pid)"
    # shellcheck disable=SC2086
    kill -TERM $ranks
    job_failed_within 5 $marker "a signal during set-up"
    grep -q "kolos: SIGTERM during set-up on rank [01] (.*): the run ends before its first step" err.txt ||
      fail "no set-up message for SIGTERM"
    setup_job
    kill -INT $pid
    job_failed_within 5 $marker "a signal during set-up"
    # kill -9 of one rank during set-up: mpirun ends the job, nothing is left.
    setup_job
    kill -9 "$(ps -o pid= --ppid $pid | head -1)"
    job_failed_within 10 $marker "a rank was killed during set-up"
    ;;
  deep_nesting)
    # One key whose value is 200,000 nested arrays crashed the TOML parser
    # (recursion): now a clear error with file, line and column.
    python3 -c 'print("[model]\nlayers = " + "[" * 200000 + "]" * 200000)' >deep.toml
    expect_failure "deep.toml:2:[0-9]+: arrays or inline tables nested more than 64 deep" -- \
      "$KOLOS" train deep.toml
    expect_failure "deep.toml:2:[0-9]+: arrays or inline tables nested more than 64 deep" -- \
      "$KOLOS" run -n 2 deep.toml
    ;;
  stopped_rank_dp)
    stopped_rank 2 1 --set parallel.data=2 --set train.micro_batch=8
    stopped_rank 4 2 --set parallel.data=4 --set train.micro_batch=4
    ;;
  stopped_rank_zero3)
    stopped_rank 2 0 --set parallel.data=2 --set train.micro_batch=8 --set parallel.zero.stage=3
    stopped_rank 4 3 --set parallel.data=4 --set train.micro_batch=4 --set parallel.zero.stage=3
    ;;
  stopped_rank_pipeline)
    stopped_rank 2 1 --set parallel.data=1 --set parallel.pipeline.size=2 --set train.micro_batch=4
    stopped_rank 4 0 --set parallel.data=2 --set parallel.pipeline.size=2 --set train.micro_batch=4
    ;;
  stopped_rank_tp1d)
    stopped_rank 2 0 --set parallel.data=1 --set parallel.tensor.size=2 --set train.micro_batch=8
    # The deadline from the config: [runtime] comm_timeout_s wins over the environment.
    timeout_env=600 stopped_rank 4 1 --set parallel.data=2 --set parallel.tensor.size=2 \
      --set train.micro_batch=8 --set runtime.comm_timeout_s=8
    ;;
  setup_failure_one_rank)
    # A rank-local error in set-up where the other rank may already wait in
    # a collective (the test copy of zero3 fails on rank 1 only): the job
    # ends with that rank's message, printed once, and not by the other
    # rank's collective running into its deadline. No clock is read: a
    # rank left waiting would end only at the deadline, with the deadline's
    # message (process_group_mpi.cpp: "did not complete within"), which the
    # check below refuses; the deadline is short (30 s) so that such a
    # failure does not take the default 600 s.
    [[ -n ${KOLOS_FAULT_PLUGIN_DIR:-} ]] || fail "KOLOS_FAULT_PLUGIN_DIR is not set"
    KOLOS_PLUGIN_PATH="$KOLOS_FAULT_PLUGIN_DIR:${KOLOS_PLUGIN_PATH:-}" KOLOS_ZERO3_FAIL_SETUP_RANK=1 \
      expect_failure "on rank 1 .* during set-up: zero3: set-up failed on this rank only" -- \
      "$KOLOS" run -n 2 "$tiny" --set parallel.zero.stage=3 --set runtime.comm_timeout_s=30
    ! grep -q "did not complete within" err.txt || fail "a rank waited for the deadline: $(cat err.txt)"
    count=$(grep -c "set-up failed on this rank only" err.txt)
    [[ $count -eq 1 ]] || fail "the message was printed $count times, expected once"
    ;;
  killed_rank)
    # A rank killed outright (no chance to report) must not leave the other
    # waiting in a collective: mpirun ends the job, non-zero, promptly.
    # A seed no other case uses marks this job's processes.
    "$KOLOS" run -n 2 "$tiny" --set train.seed=4242017 --set train.steps=100000 --set log.metrics=m.jsonl \
      --set log.progress=off >out.txt 2>err.txt &
    pid=$!
    wait_for_lines m.jsonl 3
    victim=$(pgrep -f -n "train.seed=4242017") || { kill -9 $pid; fail "no rank process found"; }
    kill -9 "$victim"
    job_failed_within 60 4242017 "a rank was killed"
    ;;
  topo)
    # This machine: text and JSON agree with the kernel's CPU count.
    expect_success "$KOLOS" topo
    grep -q "^host .* (hwloc discovery of this machine)" out.txt || fail "kolos topo: no host line"
    grep -Eq "^[0-9]+ package\(s\), [0-9]+ NUMA node\(s\), [1-9][0-9]* cores" out.txt || fail "kolos topo: no counts"
    expect_success "$KOLOS" topo --json
    python3 - out.txt <<'PY' || fail "kolos topo --json does not describe this machine"
import json, os, sys
doc = json.load(open(sys.argv[1]))
cpus = {p for c in doc["cores"] for p in c["pus"]}
assert doc["schema"] == "kolos.topology/1" and len(doc["cores"]) >= 1, doc["schema"]
assert os.sched_getaffinity(0) <= cpus, (sorted(os.sched_getaffinity(0)), sorted(cpus))
assert len(cpus) == doc["pus"] <= os.cpu_count()
print(f"{len(doc['cores'])} cores, {doc['pus']} CPUs, {len(doc['numa_nodes'])} NUMA node(s)")
PY
    # The DGX fixture: GPUs, NICs, NVLink domain, one rank per GPU on its NUMA node.
    fx="$KOLOS_SOURCE_DIR/tests/unit/topology/fixtures"
    expect_success "$KOLOS" topo --xml "$fx/dgx-h100.xml" --nvlink-file "$fx/dgx-h100.nvlink.json" \
      --sysfs-root "$fx/dgx-h100-sys" --ranks 8 --gpus
    grep -q "112 cores, 224 hardware threads, 8 GPU(s), 8 NIC(s)" out.txt || fail "DGX fixture: wrong counts"
    grep -q "NVLink domains (file .*): 0: GPUs 0-7" out.txt || fail "DGX fixture: no NVLink domain of 8"
    grep -q "rank 7: NUMA node 1, cores 98-111 (CPUs 98-111,210-223), GPU 7 0000:db:00.0" out.txt ||
      fail "DGX fixture: rank 7 not bound next to GPU 7"
    expect_failure "hwloc XML file missing\.xml: no such file" -- "$KOLOS" topo --xml missing.xml
    # kolos run shows its binding in the dry run: the flags and a line for people.
    expect_success "$KOLOS" run -n 2 "$tiny" --dry-run
    grep -Eq -- "--bind-to (core|none)" out.txt || fail "kolos run --dry-run shows no binding"
    grep -q "kolos run: binding " err.txt || fail "kolos run --dry-run does not describe the binding"
    expect_success "$KOLOS" run -n 2 "$tiny" --dry-run --bind numa
    grep -q -- "--map-by ppr:[0-9]*:numa --bind-to numa" out.txt || fail "--bind numa not passed to mpirun"
    expect_failure "--bind must be none, cores or numa, got .socket." -- "$KOLOS" run -n 2 "$tiny" --dry-run --bind socket
    # Locality at start: a tp group over two (simulated) hosts is warned
    # about; one host, nothing; a host list of the wrong length is refused.
    tp2=(--set parallel.data=1 --set parallel.tensor.size=2 --set train.steps=1 --set train.global_batch=8)
    KOLOS_SIMULATED_HOSTS=n0,n1 expect_success "$KOLOS" run -n 2 "$tiny" "${tp2[@]}"
    grep -q "kolos: warning: tp group of ranks 0-1 crosses nodes: n0 (ranks 0), n1 (ranks 1)" err.txt ||
      fail "no warning for a tp group across two hosts"
    KOLOS_SIMULATED_HOSTS=n0,n0 expect_success "$KOLOS" run -n 2 "$tiny" "${tp2[@]}"
    ! grep -q "crosses nodes" err.txt || fail "a warning for a tp group on one host"
    KOLOS_SIMULATED_HOSTS=n0 expect_failure "KOLOS_SIMULATED_HOSTS names 1 host\(s\) for 2 ranks" -- \
      "$KOLOS" run -n 2 "$tiny" "${tp2[@]}"
    ;;
  install)
    prefix="$work/prefix"
    cmake --install "$KOLOS_BINARY_DIR" --prefix "$prefix" >/dev/null || fail "cmake --install failed"
    for f in bin/kolos lib/libkolos_core.so lib/libkolos_base.so lib/libkolos_modules.so lib/libkolos_topology.so \
             lib/kolos/plugins/libkolos_dp.so share/kolos/examples/gpt-demo.toml include/kolos/config.h; do
      [[ -e "$prefix/$f" ]] || fail "$f not installed"
    done
    env -u KOLOS_PLUGIN_PATH "$prefix/bin/kolos" plugins >out.txt || fail "installed kolos plugins failed"
    grep -q "$prefix/lib/kolos/plugins/libkolos_dp.so" out.txt || { cat out.txt; fail "installed kolos does not find its plugins"; }
    env -u KOLOS_PLUGIN_PATH timeout 120 "$prefix/bin/kolos" train "$prefix/share/kolos/examples/gpt-tiny.toml" \
      --set parallel.data=1 --set train.steps=3 2>err.txt || { cat err.txt; fail "installed kolos cannot train"; }
    ;;
  *)
    fail "unknown case $case_name"
    ;;
esac
echo "PASS $case_name"
