#!/usr/bin/env python3
"""Plain PyTorch expert-parallel peer of kolos's mixtral under parallel.expert
(bench/run_moe_bench.sh).

    .cache/torch-venv/bin/python bench/peers/mixtral_ep.py --ranks 2 --threads 1 \\
        --layers 4 --hidden 256 --heads 8 --kv-heads 2 --ffn-hidden 512 \\
        --experts 8 --top-k 2 --seq-len 64 --vocab 2048 \\
        --global-batch 16 --micro-batch 4 --steps 20 --warmup 5

Needs torch 2.x (torch.distributed._functional_collectives'
all_to_all_single_autograd: uneven splits, differentiable): the virtual
environment of scripts/install-venv.sh.

The model is written out with torch.nn to match kolos's mixtral
(modules/src/llama/llama.cpp, core/src/engine/layer_factory.cpp) op for
op: token embedding; pre-norm blocks x + attn(rms_1(x)), h + moe(rms_2(h));
attention with separate bias-free q/k/v/o projections, grouped-query heads
(kv heads repeated), rotary embedding on the two halves of each head
(theta --rope-theta), causal softmax(QK^T/sqrt(d))V with the mask built per
forward; RMSNorm in float32; an untied lm_head; mean cross-entropy. Every
linear and the embedding N(0, init_std).

The mixture block: a bias-free router Linear(hidden, experts), softmax in
float32, top-k, the chosen scores renormalised to sum to 1; the
Switch/GShard load-balancing loss aux_coef * experts * sum_{k,e} f[k][e] *
P[e] added to the loss; dropless. Expert parallelism over all --ranks (ep =
ranks, no dp): rank r holds experts [r*L, (r+1)*L), L = experts / ranks.
Dispatch: the token's assignments sorted by expert, a count exchange
(all_to_all_single of the per-expert counts), then one uneven
all_to_all_single_autograd of the rows (backward sends the gradients
back); the received rows regrouped by local expert, each expert's SwiGLU
run on its rows, the results put back in arrival order and returned by the
inverse all-to-all; the combine weights the rows and index_adds them onto
their tokens. The same model at --ranks 1 and 2 gives the same losses.

Gradients: after a step's last micro-batch, the dense (replicated)
parameters' gradients are averaged over the ranks in one flat all_reduce;
expert gradients stay on their rank, divided by the number of ranks (each
rank's loss is the mean over its own tokens, as kolos's engine does). The
clip norm sums the dense squares once and the expert squares over the
ranks. AdamW, warm-up + cosine, and the data (kolos's synthetic samples at
the same global sample indices) are those of gpt_ddp.py. The initial
weights differ from kolos's, so the routing and the losses agree only
approximately; the arithmetic per step is the same.

Timing as gpt_ddp.py: a step from before the data to after the optimizer
step, the slowest rank's per step; one JSON line with the median after
--warmup.
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_ddp  # noqa: E402


def parse_args():
    p = gpt_ddp.make_parser(__doc__.split("\n\n")[0])
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--ffn-hidden", type=int, default=512)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--aux-loss-coef", type=float, default=0.01)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--norm-eps", type=float, default=1e-5)
    a = p.parse_args()
    gpt_ddp.check_args(p, a, a.ranks)
    if a.heads % a.kv_heads:
        p.error("--kv-heads must divide --heads")
    if a.experts % a.ranks:
        p.error("--experts must be a multiple of --ranks (every rank holds experts / ranks)")
    if a.top_k > a.experts:
        p.error("--top-k must be at most --experts")
    return a


def build_model(torch, dist, a, rank):
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed._functional_collectives import all_to_all_single_autograd
    world = dist.group.WORLD

    def all_to_all(rows, out_split, in_split):
        # Uneven all-to-all that sends gradients back in backward (torchtitan's
        # expert-parallel dispatch uses the same call).
        return all_to_all_single_autograd(rows, out_split, in_split, world)

    ranks = a.ranks
    local = a.experts // ranks
    head_dim = a.hidden // a.heads

    def linear(i, o):
        m = nn.Linear(i, o, bias=False)
        nn.init.normal_(m.weight, 0.0, a.init_std)
        return m

    class RmsNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(a.hidden))

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + a.norm_eps)).to(
                x.dtype) * self.weight

    def rope(x, cos, sin):
        half = x.size(-1) // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), -1)
        return x * cos + rotated * sin

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = linear(a.hidden, a.hidden)
            self.k_proj = linear(a.hidden, a.kv_heads * head_dim)
            self.v_proj = linear(a.hidden, a.kv_heads * head_dim)
            self.o_proj = linear(a.hidden, a.hidden)

        def forward(self, x, cos, sin):
            b, t, _ = x.shape
            q = self.q_proj(x).view(b, t, a.heads, head_dim).transpose(1, 2)
            k = self.k_proj(x).view(b, t, a.kv_heads, head_dim).transpose(1, 2)
            v = self.v_proj(x).view(b, t, a.kv_heads, head_dim).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            group = a.heads // a.kv_heads
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(head_dim)
            mask = torch.ones(t, t, dtype=torch.bool).triu(1)
            y = torch.matmul(torch.softmax(scores.masked_fill(mask, float("-inf")), -1), v)
            return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))

    class Expert(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = linear(a.hidden, a.ffn_hidden)
            self.up_proj = linear(a.hidden, a.ffn_hidden)
            self.down_proj = linear(a.ffn_hidden, a.hidden)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Moe(nn.Module):
        def __init__(self):
            super().__init__()
            self.router = linear(a.hidden, a.experts)
            # Every expert drawn in order (the serial model's weights), this
            # rank keeping its own.
            experts = [Expert() for _ in range(a.experts)]
            self.experts = nn.ModuleList(experts[rank * local:(rank + 1) * local])

        def forward(self, x_in):
            x = x_in.reshape(-1, a.hidden)
            n = x.size(0)
            logits = self.router(x).float()
            probs = torch.softmax(logits, -1)
            top, choice = probs.topk(a.top_k, -1)
            weights = top / top.sum(-1, keepdim=True)
            flat = choice.reshape(-1)                          # [N*k], token-major
            order = torch.argsort(flat, stable=True)
            token = order // a.top_k
            counts = torch.bincount(flat, minlength=a.experts)  # per global expert
            # How many rows this rank receives from each rank for each of its experts.
            recv = torch.empty_like(counts)
            dist.all_to_all_single(recv, counts)
            send_split = counts.view(ranks, local).sum(1).tolist()
            recv_by = recv.view(ranks, local)                  # [source, local expert]
            recv_split = recv_by.sum(1).tolist()
            rows = all_to_all(x[token], recv_split, send_split)
            # Arrival order is (source, expert); run each expert on its rows.
            expert_of = torch.repeat_interleave(
                torch.arange(local).repeat(ranks), recv_by.reshape(-1))
            by_expert = torch.argsort(expert_of, stable=True)
            sizes = torch.bincount(expert_of, minlength=local).tolist()
            outs = [e(chunk) for e, chunk in zip(self.experts, rows[by_expert].split(sizes))]
            y = torch.empty_like(rows).index_copy(0, by_expert, torch.cat(outs))
            back = all_to_all(y, send_split, recv_split)
            w = weights.reshape(-1)[order].unsqueeze(-1)
            out = torch.zeros_like(x).index_add(0, token, back * w.to(back.dtype))
            fraction = torch.nn.functional.one_hot(choice.t(), a.experts).float().mean(1)
            aux = a.aux_loss_coef * a.experts * (fraction * probs.mean(0)).sum()
            return out.reshape(x_in.shape), aux

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn = RmsNorm(), Attention()
            self.ln_2, self.mlp = RmsNorm(), Moe()

        def forward(self, x, cos, sin):
            h = x + self.attn(self.ln_1(x), cos, sin)
            y, aux = self.mlp(self.ln_2(h))
            return h + y, aux

    class Mixtral(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(a.vocab, a.hidden)
            nn.init.normal_(self.wte.weight, 0.0, a.init_std)
            self.h = nn.ModuleList(Block() for _ in range(a.layers))
            self.ln_f = RmsNorm()
            self.lm_head = linear(a.hidden, a.vocab)

        def forward(self, tokens, targets):
            t = tokens.size(1)
            inv = a.rope_theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim)
            angles = torch.arange(t, dtype=torch.float).unsqueeze(1) * inv.unsqueeze(0)
            angles = torch.cat((angles, angles), -1)
            cos, sin = angles.cos(), angles.sin()
            x = self.wte(tokens)
            aux_total = 0.0
            for block in self.h:
                x, aux = block(x, cos, sin)
                aux_total = aux_total + aux
            logits = self.lm_head(self.ln_f(x))
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
            return loss, aux_total

    return Mixtral()


def worker(rank, a, port, queue):
    import time

    import torch
    import torch.distributed as dist
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    gpt_ddp.init_gloo(torch, dist, a, rank, port)
    torch.manual_seed(a.seed)  # the same dense weights on every rank
    model = build_model(torch, dist, a, rank)
    expert_params = [p for n, p in model.named_parameters() if ".experts." in n]
    expert_ids = {id(p) for p in expert_params}
    dense_params = [p for p in model.parameters() if id(p) not in expert_ids]
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps,
                            weight_decay=a.weight_decay)
    accumulation = a.global_batch // (a.micro_batch * a.ranks)
    times, losses = [], []
    for step in range(a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        loss_sum = 0.0
        for inputs, targets in gpt_ddp.micro_batches(torch, a, step, rank, a.ranks):
            loss, aux = model(inputs, targets)
            ((loss + aux) / accumulation).backward()
            loss_sum += loss.item()
        grads = [p.grad for p in dense_params]
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        flat.div_(a.ranks)
        for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
            g.copy_(synced)
        for p in expert_params:
            p.grad.div_(a.ranks)
        coef = 1.0
        if a.grad_clip > 0:
            dense_sq = sum(float(g.pow(2).sum()) for g in grads)
            expert_sq = torch.tensor([sum(float(p.grad.pow(2).sum()) for p in expert_params)],
                                     dtype=torch.float64)
            dist.all_reduce(expert_sq)
            norm = math.sqrt(dense_sq + float(expert_sq))
            coef = min(1.0, a.grad_clip / (norm + 1e-6))
        gpt_ddp.scale_and_step(model.parameters(), opt, a, step, coef)
        times.append(time.perf_counter() - t0)
        losses.append(loss_sum / accumulation)
    t = gpt_ddp.max_over_ranks(torch, dist, times)
    l = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(l)
    local = torch.tensor([float(sum(p.numel() for p in expert_params))], dtype=torch.float64)
    dist.all_reduce(local)
    if rank == 0:
        parameters = sum(p.numel() for p in dense_params) + int(local.item())
        queue.put((t, (l / a.ranks).tolist(), parameters))
    dist.barrier()
    dist.destroy_process_group()


def main():
    a = parse_args()
    gpt_ddp.set_threads(a)
    import torch

    times, losses, parameters = gpt_ddp.spawn(worker, a, a.ranks)
    print(gpt_ddp.report(torch, a, "pytorch_all_to_all_ep", times, losses, parameters,
                         experts=a.experts, top_k=a.top_k, ep=a.ranks))


if __name__ == "__main__":
    sys.exit(main())
