#!/usr/bin/env bash
# End-to-end checkpoint cases with the real `kolos`, mpirun, h5dump, h5py:
#   cases.sh CASE       (environment: KOLOS, KOLOS_SOURCE_DIR, MPIEXEC,
#                        KOLOS_FAULT_LIB_DIR: the test copy of libkolos_checkpoint;
#                        interop_pip, hf_gpt2: KOLOS_VENV, GPT_LOGITS)
set -uo pipefail
case_name=$1
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
PY=/usr/bin/python3   # Debian's python3-h5py / numpy
if [[ $case_name == interop_pip || $case_name == hf_gpt2 ]]; then
  # pip's h5py, safetensors, transformers, torch (scripts/install-venv.sh)
  use_venv h5py safetensors transformers torch
fi

{
  tiny_gpt_model
  cat <<'TOML'
[data]
kind = "synthetic"
[optim]
lr = 3e-3
warmup_steps = 3
[train]
global_batch = 16
micro_batch = 4
steps = 12
seed = 7
[log]
progress = "off"
[checkpoint]
dir = "ckpt"
every = 4
TOML
} >run.toml

# train NP [kolos train args...]
train() {
  local np=$1; shift
  timeout 300 "$MPIEXEC" -np "$np" --oversubscribe --mca mpi_yield_when_idle 1 --bind-to none \
    "$KOLOS" train run.toml "$@"
}

# One rank of `kolos train run.toml`, as a plain command (for expect_failure).
train1=("$MPIEXEC" -np 1 --oversubscribe --bind-to none "$KOLOS" train run.toml)


# same_tensors DIR_A DIR_B: every dataset of the two index files equal, bit for bit.
same_tensors() {
  $PY - "$1" "$2" <<'PYEOF' || fail "tensors differ between $1 and $2"
import sys, h5py, numpy as np
a, b = (h5py.File(p + "/index.h5", "r") for p in sys.argv[1:3])
names = []
a.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) and not n.startswith("rng") else None)
assert len(names) > 100, names
bad = [n for n in names if a[n][()].tobytes() != b[n][()].tobytes()]
print(len(names), "datasets compared,", len(bad), "differ", bad[:3])
sys.exit(1 if bad else 0)
PYEOF
}

case "$case_name" in
  interop|interop_pip)
    # h5dump and h5py read global tensors by name; the safetensors export
    # holds the same values; `inspect` and `verify` describe the checkpoint.
    # interop: Debian's h5py (HDF5 1.10, as kolos writes); interop_pip: pip's
    # h5py (its own, newer HDF5) and the safetensors package, both required.
    train 2 >log.txt 2>&1 || { cat log.txt; fail "training failed"; }
    ckpt=ckpt/step-00000012
    [[ $(cat ckpt/latest) == step-00000012 ]] || fail "latest is $(cat ckpt/latest)"
    "$KOLOS" ckpt inspect ckpt >inspect.txt || fail "inspect failed"
    cat inspect.txt
    grep -q "step 12" inspect.txt && grep -q "mesh pp=1 dp=2 sp=1 tp=1" inspect.txt &&
      grep -q "/model/h.0.mlp.up_proj.weight *float32 \[128, 32\]" inspect.txt || fail "inspect output"
    "$KOLOS" ckpt verify ckpt || fail "verify of a sound checkpoint failed"
    "$KOLOS" ckpt export ckpt --format safetensors -o model.safetensors || fail "export failed"
    # h5dump from another directory (relative VDS sources resolve next to index.h5).
    (cd / && h5dump -d /model/h.0.attn.q_proj.weight -w 0 "$work/$ckpt/index.h5") >dump.txt ||
      fail "h5dump failed"
    $PY - "$ckpt" "$case_name" <<'PYEOF' || fail "interop values differ"
import json, re, struct, sys
import h5py, numpy as np
ckpt, case = sys.argv[1:3]
print("h5py", h5py.__version__, "with HDF5", h5py.version.hdf5_version, "from", h5py.__file__)
if case == "interop_pip":
    assert "dist-packages" not in h5py.__file__, "this is not pip's h5py"
