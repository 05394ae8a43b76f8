#!/usr/bin/env bash
# The memory role's `chunks` plugin through `kolos train` (see CMakeLists.txt):
#   cases.sh CASE      (environment: KOLOS, MPIEXEC)
set -uo pipefail
case_name=$1
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
PY=/usr/bin/python3

# The fixed overhead beyond memory.compute_budget that a chunked run's peak
# RSS, over the whole process, may reach (docs/memory.md): LibTorch,
# OpenBLAS and MPI before any model exists (about 155 MiB here), the block
# being built, then backward's temporaries (a weight's gradient before it is
# added into its chunk, the activations of this small batch) and malloc's
# slack. It does not grow with the model's states: the same bound holds at
# 4x and 8x over budget. Building the model whole (57 MiB in fp32) before
# moving it into chunks would exceed it.
overhead_mib=250

# 15.0 M parameters: 229 MiB of fp32 states (16 B per parameter) in 8
# blocks; its largest tensor, the 2048 x 384 token embedding, is 3 MiB.
cat >states.toml <<'TOML'
[model]
layers = 8
hidden = 384
heads = 8
seq_len = 32
vocab = 2048
[data]
kind = "synthetic"
[optim]
lr = 1e-3
[train]
global_batch = 4
micro_batch = 2
steps = 3
seed = 3
[log]
progress = "off"
TOML

# peak_rss_bytes (max over the steps) of a metrics file, in MiB.
peak_mib() {
  $PY -c 'import json,sys; print(max(json.loads(l)["peak_rss_bytes"] for l in open(sys.argv[1])) // 2**20)' "$1"
}

case "$case_name" in
  rss)
    mkdir -p nvme
    timeout 600 "$KOLOS" train states.toml --set log.metrics=memory.jsonl >memory.txt 2>&1 ||
      { cat memory.txt; fail "the in-memory run failed"; }
    in_memory=$(peak_mib memory.jsonl)
    echo "in memory: peak RSS $in_memory MiB"
    # 4x and 8x over budget: 57 MiB and 28 MiB for 229 MiB of states.
    for budget in 57 28; do
      timeout 600 "$KOLOS" train states.toml --set log.metrics=chunks-$budget.jsonl \
        --set memory.compute_budget=\"${budget}MiB\" --set memory.offload=\"nvme\" \
        --set memory.nvme_dir=\"nvme\" --set memory.chunk_size=\"3MiB\" >chunks-$budget.txt 2>&1 ||
        { cat chunks-$budget.txt; fail "the chunked run at a budget of $budget MiB failed"; }
      peak=$(peak_mib chunks-$budget.jsonl)
      echo "chunks, budget $budget MiB: peak RSS $peak MiB (bound $((budget + overhead_mib)) MiB)"
      [[ $peak -le $((budget + overhead_mib)) ]] ||
        fail "peak RSS $peak MiB exceeds the budget $budget MiB + overhead $overhead_mib MiB"
      [[ -z $(ls -A nvme) ]] || fail "the run left files in nvme_dir: $(ls -A nvme)"
      # Same losses as in memory (bit for bit: the JSON numbers are equal).
      $PY - memory.jsonl chunks-$budget.jsonl <<'PY' || fail "losses differ from the in-memory run"
import json, sys
loss = lambda f: [json.loads(l)["loss"] for l in open(f)]
assert loss(sys.argv[1]) == loss(sys.argv[2]), (loss(sys.argv[1]), loss(sys.argv[2]))
PY
    done
    # The bound would not hold without chunks: the states alone are 229 MiB.
    [[ $in_memory -gt $((57 + overhead_mib)) ]] ||
      fail "the in-memory run peaked at $in_memory MiB, within the chunked bound: the case proves nothing"
    ;;
  kill)
    mkdir -p nvme
    # A quarter of the model (hidden 192: 3.9 M parameters, 60 MiB of
    # states; chunks of 2 MiB, the largest tensor 1.5 MiB) under a budget
    # a quarter of that: what is checked is the state on disk after the
    # kill, not the size.
    cat >>states.toml <<'TOML'
