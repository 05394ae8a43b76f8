"""`kolos serve` under a bounded load against transformers' `generate` in
static batches, on the same weights and the same requests in the same run
(bench/run_serve_bench.sh).

Usage: bench.py KOLOS WORK CONCURRENCIES PROMPT_LEN OUTPUT_LEN REQUESTS_MIN
                HIDDEN LAYERS HEADS VOCAB ROUNDS

The model: a GPT-2 of the given shape with transformers' random
initialisation (seed 0), saved with save_pretrained (no tokenizer: prompts
and outputs are token ids, and no request stops before OUTPUT_LEN tokens).
The requests: for each concurrency C, max(REQUESTS_MIN, 2 C) prompts of
PROMPT_LEN random ids (seeded), each asking for exactly OUTPUT_LEN new
tokens, greedy.

kolos: `kolos serve` on 127.0.0.1 (max_seqs = the largest C, a KV pool
for that many full sequences); C client threads each send a streamed
/v1/completions request, read its server-sent events, and send the next
one, until the level's requests are done (a closed loop: C requests in
flight, as vLLM's benchmark_serving with --max-concurrency C and an
infinite request rate).

transformers: the same requests in batches of C (static batching: a batch
starts when the previous one has finished, so a request arrives at its
batch's start), `generate(do_sample=False, min_new_tokens=max_new_tokens=
OUTPUT_LEN)` in-process (no HTTP), eager attention, a streamer that
timestamps every decoding step.

Metrics, as vLLM's benchmark_serving defines them:
  request throughput  completed requests / the level's wall time
  output tokens/s     generated tokens / the level's wall time
  TTFT                a request's send (kolos) or its batch's start
                      (transformers) to its first generated token
  TPOT                per request, (latency - TTFT) / (OUTPUT_LEN - 1)
  ITL                 every gap between two successive chunks of a
                      request's stream (kolos: server-sent events carrying
                      tokens; transformers: decoding steps), pooled
medians and 99th percentiles over the level's requests (ITL: over the
gaps). Also: the fraction of requests whose tokens equal between the two,
and, for the single-stream decode, the memory-bandwidth bound (weight
bytes read per token against a read bandwidth measured in this run by a
torch sum over 1 GiB); for each level, a ceiling on output tokens/s for the
same fp32 arithmetic on this machine (level_floor: floating-point
operations at the best torch matmul rate measured in this run, or decoding
steps each reading the weights at that bandwidth, whichever takes longer).

Rounds: every level runs ROUNDS times on each, the two back to back at each
level (kolos first in odd rounds, transformers first in even ones), the
server up and idle while transformers runs. With more than one round, a
level's kolos/transformers figure is the median of its rounds' ratios, each
of two runs minutes apart at most, and its other figures are those of its
median round by output tokens/s.
"""
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time

import torch
import transformers

transformers.utils.logging.disable_progress_bar()


def pct(values, q):
    """numpy's default (linear) percentile, as benchmark_serving uses."""
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarise(name, c, wall, per_request, itl, output_len):
    """per_request: [(ttft, latency, tokens)]"""
    ttft = [r[0] for r in per_request]
    tpot = [(r[1] - r[0]) / (output_len - 1) for r in per_request]
    tokens = sum(r[2] for r in per_request)
    return {
        "name": name, "c": c, "requests": len(per_request), "wall": wall,
        "req_s": len(per_request) / wall, "tok_s": tokens / wall,
        "ttft_med": statistics.median(ttft), "ttft_p99": pct(ttft, 99),
        "tpot_med": statistics.median(tpot), "tpot_p99": pct(tpot, 99),
        # No gaps when every stream came in one chunk (a tiny model).
        "itl_med": statistics.median(itl) if itl else float("nan"),
        "itl_p99": pct(itl, 99) if itl else float("nan"),
    }


