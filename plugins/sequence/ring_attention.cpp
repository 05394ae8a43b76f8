// Ring attention (ring_attention.h).
//
// Forward, on rank r of sp, with the block of owner o = r - s (mod sp) in
// hand at step s: post the block's send to r+1 and the next block's receive
// from r-1, fold the block into the running max m, sum l and unnormalised
// output acc of every query row (all float32), wait, rotate. At the end
// out = acc / l and lse = m + log l; out and lse are saved, the scores are
// not.
//
// Backward, the same ring again. With P = exp(S - lse) recomputed per tile
// and D = rowsum(dO * out) (flash attention's identities):
//   dV += P^T dO,  dS = P * (dO V^T - D),  dQ += dS K / sqrt(d),
//   dK += dS^T Q / sqrt(d).
// dQ stays here. The dK/dV accumulator of a block travels one hop behind its
// K/V: at step s rank r computes its part for the block of owner r - s into
// a fresh buffer while the accumulator of that block (the sum of the parts
// of ranks r-s .. r-1) arrives from r-1, then adds the two and sends the sum
// on to r+1. The receive overlaps the computation, the send overlaps the next
// step's; after sp steps each accumulator has visited every rank and the last
// hop brings it home to its owner.
//
// Tiles. Causal balance needs skipping at a finer grain than a rank's block:
// under zigzag placement no rank's keys all follow another rank's queries,
// but one chunk's keys follow the other chunk's queries. So rows are cut
// into runs where the positions jump, and the runs into tiles of at most
// half the rows (a zigzag block: its two chunks, also on rank sp-1 whose
// chunks sp-1 and sp are adjacent; a contiguous block: its two halves, so
// that its diagonal block skips its upper quarter as well) and at most
// max_tile_rows rows, which bounds the scores a tile pair holds at once
// (B x h x rows x rows) whatever T_local. Each (query tile, key tile) pair is
// skipped, computed unmasked or computed with the positional mask by
// comparing the tiles' position ranges. Rows with many jumps (more than
// kMaxRuns runs) are taken as one run: tiny tiles would cost more in
// per-product overhead than the skipping saves, and the mask keeps any
// order of positions right.
#include "ring_attention.h"

#include <ATen/ATen.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <ctime>
#include <limits>
#include <utility>
#include <vector>

#include "kolos/core/comm/process_group.h"
#include "kolos/core/error.h"

