// ProcessGroupMPI at 1, 2, 3 and 4 ranks beyond each collective's values:
// point-to-point, asynchrony, split and a group's lifetime, a group of one,
// byte counters, small collectives in the caller's thread, transfers larger
// than one MPI call, and argument validation. The conventions are in
// comm_test_util.h.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "comm_test_util.h"
#include "kolos/core/comm/mpi.h"
#include "kolos/core/comm/process_group.h"
#include "kolos/core/error.h"

namespace kolos::comm {
namespace {

using namespace comm_test;
using std::chrono::milliseconds;

// Lowers the per-call MPI count limit for one test.
class MaxCountGuard {
 public:
  explicit MaxCountGuard(int64_t count) : previous_(detail::set_max_mpi_count(count)) {}
  ~MaxCountGuard() { detail::set_max_mpi_count(previous_); }

 private:
  int64_t previous_;
};

// ---- point-to-point -------------------------------------------------------------

TEST_F(CommTest, SendRecvRingLargerThanEagerLimit) {
  // Every rank sends first, then receives: with blocking MPI calls on one
  // thread this deadlocks once messages exceed the eager limit (4 KiB here);
  // 1 M floats = 4 MB.
  const int64_t numel = 1 << 20;
  const int right = (rank_ + 1) % n_;
  const int left = (rank_ + n_ - 1) % n_;
  at::Tensor out = at::arange(numel, at::kFloat) + rank_;
  at::Tensor in = at::zeros({numel}, at::kFloat);
  WorkPtr sent = pg_->send(out, right, 3);
  WorkPtr received = pg_->recv(in, left, 3);
  received->wait();
  sent->wait();
  expect_equal(in, at::arange(numel, at::kFloat) + left, "ring recv");
}

TEST_F(CommTest, SendRecvKeepsMessageOrderAndTags) {
  // Three messages to the right, two tags: the tag-7 message is received
  // first although it was sent last; same-tag messages keep their order.
  const int right = (rank_ + 1) % n_;
  const int left = (rank_ + n_ - 1) % n_;
  std::vector<WorkPtr> works;
  works.push_back(pg_->send(at::full({3}, rank_ * 10 + 1, at::kLong), right, 1));
  works.push_back(pg_->send(at::full({3}, rank_ * 10 + 2, at::kLong), right, 1));
  works.push_back(pg_->send(at::full({3}, rank_ * 10 + 3, at::kLong), right, 7));
  at::Tensor c = at::zeros({3}, at::kLong), a = at::zeros({3}, at::kLong),
             b = at::zeros({3}, at::kLong);
  works.push_back(pg_->recv(c, left, 7));
  works.push_back(pg_->recv(a, left, 1));
  works.push_back(pg_->recv(b, left, 1));
  for (auto& w : works) w->wait();
  expect_equal(a, at::full({3}, left * 10 + 1, at::kLong), "first tag-1 message");
  expect_equal(b, at::full({3}, left * 10 + 2, at::kLong), "second tag-1 message");
  expect_equal(c, at::full({3}, left * 10 + 3, at::kLong), "tag-7 message");
}

TEST_F(CommTest, RecvOfWrongSizeNamesThePeer) {
  // Rank 0 receives from `peer` (itself when alone): first a message shorter
  // than its tensor, then a longer one (MPI's truncation error).
  const int peer = n_ > 1 ? 1 : 0;
  if (rank_ == peer) {
    pg_->send(at::ones({5}), 0, 11);
    pg_->send(at::ones({8}), 0, 12);
  }
  if (rank_ == 0) {
    at::Tensor longer = at::zeros({8});
    expect_comm_error([&] { pg_->recv(longer, peer, 11)->wait(); },
                      {"recv from rank " + std::to_string(peer), "tag 11", "group 'world'",
                       "received 5 elements but the tensor expects 8"});
    at::Tensor shorter = at::zeros({5});
    expect_comm_error([&] { pg_->recv(shorter, peer, 12)->wait(); },
                      {"recv from rank " + std::to_string(peer), "tag 12", "truncat"});
  }
  pg_->barrier()->wait();  // the sends completed everywhere before the group goes
}

TEST_F(CommTest, WaitTimesOutOnARecvNobodySends) {
  const int peer = n_ > 1 ? 1 : 0;
  at::Tensor t = at::zeros({16});
  WorkPtr pending;
  if (rank_ == 0) {
    pending = pg_->recv(t, peer, 42);
    const auto start = std::chrono::steady_clock::now();
    expect_comm_error([&] { pending->wait(milliseconds(20)); },
                      {"recv from rank " + std::to_string(peer), "tag 42", "group 'world'",
                       "did not complete within 20 ms", "KOLOS_COMM_TIMEOUT_S"});
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
    EXPECT_FALSE(pending->is_completed());
  }
  // Only after rank 0 timed out does the peer send the matching message.
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank_ == peer) pg_->send(at::full({16}, 4.0f), 0, 42)->wait();
  if (rank_ == 0) {
    pending->wait();
    expect_equal(t, at::full({16}, 4.0f), "late recv");
  }
}

TEST_F(CommTest, PendingRecvDoesNotBlockLaterCollectives) {
  // A recv whose message comes last must not stall the group's collectives.
  const int right = (rank_ + 1) % n_;
  const int left = (rank_ + n_ - 1) % n_;
  at::Tensor in = at::zeros({4});
  WorkPtr received = pg_->recv(in, left, 5);
  at::Tensor sum = at::ones({4});
  pg_->all_reduce(sum)->wait();
  expect_equal(sum, at::full({4}, static_cast<float>(n_)), "all_reduce behind a pending recv");
  pg_->send(at::full({4}, static_cast<float>(rank_)), right, 5)->wait();
  received->wait();
  expect_equal(in, at::full({4}, static_cast<float>(left)), "recv after the collective");
}

// ---- asynchrony -------------------------------------------------------------------

TEST_F(CommTest, SeveralOpsInFlightWaitedInReverse) {
  const int right = (rank_ + 1) % n_;
  const int left = (rank_ + n_ - 1) % n_;
  at::Tensor a = contribution(4096, rank_, at::kFloat);
  at::Tensor b = at::full({100}, static_cast<double>(rank_), at::kDouble);
  at::Tensor c_in = at::full({7}, static_cast<int64_t>(rank_), at::kLong);
  at::Tensor c_out = at::zeros({7 * n_}, at::kLong);
  at::Tensor d_out = at::full({1000}, static_cast<float>(rank_));
  at::Tensor d_in = at::zeros({1000});
  at::Tensor g = contribution(333, rank_, at::kBFloat16);
  std::vector<WorkPtr> works;
  works.push_back(pg_->all_reduce(a));
  works.push_back(pg_->broadcast(b, n_ - 1));
  works.push_back(pg_->all_gather_flat(c_out, c_in));
  works.push_back(pg_->send(d_out, right));
  works.push_back(pg_->recv(d_in, left));
  works.push_back(pg_->barrier());
  works.push_back(pg_->all_reduce(g, ReduceOp::kMax));
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
  for (auto& w : works) EXPECT_TRUE(w->is_completed());
  expect_equal(a, expected_reduction(4096, n_, ReduceOp::kSum, at::kFloat), "a");
  expect_equal(b, at::full({100}, static_cast<double>(n_ - 1), at::kDouble), "b");
  for (int r = 0; r < n_; ++r) {
    expect_equal(c_out.slice(0, 7 * r, 7 * r + 7),
                 at::full({7}, static_cast<int64_t>(r), at::kLong), "c chunk " + std::to_string(r));
  }
  expect_equal(d_in, at::full({1000}, static_cast<float>(left)), "d");
  expect_equal(g, expected_reduction(333, n_, ReduceOp::kMax, at::kBFloat16), "g");
}

TEST_F(CommTest, IsCompletedEventuallyBecomesTrue) {
  at::Tensor t = at::ones({1 << 16});
  WorkPtr work = pg_->all_reduce(t);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!work->is_completed() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  EXPECT_TRUE(work->is_completed());
  work->wait(milliseconds(0));  // already complete: returns at once
  expect_equal(t, at::full({1 << 16}, static_cast<float>(n_)), "polled all_reduce");
}

TEST_F(CommTest, TwoGroupsOverTheSameRanksRunIndependently) {
  ProcessGroupPtr other = make_mpi_process_group(MPI_COMM_WORLD, "other");
  at::Tensor x = at::ones({1 << 18});
  at::Tensor y = at::full({1 << 10}, static_cast<double>(rank_), at::kDouble);
  WorkPtr wx = pg_->all_reduce(x);
  WorkPtr wy = other->all_reduce(y, ReduceOp::kMax);
  wy->wait();
  wx->wait();
  expect_equal(x, at::full({1 << 18}, static_cast<float>(n_)), "world");
  expect_equal(y, at::full({1 << 10}, static_cast<double>(n_ - 1), at::kDouble), "other");
}

// ---- split ---------------------------------------------------------------------

TEST_F(CommTest, SplitGroupsRanksByColorAndOrdersThemByKey) {
  // Even and odd world ranks; within each, ordered by descending world rank.
  ProcessGroupPtr half = pg_->split(rank_ % 2, -rank_, "parity");
  ASSERT_NE(half, nullptr);
  const int members = (n_ - rank_ % 2 + 1) / 2;
  EXPECT_EQ(half->size(), members);
  EXPECT_EQ(half->name(), "parity");
  // Higher world ranks come first: rank r is preceded by the members above it.
  EXPECT_EQ(half->rank(), (n_ - 1 - rank_) / 2);
  at::Tensor sum = at::full({3}, static_cast<double>(rank_), at::kDouble);
  half->all_reduce(sum)->wait();
  double expected = 0;
  for (int r = rank_ % 2; r < n_; r += 2) expected += r;
  expect_equal(sum, at::full({3}, expected, at::kDouble), "sum over the split group");
  // The split did not enter the parent's operation counters.
  EXPECT_EQ(pg_->stats().calls[static_cast<int>(OpType::kBarrier)], 0u);
}

TEST_F(CommTest, SplitWithNegativeColorLeavesTheRankOut) {
  ProcessGroupPtr first = pg_->split(rank_ == 0 ? 0 : -1, rank_, "first");
  if (rank_ == 0) {
    ASSERT_NE(first, nullptr);
    EXPECT_EQ(first->size(), 1);
  } else {
    EXPECT_EQ(first, nullptr);
  }
}

TEST_F(CommTest, SplitWaitsForTheGroupsQueuedOperations) {
  // A large all-reduce goes to the group's thread; the split issued right
  // after it must not run MPI on the same communicator at the same time, and
  // the reduction still completes with the right result.
  at::Tensor x = at::ones({1 << 20});
  WorkPtr pending = pg_->all_reduce(x);
  ProcessGroupPtr copy = pg_->split(0, rank_, "copy");
  ASSERT_NE(copy, nullptr);
  pending->wait();
  expect_equal(x, at::full({1 << 20}, static_cast<float>(n_)), "reduction queued before split");
  at::Tensor y = at::full({2}, static_cast<float>(rank_ + 1));
  copy->all_reduce(y, ReduceOp::kMax)->wait();
  expect_equal(y, at::full({2}, static_cast<float>(n_)), "reduction on the split group");
}

TEST(CommLifetime, DestroyingAGroupCancelsAPendingRecv) {
  ProcessGroupPtr self = make_mpi_process_group(MPI_COMM_SELF, "lonely");
  at::Tensor t = at::zeros({8});
  WorkPtr work = self->recv(t, 0, 9);
  self.reset();
  EXPECT_TRUE(work->is_completed());
  expect_comm_error([&] { work->wait(milliseconds(0)); },
                    {"recv from rank 0", "group 'lonely'", "cancelled", "destroyed"});
}

// ---- a group of one ---------------------------------------------------------------

TEST(CommSingleton, EveryOpWorksOnAGroupOfOne) {
  ProcessGroupPtr self = make_mpi_process_group(MPI_COMM_SELF, "self");
  EXPECT_EQ(self->size(), 1);
  EXPECT_EQ(self->rank(), 0);
  at::Tensor t = at::arange(10, at::kFloat);
  const at::Tensor original = t.clone();
  self->all_reduce(t, ReduceOp::kAvg)->wait();
  expect_equal(t, original, "all_reduce avg of one");
  at::Tensor out = at::zeros({10});
  self->reduce_scatter(out, {t})->wait();
  expect_equal(out, original, "reduce_scatter of one");
  self->reduce_scatter_flat(out, t, ReduceOp::kMax)->wait();
  expect_equal(out, original, "reduce_scatter_flat of one");
  std::vector<at::Tensor> outs = {at::zeros({10})};
  self->all_gather(outs, t)->wait();
  expect_equal(outs[0], original, "all_gather of one");
  self->all_gather_flat(out, t)->wait();
  expect_equal(out, original, "all_gather_flat of one");
  self->broadcast(t, 0)->wait();
  expect_equal(t, original, "broadcast of one");
  at::Tensor rows = at::zeros({10});
  self->all_to_all(rows, t)->wait();
  expect_equal(rows, original, "all_to_all of one");
  at::Tensor big_out = at::arange(1 << 20, at::kFloat);
  at::Tensor big_in = at::zeros({1 << 20});
  WorkPtr s = self->send(big_out, 0);
  WorkPtr r = self->recv(big_in, 0);
  r->wait();
  s->wait();
  expect_equal(big_in, big_out, "send to self");
  self->barrier()->wait();
  const CommStats stats = self->stats();
  EXPECT_EQ(stats.bytes[static_cast<int>(OpType::kAllReduce)], 0u);
  EXPECT_EQ(stats.bytes[static_cast<int>(OpType::kSend)], (1u << 20) * 4);
  EXPECT_EQ(stats.calls[static_cast<int>(OpType::kBarrier)], 1u);
}

// ---- byte counters --------------------------------------------------------------

TEST_F(CommTest, ByteCountersFollowTheFormulas) {
  const auto n = static_cast<uint64_t>(n_);
  const auto me = static_cast<uint64_t>(rank_);
  pg_->reset_stats();
  EXPECT_EQ(pg_->stats().total_bytes(), 0u);

  at::Tensor ar = at::ones({1000});  // 4000 bytes
  pg_->all_reduce(ar)->wait();

  std::vector<at::Tensor> rs_in;  // rank r's share: r + 1 floats
  for (int r = 0; r < n_; ++r) rs_in.push_back(at::ones({r + 1}));
  at::Tensor rs_out = at::zeros({rank_ + 1});
  pg_->reduce_scatter(rs_out, rs_in)->wait();
  at::Tensor rsf_in = at::ones({10 * n_});
  at::Tensor rsf_out = at::zeros({10});
  pg_->reduce_scatter_flat(rsf_out, rsf_in)->wait();

  at::Tensor ag_in = at::ones({rank_ + 1}, at::kDouble);
  std::vector<at::Tensor> ag_out;
  for (int r = 0; r < n_; ++r) ag_out.push_back(at::zeros({r + 1}, at::kDouble));
  pg_->all_gather(ag_out, ag_in)->wait();
  at::Tensor agf_in = at::ones({7}, at::kLong);
  at::Tensor agf_out = at::zeros({7 * n_}, at::kLong);
  pg_->all_gather_flat(agf_out, agf_in)->wait();

  at::Tensor bc = at::ones({100});
  pg_->broadcast(bc, 0)->wait();

  at::Tensor a2a_in = at::ones({2 * n_, 3}, at::kBFloat16);
  at::Tensor a2a_out = at::zeros({2 * n_, 3}, at::kBFloat16);
  pg_->all_to_all(a2a_out, a2a_in)->wait();

  at::Tensor p2p_out = at::ones({50});
  at::Tensor p2p_in = at::zeros({50});
  WorkPtr s = pg_->send(p2p_out, (rank_ + 1) % n_);
  pg_->recv(p2p_in, (rank_ + n_ - 1) % n_)->wait();
  s->wait();
  pg_->barrier()->wait();

  const CommStats st = pg_->stats();
  auto bytes = [&](OpType op) { return st.bytes[static_cast<int>(op)]; };
  auto calls = [&](OpType op) { return st.calls[static_cast<int>(op)]; };
  EXPECT_EQ(bytes(OpType::kAllReduce), 2 * (n - 1) * 4000 / n);
  const uint64_t rs_total = n * (n + 1) / 2 * 4;
  const uint64_t rs_bytes = (rs_total - (me + 1) * 4) + (n - 1) * 10 * 4;
  EXPECT_EQ(bytes(OpType::kReduceScatter), rs_bytes);
  const uint64_t ag_bytes = (me + 1) * 8 * (n - 1) + 7 * 8 * (n - 1);
  EXPECT_EQ(bytes(OpType::kAllGather), ag_bytes);
  const uint64_t bc_bytes = rank_ == 0 ? 400 * (n - 1) : 0;
  EXPECT_EQ(bytes(OpType::kBroadcast), bc_bytes);
  const uint64_t a2a_bytes = (n - 1) * 2 * 3 * 2;
  EXPECT_EQ(bytes(OpType::kAllToAll), a2a_bytes);
  EXPECT_EQ(bytes(OpType::kSend), 200u);
  EXPECT_EQ(bytes(OpType::kRecv), 0u);
  EXPECT_EQ(bytes(OpType::kBarrier), 0u);
  EXPECT_EQ(st.total_bytes(),
            2 * (n - 1) * 4000 / n + rs_bytes + ag_bytes + bc_bytes + a2a_bytes + 200);
  EXPECT_EQ(calls(OpType::kAllReduce), 1u);
  EXPECT_EQ(calls(OpType::kReduceScatter), 2u);
  EXPECT_EQ(calls(OpType::kAllGather), 2u);
  EXPECT_EQ(calls(OpType::kBroadcast), 1u);
  EXPECT_EQ(calls(OpType::kAllToAll), 1u);
  EXPECT_EQ(calls(OpType::kSend), 1u);
  EXPECT_EQ(calls(OpType::kRecv), 1u);
  EXPECT_EQ(calls(OpType::kBarrier), 1u);
  pg_->reset_stats();
  EXPECT_EQ(pg_->stats().total_bytes(), 0u);
  EXPECT_EQ(pg_->stats().calls[static_cast<int>(OpType::kAllReduce)], 0u);
}

// ---- small collectives in the caller's thread -------------------------------------

// Sets the inline limit (detail::set_inline_max_bytes) for one test.
class InlineLimitGuard {
 public:
  explicit InlineLimitGuard(int64_t bytes) : previous_(detail::set_inline_max_bytes(bytes)) {}
  ~InlineLimitGuard() { detail::set_inline_max_bytes(previous_); }

