#!/usr/bin/env bash
# `kolos generate` end to end:  cases.sh CASE
# (environment: KOLOS, MPIEXEC, KOLOS_VENV, KOLOS_SOURCE_DIR)
# hf_gpt2, hf_llama, hf_mixtral: a random GPT-2 / LLaMA with grouped-query
#        attention / Mixtral (4 experts, top 2) made by transformers; its
#        greedy generate (eager attention, 64 new tokens, two prompts)
#        against kolos generate on the model imported with `kolos ckpt
#        import --format hf`: serial (weights packed, and with
#        inference.pack_weights = false), tp1d over 2 ranks, 2 pipeline stages;
#        GPT-2 also straight from the Hugging Face directory, streamed, as
#        text through a tokenizer, with a stop string; bf16 runs (LLaMA).
# moe:   a mixtral trained by `kolos run` under expert parallelism (ep 2)
#        with auxiliary-loss-free balancing and a capacity factor serves,
#        dropless, the same greedy tokens serially, under tp1d on 2 ranks
#        and in 2 pipeline stages.
# zero3: checkpoints trained by `kolos run` under ZeRO-3 on 2 ranks serve
#        the same greedy tokens serially, under tp1d on 2 ranks, in 2
#        pipeline stages, and (GPT) in 2 stages of tp1d x 2.
# batching: requests served together, with a pool so small that sequences
#        are preempted and recomputed and prompts chunked, give each the
#        tokens it gets alone; greedy and sampled (seeded); every KV block is
#        free at the end. (Two sampled runs with the same seed giving the
#        same tokens is part of that: "alone" and "together" are two runs.)
# serve: kolos serve on 127.0.0.1 (any free port) driven by serve_client.py:
#        completions equal kolos generate, streamed equals not streamed,
#        4xx errors, disconnects and concurrent requests free every block,
#        SIGTERM exits 0; a burst past --max-queue gets 429s.
# chat:  kolos serve with chat templates written in make_chat_model.py
#        (ChatML-style from tokenizer_config.json, LLaMA-3-style, and a
#        LLaMA-2-style one with raise_exception given by --chat-template),
#        driven by chat_client.py: renderings equal transformers'
#        apply_chat_template, greedy chat equals transformers' generate,
#        logprobs equal its log_softmax within 1e-4 (chat and completions),
#        streamed equals not streamed, bad messages get 400 naming the field;
#        a missing or unsupported --chat-template is refused at start.
# bad:   an unknown [inference] key, a value out of range, a prompt longer
#        than the context, a token outside the vocabulary, a pool smaller
#        than one context, checkpoints it cannot serve: clear errors, exit != 0.
set -uo pipefail
case_name=$1
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
here=$KOLOS_SOURCE_DIR/tests/e2e/inference
PROMPTS="5,17,42,3,88,1,9;1,2,3"
MPI=(--mpirun "$MPIEXEC")

need_venv() { use_venv safetensors transformers torch; }

# generate OUT ARGS...: kolos generate, stdout to OUT, stderr shown on failure.
generate() {
  local out=$1; shift
  timeout 120 "$KOLOS" generate "$@" >"$out" 2>"$out.err" ||
    { cat "$out.err"; fail "kolos generate $* failed"; }
}

# ids_of OUT: the request lines of a multi-request run, in request order, without "[i] ".
ids_of() { sort -t']' -k1.2n "$1" | sed 's/^\[[0-9]*\] //'; }

# same FILE FILE WHAT
same() {
  if ! diff -u "$1" "$2"; then fail "$3: the token ids differ"; fi
  echo "ok: $3 ($(wc -l <"$1") sequences of $(head -1 "$1" | wc -w) tokens)"
}

