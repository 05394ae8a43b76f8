// The autoplan plugin's calibration (calibration.h): the rates of this
// machine, measured with every rank of the world running at once, for the
// planner's cost model (kolos/planner/cluster.h, MachineRates).
#include "calibration.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include <ATen/ATen.h>
#include <torch/torch.h>

#include "kolos/core/sequence.h"
#include "kolos/planner/cost_model.h"

namespace kolos::autoplan {
namespace {

namespace pl = kolos::planner;

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The group mean of a per-rank value.
double group_mean(comm::ProcessGroup& g, double x) {
  at::Tensor t = at::full({1}, x, at::kDouble);
  g.all_reduce(t)->wait();
  return t.item<double>() / g.size();
}
double group_max(comm::ProcessGroup& g, double x) {
  at::Tensor t = at::full({1}, x, at::kDouble);
  g.all_reduce(t, comm::ReduceOp::kMax)->wait();
  return t.item<double>();
}

// Seconds per call of `fn`, every rank running it at once: a warm-up, then
// as many calls as fill about `target` seconds (rank 0's count, so that the
// ranks overlap). The time is the whole group's, from the barrier before
// until the last rank is done, over the calls: what each rank gets of the
// machine while all of them work, however the cores were shared among them.
template <typename F>
double timed(comm::ProcessGroup& world, F&& fn, double target = 0.15) {
  fn();
  world.barrier()->wait();
  auto t0 = Clock::now();
  fn();
  double once = std::max(seconds_since(t0), 1e-7);
  at::Tensor n =
      at::full({1}, static_cast<int64_t>(std::clamp(target / once, 2.0, 20000.0)), at::kLong);
  world.broadcast(n, 0)->wait();
  const int64_t reps = n.item<int64_t>();
  world.barrier()->wait();
  t0 = Clock::now();
  for (int64_t i = 0; i < reps; ++i) fn();
  world.barrier()->wait();
  return group_max(world, seconds_since(t0)) / static_cast<double>(reps);
}

}  // namespace

pl::MachineRates measure(const comm::ProcessGroupPtr& world_ptr, const RunConfig& config) {
  comm::ProcessGroup& world = *world_ptr;
  const int n = world.size();
  pl::MachineRates r;
  const auto opts = at::TensorOptions().dtype(at::kFloat);
  at::manual_seed(1234 + world.rank());

  // Matrix products, square, n = 32 .. 1024: FLOP/s by size.
  for (const int64_t k : {32, 64, 128, 256, 512, 1024}) {
    const at::Tensor a = at::randn({k, k}, opts), b = at::randn({k, k}, opts);
    at::Tensor c = at::empty({k, k}, opts);
    const double s = timed(world, [&] { at::mm_out(c, a, b); });
    const double flops = 2.0 * static_cast<double>(k * k * k);
    r.gemm_curve.emplace_back(flops, flops / s);
  }
  r.gemm_flops = r.gemm_curve.back().second;

  // The attention core at the model's shape (one sequence, every head),
  // forward and backward: 3 x the forward's 4·s²·h FLOPs.
  const ModelConfig& m = config.model;
  const int64_t d = m.hidden / m.heads;
  {
    std::vector<at::Tensor> qkv;
    for (int i = 0; i < 3; ++i)
      qkv.push_back(at::randn({1, m.heads, m.seq_len, d}, opts).requires_grad_());
    const double s = timed(world, [&] {
      at::Tensor out = causal_attention(qkv);
      out.sum().backward();
      for (auto& t : qkv) t.mutable_grad() = at::Tensor();
    });
    r.attention_flops = 3.0 * 4.0 * static_cast<double>(m.seq_len * m.seq_len * m.hidden) / s;
  }

  // Memory-bound kernels at the model's activation size: a LayerNorm, a
  // GELU and a residual add, each reading and writing [s, h] fp32.
  {
    const at::Tensor x = at::randn({m.seq_len, m.hidden}, opts), w = at::ones({m.hidden}, opts),
                     bias = at::zeros({m.hidden}, opts);
    const double s = timed(world, [&] {
      at::Tensor y = at::layer_norm(x, {m.hidden}, w, bias);
      y = at::gelu(y);
      y = y + x;
    });
    r.elementwise_bytes = 3.0 * 2.0 * 4.0 * static_cast<double>(x.numel()) / s;
  }

  // The fixed cost of one operation that autograd records.
  {
    const at::Tensor a = at::ones({8}, opts).requires_grad_(), b = at::ones({8}, opts);
    r.op_seconds = timed(
        world, [&] { (void)(a + b); }, 0.05);
  }

  // A whole GPT block as modules/ builds it (LayerNorm, q/k/v/o with
  // biases, the attention core, a GELU MLP, two residual adds), forward and
  // backward, at micro-batches from 1 to the config's B: measured =
  // block_factor x predicted + block_fixed, a line fitted through them (at
  // B = 1, or a line that does not fit: the ratio at B alone, no fixed part).
  auto block_at = [&](int64_t b) -> std::pair<double, double> {
    const int64_t s = m.seq_len, h = m.hidden;
    const int64_t f = m.mlp_ratio * h;
    auto param = [&](std::initializer_list<int64_t> shape) {
      return (at::randn(shape, opts) * 0.02).requires_grad_();
    };
    const at::Tensor x = at::randn({b, s, h}, opts).requires_grad_();
    const at::Tensor ln_w = at::ones({h}, opts).requires_grad_(), ln_b = param({h});
    const at::Tensor w_qkv = param({3 * h, h}), b_qkv = param({3 * h});
    const at::Tensor w_o = param({h, h}), b_o = param({h});
    const at::Tensor w_1 = param({f, h}), b_1 = param({f}), w_2 = param({h, f}), b_2 = param({h});
    const std::vector<at::Tensor> params = {x,   ln_w, ln_b, w_qkv, b_qkv, w_o,
                                            b_o, w_1,  b_1,  w_2,   b_2};
    const double measured = timed(
        world,
        [&] {
          at::Tensor a = at::layer_norm(x, {h}, ln_w, ln_b);
          const auto qkv =
              at::linear(a, w_qkv, b_qkv).view({b, s, 3, m.heads, d}).permute({2, 0, 3, 1, 4});
          at::Tensor att = causal_attention({qkv[0], qkv[1], qkv[2]});
          att = att.transpose(1, 2).reshape({b, s, h});
          const at::Tensor x2 = x + at::linear(att, w_o, b_o);
          a = at::layer_norm(x2, {h}, ln_w, ln_b);
          const at::Tensor y = x2 + at::linear(at::gelu(at::linear(a, w_1, b_1)), w_2, b_2);
          y.sum().backward();
          for (const auto& t : params) const_cast<at::Tensor&>(t).mutable_grad() = at::Tensor();
        },
        0.6);
    pl::ModelShape shape;
    shape.layers = 1, shape.hidden = h, shape.heads = m.heads, shape.seq_len = s;
    shape.vocab = m.vocab, shape.ffn_multiplier = m.mlp_ratio;
    return {measured, pl::block_seconds(shape, r, static_cast<double>(b), 4.0)};
  };
  {
    // Sizes 1, 2, 4, ... up to B, each measured twice (the fastest kept:
    // another tenant's burst only slows); a least-squares line.
    const int64_t B = config.train.micro_batch;
    std::vector<std::pair<double, double>> points;   // (predicted, measured)
    std::vector<std::pair<double, double>> repeats;  // (first, second) measured
    for (int64_t b = 1;; b = std::min(2 * b, B)) {
      const auto first = block_at(b), second = block_at(b);
      points.emplace_back(first.second, std::min(first.first, second.first));
      repeats.emplace_back(first.first, second.first);
      if (b == B) break;
    }
    const double n = static_cast<double>(points.size());
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (const auto& [x, y] : points) sx += x, sy += y, sxx += x * x, sxy += x * y;
    const auto& [predicted_B, measured_B] = points.back();
    r.block_factor = measured_B / predicted_B;
    r.block_fixed = 0;
    if (points.size() > 1) {
      const double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
      const double fixed = (sy - slope * sx) / n;
      if (slope > 0 && fixed > 0) r.block_factor = slope, r.block_fixed = fixed;
    }
    // The spread (tune.h): the repeats' disagreement (each of a pair has
    // variance sigma^2 in the logarithm, their difference 2 sigma^2) and the
    // fitted line's misses, in the logarithm; the floor of a prediction's
    // uncertainty. Every rank computed the same figures (group times).
    double noise = 0, miss = 0;
    for (const auto& [a, b] : repeats) noise += std::log(a / b) * std::log(a / b) / 2;
    for (const auto& [x, y] : points) {
      const double fitted = r.block_factor * x + r.block_fixed;
      miss += std::log(y / fitted) * std::log(y / fitted);
    }
    r.spread = std::sqrt(noise / static_cast<double>(repeats.size()) + miss / n);
  }
  // The cores the ranks may run on together: the union of their affinities
  // (bound ranks each see their own).
  {
    cpu_set_t set;
    CPU_ZERO(&set);
    at::Tensor mine = at::zeros({CPU_SETSIZE}, at::kInt);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
      for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &set)) mine[cpu] = 1;
      }
    }
    world.all_reduce(mine, comm::ReduceOp::kMax)->wait();
    r.cores = static_cast<double>(mine.sum().item<int64_t>());
  }

  // Collectives per group size, every group of consecutive ranks at once
  // (as tensor groups are laid out): alpha + bytes/beta fitted to two sizes.
  for (int g = 2; g <= n; ++g) {
    if (n % g != 0) continue;
    const comm::ProcessGroupPtr group =
        world.split(world.rank() / g, world.rank() % g, "calibrate-" + std::to_string(g));
    for (const pl::Collective op :
         {pl::Collective::kAllReduce, pl::Collective::kAllGather, pl::Collective::kReduceScatter,
          pl::Collective::kAllToAll, pl::Collective::kSendRecv}) {
      if (op == pl::Collective::kSendRecv && g != 2) continue;  // a neighbour's hop: pairs
      double t[2] = {0, 0}, bytes[2] = {64.0 * 1024, 4.0 * 1024 * 1024};
      for (int i = 0; i < 2; ++i) {
        const int64_t numel = static_cast<int64_t>(bytes[i] / 4) / g * g;
        const at::Tensor whole = at::ones({numel}, opts);
        const at::Tensor part = at::ones({numel / g}, opts);
        at::Tensor out_whole = at::empty({numel}, opts), out_part = at::empty({numel / g}, opts);
        const int peer = group->rank() ^ 1;
        auto run = [&] {
          switch (op) {
            case pl::Collective::kAllReduce:
              group->all_reduce(out_whole.copy_(whole))->wait();
              break;
            case pl::Collective::kAllGather:
              group->all_gather_flat(out_whole, part)->wait();
              break;
            case pl::Collective::kReduceScatter:
              group->reduce_scatter_flat(out_part, whole)->wait();
              break;
            case pl::Collective::kAllToAll:
              group->all_to_all(out_whole, whole)->wait();
              break;
            case pl::Collective::kSendRecv:
              if (group->rank() % 2 == 0) {
                group->send(whole, peer)->wait();
                group->recv(out_whole, peer)->wait();
              } else {
                group->recv(out_whole, peer)->wait();
                group->send(whole, peer)->wait();
              }
              break;
          }
        };
        t[i] = group_max(world, timed(world, run, 0.1));
        if (op == pl::Collective::kSendRecv) t[i] /= 2;  // a round trip is two hops
      }
      pl::AlphaBeta ab;
      ab.beta = (bytes[1] - bytes[0]) / std::max(t[1] - t[0], 1e-9);
      ab.alpha = std::max(0.0, t[0] - bytes[0] / ab.beta);
      r.measured[{op, g}] = ab;
    }
    // The sync cost: a small all-reduce right after a piece of compute, as
    // a tensor-parallel layer does it, against the compute alone and the
    // all-reduce's own time back to back.
    {
      const int64_t k = 192;
      const at::Tensor a = at::randn({k, k}, opts), b = at::randn({k, k}, opts);
      at::Tensor c = at::empty({k, k}, opts), small = at::ones({256}, opts);
      const double compute = timed(
          world, [&] { at::mm_out(c, a, b); }, 0.1);
      const double both = timed(
          world,
          [&] {
            at::mm_out(c, a, b);
            group->all_reduce(small)->wait();
          },
          0.1);
      const pl::AlphaBeta& ar = r.measured[{pl::Collective::kAllReduce, g}];
      r.sync[g] = std::max(0.0, both - compute - (ar.alpha + 1024.0 / ar.beta));
    }
  }
  r.source = "calibration";
  return r;
}

}  // namespace kolos::autoplan
