// Ring attention (plugins/sequence/ring_attention.h) against serial causal
// attention, at 2 and 4 ranks.
//
// Every rank builds the same random full q, k, v and output gradient (one
// seed), takes the rows of its positions, runs ring_attention over the group
// and compares its output rows and its dq, dk, dv rows with serial attention
// (the numerics of attention_core in core/src/engine/layer_factory.cpp:
// masked_fill -inf, softmax, matmul) and its autograd gradients. Checks use
// EXPECT_* so that a rank with a wrong value still takes part in the rest of
// the ring and the job does not hang.
//
// The balance test counts the tile pairs each rank computes (exact, asserted)
// and prints the per-rank compute and forward times for zigzag and
// contiguous placement (measured, never asserted).
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "kolos/core/comm/mpi.h"
#include "kolos/core/comm/process_group.h"
#include "kolos/core/error.h"
#include "observed_traffic.h"
#include "ring_attention.h"

namespace kolos {
namespace {

enum class Placement { kZigzag, kContiguous };

const char* name_of(Placement p) { return p == Placement::kZigzag ? "zigzag" : "contiguous"; }

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

comm::ProcessGroupPtr world_group() { return comm::make_mpi_process_group(MPI_COMM_WORLD, "sp"); }

at::Tensor positions_of(Placement placement, int64_t seq, int64_t sp, int64_t rank) {
  if (placement == Placement::kZigzag) return zigzag_positions(seq, sp, rank);
  const int64_t local = seq / sp;
  return at::arange(rank * local, (rank + 1) * local, at::kLong);
}

// attention_core of layer_factory.cpp, on full sequences.
at::Tensor serial_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t seq = q.size(2);
  at::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(q.size(3)));
  at::Tensor mask = torch::ones({seq, seq}, torch::kBool).triu(1);
  scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
  return torch::matmul(torch::softmax(scores, -1), v);
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

double max_abs(const at::Tensor& a) { return a.abs().max().item<double>(); }

struct Shape {
  int64_t batch, heads, seq, dim;
};

// Runs one case on `group` and compares with the serial run. Tolerance:
// absolute, relative to the largest value of the reference tensor.
void check_against_serial(comm::ProcessGroup& group, Shape shape, Placement placement,
                          at::ScalarType dtype, double tolerance) {
  const std::string what = std::string(name_of(placement)) + " " + c10::toString(dtype) + " B" +
                           std::to_string(shape.batch) + " h" + std::to_string(shape.heads) + " T" +
                           std::to_string(shape.seq) + " d" + std::to_string(shape.dim) + " sp" +
                           std::to_string(group.size()) + " rank " + std::to_string(group.rank());
  torch::manual_seed(1234);  // the same full tensors on every rank
  const std::vector<int64_t> sizes{shape.batch, shape.heads, shape.seq, shape.dim};
  const at::Tensor q = torch::randn(sizes), k = torch::randn(sizes), v = torch::randn(sizes);
  const at::Tensor grad = torch::randn(sizes);

  at::Tensor qs = q.clone().requires_grad_(), ks = k.clone().requires_grad_(),
             vs = v.clone().requires_grad_();
  const at::Tensor expected = serial_attention(qs, ks, vs);
  expected.backward(grad);

  const at::Tensor pos = positions_of(placement, shape.seq, group.size(), group.rank());
  at::Tensor ql = q.index_select(2, pos).to(dtype).requires_grad_();
  at::Tensor kl = k.index_select(2, pos).to(dtype).requires_grad_();
  at::Tensor vl = v.index_select(2, pos).to(dtype).requires_grad_();
  const at::Tensor out = ring_attention(ql, kl, vl, pos, group);
  ASSERT_EQ(out.scalar_type(), dtype) << what;
  ASSERT_EQ(out.sizes(), ql.sizes()) << what;
  out.backward(grad.index_select(2, pos).to(dtype));

  const std::vector<std::pair<const char*, std::pair<at::Tensor, at::Tensor>>> pairs{
      {"output", {out.detach(), expected.detach().index_select(2, pos)}},
      {"dq", {ql.grad(), qs.grad().index_select(2, pos)}},
      {"dk", {kl.grad(), ks.grad().index_select(2, pos)}},
      {"dv", {vl.grad(), vs.grad().index_select(2, pos)}}};
  for (const auto& [name, tensors] : pairs) {
    ASSERT_TRUE(tensors.first.defined()) << what << ": no " << name;
    EXPECT_EQ(tensors.first.scalar_type(), dtype) << what << ": " << name;
    const double diff = max_abs_diff(tensors.first, tensors.second);
    const double bound = tolerance * std::max(1.0, max_abs(tensors.second));
    EXPECT_LE(diff, bound) << what << ": " << name << " differs from the serial run by " << diff;
  }
}

class RingAttention : public ::testing::TestWithParam<Placement> {};

TEST_P(RingAttention, Fp32MatchesSerial) {
  auto group = world_group();
  check_against_serial(*group, {2, 4, 32, 8}, GetParam(), at::kFloat, 1e-5);
}

// bf16 and fp16 inputs, float32 arithmetic, against the float32 serial
// run: within 1e-2 of the largest value, the inputs' and outputs' rounding
// (bf16: 8 bits of mantissa, measured worst 3.6e-3; a lost or doubled block
// is off by O(1)).
TEST_P(RingAttention, HalfPrecisionWithinTolerance) {
  auto group = world_group();
  check_against_serial(*group, {2, 4, 32, 8}, GetParam(), at::kBFloat16, 1e-2);
  check_against_serial(*group, {2, 4, 32, 8}, GetParam(), at::kHalf, 1e-2);
}

// One token per chunk (zigzag: T = 2*sp, contiguous: T = sp, one token per
// rank) and an odd head count.
TEST_P(RingAttention, OneTokenChunksAndOddHeads) {
  auto group = world_group();
  const int64_t seq = GetParam() == Placement::kZigzag ? 2 * group->size() : group->size();
  check_against_serial(*group, {2, 3, seq, 8}, GetParam(), at::kFloat, 1e-5);
  check_against_serial(*group, {1, 5, 4 * seq, 6}, GetParam(), at::kFloat, 1e-5);
}

// Subgroups of the world: at 4 ranks two rings of 2 side by side, and rings
// of one rank (no transfers) at every size.
TEST_P(RingAttention, Subgroups) {
  auto world = world_group();
  if (world->size() % 2 == 0) {
    auto pairs = world->split(world->rank() / 2, world->rank(), "sp2");
    check_against_serial(*pairs, {2, 4, 32, 8}, GetParam(), at::kFloat, 1e-5);
  }
  auto single = world->split(world->rank(), 0, "sp1");
  check_against_serial(*single, {2, 4, 32, 8}, GetParam(), at::kFloat, 1e-5);
}

// Many tiles per block (3 rows at most: tiles of 3, 3 and 2 rows of a
// zigzag chunk of 8), mixing skipped, unmasked and masked pairs.
TEST_P(RingAttention, SmallTiles) {
  auto group = world_group();
  const int64_t previous = detail::set_ring_attention_max_tile_rows(3);
  check_against_serial(*group, {2, 3, 16 * group->size(), 8}, GetParam(), at::kFloat, 1e-5);
  detail::set_ring_attention_max_tile_rows(previous);
}

INSTANTIATE_TEST_SUITE_P(Placements, RingAttention,
                         ::testing::Values(Placement::kZigzag, Placement::kContiguous),
                         [](const ::testing::TestParamInfo<Placement>& info) {
                           return std::string(name_of(info.param));
                         });

// The mask follows the positions, not the row order: a rank's rows given in
// reverse order (positions reversed with them) give the same rows back.
TEST(RingAttentionPositions, RowOrderDoesNotMatter) {
  auto group = world_group();
  torch::manual_seed(99);
  const std::vector<int64_t> sizes{1, 2, 16, 4};
  const at::Tensor q = torch::randn(sizes), k = torch::randn(sizes), v = torch::randn(sizes);
  const at::Tensor expected = serial_attention(q, k, v);
  const at::Tensor pos = zigzag_positions(16, group->size(), group->rank()).flip(0);
  const at::Tensor out = ring_attention(q.index_select(2, pos), k.index_select(2, pos),
                                        v.index_select(2, pos), pos, *group);
  EXPECT_LE(max_abs_diff(out, expected.index_select(2, pos)), 1e-5);
}

TEST(RingAttentionPositions, ZigzagLayout) {
  // sp 2, T 8: chunks of 2; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
  EXPECT_TRUE(at::equal(zigzag_positions(8, 2, 0), at::tensor({0, 1, 6, 7}, at::kLong)));
  EXPECT_TRUE(at::equal(zigzag_positions(8, 2, 1), at::tensor({2, 3, 4, 5}, at::kLong)));
  // Every position exactly once over the ranks.
  std::vector<at::Tensor> all;
  for (int64_t r = 0; r < 4; ++r) all.push_back(zigzag_positions(24, 4, r));
  EXPECT_TRUE(at::equal(std::get<0>(at::cat(all).sort()), at::arange(24, at::kLong)));
}

TEST(RingAttentionPositions, BadLengthSaysWhatWouldWork) {
  try {
    zigzag_positions(30, 4, 0);
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    for (const char* part : {"30", "multiple of 8", "24 or 32"}) {
      EXPECT_NE(message.find(part), std::string::npos) << message;
    }
  }
}

TEST(RingAttentionPositions, BadShapesAreRefused) {
  auto group = world_group();
  const at::Tensor x = torch::randn({1, 2, 4, 8});
  const at::Tensor pos = at::arange(4, at::kLong);
  EXPECT_THROW(ring_attention(x, torch::randn({1, 2, 4, 4}), x, pos, *group), Error);
  EXPECT_THROW(ring_attention(x, x, x, at::arange(3, at::kLong), *group), Error);
  EXPECT_THROW(ring_attention(x, x, x, pos.to(at::kInt), *group), Error);
  EXPECT_THROW(ring_attention(x, x.to(at::kBFloat16), x, pos, *group), Error);
}

// Bytes each rank hands to MPI on the sp group, observed by
// libkolos_pmpi_count, against the ring's formula (e = the inputs' element
// size, X = B*h*T_local*d): the forward sends sp-1 blocks of K and V
// (2 X e) with their positions (8 T_local); the backward sends them again
// and sp float32 dK/dV accumulators (2 X 4), the last one home.
TEST(RingAttentionTraffic, BytesSentMatchTheRing) {
  ASSERT_EQ(testing::pmpi_interposition_problem(), "");
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    auto group = comm::make_mpi_process_group(MPI_COMM_WORLD, "ring-traffic");
    const int64_t sp = group->size();
    const int64_t batch = 2, heads = 3, seq = 8 * sp, dim = 4, local = seq / sp;
    const at::Tensor pos = zigzag_positions(seq, sp, group->rank());
    const auto make = [&] {
      return torch::randn({batch, heads, local, dim}).to(dtype).requires_grad_();
    };
    const at::Tensor q = make(), k = make(), v = make();
    const int64_t x = batch * heads * local * dim, e = at::elementSize(dtype);

    group->barrier()->wait();
    testing::reset_observed_traffic();
    const at::Tensor out = ring_attention(q, k, v, pos, *group);
    const testing::ObservedTraffic forward = testing::observed_traffic({group});
    EXPECT_EQ(forward.sent(KOLOS_PMPI_SEND), uint64_t((sp - 1) * (2 * x * e + 8 * local)))
        << c10::toString(dtype);
    EXPECT_EQ(forward.calls(KOLOS_PMPI_SEND), uint64_t(2 * (sp - 1))) << c10::toString(dtype);

    group->barrier()->wait();
    testing::reset_observed_traffic();
    out.backward(torch::ones_like(out));
    const testing::ObservedTraffic backward = testing::observed_traffic({group});
    EXPECT_EQ(backward.sent(KOLOS_PMPI_SEND),
              uint64_t((sp - 1) * (2 * x * e + 8 * local) + sp * 2 * x * 4))
        << c10::toString(dtype);
    EXPECT_EQ(backward.calls(KOLOS_PMPI_SEND), uint64_t(2 * (sp - 1) + sp)) << c10::toString(dtype);
  }
}