# start_server LOG ARGS...: kolos serve ARGS on 127.0.0.1, any free port,
# in the background; sets $server (its pid) and $port.
start_server() {
  local log=$1; shift
  "$KOLOS" serve "$@" --port 0 >"$log.out" 2>"$log" &
  server=$!
  port=""
  for _ in $(seq 1 300); do
    port=$(sed -n 's/.*serving on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$log")
    [[ -n $port ]] && break
    kill -0 $server 2>/dev/null || break
    sleep 0.1
  done
  [[ -n $port ]] || { cat "$log"; kill $server 2>/dev/null; fail "kolos serve $* did not start"; }
}

# stop_server LOG: SIGTERM, and an orderly exit 0 within 10 s.
stop_server() {
  kill -TERM $server
  for _ in $(seq 1 100); do kill -0 $server 2>/dev/null || break; sleep 0.1; done
  kill -0 $server 2>/dev/null && { kill -KILL $server; fail "kolos serve did not stop on SIGTERM"; }
  wait $server || { cat "$1"; fail "kolos serve did not exit 0 on SIGTERM"; }
}

prompt_args() {
  local IFS=';'
  for p in $PROMPTS; do printf -- '--prompt-ids\n%s\n' "$p"; done
}
mapfile -t PROMPT_ARGS < <(prompt_args)

hf_case() {
  local kind=$1
  need_venv
  "$PY" "$here/make_hf_model.py" "$kind" "$kind" "$PROMPTS" || fail "making the $kind model failed"
  "$KOLOS" ckpt import "$kind" --format hf -o "$kind.ckpt" >import.txt 2>&1 ||
    { cat import.txt; fail "kolos ckpt import of $kind failed"; }
  generate serial.txt "$kind.ckpt" "${PROMPT_ARGS[@]}" --max-tokens 64
  ids_of serial.txt >serial.ids
  same "$kind.expected" serial.ids "$kind: kolos generate (serial) = transformers generate (greedy, eager)"
  # kolos's panels on a CPU with AVX2 (CI's have it), oneDNN's layout below
  # that: both must give transformers' tokens.
  grep -q "linear layers packed (kolos panels, avx" serial.txt.err ||
    { cat serial.txt.err; fail "$kind: fp32 weights not packed into kolos's panels"; }
  KOLOS_CPU_ISA=scalar generate onednn.txt "$kind.ckpt" "${PROMPT_ARGS[@]}" --max-tokens 64
  grep -q "linear layers packed (oneDNN)" onednn.txt.err ||
    { cat onednn.txt.err; fail "$kind: KOLOS_CPU_ISA=scalar did not pack into oneDNN's layout"; }
  ids_of onednn.txt >onednn.ids
  same "$kind.expected" onednn.ids "$kind: kolos generate (oneDNN's packing) = transformers generate"
  generate plain.txt "$kind.ckpt" "${PROMPT_ARGS[@]}" --max-tokens 64 --set inference.pack_weights=false
  ! grep -q "packed" plain.txt.err || { cat plain.txt.err; fail "$kind: inference.pack_weights = false still packed"; }
  ids_of plain.txt >plain.ids
  same "$kind.expected" plain.ids "$kind: LibTorch's plain products (inference.pack_weights = false) = transformers generate"
  generate tp2.txt "$kind.ckpt" "${PROMPT_ARGS[@]}" --max-tokens 64 -n 2 "${MPI[@]}"
  ids_of tp2.txt >tp2.ids
  same "$kind.expected" tp2.ids "$kind: kolos generate -n 2 (tp1d) = transformers generate"
  grep -q "tp1d over 2 ranks" tp2.txt.err || { cat tp2.txt.err; fail "the -n 2 run did not run tp1d over 2 ranks"; }
  generate pp2.txt "$kind.ckpt" "${PROMPT_ARGS[@]}" --max-tokens 64 -n 2 "${MPI[@]}" \
    --set inference.pipeline_stages=2
  ids_of pp2.txt >pp2.ids
  same "$kind.expected" pp2.ids "$kind: kolos generate -n 2 with 2 pipeline stages = transformers generate"
  if [[ $kind == gpt2 ]]; then
    # Text, straight from the Hugging Face directory: the prompt encoded
    # and the continuation decoded by kolos's tokenizer (the directory's
    # tokenizer.json, or --tokenizer), streamed; then cut at a stop string.
    generate text.txt "$kind" --prompt "$(cat "$kind.text.prompt")" --max-tokens 64
    printf '%s\n' "$(cat "$kind.text.expected")" >text.expected
    same text.expected text.txt "$kind: streamed text = transformers' text (its tokenizer)"
    generate stop.txt "$kind.ckpt" --tokenizer "$kind/tokenizer.json" --prompt "$(cat "$kind.text.prompt")" \
      --max-tokens 64 --set "inference.stop=[\"$(cat "$kind.text.stop")\"]"
    printf '%s\n' "$(cat "$kind.text.cut")" >stop.expected
    same stop.expected stop.txt "$kind: stop string \"$(cat "$kind.text.stop")\""
  fi
  [[ $kind == llama ]] || return 0
  generate bf16.txt "$kind.ckpt" "${PROMPT_ARGS[@]}" --max-tokens 64 --set inference.precision=bf16
  [[ $(ids_of bf16.txt | wc -w) -eq 128 ]] || fail "$kind: bf16 did not generate 2 x 64 tokens"
  grep -q "| bf16 |" bf16.txt.err || fail "$kind: the bf16 run does not say bf16"
  echo "ok: $kind in bf16 generates (first tokens: $(ids_of bf16.txt | head -1 | cut -d' ' -f1-8); fp32: $(head -1 "$kind.expected" | cut -d' ' -f1-8))"
}

# train_tiny DIR MODEL [PARALLEL [MODEL_KEYS]]: a 2-rank run of a few
# steps saving to DIR, under ZeRO-3 unless PARALLEL (lines of [parallel])
# says otherwise; MODEL_KEYS: more lines of [model] (weights drawn wide, so
# that greedy tokens vary and have clear margins).
train_tiny() {
  local parallel=${3:-"zero = { stage = 3 }"} keys=${4:-}
  cat >tiny.toml <<TOML
[model]
name = "$2"
layers = 2
hidden = 64
heads = 4
seq_len = 96
vocab = 128
init_std = 0.3
$keys
[data]
kind = "synthetic"
[optim]
lr = 3e-2
[train]
global_batch = 4
micro_batch = 2
steps = 4
[parallel]
data = 2
$parallel
[checkpoint]
dir = "$1"
TOML
  timeout 120 "$KOLOS" run -n 2 --mpirun "$MPIEXEC" tiny.toml >train.txt 2>&1 ||
    { cat train.txt; fail "training the $2 checkpoint ($parallel) failed"; }
}

case $case_name in
  hf_gpt2) hf_case gpt2 ;;
  hf_llama) hf_case llama ;;
  hf_mixtral) hf_case mixtral ;;
  moe)
    train_tiny ck-moe mixtral "expert = { size = 2 }" "kv_heads = 2
