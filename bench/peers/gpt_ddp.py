#!/usr/bin/env python3
"""PyTorch DDP peer of kolos's data-parallel GPT run (bench/run_dp_bench.sh).

    .cache/torch-venv/bin/python bench/peers/gpt_ddp.py --ranks 2 --threads 1 \
        --layers 4 --hidden 256 --heads 8 --seq-len 128 --vocab 2048 \
        --global-batch 16 --micro-batch 8 --steps 30 --warmup 5

It runs under torch 2.x (the virtual environment of scripts/install-venv.sh)
and Debian's 1.13 (/usr/bin/python3) alike; run_dp_bench.sh --peer picks
which.

The model is written out with torch.nn to match kolos's GPT
(modules/src/gpt/gpt.cpp, core/src/engine/layer_factory.cpp) op for op:
token + position embeddings N(0, init_std); pre-LN blocks
x + attn(ln_1(x)), h + mlp(ln_2(h)); separate q/k/v/o Linear(hidden, hidden)
with bias; causal softmax(QK^T/sqrt(d))V with the mask built per forward;
MLP Linear(h, 4h) -> GELU(tanh) -> Linear(4h, h); ln_f; logits tied to wte;
mean cross-entropy. Output projections use std init_std/sqrt(2*layers), as
kolos does.

Training: N ranks from torch.multiprocessing.spawn, gloo over 127.0.0.1,
DistributedDataParallel with bucket_cap_mb = --bucket-mb (default 25, as
kolos's parallel.bucket_mb; both in MiB, both cap the first bucket at 1 MiB), global_batch split over ranks and micro-batches
(no_sync() on all but the last micro-batch, loss / M), clip_grad_norm_,
warm-up + cosine learning rate, torch.optim.AdamW (betas 0.9/0.95, eps 1e-8,
weight decay 0). Data: kolos's synthetic source reimplemented bit for bit
(synthetic_sample below), read at the same global sample indices as kolos's
engine, so every rank trains on the very tokens its kolos counterpart does.
The initial weights differ (torch's and kolos's initialisers draw in a
different order), so losses agree only approximately.

Timing: a step is timed on each rank from before the data to after
optimizer.step() (as kolos's step_time_s), and a step's time is the slowest
rank's. Prints one JSON line: the median over the steps after the first
--warmup, tokens/s from that median, and every step's time.
"""
import argparse
import json
import math
import os
import socket
import statistics
import sys
import time


def make_parser(description=None):
    """The options every GPT peer shares (bench/peers/gpt_*.py add theirs)."""
    p = argparse.ArgumentParser(description=description or __doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch/BLAS threads per rank")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--mlp-ratio", type=int, default=4)
    p.add_argument("--init-std", type=float, default=0.02)
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the median")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr", type=float, default=3e-4)
    p.add_argument("--warmup-steps", type=int, default=10, help="learning-rate warm-up")
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--seed", type=int, default=1234)
    return p


def check_args(p, a, data_ranks):
    """Errors out (argparse's way) on a shape the model cannot take or a batch
    that does not split over `data_ranks` data-parallel ranks."""
    if a.hidden % a.heads:
        p.error("--hidden must be a multiple of --heads")
    if a.global_batch % (a.micro_batch * data_ranks):
        p.error("--global-batch must be a multiple of --micro-batch x the data-parallel ranks")
    return a


def parse_args(argv=None):
    p = make_parser()
    a = p.parse_args(argv)
    return check_args(p, a, a.ranks)


def linear(i, o, std, bias=True):
    """nn.Linear(i, o) initialised as kolos's layers are: weight N(0, std),
    bias zero."""
    import torch.nn as nn

    m = nn.Linear(i, o, bias=bias)
    nn.init.normal_(m.weight, 0.0, std)
    if bias:
        nn.init.zeros_(m.bias)
    return m


def attention_projections(module, a, out_std):
    """Sets kolos's attention projections on `module`, in its creation order:
    q_proj, k_proj, v_proj (std --init-std) and o_proj (std `out_std`), each
    Linear(hidden, hidden) with a bias."""
    module.q_proj = linear(a.hidden, a.hidden, a.init_std)
    module.k_proj = linear(a.hidden, a.hidden, a.init_std)
    module.v_proj = linear(a.hidden, a.hidden, a.init_std)
    module.o_proj = linear(a.hidden, a.hidden, out_std)