struct Measured {
  RingAttentionStats forward, backward;
  double forward_s = 0;  // wall time of the call, waits included
};

// Runs `runs` forwards (timed) and one backward of one shape under one
// placement; counts are those of one forward and one backward.
Measured measure(comm::ProcessGroup& group, Shape shape, Placement placement, int runs) {
  torch::manual_seed(7);
  const at::Tensor pos = positions_of(placement, shape.seq, group.size(), group.rank());
  const std::vector<int64_t> sizes{shape.batch, shape.heads, pos.numel(), shape.dim};
  const at::Tensor q = torch::randn(sizes).requires_grad_();
  const at::Tensor k = torch::randn(sizes).requires_grad_();
  const at::Tensor v = torch::randn(sizes).requires_grad_();
  Measured m;
  std::vector<double> times, compute, compute_cpu;
  at::Tensor out;
  for (int i = 0; i < runs; ++i) {
    group.barrier()->wait();
    reset_ring_attention_stats();
    const auto start = std::chrono::steady_clock::now();
    out = ring_attention(q, k, v, pos, group);
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    compute.push_back(ring_attention_stats().forward_compute_s);
    compute_cpu.push_back(ring_attention_stats().forward_compute_cpu_s);
  }
  m.forward = ring_attention_stats();
  std::sort(times.begin(), times.end());
  std::sort(compute.begin(), compute.end());
  std::sort(compute_cpu.begin(), compute_cpu.end());
  m.forward_s = times[times.size() / 2];
  m.forward.forward_compute_s = compute[compute.size() / 2];
  m.forward.forward_compute_cpu_s = compute_cpu[compute_cpu.size() / 2];
  group.barrier()->wait();
  reset_ring_attention_stats();
  out.backward(torch::ones_like(out));
  m.backward = ring_attention_stats();
  return m;
}

