# The memory estimate against the measured peak, one run at a time (source
# it after lib.sh; used by cases.sh and bench/run_memory_fit.sh).
#
# write_memory_configs writes the four models into the working directory:
#   states.toml       a 59M-parameter GPT whose states dominate (0.9 GiB of
#                     fp32 states per dp rank; one micro-batch of 2 x 32
#                     tokens a rank and step: a few MiB of activations)
#   activations.toml  a 3.4M-parameter GPT whose activations dominate
#                     (8 x 512 tokens a micro-batch)
# the two above are the ones the allowance is fitted on (run_memory_fit.sh);
# the two below differ from them in every shape and are used only to check
# the fitted estimate (run_memory_fit.sh --heldout):
#   wide.toml         52M parameters, 6 layers of hidden 768, 12 heads,
#                     sequence 48, vocabulary 12288
#   long.toml         5.7M parameters, 3 layers of hidden 384 with 6 heads,
#                     3 x 384 tokens a micro-batch
# 5 steps each: malloc's heap fragments over the first steps and the peak
# RSS grows with it before it settles (2 steps read up to 8% low).
write_memory_configs() {
  mkdir -p nvme
  cat >states.toml <<'TOML'
[model]
layers = 4
hidden = 1024
heads = 8
seq_len = 32
vocab = 8192
[train]
global_batch = 4
micro_batch = 2
steps = 5
[optim]
lr = 1e-3
TOML
  cat >activations.toml <<'TOML'
[model]
layers = 4
hidden = 256
heads = 8
seq_len = 512
vocab = 256
[train]
global_batch = 16
micro_batch = 8
steps = 5
TOML
  cat >wide.toml <<'TOML'
[model]
layers = 6
hidden = 768
heads = 12
seq_len = 48
vocab = 12288
[train]
global_batch = 8
micro_batch = 2
steps = 5
[optim]
lr = 1e-3
TOML
  cat >long.toml <<'TOML'
[model]
layers = 3
hidden = 384
heads = 6
seq_len = 384
vocab = 512
[train]
global_batch = 6
micro_batch = 3
steps = 5
TOML
}

# The runs, 2 ranks each: name | config | overrides. The fit set, on which
# the allowance is fitted (bench/run_memory_fit.sh; the e2e_memory_accuracy_*
# tests check most of it in CI):
memory_fit_runs=(
  # A model of a few MiB: what the process adds beyond its tensors and the
  # runtime (the fixed part, measured rather than fitted under the tuned heap).
  "tiny|states.toml|--set model.hidden=64 --set model.vocab=256 --set model.layers=2"
  "dp|states.toml|"
  "zero1|states.toml|--set parallel.zero.stage=1"
  "zero2|states.toml|--set parallel.zero.stage=2"
  "zero3|states.toml|--set parallel.zero.stage=3"
  "tp1d|states.toml|--set parallel.tensor.size=2"
  "pp2-1f1b|states.toml|--set parallel.pipeline.size=2"
  # bf16 with one 8-token micro-batch a rank and step: on a CPU without
  # AVX-512, LibTorch's bf16 matmul is its reference loop; the states, not
  # the tokens, are what this run checks.
  "bf16|states.toml|--set train.precision=\"bf16\" --set model.seq_len=8 --set train.global_batch=2 --set train.micro_batch=1"
  "llama|states.toml|--set model.name=\"llama\" --set model.kv_heads=2"
  "act-dp|activations.toml|"
  "act-full|activations.toml|--set train.recompute=\"full\""
  "act-sel|activations.toml|--set train.recompute=\"selective\""
  "act-sp2|activations.toml|--set parallel.sequence.size=2"
  "act-ring2|activations.toml|--set parallel.sequence.size=2 --set parallel.sequence.mode=\"ring\""
  "act-meg2|activations.toml|--set parallel.tensor.size=2 --set parallel.sequence.mode=\"megatron\""
  "act-llama|activations.toml|--set model.name=\"llama\""
)
# The held-out set: other shapes, and mixes the fit set does not have
# (bench/run_memory_fit.sh --heldout).
memory_heldout_runs=(
  "wide-zero3|wide.toml|--set parallel.zero.stage=3"
  "wide-llama-zero2-sel|wide.toml|--set model.name=\"llama\" --set model.kv_heads=4 --set parallel.zero.stage=2 --set train.recompute=\"selective\""
  "wide-pp2-zb|wide.toml|--set parallel.pipeline.size=2 --set parallel.pipeline.schedule=\"zb\""
  "wide-tp2-full|wide.toml|--set parallel.tensor.size=2 --set train.recompute=\"full\""
  "wide-bf16-zero1|wide.toml|--set train.precision=\"bf16\" --set parallel.zero.stage=1 --set model.seq_len=8 --set train.global_batch=2 --set train.micro_batch=1"
  "long-ring2-full|long.toml|--set parallel.sequence.size=2 --set parallel.sequence.mode=\"ring\" --set train.recompute=\"full\""
  "long-ulysses2-zero2|long.toml|--set parallel.sequence.size=2 --set parallel.zero.stage=2"
  "long-llama-megatron2|long.toml|--set model.name=\"llama\" --set model.kv_heads=2 --set parallel.tensor.size=2 --set parallel.sequence.mode=\"megatron\""
  "long-mixtral-ep2|long.toml|--set model.name=\"mixtral\" --set model.experts=4 --set model.top_k=2 --set parallel.expert.size=2"
  # [memory]: the states in chunks on NVMe under a budget of a quarter of
  # them (write_memory_configs makes ./nvme).
  "wide-chunks-nvme|wide.toml|--set memory.compute_budget=\"200MiB\" --set memory.offload=\"nvme\" --set memory.nvme_dir=\"nvme\""
  # Small runs of the fit set's models (tens to a few hundred MiB of
  # tensors), where the process's fixed part is a large share.
  "small-dp|activations.toml|--set train.micro_batch=2 --set train.global_batch=4"
  "small-ulysses2|activations.toml|--set train.micro_batch=2 --set train.global_batch=4 --set parallel.sequence.size=2"
  "small-tp2-full|activations.toml|--set train.micro_batch=1 --set train.global_batch=2 --set parallel.tensor.size=2 --set train.recompute=\"full\""
  "small-states-zero2|states.toml|--set model.hidden=256 --set model.vocab=2048 --set parallel.zero.stage=2"
)