def build_model(a):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    out_std = a.init_std / math.sqrt(2.0 * a.layers)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads, self.head_dim = a.heads, a.hidden // a.heads
            attention_projections(self, a, out_std)

        def forward(self, x):
            b, t, _ = x.shape

            def split(z):
                # -1: the heads this rank holds (all of them but under tensor
                # parallelism, bench/peers/gpt_dtensor_tp.py).
                return z.view(b, t, -1, self.head_dim).transpose(1, 2)

            q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
            scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
            mask = torch.ones(t, t, dtype=torch.bool).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
            y = torch.matmul(torch.softmax(scores, -1), v)
            return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.up_proj = linear(a.hidden, a.mlp_ratio * a.hidden, a.init_std)
            self.down_proj = linear(a.mlp_ratio * a.hidden, a.hidden, out_std)

        def forward(self, x):
            return self.down_proj(F.gelu(self.up_proj(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn = nn.LayerNorm(a.hidden), Attention()
            self.ln_2, self.mlp = nn.LayerNorm(a.hidden), Mlp()

        def forward(self, x):
            h = x + self.attn(self.ln_1(x))
            return h + self.mlp(self.ln_2(h))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(a.vocab, a.hidden)
            self.wpe = nn.Embedding(a.seq_len, a.hidden)
            nn.init.normal_(self.wte.weight, 0.0, a.init_std)
            nn.init.normal_(self.wpe.weight, 0.0, a.init_std)
            self.h = nn.ModuleList(Block() for _ in range(a.layers))
            self.ln_f = nn.LayerNorm(a.hidden)

        def forward(self, tokens, targets):
            pos = torch.arange(tokens.size(1), dtype=torch.long)
            x = self.wte(tokens) + self.wpe(pos).unsqueeze(0)
            for block in self.h:
                x = block(x)
            logits = torch.matmul(self.ln_f(x), self.wte.weight.t())  # tied head
            return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))

    return Gpt()


def lr_at(a, step):
    if step < a.warmup_steps:
        return a.lr * (step + 1) / a.warmup_steps
    decay = max(1, a.steps - a.warmup_steps)
    progress = min(1.0, (step - a.warmup_steps) / decay)
    return a.min_lr + 0.5 * (a.lr - a.min_lr) * (1.0 + math.cos(math.pi * progress))


_MASK64 = (1 << 64) - 1
_STRIDES = (1, 2, 3, 5)


def _mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _splitmix64(x):
    return _mix64((x + 0x9E3779B97F4A7C15) & _MASK64)


def synthetic_sample(a, index):
    """Sample `index` of kolos's synthetic source (modules/src/data/synthetic.cpp,
    hash.h), bit for bit: h = splitmix64(splitmix64(seed) ^ index); start =
    h mod vocab, stride = {1, 2, 3, 5}[splitmix64(h) mod 4]; seq_len + 1 tokens
    (start + i*stride) mod vocab."""
    h = _splitmix64(_splitmix64(a.seed & _MASK64) ^ index)
    start, stride = h % a.vocab, _STRIDES[_splitmix64(h) % len(_STRIDES)]
    return [(start + i * stride) % a.vocab for i in range(a.seq_len + 1)]


def synthetic_batch(torch, a, first_index, count):
    """Samples first_index .. first_index + count - 1 of kolos's synthetic
    source, as (inputs, targets): the tokens kolos's engine reads for the same
    global sample indices (core/src/engine/engine.cpp, next_micro_batches)."""
    tokens = torch.tensor([synthetic_sample(a, first_index + i) for i in range(count)],
                          dtype=torch.long)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def micro_batches(torch, a, step, rank, data_ranks):
    """This rank's micro-batches of step `step` (0-based) as (inputs,
    targets), one data rank of `data_ranks`: micro-batch m holds global
    samples step * global_batch + (m * data_ranks + rank) * micro_batch on,
    the samples kolos's engine gives the same rank."""
    accumulation = a.global_batch // (a.micro_batch * data_ranks)
    for m in range(accumulation):
        first = step * a.global_batch + (m * data_ranks + rank) * a.micro_batch
        yield synthetic_batch(torch, a, first, a.micro_batch)


def train_loop(torch, model, opt, a, rank, no_sync=True, batches=None):
    """Runs a.steps steps of `model` (wrapped in DDP; model(inputs, targets)
    is the loss) with `opt`; returns this rank's step times and mean losses.
    batches(step) yields the step's micro-batches as (inputs, targets)
    (default: the synthetic source's, micro_batches). Gradients are
    synchronised only on a step's last micro-batch (no_sync on the others),
    as kolos does; with no_sync=False (FSDP2, which reduce-scatters every
    micro-batch's gradients, as kolos's zero3) on every one."""
    accumulation = a.global_batch // (a.micro_batch * a.ranks)
    if batches is None:
        def batches(step):
            return micro_batches(torch, a, step, rank, a.ranks)
    times, losses = [], []
    for step in range(a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        loss_sum = 0.0
        for m, (inputs, targets) in enumerate(batches(step)):
            if no_sync and m + 1 < accumulation:
                with model.no_sync():
                    loss = model(inputs, targets)
                    (loss / accumulation).backward()
            else:
                loss = model(inputs, targets)
                (loss / accumulation).backward()
            loss_sum += loss.item()
        if a.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        for group in opt.param_groups:
            group["lr"] = lr_at(a, step)
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss_sum / accumulation)
    return times, losses


def init_gloo(torch, dist, a, rank, port):
    """What every peer's worker starts with: its threads and the gloo group."""
    torch.set_num_threads(a.threads)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks)


