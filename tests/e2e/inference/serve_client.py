# Drives a running `kolos serve` on 127.0.0.1 (bounded: every request has a
# timeout, every loop a count):  serve_client.py PORT EXPECTED_TEXT_FILE PROMPT
# (or serve_client.py PORT --burst: see there)
# Checks: /health, /v1/models, /tokenize and /detokenize; chat without a
# template refused; a greedy completion equals `kolos generate`'s text;
# streamed (server-sent events) equals non-streamed; OpenAI-style 4xx
# errors naming the field, with the server still serving; clients that
# disconnect mid-stream and 48 concurrent requests of random lengths, after
# which /metrics shows every KV block free.
import http.client
import json
import random
import sys
import threading
import time

port = int(sys.argv[1])


def call(method, path, body=None, raw=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    data = raw if raw is not None else (json.dumps(body) if body is not None else None)
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    text = resp.read().decode("utf-8")
    conn.close()
    return resp.status, text


def stream(body, close_after=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps(dict(body, stream=True)),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.status
    text, ids, events, reason = "", [], 0, None
    for line in resp:
        line = line.decode("utf-8").strip()
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            break
        chunk = json.loads(line[6:])["choices"][0]
        text += chunk["text"]
        ids += chunk["token_ids"]
        reason = chunk["finish_reason"] or reason
        events += 1
        if close_after is not None and events >= close_after:
            conn.close()  # the client goes away mid-stream
            return None
    conn.close()
    return text, ids, reason


def metrics():
    status, text = call("GET", "/metrics")
    assert status == 200
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


if sys.argv[2] == "--burst":
    # A server started with --max-queue 1 and inference.max_seqs=1: of a burst of
    # requests sent at once, at most one waits (in the inbox or the
    # scheduler) beside the one running; the others are refused
    # with 429 in OpenAI's shape; those admitted finish; the server serves on
    # and every block is free at the end.
    barrier = threading.Barrier(8)
    results = []

    def burst_one(k):
        barrier.wait()
        results.append(call("POST", "/v1/completions",
                            {"prompt": [1 + k, 2, 3], "max_tokens": 60}))

    workers = [threading.Thread(target=burst_one, args=(k,)) for k in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert len(results) == 8, len(results)
    refused = [json.loads(t)["error"] for s, t in results if s == 429]
    done = [json.loads(t) for s, t in results if s == 200]
    assert len(refused) + len(done) == 8, [s for s, _ in results]
    assert refused and all(e["type"] == "rate_limit_error" for e in refused), refused
    assert len(done) >= 1 and all(d["choices"][0]["finish_reason"] in ("length", "stop")
                                  for d in done), done
    for _ in range(100):
        m = metrics()
        if m["kolos_kv_blocks_in_use"] == 0 and m["kolos_requests_running"] == 0:
            break
        time.sleep(0.1)
    assert m["kolos_kv_blocks_in_use"] == 0, m
    print(f"ok: a burst of 8 with --max-queue 1: {len(done)} served, {len(refused)} refused with 429")
    sys.exit(0)

expected_file, prompt = sys.argv[2], sys.argv[3]
expected = open(expected_file, encoding="utf-8").read().rstrip("\n")
status, text = call("GET", "/health")
assert status == 200 and json.loads(text)["status"] == "ok", (status, text)

status, text = call("GET", "/v1/models")
assert status == 200 and json.loads(text)["data"][0]["id"] == "gpt2", (status, text)
status, text = call("POST", "/tokenize", {"prompt": prompt})
ids = json.loads(text)["tokens"]
assert status == 200 and ids and json.loads(text)["count"] == len(ids), (status, text)
status, text = call("POST", "/detokenize", {"tokens": ids})
assert status == 200 and json.loads(text)["prompt"] == prompt, (status, text)
status, text = call("POST", "/detokenize", {"tokens": [10 ** 6]})
assert status == 400 and json.loads(text)["error"]["param"] == "tokens", (status, text)
print("ok: /v1/models, /tokenize, /detokenize")

# This model's directory has no chat template: chat is a 400 that says so.
for path in ("/v1/chat/completions", "/v1/chat/render"):
    status, text = call("POST", path, {"messages": [{"role": "user", "content": "hi"}]})
    err = json.loads(text)["error"]
    assert status == 400 and err["param"] == "messages" and "no chat template" in err["message"], (status, text)
print("ok: chat without a template: 400 naming the missing template")

status, text = call("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 64})
assert status == 200, (status, text)
body = json.loads(text)
choice = body["choices"][0]
assert choice["text"] == expected, (choice["text"], expected)
assert body["usage"]["completion_tokens"] == 64 and choice["finish_reason"] == "length", body
print("ok: /v1/completions (greedy) = kolos generate's text")

s_text, s_ids, s_reason = stream({"prompt": prompt, "max_tokens": 64})
assert s_text == expected and s_ids == choice["token_ids"] and s_reason == "length", (s_text, s_reason)
print("ok: streamed (server-sent events) = not streamed")

seeded = {"prompt": prompt, "max_tokens": 20, "temperature": 0.9, "top_k": 50, "seed": 3}
a = json.loads(call("POST", "/v1/completions", seeded)[1])["choices"][0]["token_ids"]
b = json.loads(call("POST", "/v1/completions", seeded)[1])["choices"][0]["token_ids"]
assert a == b, (a, b)
print("ok: the same seed gives the same tokens")

bad = [
    (None, "{not json", 400, None),
    ({"prompt": prompt, "temperature": -1}, None, 400, "temperature"),
    ({"prompt": prompt, "top_p": 1.5}, None, 400, "top_p"),
    ({"prompt": prompt, "top_p": 0}, None, 400, "top_p"),
    ({"prompt": prompt, "max_tokens": "ten"}, None, 400, "max_tokens"),
    ({"prompt": prompt, "max_tokens": 500}, None, 400, "max_tokens"),
    ({"prompt": ""}, None, 400, "prompt"),
    ({"prompt": "fox " * 200}, None, 400, "prompt"),
    ({"prompt": 7}, None, 400, "prompt"),
    ({"max_tokens": 3}, None, 400, "prompt"),
    ({"prompt": prompt, "model": "no-such-model"}, None, 404, "model"),
    ({"prompt": prompt, "stream": "yes"}, None, 400, "stream"),
    (None, '{"prompt": "\\udc80"}', 400, None),
]
for body, raw, want, param in bad:
    status, text = call("POST", "/v1/completions", body, raw)
    error = json.loads(text)["error"]
    assert status == want and error["param"] == param and error["message"], (body, raw, status, text)
print(f"ok: {len(bad)} bad requests answered 4xx with an OpenAI-style error naming the field")

for _ in range(3):
    assert stream({"prompt": prompt, "max_tokens": 60}, close_after=2) is None

rng = random.Random(5)
words = ["the", "lazy", "fox", "serves", "kolos", "block", "cache", "join", "leave"]
failures = []


def client(k):
    try:
        for i in range(4):
            p = " ".join(rng.choice(words) for _ in range(rng.randrange(1, 12)))
            req = {"prompt": p, "max_tokens": rng.randrange(1, 40), "temperature": 0.7,
                   "seed": k * 10 + i}
            if (k + i) % 3 == 0:
                stream(req, close_after=1 if (k + i) % 2 else None)
            else:
                status, text = call("POST", "/v1/completions", req)
                assert status == 200, (status, text)
    except Exception as e:  # reported below
        failures.append(repr(e))


threads = [threading.Thread(target=client, args=(k,)) for k in range(12)]
for t in threads:
    t.start()
for t in threads:
    t.join(timeout=120)
assert not failures, failures
m = {}
for _ in range(100):  # the cancelled streams' blocks come back within a step or two
    m = metrics()
    if m["kolos_kv_blocks_in_use"] == 0 and m["kolos_requests_running"] == 0:
        break
    time.sleep(0.1)
assert m["kolos_kv_blocks_in_use"] == 0 and m["kolos_requests_running"] == 0, m
assert m["kolos_requests_total"] >= 50 and m["kolos_kv_blocks_total"] > 0, m
assert m["kolos_time_to_first_token_seconds_count"] >= 50, m
assert m["kolos_inter_token_latency_seconds_count"] + m["kolos_time_to_first_token_seconds_count"] \
    == m["kolos_generation_tokens_total"], m
assert m['kolos_time_to_first_token_seconds_bucket{le="+Inf"}'] == m["kolos_time_to_first_token_seconds_count"], m
print(f"ok: 48 concurrent requests and 3+ disconnects: every KV block free "
      f"({int(m['kolos_kv_blocks_total'])} blocks, {int(m['kolos_requests_total'])} requests, "
      f"{int(m['kolos_generation_tokens_total'])} tokens)")
