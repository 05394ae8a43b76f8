# Drives a running `kolos serve` of a model made by make_chat_model.py against
# transformers (the project's virtual environment; bounded: every request
# has a timeout):
#   chat_client.py PORT MODEL_DIR KIND [TEMPLATE_FILE]
# KIND chatml, llama3, alt: kolos's rendering of several conversations
#   (/v1/chat/render, text and ids) equals transformers'
#   apply_chat_template(..., tokenize=False) with the same template and the
#   tokenizer's encode of it; alt: a conversation the template refuses with
#   raise_exception is a 400 carrying the template's message.
# chatml also: a greedy chat completion equals transformers' greedy
#   generate from the rendered prompt (stopping at eos or <|im_end|>), and its
#   logprobs (and top_logprobs) equal transformers' log_softmax of the
#   logits within 1e-4; streamed chat equals non-streamed; /v1/completions
#   logprobs likewise; bad requests answered 400 naming the field.
import http.client
import json
import sys
import warnings

warnings.filterwarnings("ignore")
import transformers

port, model_dir, kind = int(sys.argv[1]), sys.argv[2], sys.argv[3]
template_file = sys.argv[4] if len(sys.argv) > 4 else None
TOL = 1e-4


def call(method, path, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request(method, path, body=json.dumps(body) if body is not None else None,
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    text = resp.read().decode("utf-8")
    conn.close()
    return resp.status, text


def events(path, body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", path, body=json.dumps(dict(body, stream=True)),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.status
    out = []
    for line in resp:
        line = line.decode("utf-8").strip()
        if line == "data: [DONE]":
            break
        if line.startswith("data: "):
            out.append(json.loads(line[6:]))
    conn.close()
    return out


tok = transformers.AutoTokenizer.from_pretrained(model_dir)
if template_file:
    tok.chat_template = open(template_file, encoding="utf-8").read()

CONVERSATIONS = [
    [{"role": "user", "content": "Hello  "}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"},
     {"role": "assistant", "content": " hello there "}, {"role": "user", "content": "what is kolos?"}],
    [{"role": "user", "content": "héllo — 你好 😀\n\tx"}, {"role": "assistant", "content": "ok"}],
]
checked = 0
for messages in CONVERSATIONS:
    for gen in (True, False):
        expected = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
        status, text = call("POST", "/v1/chat/render",
                            {"messages": messages, "add_generation_prompt": gen})
        assert status == 200, (status, text)
        got = json.loads(text)
        assert got["prompt"] == expected, f"{kind}: rendering differs\nkolos:        {got['prompt']!r}\ntransformers: {expected!r}"
        ids = tok.encode(expected, add_special_tokens=False)
        assert got["tokens"] == ids, (kind, got["tokens"], ids)
        checked += 1
print(f"ok: {kind}: {checked} renderings equal transformers' apply_chat_template, text and ids")

if kind == "alt":
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    try:
        tok.apply_chat_template(bad, tokenize=False)
        raise AssertionError("transformers rendered a conversation the template refuses")
    except Exception as e:  # jinja2's TemplateError
        reason = str(e)
    for path in ("/v1/chat/render", "/v1/chat/completions"):
        status, text = call("POST", path, {"messages": bad, "max_tokens": 2})
        err = json.loads(text)["error"]
        assert status == 400 and err["message"] == reason and err["param"] == "messages", (status, text)
    print(f"ok: alt: raise_exception -> 400 \"{reason}\"")
    sys.exit(0)
if kind != "chatml":
    sys.exit(0)

import torch

model = transformers.GPT2LMHeadModel.from_pretrained(model_dir, attn_implementation="eager").eval()
stop_ids = [tok.convert_tokens_to_ids("</s>"), tok.convert_tokens_to_ids("<|im_end|>")]


def reference_logprobs(prompt, generated):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + generated])).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    return lp[len(prompt) - 1:len(prompt) - 1 + len(generated)]


def check_logprobs(where, prompt, generated, chosen, tops):
    ref = reference_logprobs(prompt, generated)
    worst = 0.0
    for i, t in enumerate(generated):
        worst = max(worst, abs(chosen[i] - ref[i, t].item()))
        want = torch.topk(ref[i], len(tops[i])).values.tolist()
        got = sorted(tops[i], reverse=True)
        worst = max([worst] + [abs(a - b) for a, b in zip(got, want)])
    assert worst <= TOL, f"{where}: logprobs differ from transformers' log_softmax by {worst}"
    print(f"ok: {where}: {len(generated)} logprobs and top_logprobs within {worst:.2e} of transformers")


# A greedy chat completion against transformers' greedy generate.
messages = CONVERSATIONS[1]
prompt = prompt_ids = tok.encode(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                    add_special_tokens=False)
with torch.no_grad():
    g = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                       eos_token_id=stop_ids, pad_token_id=0)[0, len(prompt):].tolist()