namespace kolos {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Tags of the three message streams of a ring (one sp group carries only
// these, so they need only differ from each other).
constexpr int kTagKv = 3101;
constexpr int kTagPositions = 3102;
constexpr int kTagGrad = 3103;
constexpr size_t kMaxRuns = 8;

constexpr float kInf = std::numeric_limits<float>::infinity();

// One pass's tile pairs (computed, skipped, score elements) and compute time
// (wall and thread CPU).
struct PassCounters {
  std::atomic<int64_t> pairs{0}, skipped{0}, elements{0}, ns{0}, cpu_ns{0};
  void reset() { pairs = skipped = elements = ns = cpu_ns = 0; }
};

struct Counters {
  PassCounters forward, backward;
};

// This thread's CPU time. Unlike the wall clock it does not count the time
// the thread waits for a core, so on oversubscribed cores (sp ranks > cores)
// it still measures each rank's own work.
int64_t thread_cpu_ns() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

// Adds the wall and thread CPU time from construction to destruction to two
// counters.
class ComputeTimer {
 public:
  ComputeTimer(std::atomic<int64_t>& wall, std::atomic<int64_t>& cpu)
      : wall_(wall),
        cpu_(cpu),
        start_(std::chrono::steady_clock::now()),
        cpu_start_(thread_cpu_ns()) {}
  ~ComputeTimer() {
    wall_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                                  start_)
                 .count();
    cpu_ += thread_cpu_ns() - cpu_start_;
  }

 private:
  std::atomic<int64_t>& wall_;
  std::atomic<int64_t>& cpu_;
  std::chrono::steady_clock::time_point start_;
  int64_t cpu_start_;
};
Counters& counters() {
  static Counters c;
  return c;
}

// A run of rows [begin, begin + length) and the range of their positions.
struct Tile {
  int64_t begin, length, min_pos, max_pos;
};

std::atomic<int64_t> max_tile_rows{detail::kDefaultMaxTileRows};

std::vector<Tile> tiles_of(const at::Tensor& positions) {
  const at::Tensor cpu = positions.to(at::kCPU).contiguous();
  const int64_t* p = cpu.data_ptr<int64_t>();
  const int64_t n = cpu.numel();
  // Runs of consecutive positions [begin, end).
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (int64_t i = 0; i < n; ++i) {
    if (runs.empty() || p[i] != p[i - 1] + 1) runs.emplace_back(i, i);
    ++runs.back().second;
  }
  if (runs.size() > kMaxRuns) runs.assign(1, {0, n});
  const int64_t length = std::max<int64_t>(1, std::min((n + 1) / 2, max_tile_rows.load()));
  std::vector<Tile> tiles;
  for (const auto& [begin, end] : runs) {
    for (int64_t b = begin; b < end; b += length) {
      const int64_t e = std::min(end, b + length);
      const auto [lo, hi] = std::minmax_element(p + b, p + e);
      tiles.push_back(Tile{b, e - b, *lo, *hi});
    }
  }
  return tiles;
}

enum class Pair { kSkip, kFull, kMasked };

Pair classify(const Tile& q, const Tile& k) {
  if (k.min_pos > q.max_pos) return Pair::kSkip;   // every key follows every query
  if (k.max_pos <= q.min_pos) return Pair::kFull;  // every key at or before every query
  return Pair::kMasked;
}

// The block of one owner as it travels: K and V stacked ([2, B, h, T, d], the
// inputs' dtype, one message) and the owner's positions.
struct Block {
  at::Tensor kv;
  at::Tensor positions;
};

// Posts this block's sends to `right` and the next block's receives from
// `left`; `works` collects the handles, `next` the buffers being filled.
void rotate_post(comm::ProcessGroup& group, const Block& current, Block& next,
                 std::vector<comm::WorkPtr>& works) {
  const int sp = group.size();
  const int right = (group.rank() + 1) % sp;
  const int left = (group.rank() + sp - 1) % sp;
  next.kv = at::empty_like(current.kv);
  next.positions = at::empty_like(current.positions);
  works.push_back(group.send(current.kv, right, kTagKv));
  works.push_back(group.send(current.positions, right, kTagPositions));
  works.push_back(group.recv(next.kv, left, kTagKv));
  works.push_back(group.recv(next.positions, left, kTagPositions));
}

void wait_all(std::vector<comm::WorkPtr>& works) {
  for (auto& w : works) w->wait();
  works.clear();
}

// The positional mask of a pair: true where the key follows the query.
at::Tensor mask_of(const at::Tensor& q_positions, const at::Tensor& k_positions) {
  return k_positions.view({1, -1}).gt(q_positions.view({-1, 1}));
}

// Running state of the online softmax, per query row.
struct Online {
  at::Tensor m, l, acc;  // [B, h, T, 1], [B, h, T, 1], [B, h, T, d], float32
};

// Calls fn(qt, kt, scores) for every pair of a query tile and a key tile of
// `block` that is not wholly masked; scores are q·kᵀ/sqrt_d of the pair,
// float32, with the causal mask applied where the pair straddles the
// diagonal. Counts the pairs computed and skipped, and the time, into `c`.
template <typename Fn>
void for_each_visible_pair(const at::Tensor& q, const at::Tensor& q_positions,
                           const std::vector<Tile>& q_tiles, const Block& block,
                           const at::Tensor& k, double sqrt_d, PassCounters& c, Fn fn) {
  ComputeTimer timer(c.ns, c.cpu_ns);
  const std::vector<Tile> k_tiles = tiles_of(block.positions);
  for (const Tile& qt : q_tiles) {
    for (const Tile& kt : k_tiles) {
      const Pair pair = classify(qt, kt);
      if (pair == Pair::kSkip) {
        ++c.skipped;
        continue;
      }
      ++c.pairs;
      c.elements += qt.length * kt.length;
      at::Tensor s = at::matmul(q.narrow(2, qt.begin, qt.length),
                                k.narrow(2, kt.begin, kt.length).transpose(-2, -1))
                         .div_(sqrt_d);
      if (pair == Pair::kMasked) {
        s.masked_fill_(mask_of(q_positions.narrow(0, qt.begin, qt.length),
                               block.positions.narrow(0, kt.begin, kt.length)),
                       -kInf);
      }
      fn(qt, kt, s);
    }
  }
}

void forward_block(const at::Tensor& q, const at::Tensor& q_positions,
                   const std::vector<Tile>& q_tiles, const Block& block, double sqrt_d,
                   Online& state) {
  const at::Tensor k = block.kv[0].to(at::kFloat);
  const at::Tensor v = block.kv[1].to(at::kFloat);
  for_each_visible_pair(q, q_positions, q_tiles, block, k, sqrt_d, counters().forward,
                        [&](const Tile& qt, const Tile& kt, at::Tensor& s) {
                          const at::Tensor vs = v.narrow(2, kt.begin, kt.length);
                          at::Tensor m = state.m.narrow(2, qt.begin, qt.length);
                          at::Tensor l = state.l.narrow(2, qt.begin, qt.length);
                          at::Tensor acc = state.acc.narrow(2, qt.begin, qt.length);
                          const at::Tensor m_new =
                              at::maximum(m, std::get<0>(s.max(-1, /*keepdim=*/true)));
                          // A row with no visible key yet keeps m = -inf; shifting it by 0
                          // instead keeps exp() at 0 rather than exp(-inf - -inf) = NaN.
                          const at::Tensor shift = m_new.masked_fill(m_new.eq(-kInf), 0.0);
                          const at::Tensor p = s.sub_(shift).exp_();
                          const at::Tensor alpha = (m - shift).exp_();
                          l.mul_(alpha).add_(p.sum(-1, /*keepdim=*/true));
                          acc.mul_(alpha).add_(at::matmul(p, vs));
                          m.copy_(m_new);
                        });
}

// Adds this rank's gradient parts for one block: into dq (its own rows) and
// into grad_kv ([2, B, h, T, d] float32: dK, dV of the block's rows).
void backward_block(const at::Tensor& q, const at::Tensor& q_positions,
                    const std::vector<Tile>& q_tiles, const at::Tensor& grad_out,
                    const at::Tensor& lse, const at::Tensor& delta, const Block& block,
                    double sqrt_d, at::Tensor& dq, at::Tensor& grad_kv) {
  const at::Tensor k = block.kv[0].to(at::kFloat);
  const at::Tensor v = block.kv[1].to(at::kFloat);
  for_each_visible_pair(
      q, q_positions, q_tiles, block, k, sqrt_d, counters().backward,
      [&](const Tile& qt, const Tile& kt, at::Tensor& s) {
        const at::Tensor qs = q.narrow(2, qt.begin, qt.length);
        const at::Tensor gs = grad_out.narrow(2, qt.begin, qt.length);
        const at::Tensor ks = k.narrow(2, kt.begin, kt.length);
        const at::Tensor vs = v.narrow(2, kt.begin, kt.length);
        const at::Tensor p = s.sub_(lse.narrow(2, qt.begin, qt.length)).exp_();
        grad_kv[1].narrow(2, kt.begin, kt.length).add_(at::matmul(p.transpose(-2, -1), gs));
        at::Tensor ds = at::matmul(gs, vs.transpose(-2, -1));
        ds.sub_(delta.narrow(2, qt.begin, qt.length)).mul_(p).div_(sqrt_d);
        dq.narrow(2, qt.begin, qt.length).add_(at::matmul(ds, ks));
        grad_kv[0].narrow(2, kt.begin, kt.length).add_(at::matmul(ds.transpose(-2, -1), qs));
      });
}

comm::ProcessGroup* group_of(AutogradContext* ctx) {
  return reinterpret_cast<comm::ProcessGroup*>(ctx->saved_data.at("group").toInt());
}

struct RingAttentionFunction : torch::autograd::Function<RingAttentionFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& positions,
                            comm::ProcessGroup* group) {
    const int sp = group->size();
    const double sqrt_d = std::sqrt(static_cast<double>(q.size(3)));
    const at::Tensor q32 = q.to(at::kFloat).contiguous();
    const std::vector<Tile> q_tiles = tiles_of(positions);
    Online state{at::full({q.size(0), q.size(1), q.size(2), 1}, -kInf, q32.options()),
                 at::zeros({q.size(0), q.size(1), q.size(2), 1}, q32.options()),
                 at::zeros_like(q32)};

    Block current{at::stack({k, v}).contiguous(), positions};
    std::vector<comm::WorkPtr> works;
    for (int step = 0; step < sp; ++step) {
      Block next;
      if (step + 1 < sp) rotate_post(*group, current, next, works);
      forward_block(q32, positions, q_tiles, current, sqrt_d, state);
      wait_all(works);
      if (step + 1 < sp) current = std::move(next);
    }

    const at::Tensor empty = state.l.eq(0);
    const at::Tensor l = state.l.masked_fill(empty, 1.0);
    at::Tensor out = state.acc.div_(l);
    // No visible key: lse = +inf makes the backward's exp(S - lse) zero.
    const at::Tensor lse = state.m.masked_fill(empty, 0.0).add_(l.log()).masked_fill_(empty, kInf);
    ctx->save_for_backward({q, k, v, positions, out, lse});
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    return out.to(q.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    comm::ProcessGroup* group = group_of(ctx);
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &positions = saved[3],
                     &out = saved[4], &lse = saved[5];
    const int sp = group->size();
    const int right = (group->rank() + 1) % sp;
    const int left = (group->rank() + sp - 1) % sp;
    const double sqrt_d = std::sqrt(static_cast<double>(q.size(3)));
    const at::Tensor q32 = q.to(at::kFloat).contiguous();
    // An unused output still takes part: the ring is collective.
    const at::Tensor grad_out = grad_outputs[0].defined()
                                    ? grad_outputs[0].to(at::kFloat).contiguous()
                                    : at::zeros_like(q32);
    const at::Tensor delta = (grad_out * out).sum(-1, /*keepdim=*/true);
    const std::vector<Tile> q_tiles = tiles_of(positions);
    at::Tensor dq = at::zeros_like(q32);

    Block current{at::stack({k, v}).contiguous(), positions};
    std::vector<comm::WorkPtr> works;
    at::Tensor grad_sent;  // the accumulator in flight to `right`
    comm::WorkPtr grad_send;
    for (int step = 0; step < sp; ++step) {
      Block next;
      if (step + 1 < sp) rotate_post(*group, current, next, works);
      at::Tensor grad_in;
      comm::WorkPtr grad_recv;
      if (step > 0) {
        grad_in = at::empty({2, k.size(0), k.size(1), k.size(2), k.size(3)}, q32.options());
        grad_recv = group->recv(grad_in, left, kTagGrad);
      }
      at::Tensor grad_kv =
          at::zeros({2, k.size(0), k.size(1), k.size(2), k.size(3)}, q32.options());
      backward_block(q32, positions, q_tiles, grad_out, lse, delta, current, sqrt_d, dq, grad_kv);
      if (grad_recv) {
        grad_recv->wait();
        grad_kv.add_(grad_in);
      }
      if (sp > 1) {
        if (grad_send) grad_send->wait();
        grad_sent = grad_kv;
        grad_send = group->send(grad_sent, right, kTagGrad);
      } else {
        grad_sent = grad_kv;
      }
      wait_all(works);
      if (step + 1 < sp) current = std::move(next);
    }
    at::Tensor grad_kv = grad_sent;
    if (sp > 1) {
      grad_kv = at::empty_like(grad_sent);
      group->recv(grad_kv, left, kTagGrad)->wait();
      grad_send->wait();
    }
    return {dq.to(q.scalar_type()), grad_kv[0].to(k.scalar_type()), grad_kv[1].to(v.scalar_type()),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& positions, comm::ProcessGroup& group) {
  KOLOS_CHECK(q.dim() == 4, "ring_attention: q must be [B, h, T_local, d]; got ", q.sizes());
  KOLOS_CHECK(k.sizes() == q.sizes() && v.sizes() == q.sizes(),
              "ring_attention: q, k and v must have one shape [B, h, T_local, d]; got q ",
              q.sizes(), ", k ", k.sizes(), ", v ", v.sizes(),
              " (repeat grouped key/value heads before the call)");
  KOLOS_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "ring_attention: q, k and v must have one dtype; got ", q.scalar_type(), ", ",
              k.scalar_type(), ", ", v.scalar_type());
  KOLOS_CHECK(at::isFloatingType(q.scalar_type()),
              "ring_attention: q, k and v must be floating point; got ", q.scalar_type());
  KOLOS_CHECK(positions.dim() == 1 && positions.scalar_type() == at::kLong &&
                  positions.size(0) == q.size(2),
              "ring_attention: positions must be int64 [T_local] = [", q.size(2), "]; got ",
              positions.scalar_type(), " ", positions.sizes());
  return RingAttentionFunction::apply(q.contiguous(), k.contiguous(), v.contiguous(),
                                      positions.to(q.device()).contiguous(), &group);
}

at::Tensor zigzag_positions(int64_t seq, int64_t sp, int64_t rank) {
  KOLOS_CHECK_KIND(kConfig, sp >= 1 && rank >= 0 && rank < sp, "zigzag placement: rank ", rank,
                   " is not one of the ", sp, " sequence-parallel ranks");
  const int64_t chunks = 2 * sp;
  const int64_t below = seq - seq % chunks;
  KOLOS_CHECK_KIND(kConfig, seq > 0 && seq % chunks == 0, "zigzag placement over ", sp,
                   " ranks cuts the sequence into 2*sp = ", chunks, " chunks; length ", seq,
                   " does not divide: use a multiple of ", chunks,
                   " (nearest: ", below > 0 ? detail::concat(below, " or ") : std::string(),
                   below + chunks, ")");
  const int64_t chunk = seq / chunks;
  const at::TensorOptions options = at::TensorOptions().dtype(at::kLong);
  return at::cat({at::arange(rank * chunk, (rank + 1) * chunk, options),
                  at::arange((chunks - 1 - rank) * chunk, (chunks - rank) * chunk, options)});
}

RingAttentionStats ring_attention_stats() {
  const Counters& c = counters();
  RingAttentionStats s;
  s.forward_pairs = c.forward.pairs;
  s.forward_pairs_skipped = c.forward.skipped;
  s.forward_elements = c.forward.elements;
  s.backward_pairs = c.backward.pairs;
  s.backward_pairs_skipped = c.backward.skipped;
  s.backward_elements = c.backward.elements;
  s.forward_compute_s = static_cast<double>(c.forward.ns) * 1e-9;
  s.backward_compute_s = static_cast<double>(c.backward.ns) * 1e-9;
  s.forward_compute_cpu_s = static_cast<double>(c.forward.cpu_ns) * 1e-9;
  s.backward_compute_cpu_s = static_cast<double>(c.backward.cpu_ns) * 1e-9;
  return s;
}

namespace detail {
int64_t set_ring_attention_max_tile_rows(int64_t rows) {
  return max_tile_rows.exchange(std::max<int64_t>(1, rows));
}
}  // namespace detail

void reset_ring_attention_stats() {
  counters().forward.reset();
  counters().backward.reset();
}

}  // namespace kolos
