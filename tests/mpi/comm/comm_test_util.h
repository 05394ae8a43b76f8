// Shared by the ProcessGroupMPI tests (collectives_test.cpp, group_test.cpp):
// the world's rank and size, the closed-form contributions and reductions,
// the checks, and the CommTest fixture (a group over MPI_COMM_WORLD).
//
// Every rank runs every test and issues the same collectives in the same
// order; checks use EXPECT_* (not ASSERT_*) before collectives so that a rank
// with a wrong value still takes part in the rest and the job does not hang.
// Values are rank-dependent with closed-form reductions: rank s contributes
// (s + 1) * k with k = (index % 5) + 1, so over n ranks
//   sum = k n (n + 1) / 2,  max = k n,  min = k,  avg = k (n + 1) / 2.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "kolos/core/comm/mpi.h"
#include "kolos/core/comm/process_group.h"
#include "kolos/core/error.h"

namespace kolos::comm::comm_test {

inline int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

inline int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// Runs `f`, expecting a kolos::CommError whose message holds every part.
template <typename F>
void expect_comm_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected kolos::CommError";
  } catch (const CommError& e) {
    const std::string message = e.what();
    for (const auto& part : parts) {
      EXPECT_NE(message.find(part), std::string::npos)
          << "message lacks '" << part << "':\n  " << message;
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected kolos::CommError, got: " << e.what();
  }
}

// k = (i % 5) + 1 for i = 0..numel-1, as float64.
inline at::Tensor pattern(int64_t numel, int64_t shift = 0) {
  return (at::arange(shift, shift + numel, at::kDouble).remainder(5) + 1);
}

inline at::Tensor contribution(int64_t numel, int rank, at::ScalarType dtype, int64_t shift = 0) {
  return (pattern(numel, shift) * (rank + 1)).to(dtype);
}

inline at::Tensor expected_reduction(int64_t numel, int n, ReduceOp op, at::ScalarType dtype,
                                     int64_t shift = 0) {
  const at::Tensor k = pattern(numel, shift);
  switch (op) {
    case ReduceOp::kSum:
      return (k * (n * (n + 1) / 2)).to(dtype);
    case ReduceOp::kMax:
      return (k * n).to(dtype);
    case ReduceOp::kMin:
      return k.to(dtype);
    case ReduceOp::kAvg:
      if (at::isFloatingType(dtype)) return (k * (n + 1) / 2).to(dtype);
      // Integers: floor division of the integer sum.
      return at::floor(k * (n * (n + 1) / 2) / n).to(dtype);
  }
  return {};
}

inline void expect_equal(const at::Tensor& actual, const at::Tensor& expected,
                         const std::string& what) {
  EXPECT_EQ(actual.scalar_type(), expected.scalar_type()) << what;
  EXPECT_TRUE(at::equal(actual, expected))
      << what << "\nactual:   " << actual.flatten().slice(0, 0, 12)
      << "\nexpected: " << expected.flatten().slice(0, 0, 12);
}

class CommTest : public testing::Test {
 protected:
  void SetUp() override {
    rank_ = world_rank();
    n_ = world_size();
    pg_ = make_mpi_process_group(MPI_COMM_WORLD, "world");
  }
  void TearDown() override { pg_.reset(); }

  int rank_ = 0;
  int n_ = 1;
  ProcessGroupPtr pg_;
};

}  // namespace kolos::comm::comm_test