ffn_hidden = 96
experts = 4
top_k = 2
capacity_factor = 1.0
bias_update_rate = 0.05"
    generate serial.txt ck-moe "${PROMPT_ARGS[@]}" --max-tokens 40
    grep -q "served dropless" serial.txt.err || { cat serial.txt.err; fail "no note that the capacity factor is not applied"; }
    grep -q "4 experts top 2" serial.txt.err || { cat serial.txt.err; fail "the model line does not name the experts"; }
    ids_of serial.txt >serial.ids
    generate tp2.txt ck-moe "${PROMPT_ARGS[@]}" --max-tokens 40 -n 2 "${MPI[@]}"
    ids_of tp2.txt >tp2.ids
    same serial.ids tp2.ids "mixtral trained under ep 2: served under tp1d x 2 = served serially"
    generate pp2.txt ck-moe "${PROMPT_ARGS[@]}" --max-tokens 40 -n 2 "${MPI[@]}" \
      --set inference.pipeline_stages=2
    ids_of pp2.txt >pp2.ids
    same serial.ids pp2.ids "mixtral trained under ep 2: served in 2 pipeline stages = served serially"
    ;;
  zero3)
    for model in gpt llama; do
      train_tiny "ck-$model" "$model"
      generate serial.txt "ck-$model" "${PROMPT_ARGS[@]}" --max-tokens 40
      generate tp2.txt "ck-$model" "${PROMPT_ARGS[@]}" --max-tokens 40 -n 2 "${MPI[@]}"
      ids_of serial.txt >serial.ids
      ids_of tp2.txt >tp2.ids
      same serial.ids tp2.ids "$model trained under zero3 x 2: served under tp1d x 2 = served serially"
      cp serial.ids "serial-$model.ids"
    done
    generate pp2.txt ck-gpt "${PROMPT_ARGS[@]}" --max-tokens 40 -n 2 "${MPI[@]}" \
      --set inference.pipeline_stages=2
    ids_of pp2.txt >pp2.ids
    same serial-gpt.ids pp2.ids "gpt trained under zero3 x 2: served in 2 pipeline stages = served serially"
    generate pp2tp2.txt ck-gpt "${PROMPT_ARGS[@]}" --max-tokens 40 -n 4 "${MPI[@]}" \
      --set inference.pipeline_stages=2
    grep -q "tp1d over 2 ranks x 2 pipeline stages" pp2tp2.txt.err || { cat pp2tp2.txt.err; fail "not pp2 x tp2"; }
    ids_of pp2tp2.txt >pp2tp2.ids
    same serial-gpt.ids pp2tp2.ids "gpt trained under zero3 x 2: served by 2 stages of tp1d x 2 (4 ranks) = served serially"
    ;;
  batching)
    train_tiny ck gpt
    many=()
    for i in 1 2 3 4 5 6; do
      ids=$(for j in $(seq 1 $((5 * i))); do printf '%d,' $(((i * 37 + j * 11) % 128)); done)
      many+=(--prompt-ids "${ids%,}")
    done
    # One block of 4 tokens is 4 KiB for this model; one context (96) needs
    # 24 blocks: a pool of 30 holds about two sequences of the six.
    tiny=(--set inference.block_size=4 --set inference.kv_cache_memory=120KiB
      --set inference.max_step_tokens=16)
    for sampling in greedy sampled; do
      extra=()
      [[ $sampling == sampled ]] && extra=(--set inference.temperature=0.9
        --set inference.top_k=40 --set inference.top_p=0.95 --set inference.seed=11)
      generate alone.txt ck "${many[@]}" --max-tokens 24 --set inference.max_seqs=1 "${extra[@]}"
      generate together.txt ck "${many[@]}" --max-tokens 24 "${tiny[@]}" "${extra[@]}"
      ids_of alone.txt >alone.ids
      ids_of together.txt >together.ids
      same alone.ids together.ids "$sampling: batched with preemption = one at a time"
      preempted=$(sed -n 's/.*preemptions \([0-9]*\);.*/\1/p' together.txt.err)
      [[ ${preempted:-0} -gt 0 ]] || { cat together.txt.err; fail "the tiny pool did not preempt"; }
      grep -q "KV blocks in use at the end: 0 of 30" together.txt.err ||
        { cat together.txt.err; fail "KV blocks left in use"; }
      echo "ok: $sampling: $preempted preemptions, every block free at the end"
    done
    ;;
  bad)
    train_tiny ck gpt
    printf '[inference]\nblock_size = 16\ntemprature = 0.5\n' >typo.toml
    expect_failure 'typo\.toml:3:1: unknown key `inference\.temprature`; valid keys in \[inference\].*temperature.*Did you mean `temperature`' -- \
      "$KOLOS" generate ck --prompt-ids 1,2 typo.toml
    expect_failure 'inference\.top_p.*out of range; it must be in \(0, 1\]' -- \
      "$KOLOS" generate ck --prompt-ids 1,2 --set inference.top_p=1.5
    expect_failure 'inference\.temperature.*out of range' -- \
      "$KOLOS" generate ck --prompt-ids 1,2 --set inference.temperature=-1.0
    printf '[model]\nlayers = 3\n' >model.toml
    expect_failure 'model\.toml:1.*\[model\]: kolos generate reads only \[inference\]' -- \
      "$KOLOS" generate ck --prompt-ids 1,2 model.toml
    long=$(seq -s, 1 100)
    expect_failure 'request 0 .*prompt: 100 tokens leave no room in the model.s context of 96 tokens' -- \
      "$KOLOS" generate ck --prompt-ids "$long"
    expect_failure 'request 0 .*prompt: 100 tokens leave no room' -- \
      "$KOLOS" generate ck --prompt-ids "$long" -n 2 "${MPI[@]}"
    expect_failure 'token id 500 is outside the vocabulary \[0, 128\)' -- \
      "$KOLOS" generate ck --prompt-ids 1,500
    expect_failure 'inference\.kv_cache_memory = .* fewer than one sequence of the model.s context \(96 tokens\) needs: 6 blocks' -- \
      "$KOLOS" generate ck --prompt-ids 1,2 --set inference.kv_cache_memory=1KiB
    expect_failure 'no-such-dir: no such checkpoint or Hugging Face directory' -- \
      "$KOLOS" generate no-such-dir --prompt-ids 1,2
    mkdir empty
    expect_failure 'empty' -- "$KOLOS" generate empty --prompt-ids 1,2
    # 4 heads do not split over 3 ranks.
    expect_failure 'model\.heads' -- "$KOLOS" generate ck --prompt-ids 1,2 -n 3 "${MPI[@]}"
    expect_failure 'needs a tokenizer' -- "$KOLOS" generate ck --prompt "hello"
    expect_failure 'inference\.chat_template: kolos generate continues prompts as given' -- \
      "$KOLOS" generate ck --prompt-ids 1,2 --set 'inference.chat_template="t.jinja"'
    # A classifier is not a language model: refused by name, on one rank and on two.
    cat >vit.toml <<'TOML'
