// One decoding step's attention over a paged KV cache: S sequences of one
// token each at context C, L layers. Three figures, measured in this run:
//   in place  PagedKvCache::attend (every chunk one token: the in-place path)
//   gathered  the same arithmetic as LibTorch operators per sequence: an
//             index_select of its rows, matmul, softmax, matmul (the path a
//             prefill chunk takes)
//   bound     the cache bytes a step must read (keys and values of every
//             context row) over the read bandwidth of a LibTorch sum of 1 GiB
// Usage: bench_paged_attention [SEQS=16] [CONTEXT=160] [LAYERS=12] [HEADS=12]
//        [HEAD_DIM=64] [REPEATS=20]; threads: LibTorch's (OMP_NUM_THREADS).
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kolos/inference/kv_cache.h"

using kolos::inference::PagedKvCache;
using kolos::inference::StepBatch;
using kolos::inference::StepChunk;

namespace {

template <typename F>
double median_ms(int repeats, F f) {
  std::vector<double> times;
  f();  // warm-up
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  auto arg = [&](int i, int64_t fallback) { return argc > i ? std::atoll(argv[i]) : fallback; };
  const int64_t seqs = arg(1, 16), context = arg(2, 160), layers = arg(3, 12), heads = arg(4, 12),
                d = arg(5, 64);
  const int repeats = static_cast<int>(arg(6, 20));
  const int64_t block = 16, per_seq = (context + block - 1) / block;
  torch::NoGradGuard no_grad;
  PagedKvCache cache(layers, seqs * per_seq, block, heads, d, at::kFloat);
  StepBatch step;
  std::vector<at::Tensor> rows;  // each sequence's context rows
  for (int64_t s = 0; s < seqs; ++s) {
    StepChunk c;
    c.start = context - 1;
    c.length = 1;
    c.sample = true;
    // Blocks interleaved over the pool, as a busy allocator hands them out.
    for (int64_t b = 0; b < per_seq; ++b) c.blocks.push_back(static_cast<int32_t>(b * seqs + s));
    std::vector<int64_t> r;
    for (int64_t p = 0; p < context; ++p) r.push_back(c.blocks[p / block] * block + p % block);
    rows.push_back(torch::tensor(r, torch::kInt64));
    step.tokens.push_back(0);
    step.chunks.push_back(c);
  }
  const at::Tensor q = torch::randn({1, heads, seqs, d}), k = torch::randn({1, heads, seqs, d}),
                   v = torch::randn({1, heads, seqs, d});
  const at::Tensor keys = torch::randn({seqs * per_seq * block, heads, d}),
                   values = torch::randn({seqs * per_seq * block, heads, d});
  const double in_place = median_ms(repeats, [&] {
    cache.begin_step(step);
    for (int64_t l = 0; l < layers; ++l) cache.attend(q, k, v);
  });
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const double gathered = median_ms(repeats, [&] {
    for (int64_t l = 0; l < layers; ++l) {
      std::vector<at::Tensor> out;
      for (int64_t s = 0; s < seqs; ++s) {
        const at::Tensor key = keys.index_select(0, rows[s]).transpose(0, 1);  // [h, C, d]
        const at::Tensor value = values.index_select(0, rows[s]).transpose(0, 1);
        const at::Tensor scores = torch::matmul(q[0].narrow(1, s, 1), key.transpose(1, 2)) * scale;
        out.push_back(torch::matmul(torch::softmax(scores, -1), value));
      }
      (void)torch::cat(out, 1);
    }
  });
  const at::Tensor big = torch::ones({int64_t{1} << 28});
  const double sum_ms = median_ms(5, [&] { (void)big.sum(); });
  const double bandwidth = static_cast<double>(big.numel()) * 4 / (sum_ms * 1e-3);  // bytes/s
  const double step_bytes = 2.0 * static_cast<double>(layers * seqs * context * heads * d) * 4;
  const double bound = step_bytes / bandwidth * 1e3;
  std::printf(
      "decoding step: %ld sequences at context %ld, %ld layers, %ld heads of %ld, fp32, "
      "%d threads (medians of %d)\n",
      static_cast<long>(seqs), static_cast<long>(context), static_cast<long>(layers),
      static_cast<long>(heads), static_cast<long>(d), at::get_num_threads(), repeats);
  std::printf("in place  %8.2f ms\ngathered  %8.2f ms  (in place / gathered = %.2f)\n", in_place,
              gathered, in_place / gathered);
  std::printf(
      "bound     %8.2f ms  (%.1f MB of keys and values at %.1f GB/s read; in place at "
      "%.0f%% of it)\n",
      bound, step_bytes / 1e6, bandwidth / 1e9, 100 * bound / in_place);
  return 0;
}
