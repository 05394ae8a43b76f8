#!/usr/bin/env python3
"""PyTorch DDP peer of kolos's ViT on image files (bench/run_vit_bench.sh).

    .cache/torch-venv/bin/python bench/peers/vit_ddp.py --ranks 2 --threads 1 \
        --train digits/digits-train.h5 --test digits/digits-test.h5 \
        --layers 2 --hidden 64 --heads 4 --image-size 8 --patch-size 4 \
        --channels 1 --classes 10 --global-batch 64 --micro-batch 32 --steps 300

The model is kolos's ViT (modules/src/vit/vit.cpp) written with torch.nn:
patches of patch_size^2 * channels pixels through Linear(patch_dim, hidden)
with bias, a class token in front and learned positions added (both
N(0, init_std)); pre-LN blocks x + attn(ln_1(x)), h + mlp(ln_2(h)) with
LayerNorm eps --norm-eps; q/k/v/o Linear(hidden, hidden) with bias and
bidirectional attention through F.scaled_dot_product_attention; MLP
Linear(h, 4h) -> GELU (tanh) -> Linear(4h, h); output projections drawn with
std init_std / sqrt(2 * layers); ln_f; a bias-free head
Linear(hidden, classes) on the class token; mean cross entropy.

Data: the HDF5 files kolos reads (`images` N x H x W x C uint8, `labels`),
pixels as (p / 255 - mean) / std. Global sample i is sample perm_e[i mod N]
of the training file, perm_e a permutation drawn per epoch e = i // N from
--seed (kolos draws its own permutations: the same samples, another order),
and rank r's micro-batch m of step s holds global samples
s * global_batch + (m * ranks + r) * micro_batch on, as kolos's engine
reads them. Training as bench/peers/gpt_ddp.py: DDP over gloo, no_sync() on
all but the last micro-batch, clip_grad_norm_, warm-up + cosine learning
rate, torch.optim.AdamW (betas 0.9/0.95, eps 1e-8, --weight-decay on every
parameter, as kolos).

After training, rank 0 scores the whole --test file: accuracy and mean
loss. Timing: a step from before its data to after optimizer.step(), the
slowest rank's. Prints one JSON line (gpt_ddp.report's fields, and
test_accuracy, test_loss).
"""
import math
import sys

import gpt_ddp