name = "h.0.attn.q_proj.weight"
idx = h5py.File(ckpt + "/index.h5", "r")
w = idx["model/" + name][()]
assert w.shape == (32, 32) and w.dtype == np.float32 and np.isfinite(w).all()
# h5dump's text, parsed: the same values (h5dump prints 6-7 significant digits).
text = open("dump.txt").read()
data = text[text.index("DATA {"):]
data = data[:data.index("}")]
values = [float(v) for v in re.findall(r"(?<=[:,] )-?[0-9.]+(?:e[-+]?[0-9]+)?", data)]
assert len(values) == w.size, (len(values), w.size)
assert np.allclose(np.array(values, dtype=np.float32).reshape(w.shape), w, rtol=1e-5, atol=1e-7)
# The shard holds the same bytes (dp2: one writer, a whole piece).
shard = h5py.File(ckpt + "/shard-0.h5", "r")["model/" + name]
assert shard[()].tobytes() == w.tobytes()
# A small safetensors reader: 8-byte header length, JSON header, raw data.
raw = open("model.safetensors", "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
header = json.loads(raw[8:8 + n])
body = raw[8 + n:]
params = [k for k in header if k != "__metadata__"]
assert len(params) == len(idx["model"]), (len(params), len(idx["model"]))
for k in params:
    e = header[k]
    assert e["dtype"] == "F32"
    b, end = e["data_offsets"]
    t = np.frombuffer(body[b:end], dtype="<f4").reshape(e["shape"])
    assert t.tobytes() == idx["model/" + k][()].tobytes(), k
try:
    import safetensors
    from safetensors import safe_open
    from safetensors.numpy import load_file
    st = load_file("model.safetensors")
    assert sorted(st) == sorted(params), (sorted(st), sorted(params))
    assert all(st[k].tobytes() == idx["model/" + k][()].tobytes() for k in params)
    with safe_open("model.safetensors", framework="np") as f:
        assert f.metadata()["kolos.step"] == "12", f.metadata()
    print("safetensors", safetensors.__version__, "read it too")
except ImportError:
    if case == "interop_pip":
        raise
    print("(python safetensors not installed; the format is checked by the reader above)")
print("h5dump, h5py, shard and safetensors agree on", len(params), "tensors")
PYEOF
    ;;
  hf_gpt2)
    # A GPT-2-shaped kolos model, trained on 2 ranks with tensor parallelism
    # (so the export gathers sharded pieces), exported with --format hf and
    # loaded by transformers' GPT2LMHeadModel: the same logits as kolos's own
    # forward (gpt_logits) within 1e-5, in both attention implementations.
    cat >gpt2.toml <<'TOML'