[memory]
compute_budget = "15MiB"
offload = "nvme"
nvme_dir = "nvme"
chunk_size = "2MiB"
[checkpoint]
dir = "ckpt"
every = 2
TOML
    sed -i -e 's/^steps = 3/steps = 8/' -e 's/^hidden = 384/hidden = 192/' states.toml
    timeout 600 "$KOLOS" train states.toml --set checkpoint.dir=\"straight\" \
      --set log.metrics=straight.jsonl >straight.txt 2>&1 ||
      { cat straight.txt; fail "the uninterrupted run failed"; }
    # The test copy of the plugin SIGKILLs the run halfway through step 6's
    # optimizer chunks (after the checkpoint of step 4; some chunks of the
    # step updated in nvme_dir, some not): a fixed point, not a timer.
    [[ -n ${KOLOS_FAULT_PLUGIN_DIR:-} ]] || fail "KOLOS_FAULT_PLUGIN_DIR is not set"
    KOLOS_PLUGIN_PATH="$KOLOS_FAULT_PLUGIN_DIR:${KOLOS_PLUGIN_PATH:-}" KOLOS_CHUNKS_TEST_DIE_STEP=6 \
      timeout 600 "$KOLOS" train states.toml --set log.metrics=first.jsonl >first.txt 2>&1
    rc=$?
    grep -q "kolos: test hook: killed in optimizer step 6" first.txt ||
      { cat first.txt; fail "the test hook did not fire (exit $rc)"; }
    [[ $rc -eq 137 ]] || { cat first.txt; fail "the run was not killed by SIGKILL (exit $rc)"; }
    [[ $(cat ckpt/latest) == step-00000004 ]] || fail "latest is $(cat ckpt/latest), expected step 4"
    stopped=$(wc -l <first.jsonl)
    [[ $stopped -lt 8 ]] || fail "the run ended before the kill; make it longer"
    dead=$(ls -A nvme)
    [[ $dead == kolos-nvme.* ]] || fail "the killed run left no NVMe folder (found '$dead'): was it streaming?"
    echo "killed after $stopped steps; left in nvme_dir: $dead; latest: $(cat ckpt/latest)"
    timeout 600 "$KOLOS" train states.toml --resume --set log.metrics=second.jsonl >second.txt 2>&1 ||
      { cat second.txt; fail "resume failed"; }
    grep -q "resumed from ckpt/step-" second.txt || { cat second.txt; fail "no resume message"; }
    [[ -z $(ls -A nvme) ]] || fail "nvme_dir still holds $(ls -A nvme) after the next run"
    $PY - straight.jsonl second.jsonl <<'PY' || fail "the resumed losses differ from the uninterrupted run's"
import json, sys
rows = lambda f: {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(f)}
a, b = rows(sys.argv[1]), rows(sys.argv[2])
assert b and all(a[s] == b[s] for s in b), (a, b)
print(f"steps {min(b)}..{max(b)} after the resume: losses identical")
PY
    ;;
  refusals)
    # Each before training, exit 2, with what and where.
    cat >>states.toml <<'TOML'
[memory]
compute_budget = "57MiB"
chunk_size = "3MiB"
TOML
    expect_failure "memory.compute_budget: 8.0 MiB .*8388608 bytes is smaller than step [0-9]+'s working set of [0-9]+ bytes" -- \
      "$KOLOS" train states.toml --set memory.compute_budget=\"8MiB\"
    expect_failure "memory.chunk_size: \"2MiB\": .*tensor 'embed.wte.weight' .* 3145728 bytes" -- \
      "$KOLOS" train states.toml --set memory.chunk_size=\"2MiB\"
    expect_failure "memory.nvme_dir.*/nonexistent/nvme" -- \
      "$KOLOS" train states.toml --set memory.offload=\"nvme\" --set memory.nvme_dir=\"/nonexistent/nvme\"
    expect_failure "/proc" -- \
      "$KOLOS" train states.toml --set memory.offload=\"nvme\" --set memory.nvme_dir=\"/proc\"
    expect_failure "memory.offload.*needs memory.nvme_dir" -- \
      "$KOLOS" check states.toml --set memory.offload=\"nvme\"
    # The file that holds the model while it is built (memory.md, "Memory
    # used"): a directory it cannot be created in, and one too small for
    # the model's 57 MiB, each a tmpfs in a mount namespace of the run's own.
    mkdir -p ro small
    expect_failure "memory \(chunks\): cannot create the file that holds the model while it is built, in ro: Read-only file system" -- \
      unshare --mount bash -c 'mount -t tmpfs -o ro,size=1m tmpfs ro && exec "$0" "$@"' \
      "$KOLOS" train states.toml --set memory.offload=\"nvme\" --set memory.nvme_dir=\"ro\"
    expect_failure "memory \(chunks\): writing the model as it is built to a file in small failed after [0-9]+ bytes: No space left on device" -- \
      unshare --mount bash -c 'mount -t tmpfs -o size=1m tmpfs small && exec "$0" "$@"' \
      "$KOLOS" train states.toml --set memory.offload=\"nvme\" --set memory.nvme_dir=\"small\"
    ;;
  *) fail "unknown case $case_name" ;;
esac