def scale_and_step(params, opt, a, step, coef):
    """Scales the gradients by `coef` when it clips (< 1), sets the step's
    learning rate and steps the optimizer, as kolos does after its norm."""
    if coef < 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)
    for group in opt.param_groups:
        group["lr"] = lr_at(a, step)
    opt.step()


def report(torch, a, bench, times, losses, parameters, **extra):
    """The JSON line each peer prints: median step after the warm-up, the
    run's shape, first and last loss, every step's time."""
    skip = min(a.warmup, max(0, len(times) - 1))
    med = statistics.median(times[skip:])
    out = {"bench": bench, "torch": torch.__version__, "backend": "gloo", "ranks": a.ranks,
           "threads": a.threads, "parameters": parameters}
    out.update(extra)
    out.update({"steps": len(times), "warmup": skip, "global_batch": a.global_batch,
                "micro_batch": a.micro_batch, "seq_len": a.seq_len, "step_time_s_median": med,
                "tokens_per_s": a.global_batch * a.seq_len / med, "first_loss": losses[0],
                "final_loss": losses[-1], "step_times_s": [round(x, 6) for x in times]})
    return json.dumps(out)


def worker(rank, a, port, queue):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    init_gloo(torch, dist, a, rank, port)
    torch.manual_seed(a.seed)  # the same initial weights on every rank
    model = DDP(build_model(a), bucket_cap_mb=a.bucket_mb)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps,
                            weight_decay=a.weight_decay)
    times, losses = train_loop(torch, model, opt, a, rank)
    # Slowest rank per step, mean loss over ranks (after the timed loop).
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    l = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(l, op=dist.ReduceOp.SUM)
    if rank == 0:
        parameters = sum(p.numel() for p in model.parameters())
        queue.put((t.tolist(), (l / a.ranks).tolist(), parameters))
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def set_threads(a):
    """Sizes torch/BLAS threads before torch loads (OpenBLAS reads them at
    load time) and keeps gloo on the loopback interface."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(a.threads)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def spawn(worker, a, nprocs):
    """Runs worker(rank, a, port, queue) on `nprocs` processes (gloo over
    127.0.0.1) and returns what rank 0 put on the queue."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.spawn(worker, args=(a, free_port(), queue), nprocs=nprocs, join=True)
    return queue.get()


def max_over_ranks(torch, dist, values, group=None):
    """Per-step maxima over the ranks of `group` (float64 list)."""
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist()


def peak_rss_bytes():
    """This process's peak resident set (Linux ru_maxrss is in KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0


def main():
    a = parse_args()
    set_threads(a)
    import torch

    times, losses, parameters = spawn(worker, a, a.ranks)
    print(report(torch, a, "pytorch_ddp", times, losses, parameters, bucket_cap_mb=a.bucket_mb))

if __name__ == "__main__":
    sys.exit(main())
