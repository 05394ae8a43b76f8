#!/usr/bin/env bash
# `kolos serve` driven by OpenAI's Python client (openai_client.py; the
# `openai` package of the project's virtual environment):  openai.sh
# (environment: KOLOS, KOLOS_VENV, KOLOS_SOURCE_DIR)
# make_hf_model.py's GPT-2 (with its tokenizer.json) served on 127.0.0.1
# (any free port) with a chat template written here: a completion, a chat
# completion, both streamed, an unknown model and max_tokens past the
# context, each checked against transformers on the same weights or the
# server's message; then SIGTERM and exit 0.
set -uo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
here=$KOLOS_SOURCE_DIR/tests/e2e/inference
export NO_PROXY=127.0.0.1 no_proxy=127.0.0.1

use_venv openai transformers torch
"$PY" "$here/make_hf_model.py" gpt2 gpt2 "1,2,3" >make.txt 2>&1 || { cat make.txt; fail "making the gpt2 model failed"; }
cat >chat.jinja <<'JINJA'
{% for message in messages %}{{ message['role'] }}: {{ message['content'] | trim }}
{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}
JINJA

"$KOLOS" serve gpt2 --port 0 --chat-template chat.jinja >serve.out 2>serve.err &
server=$!
port=""
for _ in $(seq 1 300); do
  port=$(sed -n 's/.*serving on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' serve.err 2>/dev/null)
  [[ -n $port ]] && break
  kill -0 $server 2>/dev/null || break
  sleep 0.1
done
[[ -n $port ]] || { cat serve.err; kill $server 2>/dev/null; fail "kolos serve did not start"; }

timeout 120 "$PY" "$here/openai_client.py" "$port" gpt2 chat.jinja ||
  { cat serve.err; kill $server 2>/dev/null; fail "the openai client's checks failed"; }

kill -TERM $server
for _ in $(seq 1 100); do kill -0 $server 2>/dev/null || break; sleep 0.1; done
kill -0 $server 2>/dev/null && { kill -KILL $server; fail "kolos serve did not stop on SIGTERM"; }
rc=0
wait $server || rc=$?
[[ $rc -eq 0 ]] || { cat serve.err; fail "kolos serve exited $rc on SIGTERM"; }
grep -q "stopped" serve.err || { cat serve.err; fail "no orderly stop on SIGTERM"; }
echo "ok: SIGTERM: kolos serve stopped, exit 0"
echo "PASS: openai"
