#!/usr/bin/env bash
# Expert parallelism: kolos's mixtral at ep 2 against the same model at dp 2
# and against a plain PyTorch expert-parallel peer (all_to_all_single), on
# one shape and the same samples, all measured in this one invocation.
#
#   bench/run_moe_bench.sh [--layers 4] [--hidden 256] [--heads 8] [--kv-heads 2]
#                          [--ffn-hidden 512] [--experts 8] [--top-k 2]
#                          [--seq-len 64] [--vocab 2048] [--global-batch 16]
#                          [--micro-batch 4] [--steps 20] [--warmup 5]
#                          [--threads 1] [--build build]
#
# Builds nothing: it needs build/bin/kolos and its plugins, OpenMPI's mpirun
# and the virtual environment of scripts/install-venv.sh ($KOLOS_VENV,
# default .cache/torch-venv; `make venv`) for the peer. It writes a
# temporary TOML for the shape, then runs, in this order:
#   kolos-dp2  kolos run -n 2 CFG  (parallel.data = 2: every rank holds every expert)
#   kolos-ep2  kolos run -n 2 CFG  (data = 2, expert = 2: experts/2 per rank, all-to-all)
#   torch-ep2  bench/peers/mixtral_ep.py --ranks 2  (PyTorch, gloo all_to_all_single)
# and prints each run's median step time (steps after the first --warmup; a
# step's time is the slowest rank's), tokens/s, first and last loss, kolos's
# mean expert_cv, and the ratios kolos-ep2 / torch-ep2 and kolos-ep2 /
# kolos-dp2, with both models' parameter counts. All three train on the same
# samples (kolos's synthetic source, reimplemented bit for bit by the peer);
# the peer's initial weights differ, so its routing differs too.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)

layers=4 hidden=256 heads=8 kv_heads=2 ffn_hidden=512 experts=8 top_k=2
seq_len=64 vocab=2048 global_batch=16 micro_batch=4 steps=20 warmup=5
threads=1 build=build

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_options "${BASH_SOURCE[0]}" "layers hidden heads kv_heads ffn_hidden experts top_k seq_len vocab global_batch micro_batch steps warmup threads build" "$@"

cd "$root"
bench_peer run_moe_bench.sh torch2 torch
bench_kolos run_moe_bench.sh
bench_tmp moe-bench
cfg=$tmp/mixtral.toml
model=$(bench_gpt_model | sed 's/^name = "gpt"/name = "mixtral"/')
bench_train_toml "$cfg" "$model
kv_heads = $kv_heads
ffn_hidden = $ffn_hidden
experts = $experts
top_k = $top_k
aux_loss_coef = 0.01" "data = 2"

echo "shape: mixtral layers $layers, hidden $hidden, heads $heads/$kv_heads kv, ffn_hidden $ffn_hidden, experts $experts top_k $top_k, seq_len $seq_len, vocab $vocab, global_batch $global_batch, micro_batch $micro_batch, $steps steps (median of the last $((steps - warmup)))"
bench_machine
echo "peer: $python, torch $("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null); kolos: $("$kolos" version 2>/dev/null | tr -s ' \n' ' ')"

run_kolos() {  # name, extra --set arguments...
  local name=$1; shift
  KOLOS_THREADS=$threads "$kolos" run -n 2 "$cfg" --set log.metrics="$tmp/$name.jsonl" "$@" \
    > "$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log" >&2; exit 1; }
}
echo "[1/3] kolos-dp2: $kolos run -n 2 (data 2, $threads thread per rank)" >&2
run_kolos kolosdp2
echo "[2/3] kolos-ep2: $kolos run -n 2 (data 2, expert 2)" >&2
run_kolos kolosep2 --set parallel.expert=2
echo "[3/3] torch-ep2: $python bench/peers/mixtral_ep.py --ranks 2" >&2
"$python" "$here/peers/mixtral_ep.py" --ranks 2 --threads "$threads" --layers "$layers" \
  --hidden "$hidden" --heads "$heads" --kv-heads "$kv_heads" --ffn-hidden "$ffn_hidden" \
  --experts "$experts" --top-k "$top_k" --seq-len "$seq_len" --vocab "$vocab" \
  --global-batch "$global_batch" --micro-batch "$micro_batch" --steps "$steps" \
  --warmup "$warmup" > "$tmp/torchep2.json" 2> "$tmp/torchep2.log" ||
  { cat "$tmp/torchep2.log" >&2; exit 1; }

echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
"$python" - "$tmp" "$warmup" "$global_batch" "$seq_len" <<'PY'
import json, statistics, sys
tmp, warmup, batch, seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

def rows(name):
    return [json.loads(l) for l in open(f"{tmp}/{name}.jsonl") if l.strip()]

def kolos(name):
    r = rows(name)
    times = [x["step_time_s"] for x in r if x["step"] > warmup]
    cv = statistics.mean(x["expert_cv"] for x in r)
    return statistics.median(times), r[0]["loss"], r[-1]["loss"], cv

peer = json.loads(open(f"{tmp}/torchep2.json").read().strip().splitlines()[-1])
runs = [("kolos-dp2", kolos("kolosdp2")), ("kolos-ep2", kolos("kolosep2")),
        ("torch-ep2", (peer["step_time_s_median"], peer["first_loss"], peer["final_loss"], None))]
print()
print(f"{'run':<10} {'median step ms':>15} {'tokens/s':>10} {'loss first -> last':>20} {'expert cv':>10}")
for name, (med, first, last, cv) in runs:
    cvs = "-" if cv is None else f"{cv:.3f}"
    print(f"{name:<10} {med * 1e3:>15.1f} {batch * seq / med:>10.0f} {first:>9.4f} -> {last:<8.4f} {cvs:>10}")
m = {name: v[0] for name, v in runs}
print()
print(f"kolos-ep2 / torch-ep2 (step time, the same expert-parallel model): {m['kolos-ep2'] / m['torch-ep2']:.3f}")
print(f"kolos-ep2 / kolos-dp2 (expert parallelism against replicated experts): {m['kolos-ep2'] / m['kolos-dp2']:.3f}")
kolos_p = rows("kolosdp2")[-1]["param_bytes"] // 4
print(f"parameters: kolos {kolos_p} ({kolos_p / 1e6:.2f} M), torch-ep2 {peer['parameters']}"
      + ("" if kolos_p == peer["parameters"] else "  ** DIFFERENT MODEL SHAPES **"))
PY