def parse_args(argv=None):
    p = gpt_ddp.make_parser(__doc__.split("\n\n")[0])
    p.add_argument("--train", required=True, help="training images (HDF5)")
    p.add_argument("--test", required=True, help="held-out images (HDF5)")
    p.add_argument("--image-size", type=int, default=8)
    p.add_argument("--patch-size", type=int, default=4)
    p.add_argument("--channels", type=int, default=1)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--norm-eps", type=float, default=1e-5)
    p.add_argument("--mean", type=float, default=0.3)
    p.add_argument("--std", type=float, default=0.4)
    a = p.parse_args(argv)
    if a.image_size % a.patch_size:
        p.error("--image-size must be a multiple of --patch-size")
    # gpt_ddp's report() names the sequence: here the tokens per image.
    a.seq_len = (a.image_size // a.patch_size) ** 2 + 1
    return gpt_ddp.check_args(p, a, a.ranks)


def build_model(a):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    out_std = a.init_std / math.sqrt(2.0 * a.layers)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = a.heads
            gpt_ddp.attention_projections(self, a, out_std)

        def forward(self, x):
            b, t, h = x.shape

            def split(z):
                return z.view(b, t, self.heads, h // self.heads).transpose(1, 2)

            y = F.scaled_dot_product_attention(split(self.q_proj(x)), split(self.k_proj(x)),
                                               split(self.v_proj(x)))
            return self.o_proj(y.transpose(1, 2).reshape(b, t, h))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(a.hidden, eps=a.norm_eps)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(a.hidden, eps=a.norm_eps)
            self.up_proj = gpt_ddp.linear(a.hidden, a.mlp_ratio * a.hidden, a.init_std)
            self.down_proj = gpt_ddp.linear(a.mlp_ratio * a.hidden, a.hidden, out_std)

        def forward(self, x):
            h = x + self.attn(self.ln_1(x))
            return h + self.down_proj(F.gelu(self.up_proj(self.ln_2(h)), approximate="tanh"))

    class Vit(nn.Module):
        def __init__(self):
            super().__init__()
            side = a.image_size // a.patch_size
            patch_dim = a.patch_size ** 2 * a.channels
            self.patch_proj = gpt_ddp.linear(patch_dim, a.hidden, a.init_std)
            self.cls_token = nn.Parameter(torch.randn(a.hidden) * a.init_std)
            self.pos_embed = nn.Parameter(torch.randn(side * side + 1, a.hidden) * a.init_std)
            self.h = nn.ModuleList(Block() for _ in range(a.layers))
            self.ln_f = nn.LayerNorm(a.hidden, eps=a.norm_eps)
            self.classifier = gpt_ddp.linear(a.hidden, a.classes, a.init_std, bias=False)

        def forward(self, pixels, labels=None):  # [B, H, W, C] float
            """The logits, or with labels the mean cross entropy."""
            b, p, s = pixels.size(0), a.patch_size, a.image_size // a.patch_size
            patches = (pixels.reshape(b, s, p, s, p, a.channels).permute(0, 1, 3, 2, 4, 5)
                       .reshape(b, s * s, p * p * a.channels))
            x = self.patch_proj(patches)
            x = torch.cat([self.cls_token.view(1, 1, -1).expand(b, 1, -1), x], 1)
            x = x + self.pos_embed.unsqueeze(0)
            for block in self.h:
                x = block(x)
            logits = self.classifier(self.ln_f(x)[:, 0])
            return logits if labels is None else F.cross_entropy(logits, labels)

    return Vit()


def load(torch, a, path):
    import h5py

    with h5py.File(path, "r") as f:
        images = torch.from_numpy(f["images"][...]).float()
        labels = torch.from_numpy(f["labels"][...]).long()
    expected = (a.image_size, a.image_size, a.channels)
    if tuple(images.shape[1:]) != expected:
        raise SystemExit(f"vit_ddp: {path}: images of {tuple(images.shape[1:])}, not {expected}")
    return (images / 255.0 - a.mean) / a.std, labels


class Sampler:
    """Global sample index -> a training sample, one permutation per epoch."""

    def __init__(self, torch, a, images, labels):
        self.torch, self.a, self.images, self.labels = torch, a, images, labels
        self.perms = {}

    def batch(self, first, count):
        torch, n = self.torch, self.labels.numel()
        rows = []
        for i in range(first, first + count):
            epoch = i // n
            if epoch not in self.perms:
                g = torch.Generator().manual_seed(self.a.seed * 1000003 + epoch)
                self.perms[epoch] = torch.randperm(n, generator=g)
            rows.append(int(self.perms[epoch][i % n]))
        index = torch.tensor(rows)
        return self.images[index], self.labels[index]


def worker(rank, a, port, queue):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    gpt_ddp.init_gloo(torch, dist, a, rank, port)
    train = Sampler(torch, a, *load(torch, a, a.train))
    torch.manual_seed(a.seed)  # the same initial weights on every rank
    model = DDP(build_model(a), bucket_cap_mb=a.bucket_mb)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps,
                            weight_decay=a.weight_decay)
    accumulation = a.global_batch // (a.micro_batch * a.ranks)

    def batches(step):  # rank's micro-batch m: the global samples kolos gives it
        for m in range(accumulation):
            first = step * a.global_batch + (m * a.ranks + rank) * a.micro_batch
            yield train.batch(first, a.micro_batch)

    times, losses = gpt_ddp.train_loop(torch, model, opt, a, rank, batches=batches)
    t = gpt_ddp.max_over_ranks(torch, dist, times)
    l = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(l, op=dist.ReduceOp.SUM)
    if rank == 0:
        images, labels = load(torch, a, a.test)
        with torch.no_grad():
            logits = model.module(images)
            accuracy = logits.argmax(1).eq(labels).float().mean().item()
            test_loss = F.cross_entropy(logits, labels).item()
        parameters = sum(p.numel() for p in model.parameters())
        queue.put((t, (l / a.ranks).tolist(), parameters, accuracy, test_loss))
    dist.barrier()
    dist.destroy_process_group()


def main():
    a = parse_args()
    gpt_ddp.set_threads(a)
    import torch

    times, losses, parameters, accuracy, test_loss = gpt_ddp.spawn(worker, a, a.ranks)
    print(gpt_ddp.report(torch, a, "pytorch_vit_ddp", times, losses, parameters,
                         test_accuracy=accuracy, test_loss=test_loss))


if __name__ == "__main__":
    sys.exit(main())