status, text = call("POST", "/v1/chat/completions",
                    {"messages": messages, "max_tokens": 12, "logprobs": True, "top_logprobs": 3})
assert status == 200, (status, text)
body = json.loads(text)
choice = body["choices"][0]
assert body["object"] == "chat.completion" and choice["message"]["role"] == "assistant", body
assert choice["token_ids"] == g, ("chat greedy tokens differ", choice["token_ids"], g)
assert choice["message"]["content"] == tok.decode(g, skip_special_tokens=True), choice
assert choice["finish_reason"] == ("stop" if g[-1] in stop_ids else "length"), choice
assert body["usage"]["prompt_tokens"] == len(prompt) and body["usage"]["completion_tokens"] == len(g)
content = choice["logprobs"]["content"]
assert len(content) == len(g) and all(len(c["top_logprobs"]) == 3 for c in content), content
for c in content:
    assert bytes(c["bytes"]).decode("utf-8") == c["token"], c
check_logprobs("chat", prompt, g, [c["logprob"] for c in content],
               [[t["logprob"] for t in c["top_logprobs"]] for c in content])
print(f"ok: chat: greedy = transformers' generate ({len(g)} tokens, {choice['finish_reason']})")

chunks = events("/v1/chat/completions",
                {"messages": messages, "max_tokens": 12, "logprobs": True, "top_logprobs": 3})
first = chunks[0]["choices"][0]
assert first["delta"] == {"role": "assistant", "content": ""}, first
streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
streamed_ids = sum((c["choices"][0]["token_ids"] for c in chunks), [])
streamed_lp = sum(((c["choices"][0]["logprobs"] or {"content": []})["content"] for c in chunks), [])
last = chunks[-1]
assert all(c["object"] == "chat.completion.chunk" for c in chunks), chunks
assert streamed == choice["message"]["content"] and streamed_ids == g, (streamed, streamed_ids)
assert streamed_lp == content, "streamed logprobs differ"
assert last["choices"][0]["finish_reason"] == choice["finish_reason"] and last["usage"] == body["usage"]
print(f"ok: chat streamed ({len(chunks)} events) = not streamed")

# Legacy completions logprobs.
prompt = [5, 17, 42, 3, 88, 1, 9]
status, text = call("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 10, "logprobs": 5})
assert status == 200, (status, text)
choice = json.loads(text)["choices"][0]
lp = choice["logprobs"]
n = len(choice["token_ids"])
assert len(lp["tokens"]) == n and len(lp["token_logprobs"]) == n and len(lp["top_logprobs"]) == n
assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"]), lp
for t, top in zip(choice["token_ids"], lp["top_logprobs"]):
    assert 1 <= len(top) <= 5, top
check_logprobs("completions", prompt, choice["token_ids"], lp["token_logprobs"],
               [list(top.values()) if len(top) == 5 else [] for top in lp["top_logprobs"]])
status, text = call("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 3, "logprobs": 0})
lp0 = json.loads(text)["choices"][0]["logprobs"]
assert status == 200 and lp0["top_logprobs"] == [{}, {}, {}], lp0
status, text = call("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 3})
assert json.loads(text)["choices"][0]["logprobs"] is None

# Bad requests: 400 with OpenAI's error object naming the field.
BAD = [
    ("/v1/chat/completions", {"messages": "hi"}, "messages"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {}, "messages"),
    ("/v1/chat/completions", {"messages": ["hi"]}, "messages[0]"),
    ("/v1/chat/completions", {"messages": [{"role": 42, "content": "a"}]}, "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"},
                                           {"role": "wizard", "content": "b"}]}, "messages[1].role"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 7}]}, "messages[0].content"),
    ("/v1/chat/completions", {"messages": messages, "top_logprobs": 3}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": messages, "logprobs": 1}, "logprobs"),
    ("/v1/chat/completions", {"messages": messages, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": messages, "temperature": -1}, "temperature"),
    ("/v1/chat/completions", {"messages": messages, "max_tokens": 90}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "fox " * 60}]}, "messages"),
    ("/v1/completions", {"prompt": prompt, "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": prompt, "logprobs": True}, "logprobs"),
]
for path, body, param in BAD:
    status, text = call("POST", path, body)
    err = json.loads(text).get("error", {})
    assert status == 400 and err.get("param") == param, (path, body, status, text)
status, text = call("GET", "/health")
assert status == 200, (status, text)
# Without max_tokens a request runs as far as the context leaves room (61 + 35 = 96).
status, text = call("POST", "/v1/chat/completions", {"messages": messages})
assert status == 200 and json.loads(text)["usage"]["completion_tokens"] <= 96 - len(prompt_ids), text
print(f"ok: {len(BAD)} bad chat and logprobs requests answered 400 naming the field; still serving")
