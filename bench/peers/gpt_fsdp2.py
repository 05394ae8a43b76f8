#!/usr/bin/env python3
"""PyTorch 2.x FSDP2 (torch.distributed.fsdp.fully_shard) peer of kolos's zero3.

    .cache/torch-venv/bin/python bench/peers/gpt_fsdp2.py --ranks 2 --threads 1 \\
        --layers 8 --hidden 512 --heads 8 --seq-len 64 --vocab 2048 \\
        --global-batch 8 --micro-batch 2 --steps 8 --warmup 3

Needs torch >= 2.6 (fully_shard in torch.distributed.fsdp): run it with the
virtual environment of scripts/install-venv.sh, not Debian's 1.13.

The GPT, data (kolos's synthetic samples, bit for bit, at the same sample
indices), learning-rate schedule, clipping, AdamW and timing are those of
bench/peers/gpt_ddp.py (imported). Sharding: fully_shard on every block,
then on the whole model (embeddings, ln_f and the tied head in the root
group), on a 1-D CPU device mesh over gloo, with FSDP2's defaults:
parameters resharded after forward (gathered again for backward), gradients
reduce-scattered after every micro-batch's backward (as kolos's zero3
does), fp32 throughout. Each rank keeps 1/N of parameters, gradients and
AdamW states. clip_grad_norm_ works on the sharded gradients (DTensors).

Prints one JSON line like gpt_ddp.py, plus the peak RSS of the rank with the
largest one (ru_maxrss), the RSS before the model was built (the Python and
torch baseline) and this rank's sharded parameter bytes.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_ddp  # noqa: E402


def worker(rank, a, port, queue):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    gpt_ddp.init_gloo(torch, dist, a, rank, port)
    baseline = gpt_ddp.peak_rss_bytes()
    mesh = init_device_mesh("cpu", (a.ranks,))
    torch.manual_seed(a.seed)
    model = gpt_ddp.build_model(a)
    parameters = sum(p.numel() for p in model.parameters())
    for block in model.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    shard_bytes = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps,
                            weight_decay=a.weight_decay)
    times, losses = gpt_ddp.train_loop(torch, model, opt, a, rank, no_sync=False)
    t = gpt_ddp.max_over_ranks(torch, dist, times)
    l = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(l, op=dist.ReduceOp.SUM)
    rss = gpt_ddp.max_over_ranks(torch, dist, [gpt_ddp.peak_rss_bytes(), baseline, shard_bytes])
    if rank == 0:
        queue.put((t, (l / a.ranks).tolist(), rss, parameters))
    dist.barrier()
    dist.destroy_process_group()


def main():
    a = gpt_ddp.parse_args()
    gpt_ddp.set_threads(a)
    import torch

    times, losses, (rss, baseline, shard_bytes), parameters = gpt_ddp.spawn(worker, a, a.ranks)
    print(gpt_ddp.report(torch, a, "pytorch_fsdp2", times, losses, parameters,
                         peak_rss_bytes=rss, baseline_rss_bytes=baseline,
                         param_shard_bytes=shard_bytes))

if __name__ == "__main__":
    sys.exit(main())
