#!/usr/bin/env python3
"""PyTorch 2.x torch.distributed.pipelining peer of kolos's pipeline schedules
(bench/run_pipeline_bench.sh, bench/pipeline/pipeline_bench.cpp).

    .cache/torch-venv/bin/python bench/peers/gpt_pipelining.py --ranks 2 \\
        --layers 6 --hidden 128 --heads 4 --seq-len 64 --vocab 512 \\
        --global-batch 32 --micro-batch 4 --steps 10 --warmup 3

Runs, one after the other on the same P ranks (gloo, CPU), the schedules
that match kolos's:
    gpipe        ScheduleGPipe                  1 stage per rank
    1f1b         Schedule1F1B                   1 stage per rank
    interleaved  ScheduleInterleaved1F1B        2 stages per rank (kolos chunks = 2)
    zb           ScheduleInterleavedZeroBubble  1 stage per rank (ZB-H1, as kolos's zb)
and prints one JSON line with each schedule's median step time (a step's
time is its slowest rank's; median over the steps after --warmup).

The model is bench/peers/gpt_ddp.py's GPT, cut as kolos cuts it
(docs/pipeline.md): the block list embed, h.0 .. h.{L-1}, head is split
into P*V contiguous stages minimising the largest stage's parameter count
(kolos's balance = "params"; for interleaved, the same number of blocks in
every stage, as kolos requires); virtual stage s runs on rank s mod P.
The head (ln_f and the LM head) lives on the last stage, which holds its
own copy of the token embedding for the tied head (kolos keeps such a copy
too, and also all-reduces the two copies' gradients each step; this peer
does not: torch.distributed.pipelining has no tied weights across stages).

One step: zero the gradients, schedule.step() over global_batch samples
split into global_batch / micro_batch micro-batches (kolos's synthetic
samples bit for bit, the engine's sample indices), the global gradient norm
(local sums of squares all-reduced over the ranks) and clipping, AdamW.
"""
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_ddp  # noqa: E402

SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb", 1))


