// The CUDA backend without a GPU: loading it, the ncclUniqueId exchange over
// MPI, routing of CPU tensors, and the refusal of a device that is not
// there (tests/mpi/device/CMakeLists.txt).
#include <gtest/gtest.h>
#include <mpi.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/torch.h>

#include <cstring>
#include <regex>
#include <string>

#include "equivalence.h"
#include "kolos/core/device.h"
#include "kolos/core/devices.h"
#include "kolos/core/engine.h"
#include "kolos/core/error.h"
#include "kolos/core/runtime.h"
#include "kolos/modules/data.h"
#include "kolos/modules/gpt.h"

namespace kolos {
namespace {

TEST(CudaBackend, LoadsAndNamesItsNccl) {
  ASSERT_TRUE(device::cuda_backend_built());
  auto add = c10::Dispatcher::singleton().findSchema({"aten::add", "Tensor"});
  ASSERT_TRUE(add.has_value());
  // Before: a kolos built against the wheel links LibTorch's CPU library
  // only (this is the program's first test, so nothing has loaded the
  // backend yet). One built against a CUDA LibTorch's TorchConfig links all.
  if (KOLOS_TEST_TORCH_CPU_ONLY) {
    EXPECT_FALSE(add->hasKernelForDispatchKey(c10::DispatchKey::CUDA));
  }
  device::CudaBackend& backend = device::cuda_backend();
  EXPECT_TRUE(std::regex_match(backend.nccl_version(), std::regex(R"(2\.\d+\.\d+)")))
      << backend.nccl_version();
  // After: libtorch_cuda.so came with it, and LibTorch's CUDA kernels are
  // registered with the dispatcher.
  EXPECT_TRUE(add->hasKernelForDispatchKey(c10::DispatchKey::CUDA));
  EXPECT_TRUE(c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA));
}

// Rank 0's id reaches every rank through ProcessGroupMPI's broadcast, as
// ProcessGroupNCCL's set-up sends it; two ids differ.
TEST(CudaBackend, UniqueIdIsExchangedOverMpi) {
  device::CudaBackend& backend = device::cuda_backend();
  auto world = testing::world_group();
  const std::string a = backend.nccl_unique_id();
  const std::string b = backend.nccl_unique_id();
  ASSERT_EQ(a.size(), 128u);  // sizeof(ncclUniqueId)
  EXPECT_NE(a, b);
  at::Tensor id = torch::zeros({128}, torch::kUInt8);
  if (world->rank() == 0) std::memcpy(id.data_ptr(), a.data(), a.size());
  world->broadcast(id, 0)->wait();
  at::Tensor mine = torch::zeros({128}, torch::kUInt8);
  std::memcpy(mine.data_ptr(), a.data(), a.size());
  // Every rank now holds rank 0's id; rank 0's own is what it sent.
  at::Tensor first = id.clone();
  world->broadcast(first, 0)->wait();
  EXPECT_TRUE(torch::equal(id, first));
  if (world->rank() == 0) EXPECT_TRUE(torch::equal(id, mine));
  EXPECT_GT(id.sum().item<int64_t>(), 0);
}

// A routing group sends CPU tensors to the group it wraps (MPI): the same
// results and the same traffic counters as the plain group.
TEST(CudaBackend, RoutingGroupKeepsCpuTensorsOnMpi) {
  auto routed = device::route_by_device(testing::world_group());
  EXPECT_EQ(routed->backend(), "mpi+nccl");
  routed->reset_stats();
  at::Tensor t = torch::full({5}, static_cast<float>(routed->rank() + 1));
  routed->all_reduce(t)->wait();
  const int n = routed->size();
  EXPECT_TRUE(torch::equal(t, torch::full({5}, static_cast<float>(n * (n + 1) / 2))));
  EXPECT_EQ(routed->stats().calls[static_cast<int>(comm::OpType::kAllReduce)], 1u);
  auto half = routed->split(routed->rank() % 2, routed->rank(), "half");
  ASSERT_NE(half, nullptr);
  EXPECT_EQ(half->backend(), "mpi+nccl");
  at::Tensor one = torch::ones({3});
  half->all_reduce(one)->wait();
  EXPECT_TRUE(torch::equal(one, torch::full({3}, static_cast<float>(half->size()))));
}

// Without a GPU the device is refused with the host and the reason; with
// one, the rank's GPU (node-local rank modulo the GPUs) is opened.
TEST(CudaBackend, OpensTheRanksGpuOrSaysWhyNot) {
  device::CudaBackend& backend = device::cuda_backend();
  if (cuda::device_count() == 0) {
    try {
      backend.open(0, "node07");
      FAIL() << "no GPU here, yet the device opened";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("runtime.device = \"cuda\" on node07: no usable GPU"),
                std::string::npos)
          << e.what();
    }
  } else {
    const int device = backend.open(3, "node07");
    EXPECT_EQ(device, 3 % cuda::device_count());
    EXPECT_NE(backend.describe(device).find("NCCL 2."), std::string::npos);
  }
}

// An engine on runtime.device = "cuda" without a GPU stops in set-up with
// that error on every rank (agreed), before any model exists.
TEST(CudaBackend, EngineRefusesCudaWithoutAGpu) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  modules::register_builtin_models();
  const RunConfig config = testing::tiny_gpt_config({"runtime.device=\"cuda\""});
  try {
    Engine engine(config, testing::world_group(), [](const RunConfig& c) {
      return data::make_source(c);
    });
    FAIL() << "the engine started on a missing GPU";
  } catch (const AgreedError& e) {
    EXPECT_NE(std::string(e.what()).find("no usable GPU"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kolos
