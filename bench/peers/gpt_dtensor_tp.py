#!/usr/bin/env python3
"""PyTorch 2.x DTensor tensor-parallel peer of kolos's tp1d
(bench/run_tp_bench.sh --peer torch2).

    .cache/torch-venv/bin/python bench/peers/gpt_dtensor_tp.py --ranks 2 \\
        --layers 4 --hidden 256 --heads 8 --seq-len 64 --vocab 4096 \\
        --global-batch 8 --micro-batch 8 --steps 10 --warmup 3

bench/peers/gpt_ddp.py's GPT, parallelised with
torch.distributed.tensor.parallel.parallelize_module on a 1-D CPU mesh of
all ranks (gloo), laid out as kolos's tp1d lays out its GPT
(docs/tensor-parallel.md):
  q_proj, k_proj, v_proj, up_proj   ColwiseParallel (heads split N ways)
  o_proj, down_proj                 RowwiseParallel (one all-reduce forward)
  wte, wpe                          RowwiseParallel: rows (vocabulary,
                                    positions) split, partial lookups all-reduced
  LM head                           ColwiseParallel with Shard(-1) logits, tied to
                                    wte (both hold the same vocabulary rows), and
                                    a vocabulary-parallel cross entropy
                                    (torch.distributed.tensor.parallel.loss_parallel)
  layer norms                       whole on every rank
Every rank sees the whole batch (no data parallelism): global_batch in
micro-batches of micro_batch, kolos's synthetic samples bit for bit at the
engine's sample indices. Clipping: the global norm (sharded gradients'
squares summed over the ranks, replicated ones counted once), AdamW
(single-tensor, as torch's CPU default). Prints one JSON line like
gpt_ddp.py.
"""
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_ddp  # noqa: E402


def worker(rank, a, port, queue):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   loss_parallel, parallelize_module)

    gpt_ddp.init_gloo(torch, dist, a, rank, port)
    mesh = init_device_mesh("cpu", (a.ranks,))
    torch.manual_seed(a.seed)
    model = gpt_ddp.build_model(a)
    parameters = sum(p.numel() for p in model.parameters())
    # The tied head as a module of its own, so that it can be planned.
    model.head = torch.nn.Linear(a.hidden, a.vocab, bias=False)
    del model.head.weight
    plan = {"wte": RowwiseParallel(input_layouts=Replicate()),
            "wpe": RowwiseParallel(input_layouts=Replicate()),
            "head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}
    for i in range(a.layers):
        for name in ("attn.q_proj", "attn.k_proj", "attn.v_proj", "mlp.up_proj"):
            plan[f"h.{i}.{name}"] = ColwiseParallel()
        for name in ("attn.o_proj", "mlp.down_proj"):
            plan[f"h.{i}.{name}"] = RowwiseParallel()
    model.head.weight = torch.nn.Parameter(torch.empty(0))  # replaced below
    parallelize_module(model, mesh, {k: v for k, v in plan.items() if k != "head"})
    parallelize_module(model.head, mesh, plan["head"])
    model.head.weight = model.wte.weight  # tied: both Shard(0) over the vocabulary

    def forward(tokens, targets):
        pos = torch.arange(tokens.size(1), dtype=torch.long)
        x = model.wte(tokens) + model.wpe(pos).unsqueeze(0)
        for block in model.h:
            x = block(x)
        logits = model.head(model.ln_f(x))  # DTensor, vocabulary-sharded
        with loss_parallel():
            loss = F.cross_entropy(logits.reshape(-1, a.vocab), targets.reshape(-1))
            loss_value = loss.full_tensor() if isinstance(loss, DTensor) else loss
        return loss, loss_value

    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps,
                            weight_decay=a.weight_decay, foreach=False)
    accumulation = a.global_batch // a.micro_batch
    times, losses = [], []
    for step in range(a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        loss_sum = 0.0
        for inputs, targets in gpt_ddp.micro_batches(torch, a, step, 0, 1):
            loss, value = forward(inputs, targets)
            with loss_parallel():
                (loss / accumulation).backward()
            loss_sum += value.item()
        coef = 1.0
        if a.grad_clip > 0:
            sharded = torch.zeros(1)
            whole = torch.zeros(1)
            for p in params:
                g = p.grad
                if isinstance(g, DTensor):
                    local = g.to_local().pow(2).sum()
                    if any(isinstance(pl, Shard) for pl in g.placements):
                        sharded += local
                    else:
                        whole += local
                elif g is not None:
                    whole += g.pow(2).sum()
            dist.all_reduce(sharded)
            coef = a.grad_clip / (math.sqrt(float(sharded + whole)) + 1e-6)
        gpt_ddp.scale_and_step(params, opt, a, step, coef)
        times.append(time.perf_counter() - t0)
        losses.append(loss_sum / accumulation)
    t = gpt_ddp.max_over_ranks(torch, dist, times)
    if rank == 0:
        queue.put((t, losses, parameters))
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = gpt_ddp.make_parser(__doc__.split("\n\n")[0])
    p.set_defaults(layers=4, hidden=256, heads=8, seq_len=64, vocab=4096, global_batch=8,
                   micro_batch=8, steps=10, warmup=3)
    a = p.parse_args()
    gpt_ddp.check_args(p, a, 1)
    if a.heads % a.ranks or (a.mlp_ratio * a.hidden) % a.ranks or a.vocab % a.ranks:
        p.error("--heads, the MLP width and --vocab must divide by --ranks")
    gpt_ddp.set_threads(a)
    import torch

    times, losses, parameters = gpt_ddp.spawn(worker, a, a.ranks)
    print(gpt_ddp.report(torch, a, "pytorch_dtensor_tp", times, losses, parameters))

if __name__ == "__main__":
    sys.exit(main())