def start_server(kolos, model_dir, max_seqs, kv_bytes, log):
    err = open(log, "w")
    proc = subprocess.Popen(
        [kolos, "serve", model_dir, "--port", "0", "--max-queue", str(4 * max_seqs),
         "--set", f"inference.max_seqs={max_seqs}",
         "--set", f"inference.kv_cache_memory={kv_bytes // (1 << 20) + 1}MiB"]
        + [a for kv in os.environ.get("KOLOS_BENCH_SET", "").split() for a in ("--set", kv)],
        stdout=subprocess.DEVNULL, stderr=err)
    for _ in range(1200):
        with open(log) as f:
            text = f.read()
        if "serving on http://127.0.0.1:" in text:
            port = int(text.split("serving on http://127.0.0.1:")[1].split()[0].rstrip(")"))
            return proc, port, text
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"bench: kolos serve did not start:\n{open(log).read()}")


def kolos_request(port, prompt, output_len):
    """One streamed completion: (ttft, latency, tokens, itl gaps, ids)."""
    body = json.dumps({"prompt": prompt, "max_tokens": output_len, "temperature": 0, "stream": True})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"kolos answered {resp.status}: {resp.read()[:300]!r}")
    ids, ttft, last, gaps = [], None, None, []
    for line in resp:
        if not line.startswith(b"data: "):
            continue
        if line.startswith(b"data: [DONE]"):
            break
        got = json.loads(line[6:])["choices"][0]["token_ids"]
        if not got:
            continue
        now = time.perf_counter()
        if ttft is None:
            ttft = now - start
        else:
            gaps.append(now - last)
        last = now
        ids += got
    conn.close()
    latency = time.perf_counter() - start
    if len(ids) != output_len:
        raise RuntimeError(f"kolos returned {len(ids)} tokens, asked for {output_len}")
    return ttft, latency, len(ids), gaps, ids


