#!/usr/bin/env python3
"""PyTorch peer of kolos's zero1: DDP + torch.distributed.optim.ZeroRedundancyOptimizer.

    .cache/torch-venv/bin/python bench/zero/gpt_zero_peer.py --ranks 2 --threads 1 --layers 8 ...

The same GPT, data (kolos's synthetic samples, bit for bit, at the same
sample indices), bucket size (--bucket-mb: DDP's bucket_cap_mb), schedule
and timing as bench/peers/gpt_ddp.py (whose model and helpers it imports),
with the optimizer replaced by
ZeroRedundancyOptimizer(AdamW): gradients all-reduced by DDP, each rank
steps the parameters it owns, then they are broadcast (PyTorch 1.13 and
2.x alike; run_zero_bench.sh --peer picks which). That
is ZeRO stage 1, as kolos's zero1 (which all-gathers shards instead).
Prints one JSON line like gpt_ddp.py, plus the peak RSS of the slowest rank.
"""
import json
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peers"))
import gpt_ddp  # noqa: E402


def worker(rank, a, port, queue):
    import torch
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(a.threads)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
    torch.manual_seed(a.seed)
    model = DDP(gpt_ddp.build_model(a), bucket_cap_mb=a.bucket_mb)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=a.lr,
                                  betas=(a.beta1, a.beta2), eps=a.eps,
                                  weight_decay=a.weight_decay)
    times, losses = gpt_ddp.train_loop(torch, model, opt, a, rank)
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    l = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(l, op=dist.ReduceOp.SUM)
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0],
                       dtype=torch.float64)
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    if rank == 0:
        parameters = sum(p.numel() for p in model.parameters())
        queue.put((t.tolist(), (l / a.ranks).tolist(), rss.item(), parameters))
    dist.barrier()
    dist.destroy_process_group()


def main():
    a = gpt_ddp.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(a.threads)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.spawn(worker, args=(a, gpt_ddp.free_port(), queue), nprocs=a.ranks, join=True)
    times, losses, rss, parameters = queue.get()
    skip = min(a.warmup, max(0, len(times) - 1))
    med = statistics.median(times[skip:])
    print(json.dumps({
        "bench": "pytorch_zero_redundancy_optimizer", "torch": torch.__version__,
        "backend": "gloo", "ranks": a.ranks, "threads": a.threads, "parameters": parameters,
        "bucket_cap_mb": a.bucket_mb, "steps": len(times),
        "warmup": skip, "step_time_s_median": med,
        "tokens_per_s": a.global_batch * a.seq_len / med, "first_loss": losses[0],
        "final_loss": losses[-1], "peak_rss_bytes": rss,
        "step_times_s": [round(x, 6) for x in times],
    }))


if __name__ == "__main__":
    sys.exit(main())
