// ProcessGroupMPI against analytic results, at 1, 2, 3 and 4 ranks: the
// basics (names, the timeout, stats, a bare backend), reductions for every
// dtype x every op, gathers and broadcast, all_to_all. The rest of the
// group's behaviour is in group_test.cpp; the conventions, in
// comm_test_util.h.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "comm_test_util.h"
#include "kolos/core/comm/mpi.h"
#include "kolos/core/comm/process_group.h"
#include "kolos/core/error.h"

namespace kolos::comm {
namespace {

using namespace comm_test;
using std::chrono::milliseconds;

std::string dtype_label(at::ScalarType t) { return c10::toString(t); }

// ---- basics -------------------------------------------------------------------

TEST_F(CommTest, GroupKnowsItsPlace) {
  EXPECT_EQ(pg_->rank(), rank_);
  EXPECT_EQ(pg_->size(), n_);
  EXPECT_EQ(pg_->name(), "world");
  EXPECT_EQ(pg_->backend(), "mpi");
}

TEST(CommNames, ToString) {
  EXPECT_STREQ(to_string(ReduceOp::kSum), "sum");
  EXPECT_STREQ(to_string(ReduceOp::kAvg), "avg");
  EXPECT_STREQ(to_string(ReduceOp::kMax), "max");
  EXPECT_STREQ(to_string(ReduceOp::kMin), "min");
  EXPECT_STREQ(to_string(OpType::kAllReduce), "all_reduce");
  EXPECT_STREQ(to_string(OpType::kReduceScatter), "reduce_scatter");
  EXPECT_STREQ(to_string(OpType::kAllGather), "all_gather");
  EXPECT_STREQ(to_string(OpType::kBroadcast), "broadcast");
  EXPECT_STREQ(to_string(OpType::kAllToAll), "all_to_all");
  EXPECT_STREQ(to_string(OpType::kSend), "send");
  EXPECT_STREQ(to_string(OpType::kRecv), "recv");
  EXPECT_STREQ(to_string(OpType::kBarrier), "barrier");
}

TEST(CommTimeout, DefaultTimeoutReadsTheEnvironment) {
  const char* old = std::getenv("KOLOS_COMM_TIMEOUT_S");
  const std::string saved = old ? old : "";
  unsetenv("KOLOS_COMM_TIMEOUT_S");
  EXPECT_EQ(default_timeout(), milliseconds(600'000));
  setenv("KOLOS_COMM_TIMEOUT_S", "2.5", 1);
  EXPECT_EQ(default_timeout(), milliseconds(2'500));
  setenv("KOLOS_COMM_TIMEOUT_S", "120", 1);
  EXPECT_EQ(default_timeout(), milliseconds(120'000));
  for (const char* bad : {"abc", "10s", "-1", "0", "nan", "1e30"}) {
    setenv("KOLOS_COMM_TIMEOUT_S", bad, 1);
    expect_comm_error([] { default_timeout(); },
                      {"KOLOS_COMM_TIMEOUT_S", std::string("'") + bad + "'", "seconds"});
  }
  if (old) {
    setenv("KOLOS_COMM_TIMEOUT_S", saved.c_str(), 1);
  } else {
    unsetenv("KOLOS_COMM_TIMEOUT_S");
  }
}

TEST(CommStats, TotalBytesSumsAllOps) {
  CommStats stats;
  EXPECT_EQ(stats.total_bytes(), 0u);
  stats.bytes[static_cast<int>(OpType::kAllReduce)] = 10;
  stats.bytes[static_cast<int>(OpType::kSend)] = 5;
  EXPECT_EQ(stats.total_bytes(), 15u);
}

// A backend that implements nothing: every collective fails by name.
class BareGroup final : public ProcessGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  std::string backend() const override { return "bare"; }
  CommStats stats() const override { return {}; }
  void reset_stats() override {}

 private:
  std::string name_ = "g";
};

TEST(CommBase, UnimplementedOpsFailByName) {
  BareGroup group;
  const at::Tensor t = at::zeros({4});
  const std::vector<std::string> base = {"backend 'bare'", "group 'g'", "does not support"};
  auto with = [&](const char* op) {
    auto parts = base;
    parts.push_back(op);
    return parts;
  };
  expect_comm_error([&] { group.all_reduce(t); }, with("all_reduce"));
  expect_comm_error([&] { group.reduce_scatter(t, {t}); }, with("reduce_scatter"));
  expect_comm_error([&] { group.reduce_scatter_flat(t, t); }, with("reduce_scatter_flat"));
  expect_comm_error([&] { group.all_gather({t}, t); }, with("all_gather"));
  expect_comm_error([&] { group.all_gather_flat(t, t); }, with("all_gather_flat"));
  expect_comm_error([&] { group.broadcast(t, 0); }, with("broadcast"));
  expect_comm_error([&] { group.all_to_all(t, t); }, with("all_to_all"));
  expect_comm_error([&] { group.send(t, 0); }, with("send"));
  expect_comm_error([&] { group.recv(t, 0); }, with("recv"));
  expect_comm_error([&] { group.barrier(); }, with("barrier"));
  expect_comm_error([&] { group.split(0, 0, "sub"); }, with("split"));
}

// ---- reductions, every dtype x every op ---------------------------------------

const std::vector<at::ScalarType> kReduceDtypes = {
    at::kFloat, at::kDouble, at::kInt, at::kLong, at::kByte, at::kChar, at::kBFloat16, at::kHalf};
const std::vector<ReduceOp> kReduceOps = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax,
                                          ReduceOp::kMin};

class ReduceTest : public CommTest,
                   public testing::WithParamInterface<std::tuple<at::ScalarType, ReduceOp>> {};

TEST_P(ReduceTest, AllReduce) {
  const auto [dtype, op] = GetParam();
  const std::string what = std::string("all_reduce ") + to_string(op) + " " + dtype_label(dtype);
  at::Tensor t = contribution(1000, rank_, dtype).reshape({10, 100});
  pg_->all_reduce(t, op)->wait();
  expect_equal(t, expected_reduction(1000, n_, op, dtype).reshape({10, 100}), what);
}

TEST_P(ReduceTest, ReduceScatterUneven) {
  const auto [dtype, op] = GetParam();
  // Chunk r has r + 2 elements: sizes differ between ranks. Chunk r holds the
  // pattern shifted by r so that chunks differ too.
  std::vector<at::Tensor> inputs;
  for (int r = 0; r < n_; ++r) inputs.push_back(contribution(r + 2, rank_, dtype, r));
  at::Tensor output = at::empty({rank_ + 2}, at::TensorOptions().dtype(dtype));
  pg_->reduce_scatter(output, inputs, op)->wait();
  expect_equal(output, expected_reduction(rank_ + 2, n_, op, dtype, rank_),
               std::string("reduce_scatter ") + to_string(op) + " " + dtype_label(dtype));
}

TEST_P(ReduceTest, ReduceScatterFlat) {
  const auto [dtype, op] = GetParam();
  const int64_t chunk = 37;
  at::Tensor input = contribution(chunk * n_, rank_, dtype);
  at::Tensor output = at::empty({chunk}, at::TensorOptions().dtype(dtype));
  pg_->reduce_scatter_flat(output, input, op)->wait();
  expect_equal(
      output,
      expected_reduction(chunk * n_, n_, op, dtype).slice(0, rank_ * chunk, (rank_ + 1) * chunk),
      std::string("reduce_scatter_flat ") + to_string(op) + " " + dtype_label(dtype));
}

INSTANTIATE_TEST_SUITE_P(DtypesTimesOps, ReduceTest,
                         testing::Combine(testing::ValuesIn(kReduceDtypes),
                                          testing::ValuesIn(kReduceOps)),
                         [](const auto& info) {
                           return dtype_label(std::get<0>(info.param)) + "_" +
                                  to_string(std::get<1>(info.param));
                         });

TEST_F(CommTest, IntegerAverageFloors) {
  // Rank s holds -(s + 1): the sum is -n(n+1)/2, its floor-divided average
  // floor(-(n+1)/2), e.g. -2 (not -1) at n = 2.
  at::Tensor t = at::full({5}, -(rank_ + 1), at::kLong);
  pg_->all_reduce(t, ReduceOp::kAvg)->wait();
  const int64_t sum = -static_cast<int64_t>(n_) * (n_ + 1) / 2;
  const int64_t floor_avg = sum >= 0 ? sum / n_ : -((-sum + n_ - 1) / n_);
  expect_equal(t, at::full({5}, floor_avg, at::kLong), "avg of negative int64");
}

TEST_F(CommTest, ReduceScatterWithPackedInputs) {
  // Inputs that are consecutive views of one buffer are used without packing.
  at::Tensor flat = contribution(3 * n_, rank_, at::kFloat);
  std::vector<at::Tensor> inputs = flat.split(3);
  at::Tensor output = at::empty({3});
  pg_->reduce_scatter(output, inputs)->wait();
  expect_equal(
      output,
      expected_reduction(3 * n_, n_, ReduceOp::kSum, at::kFloat).slice(0, 3 * rank_, 3 * rank_ + 3),
      "reduce_scatter of views");
}

// ---- gathers ------------------------------------------------------------------

// Rank r's all_gather input: r + 1 elements (uneven), values r * 10 + j % 7.
at::Tensor gather_input(int r, at::ScalarType dtype) {
  at::Tensor v = at::arange(r + 1, at::kDouble).remainder(7) + r * 10;
  if (dtype == at::kBool) v = v.remainder(2);
  return v.to(dtype);
}

class GatherTest : public CommTest, public testing::WithParamInterface<at::ScalarType> {};

TEST_P(GatherTest, AllGatherUneven) {
  const at::ScalarType dtype = GetParam();
  at::Tensor input = gather_input(rank_, dtype);
  std::vector<at::Tensor> outputs;
  for (int r = 0; r < n_; ++r) {
    outputs.push_back(at::full({r + 1}, 99, at::TensorOptions().dtype(dtype)));
  }
  pg_->all_gather(outputs, input)->wait();
  for (int r = 0; r < n_; ++r) {
    expect_equal(outputs[r], gather_input(r, dtype), "all_gather slot " + std::to_string(r));
  }
}

TEST_P(GatherTest, AllGatherIntoViewsOfOneBuffer) {
  // Outputs are consecutive views (received in place); the input is this
  // rank's own slot (MPI_IN_PLACE).
  const at::ScalarType dtype = GetParam();
  const int64_t total = static_cast<int64_t>(n_) * (n_ + 1) / 2;
  at::Tensor buffer = at::zeros({total}, at::TensorOptions().dtype(dtype));
  std::vector<int64_t> sizes;
  for (int r = 0; r < n_; ++r) sizes.push_back(r + 1);
  std::vector<at::Tensor> outputs = buffer.split_with_sizes(sizes);
  outputs[rank_].copy_(gather_input(rank_, dtype));
  pg_->all_gather(outputs, outputs[rank_])->wait();
  for (int r = 0; r < n_; ++r) {
    expect_equal(outputs[r], gather_input(r, dtype),
                 "in-place all_gather slot " + std::to_string(r));
  }
}

TEST_P(GatherTest, AllGatherFlat) {
  const at::ScalarType dtype = GetParam();
  const int64_t chunk = 5;
  auto chunk_of = [&](int r) {
    at::Tensor v = at::arange(chunk, at::kDouble) + r * 10;
    if (dtype == at::kBool) v = v.remainder(2);
    return v.to(dtype);
  };
  at::Tensor output = at::zeros({n_ * chunk}, at::TensorOptions().dtype(dtype));
  pg_->all_gather_flat(output, chunk_of(rank_))->wait();
  for (int r = 0; r < n_; ++r) {
    expect_equal(output.slice(0, r * chunk, (r + 1) * chunk), chunk_of(r),
                 "all_gather_flat chunk " + std::to_string(r));
  }
  // In place: the input is this rank's chunk of the output.
  at::Tensor in_place = at::zeros({n_ * chunk}, at::TensorOptions().dtype(dtype));
  in_place.slice(0, rank_ * chunk, (rank_ + 1) * chunk).copy_(chunk_of(rank_));
  pg_->all_gather_flat(in_place, in_place.slice(0, rank_ * chunk, (rank_ + 1) * chunk))->wait();
  expect_equal(in_place, output, "in-place all_gather_flat");
}

TEST_P(GatherTest, BroadcastFromEveryRoot) {
  const at::ScalarType dtype = GetParam();
  for (int root = 0; root < n_; ++root) {
    auto value_of = [&](int r) {
      at::Tensor v = at::arange(64, at::kDouble).remainder(9) + r;
      if (dtype == at::kBool) v = v.remainder(2);
      return v.to(dtype).reshape({8, 8});
    };
    at::Tensor t = value_of(rank_);
    pg_->broadcast(t, root)->wait();
    expect_equal(t, value_of(root), "broadcast from root " + std::to_string(root));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GatherTest,
                         testing::Values(at::kFloat, at::kDouble, at::kInt, at::kLong, at::kByte,
                                         at::kChar, at::kBFloat16, at::kHalf, at::kBool),
                         [](const auto& info) { return dtype_label(info.param); });

// ---- all_to_all ---------------------------------------------------------------

// Element (row i, column c) that rank s sends to rank r.
double a2a_value(int s, int r, int64_t i, int64_t c) { return s * 1000 + r * 100 + i * 10 + c; }

TEST_F(CommTest, AllToAllUneven) {
  // Rank s sends s + 2r + 1 rows of 3 columns to rank r; so this rank
  // receives r + 2 * rank + 1 rows from rank r. Splits differ per rank and
  // per direction.
  const int64_t cols = 3;
  std::vector<int64_t> in_splits(n_), out_splits(n_);
  int64_t in_rows = 0, out_rows = 0;
  for (int r = 0; r < n_; ++r) {
    in_splits[r] = rank_ + 2 * r + 1;
    out_splits[r] = r + 2 * rank_ + 1;
    in_rows += in_splits[r];
    out_rows += out_splits[r];
  }
  at::Tensor input = at::empty({in_rows, cols}, at::kDouble);
  int64_t row = 0;
  for (int r = 0; r < n_; ++r) {
    for (int64_t i = 0; i < in_splits[r]; ++i, ++row) {
      for (int64_t c = 0; c < cols; ++c) input[row][c] = a2a_value(rank_, r, i, c);
    }
  }
  at::Tensor output = at::full({out_rows, cols}, -1.0, at::kDouble);
  pg_->reset_stats();
  pg_->all_to_all(output, input, out_splits, in_splits)->wait();
  at::Tensor expected = at::empty({out_rows, cols}, at::kDouble);
  row = 0;
  for (int s = 0; s < n_; ++s) {
    for (int64_t i = 0; i < out_splits[s]; ++i, ++row) {
      for (int64_t c = 0; c < cols; ++c) expected[row][c] = a2a_value(s, rank_, i, c);
    }
  }
  expect_equal(output, expected, "uneven all_to_all");
  uint64_t sent = 0;
  for (int r = 0; r < n_; ++r) {
    if (r != rank_) sent += in_splits[r] * cols * sizeof(double);
  }
  EXPECT_EQ(pg_->stats().bytes[static_cast<int>(OpType::kAllToAll)], sent);
}

TEST_F(CommTest, AllToAllEvenSplitBFloat16) {
  // Empty splits: 2 rows of 4 per peer.
  const int64_t rows = 2, cols = 4;
  at::Tensor input = at::empty({n_ * rows, cols}, at::kFloat);
  for (int r = 0; r < n_; ++r) {
    input.slice(0, r * rows, (r + 1) * rows)
        .copy_(at::arange(rows * cols, at::kFloat).reshape({rows, cols}) + rank_ * 16 + r);
  }
  input = input.to(at::kBFloat16);
  at::Tensor output = at::zeros_like(input);
  pg_->all_to_all(output, input)->wait();
  for (int s = 0; s < n_; ++s) {
    at::Tensor expected =
        (at::arange(rows * cols, at::kFloat).reshape({rows, cols}) + s * 16 + rank_)
            .to(at::kBFloat16);
    expect_equal(output.slice(0, s * rows, (s + 1) * rows), expected,
                 "even all_to_all block from " + std::to_string(s));
  }
}

}  // namespace
}  // namespace kolos::comm
