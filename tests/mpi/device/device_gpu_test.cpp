// The CUDA device on real GPUs (label gpu; device_gpu_test_np2 also
// multigpu: NCCL puts one rank on one GPU). Fails, never skips, when the
// GPUs are missing.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "equivalence.h"
#include "kolos/core/device.h"
#include "kolos/core/devices.h"
#include "kolos/core/runtime.h"

namespace kolos {
namespace {

// This rank's GPU, opened as the engine opens it (local rank = world rank:
// the tests run on one node).
at::Device open_gpu() {
  const int n = testing::world_size();
  EXPECT_GE(cuda::device_count(), n) << "needs " << n << " GPU(s), one per rank";
  const int index = device::cuda_backend().open(testing::world_rank(), "this node");
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
}

// Each collective on CUDA tensors (NCCL, through a routing group) gives
// what the same collective gives on CPU tensors (MPI).
TEST(Nccl, CollectivesMatchMpi) {
  const at::Device gpu = open_gpu();
  auto cpu_group = testing::world_group();
  auto routed = device::route_by_device(testing::world_group());
  const int rank = routed->rank(), n = routed->size();
  torch::manual_seed(17 + rank);
  auto both = [&](const at::Tensor& t) { return std::make_pair(t.clone(), t.to(gpu)); };
  auto same = [](const at::Tensor& cpu, const at::Tensor& cuda, const char* what) {
    EXPECT_TRUE(torch::allclose(cpu, cuda.cpu(), 1e-6, 1e-6)) << what;
  };

  for (auto op : {comm::ReduceOp::kSum, comm::ReduceOp::kAvg, comm::ReduceOp::kMax}) {
    auto [c, g] = both(torch::randn({1000}));
    cpu_group->all_reduce(c, op)->wait();
    routed->all_reduce(g, op)->wait();
    same(c, g, comm::to_string(op));
  }
  {
    auto [c, g] = both(torch::randn({333}));
    cpu_group->broadcast(c, n - 1)->wait();
    routed->broadcast(g, n - 1)->wait();
    same(c, g, "broadcast");
  }
  {
    at::Tensor in = torch::randn({64});
    at::Tensor c = torch::empty({64 * n}), g = torch::empty({64 * n}, gpu);
    cpu_group->all_gather_flat(c, in)->wait();
    routed->all_gather_flat(g, in.to(gpu))->wait();
    same(c, g, "all_gather_flat");
    at::Tensor rc = torch::empty({64}), rg = torch::empty({64}, gpu);
    cpu_group->reduce_scatter_flat(rc, c)->wait();
    routed->reduce_scatter_flat(rg, g)->wait();
    same(rc, rg, "reduce_scatter_flat");
  }
  {
    // Uneven: rank r owns r + 3 elements.
    std::vector<at::Tensor> c_out, g_out, c_in, g_in;
    for (int r = 0; r < n; ++r) {
      c_out.push_back(torch::zeros({r + 3}));
      g_out.push_back(torch::zeros({r + 3}, gpu));
      at::Tensor x = torch::randn({r + 3});
      c_in.push_back(x);
      g_in.push_back(x.to(gpu));
    }
    at::Tensor mine = torch::randn({rank + 3});
    cpu_group->all_gather(c_out, mine)->wait();
    routed->all_gather(g_out, mine.to(gpu))->wait();
    for (int r = 0; r < n; ++r) same(c_out[r], g_out[r], "all_gather");
    at::Tensor rc = torch::zeros({rank + 3}), rg = torch::zeros({rank + 3}, gpu);
    cpu_group->reduce_scatter(rc, c_in)->wait();
    routed->reduce_scatter(rg, g_in)->wait();
    same(rc, rg, "reduce_scatter");
  }
  {
    at::Tensor in = torch::randn({4 * n, 3});
    at::Tensor c = torch::empty({4 * n, 3}), g = torch::empty({4 * n, 3}, gpu);
    cpu_group->all_to_all(c, in)->wait();
    routed->all_to_all(g, in.to(gpu))->wait();
    same(c, g, "all_to_all");
  }
  if (n > 1) {
    at::Tensor send = torch::full({10}, static_cast<float>(rank)).to(gpu);
    at::Tensor recv = torch::empty({10}, gpu);
    const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    auto s = rank % 2 == 0 ? routed->send(send, next) : routed->recv(recv, prev);
    auto r = rank % 2 == 0 ? routed->recv(recv, prev) : routed->send(send, next);
    s->wait();
    r->wait();
    EXPECT_TRUE(torch::equal(recv.cpu(), torch::full({10}, static_cast<float>(prev))));
  }
  routed->barrier()->wait();
  EXPECT_EQ(routed->backend(), "mpi+nccl");
}

// Mixing devices in one operation is refused, naming the operation.
TEST(Nccl, MixedDevicesAreRefused) {
  const at::Device gpu = open_gpu();
  auto routed = device::route_by_device(testing::world_group());
  at::Tensor out = torch::empty({4 * routed->size()});
  EXPECT_THROW(routed->all_gather_flat(out, torch::ones({4}, gpu)), CommError);
}

// Training on the GPU follows the CPU run of the same model: same data,
// same initial parameters (initialised on the CPU, then moved). fp32
// matmuls on the GPU sum in another order, without TF32 (LibTorch's
// default): per-step losses within 1e-4, parameters within 1e-3.
TEST(Device, TrainsLikeTheCpu) {
  open_gpu();
  const RunConfig cpu = testing::tiny_gpt_config();
  const RunConfig cuda = testing::tiny_gpt_config({"runtime.device=\"cuda\""});
  testing::RunRecord reference = testing::run_and_record(cpu, testing::self_group());
  testing::RunRecord candidate = testing::run_and_record(cuda, testing::world_group());
  for (auto& [name, p] : candidate.parameters) {
    p = p.cpu();
  }
  testing::expect_records_match(reference, candidate, testing::Tolerance{1e-4, 1e-3, 1e-3},
                                "cuda vs cpu");
}

// A low precision on the GPU trains: its loss falls as the fp32 run's does.
void expect_trains_in(const std::string& precision) {
  open_gpu();
  testing::RunRecord r = testing::run_and_record(
      testing::tiny_gpt_config({"runtime.device=\"cuda\"", "train.precision=\"" + precision + "\"",
                                "train.steps=60"}),
      testing::world_group());
  ASSERT_FALSE(r.losses.empty());
  EXPECT_LT(r.losses.back(), 0.8 * r.losses.front()) << precision;
}

TEST(Device, Bf16Trains) { expect_trains_in("bf16"); }
// fp16 with its loss scaling.
TEST(Device, Fp16Trains) { expect_trains_in("fp16"); }

// Recomputation on the GPU gives the run without it (no dropout: the same
// arithmetic, replayed).
TEST(Device, RecomputedTrainsLikeStored) {
  open_gpu();
  testing::RunRecord stored = testing::run_and_record(
      testing::tiny_gpt_config({"runtime.device=\"cuda\""}), testing::world_group());
  testing::RunRecord recomputed = testing::run_and_record(
      testing::tiny_gpt_config({"runtime.device=\"cuda\"", "train.recompute=\"full\""}),
      testing::world_group());
  testing::expect_records_match(stored, recomputed, testing::Tolerance{1e-6, 1e-5, 1e-5},
                                "recomputed vs stored");
}

}  // namespace
}  // namespace kolos
