// libkolos_cuda.so: kolos's CUDA backend (kolos/core/device.h). Its one
// exported entry point, kolos_cuda_backend(), is what the core looks up
// after loading it.
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>

#include "kolos/core/device.h"
#include "kolos/core/error.h"
#include "process_group_nccl.h"

namespace kolos::cuda {
namespace {

// 13020 -> "13.2"
std::string cuda_version_text(int v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

// Compute capability 7.0 (V100) is the oldest kolos runs on; CUDA 11 the
// oldest CUDA.
constexpr int kMinMajor = 7;
constexpr int kMinCuda = 11000;

class Backend final : public device::CudaBackend {
 public:
  int open(int local_rank, const std::string& host) override {
    const std::string where = "runtime.device = \"cuda\" on " + host + ": ";
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    int count = 0;
    const cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess || count == 0) {
      const std::string why = rc != cudaSuccess ? cudaGetErrorString(rc) : "no device";
      cudaGetLastError();  // clear the sticky error
      throw ConfigError(where + "no usable GPU (cudaGetDeviceCount: " + why + "; driver " +
                        (driver > 0 ? "supports CUDA " + cuda_version_text(driver) : "not loaded") +
                        "); use device = \"cpu\"");
    }
    if (driver < kMinCuda) {
      throw ConfigError(where + "the NVIDIA driver supports CUDA " + cuda_version_text(driver) +
                        "; kolos needs CUDA 11 or newer");
    }
    if (runtime < kMinCuda) {
      throw ConfigError(where + "the CUDA runtime is " + cuda_version_text(runtime) +
                        "; kolos needs CUDA 11 or newer");
    }
    const int device = local_rank % count;
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
      throw ConfigError(where + "cannot read the properties of GPU " + std::to_string(device));
    }
    if (prop.major < kMinMajor) {
      throw ConfigError(where + "GPU " + std::to_string(device) + " (" + prop.name +
                        ") has compute capability " + std::to_string(prop.major) + "." +
                        std::to_string(prop.minor) +
                        "; kolos needs 7.0 (V100) or newer");
    }
    if (c10::cuda::device_count() <= device) {
      throw ConfigError(where + "LibTorch sees " + std::to_string(c10::cuda::device_count()) +
                        " GPU(s), the CUDA runtime " + std::to_string(count) +
                        " (CUDA_VISIBLE_DEVICES?)");
    }
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
    return device;
  }

  std::string describe(int device) const override {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "GPU " + std::to_string(device);
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    char memory[32];
    std::snprintf(memory, sizeof memory, "%.1f GiB",
                  static_cast<double>(prop.totalGlobalMem) / (1ull << 30));
    return std::string(prop.name) + " (cc " + std::to_string(prop.major) + "." +
           std::to_string(prop.minor) + ", " + memory + "), CUDA runtime " +
           cuda_version_text(runtime) + ", driver " + cuda_version_text(driver) + ", NCCL " +
           nccl_version();
  }

  comm::ProcessGroupPtr nccl_group(const comm::ProcessGroupPtr& control) override {
    return make_nccl_group(control, c10::cuda::current_device());
  }

  std::string nccl_unique_id() const override { return cuda::nccl_unique_id(); }
  std::string nccl_version() const override { return cuda::nccl_version(); }
};

}  // namespace
}  // namespace kolos::cuda

extern "C" __attribute__((visibility("default"))) kolos::device::CudaBackend* kolos_cuda_backend() {
  static kolos::cuda::Backend backend;
  return &backend;
}