[model]
name = "gpt"
layers = 3
hidden = 64
heads = 4
seq_len = 32
vocab = 96
[data]
kind = "synthetic"
[optim]
lr = 1e-2
warmup_steps = 2
[train]
global_batch = 8
micro_batch = 4
steps = 10
seed = 11
[parallel]
tensor = 2
[log]
progress = "off"
[checkpoint]
dir = "ckpt"
TOML
    timeout 300 "$MPIEXEC" -np 2 --oversubscribe --mca mpi_yield_when_idle 1 --bind-to none \
      "$KOLOS" train gpt2.toml >log.txt 2>&1 || { cat log.txt; fail "training failed"; }
    "$KOLOS" ckpt export ckpt --format hf -o hf || fail "export --format hf failed"
    [[ -s hf/model.safetensors && -s hf/config.json ]] || fail "export wrote no model.safetensors/config.json"
    # 2 rows of 32 tokens: the whole context, every position.
    # shellcheck disable=SC2046
    "$GPT_LOGITS" ckpt kolos.safetensors 2 $($PY -c "
import random; r = random.Random(5); print(*[r.randrange(96) for _ in range(64)])") ||
      fail "gpt_logits failed"
    $PY - <<'PYEOF' || fail "transformers' GPT-2 disagrees with kolos"
import json, warnings
warnings.filterwarnings("ignore")
import torch, transformers
from safetensors.torch import load_file
from transformers import GPT2LMHeadModel
ref = load_file("kolos.safetensors")
tokens, expected = ref["tokens"], ref["logits"]
assert tuple(expected.shape) == (2, 32, 96), expected.shape
worst = 0.0
for attn in ("eager", "sdpa"):
    model, info = GPT2LMHeadModel.from_pretrained("hf", output_loading_info=True, attn_implementation=attn)
    model.eval()
    bad = {k: v for k, v in info.items() if v}
    assert not bad, f"loading reported {bad}"
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(), "head not tied"
    # Trained, so every layout mistake would show: norms and biases moved.
    h0 = model.transformer.h[0]
    assert (h0.ln_1.weight - 1).abs().max() > 1e-3 and h0.attn.c_attn.bias.abs().max() > 1e-3
    with torch.no_grad():
        logits = model(tokens).logits
    diff = (logits - expected).abs().max().item()
    worst = max(worst, diff)
    print(f"transformers {transformers.__version__} ({attn}): max |logits - kolos| = {diff:.3g}, "
          f"logits span {expected.min().item():.3f}..{expected.max().item():.3f}")
assert worst < 1e-5, worst
PYEOF
    ;;
  resume_after_stop)
    # Uninterrupted 30 steps vs: SIGTERM mid-run (a checkpoint is written
    # before exit 3), then --resume to the end: the same losses, and the
    # final checkpoints equal bit for bit.
    sed -i 's/^steps = 12/steps = 300/; s/^every = 4/every = 0/' run.toml
    train 2 --set checkpoint.dir=straight --set log.metrics=straight.jsonl >log.txt 2>&1 ||
      { cat log.txt; fail "straight run failed"; }
    # SIGTERM to the ranks themselves, as Slurm's preemption sends it (mpirun
    # would take a SIGTERM for itself and end the job).
    "$MPIEXEC" -np 2 --oversubscribe --mca mpi_yield_when_idle 1 --bind-to none \
      "$KOLOS" train run.toml --set log.metrics=first.jsonl >first.txt 2>&1 &
    pid=$!
    for _ in $(seq 1 600); do
      [[ -s first.jsonl && $(wc -l <first.jsonl) -ge 5 ]] && break
      sleep 0.05
    done
    ranks=$(ps -o pid= --ppid $pid)
    [[ -n $ranks ]] || fail "no rank processes under mpirun ($pid)"
    # shellcheck disable=SC2086
    kill -TERM $ranks
    timeout 60 tail --pid=$pid -f /dev/null || { kill -9 $pid; fail "did not stop within 60 s"; }
    wait $pid
    rc=$?
    cat first.txt
    [[ $rc -eq 3 ]] || fail "exit $rc after SIGTERM, expected 3"
    stopped=$(wc -l <first.jsonl)
    [[ $stopped -lt 300 ]] || fail "the run ended before the signal; make it longer"
    [[ $(cat ckpt/latest) == $(printf "step-%08d" "$stopped") ]] ||
      fail "latest is $(cat ckpt/latest), expected the stop step $stopped"
    train 2 --resume --set log.metrics=second.jsonl >second.txt 2>&1 ||
      { cat second.txt; fail "resume failed"; }
    grep -q "resumed from ckpt/step-" second.txt || fail "no resume message"
    same_tensors straight/step-00000300 ckpt/step-00000300
    $PY - <<'PYEOF' || fail "losses differ"