[model]
name = "vit"
image_size = 8
patch_size = 4
channels = 1
classes = 3
layers = 1
hidden = 16
heads = 2
[data]
kind = "synthetic"
[train]
global_batch = 2
micro_batch = 2
steps = 1
[checkpoint]
dir = "vitck"
TOML
    timeout 120 "$KOLOS" train vit.toml >vit.txt 2>&1 || { cat vit.txt; fail "training the vit checkpoint failed"; }
    expect_failure 'model\.name = "vit" is not a language model; kolos generate and kolos serve run "gpt", "llama" and "mixtral"' -- \
      "$KOLOS" generate vitck --prompt-ids 1,2
    expect_failure 'model\.name = "vit" is not a language model' -- \
      "$KOLOS" generate vitck --prompt-ids 1,2 -n 2 "${MPI[@]}"

    expect_failure 'inference\.pipeline_stages = 3: the stages must divide the 2 ranks' -- \
      "$KOLOS" generate ck --prompt-ids 1,2 -n 2 "${MPI[@]}" --set inference.pipeline_stages=3
    ;;
  serve)
    need_venv
    "$PY" "$here/make_hf_model.py" gpt2 gpt2 "1,2,3" || fail "making the gpt2 model failed"
    generate text.txt gpt2 --prompt "$(cat gpt2.text.prompt)" --max-tokens 64
    "$KOLOS" serve gpt2 --port 0 --set inference.block_size=4 --set inference.kv_cache_memory=256KiB \
      >serve.out 2>serve.err &
    server=$!
    port=""
    for _ in $(seq 1 300); do
      port=$(sed -n 's/.*serving on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' serve.err)
      [[ -n $port ]] && break
      kill -0 $server 2>/dev/null || break
      sleep 0.1
    done
    [[ -n $port ]] || { cat serve.err; kill $server 2>/dev/null; fail "kolos serve did not start"; }
    timeout 240 python3 "$here/serve_client.py" "$port" text.txt "$(cat gpt2.text.prompt)" ||
      { cat serve.err; kill $server 2>/dev/null; fail "the client's checks failed"; }
    kill -TERM $server
    rc=0
    for _ in $(seq 1 100); do kill -0 $server 2>/dev/null || break; sleep 0.1; done
    kill -0 $server 2>/dev/null && { kill -KILL $server; fail "kolos serve did not stop on SIGTERM"; }
    wait $server || rc=$?
    [[ $rc -eq 0 ]] || { cat serve.err; fail "kolos serve exited $rc on SIGTERM"; }
    grep -q "stopped" serve.err || fail "no orderly stop"
    echo "ok: SIGTERM: kolos serve stopped, exit 0"
    start_server burst.err gpt2 --max-queue 1 --set inference.max_seqs=1
    timeout 240 python3 "$here/serve_client.py" "$port" --burst ||
      { cat burst.err; kill $server 2>/dev/null; fail "the --max-queue checks failed"; }
    stop_server burst.err
    ;;
  chat)
    need_venv
    "$PY" "$here/make_chat_model.py" chat || fail "making the chat model failed"
    for kind in chatml llama3 alt; do
      dir=chat/$kind template=()
      [[ $kind == alt ]] && dir=chat/chatml template=(--chat-template chat/alt.jinja)
      start_server "$kind.err" "$dir" "${template[@]}"
      timeout 240 "$PY" "$here/chat_client.py" "$port" "$dir" "$kind" "${template[@]:1}" ||
        { cat "$kind.err"; kill $server 2>/dev/null; fail "the $kind chat checks failed"; }
      stop_server "$kind.err"
      ends=$(sed -n 's/.*a turn ends at eos\(.*\)$/\1/p' "$kind.err")
      want=" <|im_end|>"
      [[ $kind == llama3 ]] && want=" <|eot_id|>"
      [[ $kind == alt ]] && want=""  # its assistant turn ends with eos_token itself
      [[ $ends == "$want" ]] || { cat "$kind.err"; fail "$kind: turn-end tokens '$ends', expected '$want'"; }
    done
    echo "ok: chat requests stop at <|im_end|> (chatml) and <|eot_id|> (llama3) beside eos"
    expect_failure 'chat template chat/nope\.jinja: cannot be read' -- \
      "$KOLOS" serve chat/chatml --port 0 --chat-template chat/nope.jinja
    expect_failure 'chat/bad\.jinja:1:4: unsupported construct: the statement `\{% macro %\}`' -- \
      "$KOLOS" serve chat/chatml --port 0 --chat-template chat/bad.jinja
    ;;
  *) fail "unknown case $case_name" ;;
esac
echo "PASS: $case_name"
