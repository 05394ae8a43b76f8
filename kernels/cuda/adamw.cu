// Multi-tensor fused AdamW (apex's multi_tensor_apply idea): one launch
// covers many tensors; each block updates one 64K-element chunk of one
// tensor, whose pointers travel in the kernel's parameter block.
#include <algorithm>
#include <vector>

#include "../cpu/kernel_table.h"
#include "check.cuh"
#include "kolos/kernels/cuda.h"

namespace kolos::kernels::cuda {
namespace {

constexpr int kMaxTensors = 32;
constexpr int kMaxBlocks = 320;
constexpr int64_t kChunk = 1 << 16;
constexpr int kThreads = 512;

// 32 * 5 * 8 + 320 * 2 * 4 = 3840 bytes: within the 4 KiB parameter limit.
struct TensorList {
  float* p[kMaxTensors];
  const float* g[kMaxTensors];
  float* m[kMaxTensors];
  float* v[kMaxTensors];
  int64_t n[kMaxTensors];
  int block_tensor[kMaxBlocks];
  int block_chunk[kMaxBlocks];
};

// The CPU formula with explicit round-to-nearest intrinsics: nvcc would
// otherwise contract a*b+c into fma where the CPU rounds twice.
__global__ void adamw_kernel(TensorList list, kernels::detail::AdamWScalars s) {
  const int t = list.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(list.block_chunk[blockIdx.x]) * kChunk;
  const int64_t end = min(list.n[t], begin + kChunk);
  float* p = list.p[t];
  const float* g = list.g[t];
  float* m = list.m[t];
  float* v = list.v[t];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float gi = __fmul_rn(g[i], s.grad_scale);
    const float pi = __fmul_rn(p[i], s.weight_decay_factor);
    const float mi = __fmaf_rn(gi, s.one_minus_beta1, __fmul_rn(m[i], s.beta1));
    const float vi = __fmaf_rn(__fmul_rn(gi, s.one_minus_beta2), gi, __fmul_rn(v[i], s.beta2));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.bias_correction2_sqrt), s.eps);
    p[i] = __fadd_rn(pi, __fdiv_rn(__fmul_rn(s.neg_step_size, mi), denom));
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace

void adamw_step(const AdamWTensor* tensors, size_t count, const AdamWConfig& config,
                cudaStream_t stream) {
  const kernels::detail::AdamWScalars s = kernels::detail::adamw_scalars(config);
  detail::check_arg(count == 0 || tensors != nullptr, "adamw_step", "null tensor list");
  TensorList list{};
  int ntensors = 0, nblocks = 0;
  auto launch = [&] {
    if (nblocks == 0) return;
    adamw_kernel<<<nblocks, kThreads, 0, stream>>>(list, s);
    detail::check_launch("adamw_step");
    ntensors = 0;
    nblocks = 0;
  };
  for (size_t i = 0; i < count; ++i) {
    const AdamWTensor& x = tensors[i];
    detail::check_arg(x.numel >= 0, "adamw_step", "negative numel");
    if (x.numel == 0) continue;
    detail::check_arg(x.param && x.grad && x.exp_avg && x.exp_avg_sq, "adamw_step", "null pointer");
    const int64_t chunks = (x.numel + kChunk - 1) / kChunk;
    for (int64_t c = 0; c < chunks; ++c) {
      if (c == 0 || ntensors == 0) {  // (re)register the tensor in this launch
        if (ntensors == kMaxTensors) launch();
        list.p[ntensors] = x.param;
        list.g[ntensors] = x.grad;
        list.m[ntensors] = x.exp_avg;
        list.v[ntensors] = x.exp_avg_sq;
        list.n[ntensors] = x.numel;
        ++ntensors;
      }
      list.block_tensor[nblocks] = ntensors - 1;
      list.block_chunk[nblocks] = static_cast<int>(c);
      if (++nblocks == kMaxBlocks) launch();
    }
  }
  launch();
}

}  // namespace kolos::kernels::cuda