import json
loss = lambda f: [json.loads(l)["loss"] for l in open(f)]
a, b = loss("straight.jsonl"), loss("first.jsonl") + loss("second.jsonl")
assert a == b, (a, b)
print(len(a), "losses identical")
PYEOF
    ;;
  restart_smaller)
    # `kolos run -n 4` with a rank dead mid-run, then
    # `kolos run -n 2 --resume`: training continues from `latest` with the
    # losses of an uninterrupted 2-rank run (same global batch and data; the
    # 4-rank history differs only in the order of floating-point sums).
    sed -i 's/^steps = 12/steps = 40/' run.toml
    kolos_run() { timeout 300 "$KOLOS" run "$@"; }
    kolos_run -n 2 run.toml --set parallel.data=2 --set checkpoint.dir=straight \
      --set log.metrics=straight.jsonl >log.txt 2>&1 || { cat log.txt; fail "straight run failed"; }
    # Rank 3 of 4 dies at a fixed point of the run, not after a timer: the
    # test copy of libkolos_checkpoint (preloaded, as in kill_mid_save)
    # ends it right after it wrote its part of step 16's save. The job must
    # end, non-zero, with no rank left; step 12 stays the latest.
    fault_lib=$KOLOS_FAULT_LIB_DIR/libkolos_checkpoint.so
    [[ -f $fault_lib ]] || fail "no test copy of the checkpoint library at $fault_lib"
    marker=$((4400000 + RANDOM))
    first="first-$marker.jsonl"  # the name marks this job's processes
    env LD_PRELOAD="$fault_lib" KOLOS_CKPT_TEST_DIE_RANK=3 KOLOS_CKPT_TEST_DIE_STEP=16 \
      timeout 300 "$KOLOS" run -n 4 run.toml --set parallel.data=4 --set "log.metrics=$first" >first.txt 2>&1
    rc=$?
    grep -q "rank 3 dies in the middle of saving step 16" first.txt ||
      { cat first.txt; fail "the test hook did not fire (exit $rc)"; }
    [[ $rc -ne 0 && $rc -ne 124 ]] || { cat first.txt; fail "the job did not end with an error after rank 3 died (exit $rc)"; }
    ! pgrep -f "first-$marker" >/dev/null || { pkill -9 -f "first-$marker"; fail "ranks left behind"; }
    latest=$(cat ckpt/latest) || fail "no checkpoint was written before the death"
    at=$((10#${latest#step-}))
    [[ $latest == step-00000012 ]] || fail "latest is $latest, expected step-00000012"
    kolos_run -n 2 run.toml --resume --set parallel.data=2 --set log.metrics=second.jsonl \
      >second.txt 2>&1 || { cat second.txt; fail "resume at 2 ranks failed"; }
    grep -q "resumed from ckpt/$latest at step $at" second.txt || { cat second.txt; fail "did not resume from $latest"; }
    $PY - straight.jsonl second.jsonl "$at" <<'PYEOF' || fail "the resumed losses differ from the uninterrupted run's"
import json, sys
def losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, open(path)) if "loss" in r}
a, b, at = losses(sys.argv[1]), losses(sys.argv[2]), int(sys.argv[3])
steps = [s for s in sorted(b) if s > at]
assert steps and steps[-1] == 40, steps
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in steps)
print(len(steps), "steps after the restart at", at, "- largest relative loss difference", worst)
sys.exit(0 if worst <= 1e-4 else 1)
PYEOF
    ;;
  kill_mid_save)
    # Rank 1 dies after writing its part of the step-8 save: the job fails,
    # step-4 stays the latest and sound; a resumed run clears the leftover.
    sed -i 's/^micro_batch = 4/micro_batch = 2/; s/^global_batch = 16/global_batch = 8/' run.toml
    sed -i 's/^\[checkpoint\]/[parallel]\ndata = 2\n[checkpoint]/' run.toml
    # shard per rank: ZeRO-free dp writes only rank 0; make rank 1 die anyway.
    # Only the test copy of libkolos_checkpoint (KOLOS_FAULT_LIB_DIR) has the
    # switch; the installed library ignores these variables. The ranks get
    # it with LD_PRELOAD: the loader then takes the preloaded object for
    # kolos's libkolos_checkpoint.so (same soname) whatever the binary's
    # search path says. LD_LIBRARY_PATH, used before, loses to a DT_RPATH,
    # which Spack's compiler wrapper writes (--disable-new-dtags): such a
    # kolos loaded the library without the switch, no rank died, and the
    # job "survived a dead rank". The death is at a fixed point (after the
    # shard write of step 8), never a timing.
    fault_lib=$KOLOS_FAULT_LIB_DIR/libkolos_checkpoint.so
    [[ -f $fault_lib ]] || fail "no test copy of the checkpoint library at $fault_lib"
    timeout 300 "$MPIEXEC" -np 2 --oversubscribe --mca mpi_yield_when_idle 1 --bind-to none \
      env LD_PRELOAD="$fault_lib" KOLOS_CKPT_TEST_DIE_RANK=1 KOLOS_CKPT_TEST_DIE_STEP=8 \
      "$KOLOS" train run.toml >log.txt 2>&1
    rc=$?
    cat log.txt
    grep -q "rank 1 dies in the middle of saving step 8" log.txt ||
      fail "the test hook did not fire (is $fault_lib the library the ranks loaded?)"
    [[ $rc -ne 0 && $rc -ne 124 ]] || fail "the job survived a dead rank (exit $rc)"
    [[ $(cat ckpt/latest) == step-00000004 ]] || fail "latest is $(cat ckpt/latest)"
    [[ ! -e ckpt/step-00000008 ]] || fail "a half-written step-8 was committed"
    "$KOLOS" ckpt verify ckpt || fail "the previous checkpoint is damaged"
    train 2 --resume >log.txt 2>&1 || { cat log.txt; fail "resume failed"; }
    grep -q "resumed from ckpt/step-00000004" log.txt || fail "did not resume from step 4"
    [[ $(cat ckpt/latest) == step-00000012 ]] || fail "latest is $(cat ckpt/latest)"
    ls -a ckpt | grep -q "^\.tmp" && fail "a temporary directory was left behind"
    "$KOLOS" ckpt verify ckpt || fail "verify"
    ;;
  damaged)
    # Bit flip, truncation, a missing shard, another model's shape: `verify`
    # and `train --resume` fail naming the file and dataset, and write nothing.
    train 1 >log.txt 2>&1 || { cat log.txt; fail "training failed"; }
    good=ckpt/step-00000012
    check() {  # check NAME VERIFY_REGEX RESUME_REGEX
      local before
      before=$(cd "$2" && md5sum * | sort)
      expect_failure "$3" -- "$KOLOS" ckpt verify "$2"
      expect_failure "$4" -- "${train1[@]}" --resume "$2" --set checkpoint.dir=other
      [[ $(cd "$2" && md5sum * | sort) == "$before" ]] || fail "$1: the checkpoint was modified"
      [[ ! -e other/latest ]] || fail "$1: a failed resume wrote a checkpoint"
    }
    cp -r $good flip
    off=$($PY -c "import h5py; print(h5py.File('flip/shard-0.h5','r')['model/h.1.mlp.up_proj.weight'].id.get_offset())")
    $PY -c "
