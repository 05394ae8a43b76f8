#!/usr/bin/env bash
# Pipeline schedules side by side: measured idle fraction vs the theoretical
# bubble and step time, for gpipe, 1f1b, interleaved (chunks = 2) and zb, on
# the same GPT and ranks, at P = 2 and P = 4.
#
#   bench/run_pipeline_bench.sh [--build build] [--steps 10] [--warmup 3] [--ranks "2 4"]
#                               [--peer none|torch2] [--set key=value ...]
#
# Builds nothing: needs build/bin/bench_pipeline and the pipeline plugin
# (ninja -C build bench_pipeline). More ranks than cores run oversubscribed
# (mpi_yield_when_idle), which inflates idle time; on such a machine compare
# the schedules with each other rather than with the theory.
#
# --peer torch2 also runs, after kolos at each P, PyTorch 2.x's
# torch.distributed.pipelining on the same ranks (bench/peers/gpt_pipelining.py,
# gloo, under the virtual environment of scripts/install-venv.sh:
# $KOLOS_VENV, default .cache/torch-venv): ScheduleGPipe, Schedule1F1B,
# ScheduleInterleaved1F1B (2 stages per rank) and ScheduleInterleavedZeroBubble
# (1 stage per rank, ZB-H1) on the same GPT shape, the same stage cut, the
# same samples and micro-batches, and prints each schedule's step time next
# to kolos's and their ratio. The shape (layers=... below) is passed to both (--set
# model.* / train.* changes kolos only: use the variables' defaults).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
build=build peer=none ranks="2 4" steps=10 warmup=3
# bench/pipeline/pipeline_bench.cpp's model, written out so the peer gets it too.
layers=6 hidden=128 heads=4 seq_len=64 vocab=512 global_batch=32 micro_batch=4
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift ;;
    --peer) peer=$2; shift ;;
    --ranks) ranks=$2; shift ;;
    --steps) steps=$2; shift ;;
    --warmup) warmup=$2; shift ;;
    -h|--help) sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) args+=("$1") ;;
  esac
  shift
done
bin="$root/$build/bin/bench_pipeline"
[[ -x "$bin" ]] || { echo "missing $bin: ninja -C $build bench_pipeline" >&2; exit 1; }
case "$peer" in
  none) ;;
  torch2) python=${KOLOS_VENV:-$root/.cache/torch-venv}/bin/python
    [[ -x $python ]] || { echo "run_pipeline_bench.sh: $python missing (scripts/install-venv.sh)" >&2; exit 1; } ;;
  *) echo "run_pipeline_bench.sh: --peer is none or torch2, not '$peer'" >&2; exit 2 ;;
esac
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
shape=(--set model.layers=$layers --set model.hidden=$hidden --set model.heads=$heads
       --set model.seq_len=$seq_len --set model.vocab=$vocab
       --set train.global_batch=$global_batch --set train.micro_batch=$micro_batch)
echo "shape: layers $layers, hidden $hidden, heads $heads, seq_len $seq_len, vocab $vocab, global_batch $global_batch, micro_batch $micro_batch; $steps steps after $warmup warm-up"
echo "machine: $(env -u OMP_NUM_THREADS nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), load average $(cut -d' ' -f1-3 /proc/loadavg) at start"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kolos-pipeline-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
for p in $ranks; do
  mpirun -np "$p" --oversubscribe --mca mpi_yield_when_idle 1 --bind-to none \
    "$bin" --steps "$steps" --warmup "$warmup" "${shape[@]}" ${args[@]+"${args[@]}"} |
    tee "$tmp/kolos$p.out"
  [[ $peer == torch2 ]] || continue
  echo "[peer] torch.distributed.pipelining on $p ranks ($python)" >&2
  "$python" "$here/peers/gpt_pipelining.py" --ranks "$p" --threads 1 --layers "$layers" \
    --hidden "$hidden" --heads "$heads" --seq-len "$seq_len" --vocab "$vocab" \
    --global-batch "$global_batch" --micro-batch "$micro_batch" --steps "$steps" \
    --warmup "$warmup" --lr 1e-3 --warmup-steps 2 > "$tmp/peer$p.json" 2> "$tmp/peer$p.log" ||
    { cat "$tmp/peer$p.log" >&2; exit 1; }
  "$python" - "$tmp/kolos$p.out" "$tmp/peer$p.json" <<'PY'
import json, sys
kolos = json.loads([l for l in open(sys.argv[1]) if l.startswith('{"P"')][-1])
peer = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
k = {s["schedule"]: s for s in kolos["schedules"]}
names = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B",
         "interleaved": "ScheduleInterleaved1F1B", "zb": "ScheduleInterleavedZeroBubble"}
print(f"\nkolos vs torch.distributed.pipelining (torch {peer['torch']}, gloo), P={peer['P']} "
      f"M={peer['M']} (kolos M={kolos['M']}), {peer['threads']} thread per rank")
print(f"{'schedule':<12} {'V':>2} {'peer schedule':<30} {'blocks/stage':<14} {'kolos ms':>9} "
      f"{'torch ms':>9} {'kolos/torch':>11} {'torch loss':>18}")
for s in peer["schedules"]:
    km = k[s["schedule"]]["step_ms"]
    print(f"{s['schedule']:<12} {s['chunks']:>2} {names[s['schedule']]:<30} "
          f"{','.join(map(str, s['blocks_per_stage'])):<14} {km:>9.1f} {s['step_ms']:>9.1f} "
          f"{km / s['step_ms']:>11.3f} {s['first_loss']:>8.4f}->{s['final_loss']:<8.4f}")
print(f"peer parameters: {peer['schedules'][0]['parameters']} (the last stage's copy of the "
      f"tied embedding not counted)")
PY
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