# measure_memory NAME RANKS CONFIG [OVERRIDES...]: runs CONFIG on RANKS
# ranks and prints "NAME ESTIMATE RUNTIME PEAK" in bytes: the estimate
# `kolos run` printed (the one its engine checked before building the
# model), the runtime that estimate counted (rank 0's resident memory before
# the model existed) and the peak RSS the run measured (ru_maxrss of the
# whole process, the maximum over ranks and steps). Fails on a failed run.
measure_memory() {
  local name=$1 ranks=$2 config=$3
  shift 3
  timeout 600 "$KOLOS" run -n "$ranks" "$config" "$@" --set log.metrics="$name.jsonl" \
    --set log.progress=off >"$name.out" 2>&1 || { cat "$name.out" >&2; fail "$name: the run failed"; }
  python3 - "$name" "$name.out" "$name.jsonl" <<'PY' || { cat "$name.out" >&2; fail "$name: no estimate or metrics"; }
import json, re, sys
name, out, metrics = sys.argv[1:]
m = re.search(r"memory estimate .* per rank \((\d+) bytes, of which runtime (\d+);", open(out).read())
assert m, "no memory estimate line in the output"
peak = max(json.loads(l)["peak_rss_bytes"] for l in open(metrics))
print(name, m.group(1), m.group(2), peak)
PY
}

# memory_header, then memory_row NAME ESTIMATE RUNTIME PEAK for each run:
# the whole estimate against the whole peak, then the model's part of each
# (the runtime taken out of both), and that error against the 15% bound
# (memory_row fails past it).
memory_header() {
  printf '%-22s %11s %11s %8s   %11s %11s %8s\n' run estimate measured error \
    "est. - rt" "meas. - rt" error
}
memory_row() {
  python3 - "$@" <<'PY'
import sys
name, (e, r, p) = sys.argv[1], map(float, sys.argv[2:5])
M = 2**20
err = (e - r) / (p - r) - 1
print(f"{name:22s} {e / M:9.1f}Mi {p / M:9.1f}Mi {100 * (e / p - 1):+7.1f}%   {(e - r) / M:9.1f}Mi "
      f"{(p - r) / M:9.1f}Mi {100 * err:+7.1f}% {'ok' if abs(err) <= 0.15 else 'OFF'}")
sys.exit(abs(err) > 0.15)
PY
}
