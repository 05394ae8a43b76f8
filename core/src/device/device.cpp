// The device of a run: loading libkolos_cuda.so, and process groups that
// route CUDA tensors to NCCL (kolos/core/device.h).
#include "kolos/core/device.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kolos/config.h"
#include "kolos/core/error.h"

namespace kolos::device {

const char* to_string(Kind kind) { return kind == Kind::kCuda ? "cuda" : "cpu"; }

bool cuda_backend_built() { return KOLOS_CUDA_BACKEND != 0; }

namespace {

// The folder of the library this function is in (libkolos_core.so).
std::string own_directory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&own_directory), &info) == 0 || info.dli_fname == nullptr) {
    return ".";
  }
  const std::string path = info.dli_fname;
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

CudaBackend* load_backend() {
  if (!cuda_backend_built()) {
    throw ConfigError(
        "runtime.device = \"cuda\": this kolos was built without its CUDA backend "
        "(libkolos_cuda.so: it needs nvcc and a LibTorch with CUDA at configure time, "
        "KOLOS_TORCH=system with a CUDA PyTorch's cmake prefix, or the torch wheel; "
        "docs/devices.md)");
  }
  const char* env = std::getenv("KOLOS_CUDA_LIBRARY");
  const std::string path = env != nullptr && *env != '\0'
                               ? std::string(env)
                               : own_directory() + "/libkolos_cuda.so";
  // RTLD_GLOBAL: LibTorch's CUDA libraries register kernels and hooks that
  // code outside this library (the model, the plugins) reaches through the
  // dispatcher.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    throw ConfigError("runtime.device = \"cuda\": cannot load the CUDA backend " + path + ": " +
                      (why != nullptr ? why : "unknown error") +
                      " (it loads LibTorch's CUDA libraries, libtorch_cuda.so and the CUDA "
                      "runtime, cuBLAS, cuDNN and NCCL it links)");
  }
  using Entry = CudaBackend* (*)();
  auto entry = reinterpret_cast<Entry>(dlsym(handle, "kolos_cuda_backend"));
  if (entry == nullptr) {
    throw ConfigError("runtime.device = \"cuda\": " + path +
                      " has no kolos_cuda_backend(); is it kolos's CUDA backend?");
  }
  CudaBackend* backend = entry();
  KOLOS_CHECK(backend != nullptr, path, ": kolos_cuda_backend() returned null");
  return backend;  // the library stays loaded for the life of the process
}

// CUDA tensors to an NCCL group over the same ranks, made on first use;
// everything else to the wrapped group.
class RoutingGroup final : public comm::ProcessGroup {
 public:
  explicit RoutingGroup(comm::ProcessGroupPtr host) : host_(std::move(host)) {}

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const std::string& name() const override { return host_->name(); }
  std::string backend() const override { return host_->backend() + "+nccl"; }

  comm::WorkPtr all_reduce(const at::Tensor& tensor, comm::ReduceOp op) override {
    return on({tensor}, "all_reduce").all_reduce(tensor, op);
  }
  comm::WorkPtr reduce_scatter(const at::Tensor& output, const std::vector<at::Tensor>& inputs,
                               comm::ReduceOp op) override {
    std::vector<at::Tensor> all = inputs;
    all.push_back(output);
    return on(all, "reduce_scatter").reduce_scatter(output, inputs, op);
  }
  comm::WorkPtr reduce_scatter_flat(const at::Tensor& output, const at::Tensor& input,
                                    comm::ReduceOp op) override {
    return on({output, input}, "reduce_scatter").reduce_scatter_flat(output, input, op);
  }
  comm::WorkPtr all_gather(const std::vector<at::Tensor>& outputs, const at::Tensor& input) override {
    std::vector<at::Tensor> all = outputs;
    all.push_back(input);
    return on(all, "all_gather").all_gather(outputs, input);
  }
  comm::WorkPtr all_gather_flat(const at::Tensor& output, const at::Tensor& input) override {
    return on({output, input}, "all_gather").all_gather_flat(output, input);
  }
  comm::WorkPtr broadcast(const at::Tensor& tensor, int root) override {
    return on({tensor}, "broadcast").broadcast(tensor, root);
  }
  comm::WorkPtr all_to_all(const at::Tensor& output, const at::Tensor& input,
                           const std::vector<int64_t>& out_splits,
                           const std::vector<int64_t>& in_splits) override {
    return on({output, input}, "all_to_all").all_to_all(output, input, out_splits, in_splits);
  }
  comm::WorkPtr send(const at::Tensor& tensor, int dst, int tag) override {
    return on({tensor}, "send").send(tensor, dst, tag);
  }
  comm::WorkPtr recv(const at::Tensor& tensor, int src, int tag) override {
    return on({tensor}, "recv").recv(tensor, src, tag);
  }
  // Control: the host group orders the ranks; a barrier does not order
  // work already queued on the GPU (wait for its Work first).
  comm::WorkPtr barrier() override { return host_->barrier(); }

  std::shared_ptr<comm::ProcessGroup> split(int64_t color, int64_t key,
                                            const std::string& name) override {
    auto part = host_->split(color, key, name);
    return part ? route_by_device(std::move(part)) : nullptr;
  }

  comm::CommStats stats() const override {
    comm::CommStats out = host_->stats();
    std::lock_guard<std::mutex> lock(mutex_);
    if (gpu_) {
      const comm::CommStats g = gpu_->stats();
      for (size_t i = 0; i < out.bytes.size(); ++i) {
        out.bytes[i] += g.bytes[i];
        out.calls[i] += g.calls[i];
      }
    }
    return out;
  }
  void reset_stats() override {
    host_->reset_stats();
    std::lock_guard<std::mutex> lock(mutex_);
    if (gpu_) gpu_->reset_stats();
  }

 private:
  // The group for these tensors: all on the CPU, or all on CUDA.
  comm::ProcessGroup& on(const std::vector<at::Tensor>& tensors, const char* op) {
    int cuda = 0, defined = 0;
    for (const auto& t : tensors) {
      if (!t.defined()) continue;
      ++defined;
      cuda += t.is_cuda() ? 1 : 0;
    }
    if (cuda == 0) return *host_;
    if (cuda != defined) {
      throw CommError(std::string(op) + " on group '" + name() +
                      "' mixes CUDA and CPU tensors; every tensor of one operation must be on "
                      "the same device");
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (!gpu_) gpu_ = cuda_backend().nccl_group(host_);
    return *gpu_;
  }

  comm::ProcessGroupPtr host_;
  mutable std::mutex mutex_;
  comm::ProcessGroupPtr gpu_;
};

}  // namespace

CudaBackend& cuda_backend() {
  static std::once_flag once;
  static CudaBackend* backend = nullptr;
  static std::string failure;
  std::call_once(once, [] {
    try {
      backend = load_backend();
    } catch (const std::exception& e) {
      failure = e.what();
    }
  });
  if (backend == nullptr) throw ConfigError(failure);
  return *backend;
}

comm::ProcessGroupPtr route_by_device(comm::ProcessGroupPtr group) {
  KOLOS_CHECK(group != nullptr, "route_by_device: no group");
  return std::make_shared<RoutingGroup>(std::move(group));
}

}  // namespace kolos::device