std::vector<double> gather(double value) {
  std::vector<double> all(world_size());
  MPI_Allgather(&value, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
  return all;
}

// One placement's measurements, every rank's (index: rank).
struct Gathered {
  std::vector<double> pairs, elements, compute, cpu, wall, back;
};

// Collective: every rank calls it (a braced list gathers in its written
// order, the same on every rank).
Gathered gather(const Measured& m) {
  return {gather(double(m.forward.forward_pairs)),
          gather(double(m.forward.forward_elements)),
          gather(m.forward.forward_compute_s),
          gather(m.forward.forward_compute_cpu_s),
          gather(m.forward_s),
          gather(m.backward.backward_compute_s)};
}

// Tile-pair counts per rank are exact. A rank's rows are two tiles of
// c = T / 2sp rows (its chunks under zigzag, its halves under contiguous
// placement), so every block is 4 pairs of c x c. Zigzag gives every rank
// 2*sp+1 pairs: 2 for each other rank's block and 3 for its own. Contiguous
// placement gives rank r 4 for each earlier rank's block, 3 for its own and
// none for later ranks': 4r+3. Times are printed for the record.
// KOLOS_RING_BALANCE_ROWS sets the rows per rank (default 256; at most 1024,
// so that a chunk stays one tile of <= 512 rows and the counts hold) for
// measurements at sizes where fixed costs per block weigh less.
TEST(RingAttentionBalance, ZigzagBalancesComputedBlocks) {
  auto group = world_group();
  const int64_t sp = group->size(), rank = group->rank();
  const char* rows_env = std::getenv("KOLOS_RING_BALANCE_ROWS");
  const int64_t per_rank = rows_env != nullptr ? std::atoll(rows_env) : 256;
  ASSERT_TRUE(per_rank >= 2 && per_rank <= 1024 && per_rank % 2 == 0)
      << "KOLOS_RING_BALANCE_ROWS = " << rows_env << ": use an even number of rows in [2, 1024]";
  const Shape shape{1, 8, per_rank * sp, 64};
  const int64_t c = shape.seq / (2 * sp);
  const Measured zigzag = measure(*group, shape, Placement::kZigzag, 5);
  const Measured contiguous = measure(*group, shape, Placement::kContiguous, 5);

  EXPECT_EQ(zigzag.forward.forward_pairs, 2 * sp + 1);
  EXPECT_EQ(zigzag.forward.forward_pairs_skipped, 2 * sp - 1);
  EXPECT_EQ(zigzag.forward.forward_elements, (2 * sp + 1) * c * c);
  EXPECT_EQ(zigzag.backward.backward_pairs, 2 * sp + 1);
  EXPECT_EQ(zigzag.backward.backward_elements, (2 * sp + 1) * c * c);
  EXPECT_EQ(contiguous.forward.forward_pairs, 4 * rank + 3);
  EXPECT_EQ(contiguous.forward.forward_pairs_skipped, 4 * (sp - 1 - rank) + 1);
  EXPECT_EQ(contiguous.forward.forward_elements, (4 * rank + 3) * c * c);
  EXPECT_EQ(contiguous.backward.backward_pairs, 4 * rank + 3);
  EXPECT_EQ(contiguous.backward.backward_elements, (4 * rank + 3) * c * c);

  const Gathered zz = gather(zigzag);
  const Gathered ct = gather(contiguous);
  if (world_rank() != 0) return;
  std::printf("ring attention balance: B %lld h %lld T %lld d %lld, sp %lld, fp32, median of 5\n",
              static_cast<long long>(shape.batch), static_cast<long long>(shape.heads),
              static_cast<long long>(shape.seq), static_cast<long long>(shape.dim),
              static_cast<long long>(sp));
  std::printf("%-10s %4s %6s %10s %12s %12s %12s %12s\n", "placement", "rank", "pairs", "elements",
              "compute ms", "cpu ms", "forward ms", "bwd comp ms");
  auto rows = [&](const char* name, const Gathered& g) {
    for (int r = 0; r < world_size(); ++r) {
      std::printf("%-10s %4d %6.0f %10.0f %12.2f %12.2f %12.2f %12.2f\n", name, r, g.pairs[r],
                  g.elements[r], g.compute[r] * 1e3, g.cpu[r] * 1e3, g.wall[r] * 1e3,
                  g.back[r] * 1e3);
    }
    const auto [lo, hi] = std::minmax_element(g.compute.begin(), g.compute.end());
    const auto [cpu_lo, cpu_hi] = std::minmax_element(g.cpu.begin(), g.cpu.end());
    std::printf("%-10s spread max/min: compute %.2f, cpu %.2f\n", name, *hi / *lo,
                *cpu_hi / *cpu_lo);
  };
  rows("zigzag", zz);
  rows("contiguous", ct);
}

}  // namespace
}  // namespace kolos