def cut(weights, parts):
    """Contiguous split of `weights` into `parts` non-empty groups minimising
    the largest group's sum (linear partition); returns the group sizes."""
    n = len(weights)
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    choice = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0
    for k in range(1, parts + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                v = max(best[k - 1][j], prefix[i] - prefix[j])
                if v < best[k][i]:
                    best[k][i], choice[k][i] = v, j
    sizes, i = [], n
    for k in range(parts, 0, -1):
        j = choice[k][i]
        sizes.append(i - j)
        i = j
    return sizes[::-1]


def build_stages(torch, a, nstages):
    """The model's block list cut into `nstages` stage modules."""
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(a.seed)
    model = gpt_ddp.build_model(a)
    # Blocks as kolos lists them: embed, h.0 .. h.{L-1}, head (ln_f; the
    # tied LM head's weight is the embedding's, counted once, on embed).
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    weights = ([count(model.wte) + count(model.wpe)] + [count(b) for b in model.h] +
               [count(model.ln_f)])
    if len(weights) < nstages:
        raise SystemExit(f"{len(weights)} blocks do not fill {nstages} stages")
    if a.equal_blocks and len(weights) % nstages:
        raise SystemExit(f"{len(weights)} blocks do not split evenly into {nstages} stages")
    sizes = [len(weights) // nstages] * nstages if a.equal_blocks else cut(weights, nstages)

    class Stage(nn.Module):
        def __init__(self, first, blocks, last):
            super().__init__()
            self.first, self.last = first, last
            if first:
                self.wte, self.wpe = model.wte, model.wpe
            self.h = nn.ModuleList(blocks)
            if last:
                self.ln_f = model.ln_f
                # The tied head's weight: the embedding itself on a single
                # stage, a copy of its initial value otherwise.
                self.head_weight = (model.wte.weight if first else
                                    nn.Parameter(model.wte.weight.detach().clone()))

        def forward(self, x):
            if self.first:
                pos = torch.arange(x.size(1), dtype=torch.long)
                x = self.wte(x) + self.wpe(pos).unsqueeze(0)
            for block in self.h:
                x = block(x)
            if self.last:
                x = torch.matmul(self.ln_f(x), self.head_weight.t())
            return x

    stages, start = [], 0
    for s, size in enumerate(sizes):
        idx = list(range(start, start + size))
        start += size
        first, last = idx[0] == 0, idx[-1] == len(weights) - 1
        blocks = [model.h[i - 1] for i in idx if 0 < i <= a.layers]
        stages.append(Stage(first, blocks, last))
    return stages, sizes


def loss_fn(torch, logits, targets):
    import torch.nn.functional as F

    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def run_schedule(torch, dist, a, rank, name, chunks):
    from torch.distributed import pipelining as pp

    P = a.ranks
    nstages = P * chunks
    a.equal_blocks = name == "interleaved"
    modules, sizes = build_stages(torch, a, nstages)
    mine = [s for s in range(nstages) if s % P == rank]
    stages = [pp.PipelineStage(modules[s], s, nstages, torch.device("cpu")) for s in mine]
    M = a.global_batch // a.micro_batch
    lf = lambda out, tgt: loss_fn(torch, out, tgt)  # noqa: E731
    if name == "gpipe":
        schedule = pp.ScheduleGPipe(stages[0], n_microbatches=M, loss_fn=lf)
    elif name == "1f1b":
        schedule = pp.Schedule1F1B(stages[0], n_microbatches=M, loss_fn=lf)
    elif name == "interleaved":
        schedule = pp.ScheduleInterleaved1F1B(stages, n_microbatches=M, loss_fn=lf)
    else:
        schedule = pp.ScheduleInterleavedZeroBubble(stages, n_microbatches=M, loss_fn=lf)
    params = [p for s in mine for p in modules[s].parameters()]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps,
                            weight_decay=a.weight_decay)
    first, last = 0 in mine, (nstages - 1) in mine
    times, losses = [], []
    for step in range(a.steps + a.warmup):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        inputs, targets = gpt_ddp.synthetic_batch(torch, a, step * a.global_batch,
                                                  a.global_batch)
        out = []
        if first and last:
            schedule.step(inputs, target=targets, losses=out)
        elif first:
            schedule.step(inputs)
        elif last:
            schedule.step(target=targets, losses=out)
        else:
            schedule.step()
        coef = 1.0
        if a.grad_clip > 0:
            sq = torch.zeros(1, dtype=torch.float32)
            for p in params:
                if p.grad is not None:
                    sq += p.grad.pow(2).sum()
            dist.all_reduce(sq)
            coef = a.grad_clip / (float(sq.sqrt()) + 1e-6)
        gpt_ddp.scale_and_step(params, opt, a, step, coef)
        times.append(time.perf_counter() - t0)
        losses.append(float(sum(x.item() for x in out) / len(out)) if out else 0.0)
    t = gpt_ddp.max_over_ranks(torch, dist, times)
    l = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(l, op=dist.ReduceOp.SUM)  # only the last stage's rank adds a loss
    med = statistics.median(t[a.warmup:])
    return {"schedule": name, "chunks": chunks, "stages": nstages, "blocks_per_stage": sizes,
            "step_ms": med * 1e3, "first_loss": l[0].item(), "final_loss": l[-1].item(),
            "parameters": sum(p.numel() for m in modules for p in m.parameters())
            - (0 if nstages == 1 else a.vocab * a.hidden)}


def worker(rank, a, port, queue):
    import torch
    import torch.distributed as dist

    gpt_ddp.init_gloo(torch, dist, a, rank, port)
    results = []
    for name, chunks in SCHEDULES:
        if a.schedules and name not in a.schedules:
            continue
        results.append(run_schedule(torch, dist, a, rank, name, chunks))
        dist.barrier()
    if rank == 0:
        queue.put(results)
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = gpt_ddp.make_parser(__doc__.split("\n\n")[0])
    p.add_argument("--schedules", default="", help="comma-separated subset (default: all four)")
    p.set_defaults(layers=6, hidden=128, heads=4, seq_len=64, vocab=512, global_batch=32,
                   micro_batch=4, steps=10, warmup=3)
    a = p.parse_args()
    a.schedules = [s for s in a.schedules.split(",") if s]
    gpt_ddp.check_args(p, a, 1)
    gpt_ddp.set_threads(a)
    import torch

    results = gpt_ddp.spawn(worker, a, a.ranks)
    print(json.dumps({"bench": "pytorch_pipelining", "torch": torch.__version__,
                      "backend": "gloo", "P": a.ranks, "M": a.global_batch // a.micro_batch,
                      "threads": a.threads, "steps": a.steps, "warmup": a.warmup,
                      "schedules": results}))


if __name__ == "__main__":
    sys.exit(main())