f = open('flip/shard-0.h5', 'r+b'); f.seek($off + 100); b = f.read(1); f.seek($off + 100)
f.write(bytes([b[0] ^ 0x10]))"
    check bitflip flip "flip/shard-0.h5: dataset /model/h.1.mlp.up_proj.weight: checksum mismatch" \
      "flip/shard-0.h5: dataset /model/h.1.mlp.up_proj.weight: checksum mismatch"
    cp -r $good trunc
    truncate -s 100000 trunc/shard-0.h5
    check truncated trunc "trunc/shard-0.h5" "trunc/shard-0.h5"
    cp -r $good missing
    rm missing/shard-0.h5
    check missing missing "missing shard missing/shard-0.h5" "missing shard missing/shard-0.h5"
    before=$(cd $good && md5sum * | sort)
    expect_failure "$good/index.h5: dataset /model/embed.wte.weight has shape \[64, 32\], this run's is \[64, 48\]" -- \
      "${train1[@]}" --resume $good --set model.hidden=48 --set checkpoint.dir=other
    [[ $(cd $good && md5sum * | sort) == "$before" ]] || fail "the checkpoint was modified"
    expect_failure "no checkpoint at nowhere" -- "${train1[@]}" --resume nowhere
    ;;
  *)
    fail "unknown case $case_name"
    ;;
esac
echo "PASS: $case_name"