 private:
  int64_t previous_;
};

TEST_F(CommTest, SmallCollectiveOnAnIdleGroupCompletesWithinTheCall) {
  at::Tensor t = contribution(1024, rank_, at::kFloat);  // 4 KiB
  WorkPtr w = pg_->all_reduce(t);
  EXPECT_TRUE(w->is_completed()) << "a 4 KiB all_reduce on an idle group runs inline";
  w->wait();
  expect_equal(t, expected_reduction(1024, n_, ReduceOp::kSum, at::kFloat), "inline all_reduce");
  at::Tensor big = contribution(detail::kDefaultInlineMaxBytes / 4 + 1, rank_, at::kFloat);
  pg_->all_reduce(big)->wait();  // one element over the limit: the thread's
  expect_equal(big, expected_reduction(big.numel(), n_, ReduceOp::kSum, at::kFloat),
               "all_reduce past the inline limit");
  InlineLimitGuard guard(-1);  // everything through the thread gives the same
  at::Tensor u = contribution(1024, rank_, at::kFloat);
  pg_->all_reduce(u)->wait();
  expect_equal(u, expected_reduction(1024, n_, ReduceOp::kSum, at::kFloat), "thread all_reduce");
}

TEST_F(CommTest, SmallCollectiveAfterWaitingForTheThreadRunsInline) {
  // The thread marks the group idle before it completes an operation's
  // Work, so a small collective issued once wait() has returned (the norm
  // after a gradient bucket) finds the group idle and runs inline, instead
  // of queueing behind an operation that has already finished.
  for (int i = 0; i < 20; ++i) {
    at::Tensor big = contribution(1 << 18, rank_, at::kFloat, i);  // 1 MiB: the thread's
    pg_->all_reduce(big)->wait();
    at::Tensor small = contribution(1024, rank_, at::kFloat, i);
    WorkPtr w = pg_->all_reduce(small);
    EXPECT_TRUE(w->is_completed()) << "iteration " << i;
    w->wait();
    expect_equal(small, expected_reduction(1024, n_, ReduceOp::kSum, at::kFloat, i),
                 "small all_reduce after a large one");
  }
}

TEST_F(CommTest, SmallCollectivesNeverOvertakeQueuedOnes) {
  // Large all_reduces go to the thread; small ones issued behind them must
  // wait their turn. If one overtook on some rank, ranks would pair
  // different MPI calls and the results (or MPI) would break. Rank 0 issues
  // its small ones at once, the others after a pause (their thread is then
  // often idle again), so the ranks take different paths for the same call.
  std::vector<at::Tensor> tensors;
  std::vector<ReduceOp> ops;
  std::vector<WorkPtr> works;
  for (int i = 0; i < 24; ++i) {
    const bool large = i % 3 == 0;
    const int64_t numel = large ? (1 << 18) : 8 + i;
    const ReduceOp op = i % 2 ? ReduceOp::kMax : ReduceOp::kSum;
    if (!large && rank_ != 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    tensors.push_back(contribution(numel, rank_, at::kFloat, i));
    ops.push_back(op);
    works.push_back(pg_->all_reduce(tensors.back(), op));
  }
  for (auto& w : works) w->wait();
  for (size_t i = 0; i < tensors.size(); ++i) {
    expect_equal(
        tensors[i],
        expected_reduction(tensors[i].numel(), n_, ops[i], at::kFloat, static_cast<int64_t>(i)),
        "all_reduce " + std::to_string(i));
  }
}

// ---- transfers larger than one MPI call ----------------------------------------

TEST_F(CommTest, LargeTransfersAreSplitIntoSeveralMpiCalls) {
  MaxCountGuard guard(7);  // every rank sets the same limit
  at::Tensor t = contribution(100, rank_, at::kLong);
  pg_->all_reduce(t, ReduceOp::kMax)->wait();
  expect_equal(t, expected_reduction(100, n_, ReduceOp::kMax, at::kLong), "chunked all_reduce");
  at::Tensor h = contribution(50, rank_, at::kHalf);
  pg_->all_reduce(h)->wait();
  expect_equal(h, expected_reduction(50, n_, ReduceOp::kSum, at::kHalf), "chunked fp16 all_reduce");
  at::Tensor b = at::full({23}, static_cast<double>(rank_), at::kDouble);
  pg_->broadcast(b, n_ - 1)->wait();
  expect_equal(b, at::full({23}, static_cast<double>(n_ - 1), at::kDouble), "chunked broadcast");
  at::Tensor out = at::arange(100, at::kFloat) + rank_;
  at::Tensor in = at::zeros({100});
  const int left = (rank_ + n_ - 1) % n_;
  WorkPtr s = pg_->send(out, (rank_ + 1) % n_);
  pg_->recv(in, left)->wait();
  s->wait();
  expect_equal(in, at::arange(100, at::kFloat) + left, "chunked send/recv");
  // The variable-size collectives reject what one call cannot carry.
  std::vector<at::Tensor> outs;
  for (int r = 0; r < n_; ++r) outs.push_back(at::zeros({8}));
  expect_comm_error([&] { pg_->all_gather(outs, at::zeros({8})); },
                    {"all_gather", "group 'world'", "has 8 elements", "(7, MPI counts"});
  expect_comm_error([&] { pg_->reduce_scatter_flat(at::zeros({8}), at::zeros({8 * n_})); },
                    {"reduce_scatter_flat", "input has " + std::to_string(8 * n_) + " elements"});
}

// ---- argument validation (in the caller's thread) -------------------------------

TEST_F(CommTest, ArgumentErrorsNameGroupOpAndSizes) {
  const std::string group =
      "group 'world' (rank " + std::to_string(rank_) + " of " + std::to_string(n_) + ")";
  const at::Tensor f = at::zeros({4});
  expect_comm_error(
      [&] {
        pg_->all_reduce(at::zeros({4, 4}).t());
      },
      {"all_reduce", group, "not contiguous", "strides [1, 4]"});
  expect_comm_error([&] { pg_->all_reduce(at::zeros({4}, at::kBool)); },
                    {"all_reduce", "cannot reduce (sum) bool"});
  expect_comm_error([&] { pg_->broadcast(at::zeros({4}, at::kComplexFloat), 0); },
                    {"broadcast", "has dtype", "supported: float32"});
  expect_comm_error([&] { pg_->all_reduce(at::Tensor()); }, {"all_reduce", "undefined"});
  std::vector<at::Tensor> too_many(n_ + 1, f);
  expect_comm_error(
      [&] { pg_->reduce_scatter(f, too_many); },
      {"reduce_scatter", "inputs has " + std::to_string(n_ + 1) +
                             " tensors, expected one per rank (" + std::to_string(n_) + ")"});
  std::vector<at::Tensor> fours(n_, f);
  expect_comm_error([&] { pg_->reduce_scatter(at::zeros({3}), fours); },
                    {"reduce_scatter",
                     "output has 3 elements but inputs[" + std::to_string(rank_) + "]", "has 4"});
  expect_comm_error([&] { pg_->reduce_scatter_flat(f, at::zeros({4 * n_ + 1})); },
                    {"reduce_scatter_flat", "input has " + std::to_string(4 * n_ + 1) +
                                                " elements, expected group size " +
                                                std::to_string(n_) + " x output's 4"});
  std::vector<at::Tensor> doubles(n_, at::zeros({4}, at::kDouble));
  expect_comm_error([&] { pg_->all_gather(doubles, f); },
                    {"all_gather", "outputs[0] has dtype float64 but input has float32"});
  expect_comm_error(
      [&] { pg_->all_gather(fours, at::zeros({5})); },
      {"all_gather", "outputs[" + std::to_string(rank_) + "]", "has 4 elements", "input has 5"});
  expect_comm_error([&] { pg_->all_gather_flat(at::zeros({4 * n_ + 2}), f); },
                    {"all_gather_flat", "output has " + std::to_string(4 * n_ + 2) + " elements"});
  expect_comm_error(
      [&] { pg_->broadcast(f, n_); },
      {"broadcast", "root is rank " + std::to_string(n_), "ranks 0.." + std::to_string(n_ - 1)});
  expect_comm_error([&] { pg_->send(f, -1); }, {"send", "dst is rank -1", group});
  expect_comm_error([&] { pg_->recv(f, n_ + 3); },
                    {"recv", "src is rank " + std::to_string(n_ + 3)});
  expect_comm_error([&] { pg_->recv(f, 0, -2); }, {"recv", "tag -2"});
  at::Tensor rows = at::zeros({2 * n_, 3});
  std::vector<int64_t> bad_splits(n_, 1);  // sums to n rows, input has 2n
  expect_comm_error([&] { pg_->all_to_all(rows, rows, {}, bad_splits); },
                    {"all_to_all", "in_splits sums to " + std::to_string(n_) +
                                       " rows but input has " + std::to_string(2 * n_)});
  expect_comm_error(
      [&] {
        pg_->all_to_all(at::zeros({2 * n_, 4}), rows);
      },
      {"all_to_all", "a row of input has 3 elements", "output has 4"});
  expect_comm_error([&] { pg_->all_to_all(rows, rows, std::vector<int64_t>(n_ + 1, 1), {}); },
                    {"all_to_all", "out_splits has " + std::to_string(n_ + 1) + " entries"});
  if (n_ > 1) {
    expect_comm_error([&] { pg_->all_to_all(at::zeros({n_ + 1}), at::zeros({n_ + 1})); },
                      {"all_to_all", "not a multiple of the group size"});
    std::vector<int64_t> in_splits(n_, 0), out_splits(n_, 0);
    in_splits[rank_] = 1;
    in_splits[(rank_ + 1) % n_] = 2 * n_ - 1;
    out_splits[(rank_ + 1) % n_] = 2 * n_;
    expect_comm_error([&] { pg_->all_to_all(rows, rows, out_splits, in_splits); },
                      {"all_to_all", "sends itself 1 rows", "expects 0"});
  }
  // Nothing was enqueued: the group still works.
  at::Tensor ok = at::ones({3});
  pg_->all_reduce(ok)->wait();
  expect_equal(ok, at::full({3}, static_cast<float>(n_)), "all_reduce after rejected calls");
}

}  // namespace
}  // namespace kolos::comm