def run_kolos(port, prompts, c, output_len):
    queue = list(range(len(prompts)))
    lock = threading.Lock()
    results, itl, errors = [None] * len(prompts), [], []

    def worker():
        while True:
            with lock:
                if not queue or errors:
                    return
                i = queue.pop(0)
            try:
                ttft, latency, n, gaps, ids = kolos_request(port, prompts[i], output_len)
            except Exception as e:  # reported after the level
                with lock:
                    errors.append(e)
                return
            with lock:
                results[i] = (ttft, latency, n, ids)
                itl.extend(gaps)

    threads = [threading.Thread(target=worker) for _ in range(c)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise SystemExit(f"bench: a kolos request failed: {errors[0]}")
    return wall, results, itl


class StepClock(transformers.generation.streamers.BaseStreamer):
    """Timestamps each decoding step of generate (its first put is the prompt)."""

    def __init__(self):
        self.times = []
        self.prompt_seen = False

    def put(self, value):
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.times.append(time.perf_counter())

    def end(self):
        pass


def run_transformers(model, prompts, c, output_len):
    results, itl = [], []
    start = time.perf_counter()
    for b in range(0, len(prompts), c):
        batch = torch.tensor(prompts[b:b + c])
        clock = StepClock()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(batch, attention_mask=torch.ones_like(batch), do_sample=False,
                                 max_new_tokens=output_len, min_new_tokens=output_len,
                                 eos_token_id=None, pad_token_id=0, streamer=clock)
        t1 = time.perf_counter()
        assert len(clock.times) == output_len, (len(clock.times), output_len)
        gaps = [b_ - a_ for a_, b_ in zip(clock.times, clock.times[1:])]
        for row in out[:, batch.size(1):].tolist():
            results.append((clock.times[0] - t0, t1 - t0, len(row), row))
            itl.extend(gaps)
    return time.perf_counter() - start, results, itl


def read_bandwidth():
    """GB/s of a torch sum over 1 GiB of fp32 (best of 5, after a warm-up)."""
    x = torch.ones(1 << 28)
    x.sum()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return x.numel() * 4 / best / 1e9


def matmul_rate(hidden):
    """The best fp32 GFLOP/s of torch.mm over rows 256, 1024 and 4096 of the
    MLP's first product (hidden by 4 hidden), best of 5 each."""
    best = 0.0
    for rows in (256, 1024, 4096):
        a, b = torch.randn(rows, hidden), torch.randn(hidden, 4 * hidden)
        torch.mm(a, b)
        for _ in range(5):
            t = time.perf_counter()
            torch.mm(a, b)
            best = max(best, 2 * rows * hidden * 4 * hidden / (time.perf_counter() - t) / 1e9)
    return best


def level_floor(n, prompt_len, output_len, c, body, hidden, layers, vocab, weight_bytes, rate, bw):
    """A lower bound on the wall time of a level doing its arithmetic in fp32
    on this machine, as (flops, (a) seconds, steps, (b) seconds): the longer
    of (a) its floating-point operations at the best measured matmul rate
    and (b) its decoding steps, each reading every weight once, at the
    measured read bandwidth. (a): per
    request, the prompt and the fed-back tokens through the body's products
    (2 x body parameters each), attention's QK and PV at each position
    (4 x position x hidden per layer), and the head for each generated token
    (2 x hidden x vocab). (b): with c requests in flight a step decodes at
    most c tokens, so n (output_len - 1) / c steps at least. Keys and values
    read by attention, norms and sampling are left out: the bound is low."""
    fed = prompt_len + output_len - 1
    flops = n * (fed * 2 * body + 4 * hidden * layers * fed * (fed + 1) / 2 +
                 output_len * 2 * hidden * vocab)
    steps = -(-n * (output_len - 1) // c)
    compute_s, memory_s = flops / (rate * 1e9), steps * weight_bytes / (bw * 1e9)
    return flops, compute_s, steps, memory_s


def main():
    kolos, work = sys.argv[1], sys.argv[2]
    levels = [int(c) for c in sys.argv[3].split(",")]
    prompt_len, output_len, requests_min = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    hidden, layers, heads, vocab = (int(v) for v in sys.argv[7:11])
    rounds = int(sys.argv[11])
    context = prompt_len + output_len

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=vocab, n_positions=context, n_embd=hidden, n_layer=layers,
                                  n_head=heads, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
    model_dir = os.path.join(work, "gpt2")
    transformers.GPT2LMHeadModel(cfg).save_pretrained(model_dir)
    os.sync()  # the weights' write-back would otherwise stall the first measurements
    model = transformers.GPT2LMHeadModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    params = sum(p.numel() for p in model.parameters())  # the tied head counted once
    weight_bytes = params * 4
    print(f"model: GPT-2, hidden {hidden}, {layers} layers, {heads} heads, vocab {vocab}, context {context}: "
          f"{params / 1e6:.1f}M parameters, {weight_bytes / 2**20:.0f} MiB in fp32 "
          f"(random weights, transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads)")
    print(f"requests: {prompt_len} prompt tokens, {output_len} new tokens each (greedy, no early stop); "
          f"max({requests_min}, 2 x concurrency) per level")

    rng = random.Random(1)
    prompts = {c: [[rng.randrange(vocab) for _ in range(prompt_len)] for _ in range(max(requests_min, 2 * c))]
               for c in levels}

    # The server stays up through every round; while transformers runs it
    # is idle (no request in flight, its threads asleep).
    max_seqs = max(levels)
    kv_bytes = max_seqs * context * layers * 2 * hidden * 4 * 5 // 4  # full sequences, 16-token blocks rounding
    proc, port, log = start_server(kolos, model_dir, max_seqs, kv_bytes, os.path.join(work, "serve.err"))
    print("kolos: " + " | ".join(l.removeprefix("kolos: ") for l in log.splitlines() if l.startswith("kolos: gpt")))
    try:
        for p in prompts[levels[0]][:2]:  # warm-up: two full requests each, not measured
            kolos_request(port, p, output_len)
        run_transformers(model, prompts[levels[0]][:2], 1, output_len)

        def run(name, c):
            if name == "kolos":
                return run_kolos(port, prompts[c], c, output_len)
            return run_transformers(model, prompts[c], c, output_len)

        # Each round runs every level on both, the two back to back at each
        # level, kolos first in odd rounds and second in even ones, so that a
        # drift of the machine's speed falls on both alike.
        rows, outputs = [], {}
        for rnd in range(1, rounds + 1):
            for c in levels:
                for name in ("kolos", "transformers") if rnd % 2 == 1 else ("transformers", "kolos"):
                    wall, results, itl = run(name, c)
                    row = summarise(name, c, wall, [r[:3] for r in results], itl, output_len)
                    row["round"] = rnd
                    rows.append(row)
                    outputs[(name, c, rnd)] = [r[3] for r in results]
    except BaseException:  # a failed request or an interrupt: no server left behind
        proc.kill()
        raise
    proc.terminate()
    if proc.wait(60) != 0:
        raise SystemExit(f"bench: kolos serve exited {proc.returncode} on SIGTERM")

    print()
    rounds_col = rounds > 1
    print(("| round " if rounds_col else "") + "| server | concurrency | requests | req/s | output tok/s | "
          "TTFT med / p99 (ms) | TPOT med / p99 (ms) | ITL med / p99 (ms) |")
    print(("|---:" if rounds_col else "") + "|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in sorted(rows, key=lambda r: (r["round"], r["name"] != "kolos", r["c"])):
        print((f"| {r['round']} " if rounds_col else "") +
              f"| {r['name']} | {r['c']} | {r['requests']} | {r['req_s']:.2f} | {r['tok_s']:.1f} | "
              f"{r['ttft_med'] * 1e3:.0f} / {r['ttft_p99'] * 1e3:.0f} | "
              f"{r['tpot_med'] * 1e3:.1f} / {r['tpot_p99'] * 1e3:.1f} | "
              f"{r['itl_med'] * 1e3:.1f} / {r['itl_p99'] * 1e3:.1f} |")
    print()
    # With several rounds, a level's figure is its median round's (by output
    # tokens/s) and its ratio the median of the rounds' ratios.
    by = {}
    for name in ("kolos", "transformers"):
        for c in levels:
            mine = sorted((r for r in rows if r["name"] == name and r["c"] == c), key=lambda r: r["tok_s"])
            by[(name, c)] = mine[(len(mine) - 1) // 2]
    for c in levels:
        ratios = [next(r["tok_s"] for r in rows if r["name"] == "kolos" and r["c"] == c and r["round"] == rnd) /
                  next(r["tok_s"] for r in rows if r["name"] == "transformers" and r["c"] == c and r["round"] == rnd)
                  for rnd in range(1, rounds + 1)]
        same = sum(a == b for rnd in range(1, rounds + 1)
                   for a, b in zip(outputs[("kolos", c, rnd)], outputs[("transformers", c, rnd)]))
        each = f" (rounds: {', '.join(f'{x:.2f}' for x in ratios)}; median)" if rounds_col else ""
        print(f"concurrency {c}: output tokens/s kolos/transformers = {statistics.median(ratios):.2f}{each}; "
              f"same greedy tokens in {same} of {rounds * len(prompts[c])} requests")

    bw = read_bandwidth()
    rate = matmul_rate(hidden)
    body = params - model.transformer.wte.weight.numel() - model.transformer.wpe.weight.numel()
    print(f"machine: fp32 matmul at {rate:.0f} GFLOP/s (torch.mm, best of 256, 1024 and 4096 rows by "
          f"{hidden} x {4 * hidden}), read bandwidth {bw:.1f} GB/s (torch sum over 1 GiB)")
    for c in levels:
        n = len(prompts[c])
        flops, compute_s, steps, memory_s = level_floor(
            n, prompt_len, output_len, c, body, hidden, layers, vocab, weight_bytes, rate, bw)
        ceiling = n * output_len / max(compute_s, memory_s)
        k, t = by[("kolos", c)], by[("transformers", c)]
        print(f"concurrency {c}: ceiling {ceiling:.0f} output tokens/s for this arithmetic in fp32 here "
              f"(the longer of {flops / 1e12:.2f} TFLOP at the matmul rate, {compute_s:.2f} s, and "
              f"{steps} decoding steps reading the weights, {memory_s:.2f} s); kolos reached "
              f"{100 * k['tok_s'] / ceiling:.0f}% of it, transformers {100 * t['tok_s'] / ceiling:.0f}%; "
              f"2x transformers is {200 * t['tok_s'] / ceiling:.0f}% of it")
    bound = bw * 1e9 / weight_bytes
    if 1 in levels:
        single = 1.0 / by[("kolos", 1)]["tpot_med"]
        print(f"single-stream decode: kolos {single:.1f} tokens/s (1 / median TPOT at concurrency 1); "
              f"memory-bandwidth bound {bound:.1f} tokens/s ({weight_bytes / 2**20:.0f} MiB of weights per token "
              f"at a read bandwidth of {bw:.1f} GB/s, torch sum over 1 GiB): {100 * single / bound:.0f}% of it")


if __name__ == "__main__":
    main()
