# Drives a running `kolos serve` of make_hf_model.py's GPT-2 with a chat
# template given by --chat-template, with OpenAI's own Python client (the
# `openai` package of the project's virtual environment), against
# transformers on the same weights:
#   openai_client.py PORT MODEL_DIR TEMPLATE_FILE
# Checks: /v1/models lists the model; a greedy completion (temperature 0)
# is transformers' greedy generate, token for token and as text; a greedy
# chat completion is transformers' greedy generate from the conversation
# rendered by its apply_chat_template with the same template; streamed
# completions and chat (iterated chunk by chunk) concatenate to the
# non-streamed text and tokens; errors reach the client as its exception
# classes with the server's message, field and code: an unknown model
# (NotFoundError, 404) and max_tokens past the context (BadRequestError,
# 400); a completion is answered at once while 12 other connections stall
# mid-request. Bounded: every request has a timeout and the client does not
# retry.
import socket
import sys
import time
import warnings

warnings.filterwarnings("ignore")
import openai
import torch
import transformers

port, model_dir, template_file = int(sys.argv[1]), sys.argv[2], sys.argv[3]
MODEL = "gpt2"  # kolos serve's default model name: the directory's name
CONTEXT = 96  # n_positions of make_hf_model.py's GPT-2

client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", timeout=60, max_retries=0)
tok = transformers.PreTrainedTokenizerFast(tokenizer_file=f"{model_dir}/tokenizer.json")
tok.chat_template = open(template_file, encoding="utf-8").read()
model = transformers.GPT2LMHeadModel.from_pretrained(model_dir, attn_implementation="eager").eval()


def greedy(prompt_ids, n):
    # The tokenizer has no end-of-text token: every request runs n tokens.
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


models = client.models.list()
assert [m.id for m in models.data] == [MODEL], models
print(f"ok: models.list(): {MODEL}")

# A completion from text, greedy: transformers' greedy tokens, its text.
prompt = "the lazy fox serves"
prompt_ids = tok.encode(prompt, add_special_tokens=False)
expected = greedy(prompt_ids, 64)
assert len(set(expected)) > 5, f"a degenerate reference: {expected}"
done = client.completions.create(model=MODEL, prompt=prompt, max_tokens=64, temperature=0)
choice = done.choices[0]
assert done.object == "text_completion" and done.model == MODEL, done
assert choice.token_ids == expected, ("completion tokens differ from transformers'", choice.token_ids, expected)
assert choice.text == tok.decode(expected, skip_special_tokens=True), (choice.text, tok.decode(expected))
assert choice.finish_reason == "length", choice
assert done.usage.prompt_tokens == len(prompt_ids) and done.usage.completion_tokens == len(expected), done.usage
assert len(choice.text) > 0, choice
print(f"ok: completions.create: greedy = transformers' generate ({len(expected)} tokens, {choice.finish_reason}): "
      f"{choice.text!r}")

# Streamed: the chunks' text concatenates to the non-streamed text.
pieces, ids, reasons, usage = [], [], [], None
for chunk in client.completions.create(model=MODEL, prompt=prompt, max_tokens=64, temperature=0, stream=True):
    assert chunk.object == "text_completion", chunk
    pieces.append(chunk.choices[0].text)
    ids += chunk.choices[0].token_ids
    reasons.append(chunk.choices[0].finish_reason)
    usage = chunk.usage or usage
assert len(pieces) > 1, f"one chunk only: {pieces}"
assert "".join(pieces) == choice.text, ("streamed text differs", "".join(pieces), choice.text)
assert ids == expected, ("streamed tokens differ", ids, expected)
assert [r for r in reasons if r] == [choice.finish_reason], reasons
assert usage is not None and usage.completion_tokens == len(expected), usage
print(f"ok: completions.create(stream=True): {len(pieces)} chunks concatenate to the same text")

# Chat: the conversation rendered by transformers' apply_chat_template with
# the same template, then transformers' greedy generate.
messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "what is kolos? ünï 你好"}]
rendered = tok.encode(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                      add_special_tokens=False)
expected_chat = greedy(rendered, 16)
assert len(set(expected_chat)) > 3, f"a degenerate reference: {expected_chat}"
chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
reply = chat.choices[0]
assert chat.object == "chat.completion" and reply.message.role == "assistant", chat
assert reply.token_ids == expected_chat, ("chat tokens differ from transformers'", reply.token_ids, expected_chat)
assert reply.message.content == tok.decode(expected_chat, skip_special_tokens=True), reply.message
assert reply.finish_reason == "length", reply
assert chat.usage.prompt_tokens == len(rendered) and chat.usage.completion_tokens == len(expected_chat), chat.usage
print(f"ok: chat.completions.create: greedy = transformers' generate from apply_chat_template "
      f"({len(expected_chat)} tokens, {reply.finish_reason}): {reply.message.content!r}")

deltas, roles, ids = [], [], []
for chunk in client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                            stream=True):
    assert chunk.object == "chat.completion.chunk", chunk
    delta = chunk.choices[0].delta
    roles.append(delta.role)
    deltas.append(delta.content or "")
    ids += chunk.choices[0].token_ids
assert roles[0] == "assistant", roles
assert "".join(deltas) == reply.message.content, ("streamed chat differs", "".join(deltas), reply.message.content)
assert ids == expected_chat, ("streamed chat tokens differ", ids, expected_chat)
print(f"ok: chat.completions.create(stream=True): {len(deltas)} chunks concatenate to the same content")

# Errors: OpenAI's exception classes, carrying the server's message and field.
try:
    client.completions.create(model="no-such-model", prompt=prompt, max_tokens=4)
    raise AssertionError("an unknown model was served")
except openai.NotFoundError as e:
    assert e.status_code == 404 and e.param == "model" and e.code == "model_not_found", (e.status_code, e.body)
    assert e.body["message"] == f"the model `no-such-model` does not exist; this server serves `{MODEL}`", e.body
    print(f"ok: an unknown model: openai.NotFoundError: {e.body['message']}")
try:
    client.chat.completions.create(model=MODEL, messages=messages, max_tokens=CONTEXT)
    raise AssertionError("max_tokens past the context was accepted")
except openai.BadRequestError as e:
    want = (f"`max_tokens` = {CONTEXT} runs past the context: {len(rendered)} prompt tokens + max_tokens > "
            f"{CONTEXT}")
    assert e.status_code == 400 and e.param == "max_tokens", (e.status_code, e.body)
    assert e.body["message"] == want, (e.body, want)
    print(f"ok: max_tokens past the context: openai.BadRequestError: {e.body['message']}")

# The server still serves after the errors.
again = client.completions.create(model=MODEL, prompt=prompt, max_tokens=64, temperature=0)
assert again.choices[0].text == choice.text, again
print("ok: still serving after the errors")

# Twelve connections that stop in the middle of a request body each hold a
# handler thread (until the server's 5 s read timeout); a completion sent
# meanwhile is still answered at once. A pool of 8 handler threads,
# cpp-httplib's default on a small machine, would keep it waiting 5 s.
stalled = []
for _ in range(12):
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n{\"prompt\": ")
    stalled.append(sock)
time.sleep(0.3)
quick = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", timeout=3, max_retries=0)
start = time.perf_counter()
short = quick.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
elapsed = time.perf_counter() - start
assert short.choices[0].token_ids == expected[:8], (short.choices[0].token_ids, expected[:8])
for sock in stalled:
    sock.close()
print(f"ok: a completion answered in {elapsed:.2f} s beside 12 stalled connections")
