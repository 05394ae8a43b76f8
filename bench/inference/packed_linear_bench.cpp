// The linear layers of one GPT-2 step (per layer q, k, v, o: H x H; the
// MLP: H -> 4H -> H; then the tied head, H -> V) over R rows, with the
// weights packed three ways, measured in this run, in interleaved rounds
// (the machine's speed may drift; each round runs every kernel once):
//   panels   kolos's panels (PackedLinear::Kernel::kPanels, kolos/kernels/linear.h)
//   oneDNN   oneDNN's blocked layout (PackedLinear::Kernel::kOneDnn)
//   plain    at::linear on the unpacked weight (LibTorch's product)
//   bound    the weights' bytes over the read bandwidth of a LibTorch sum
//            over 1 GiB: no product of a few rows can beat it, since every
//            weight is read once from memory (they do not fit in a cache)
// Then the MLP's GELU (tanh form) over the same rows, kolos's kernel
// against torch::gelu, interleaved.
// Usage: bench_packed_linear [HIDDEN=768] [LAYERS=12] [VOCAB=32000]
//        [ROWS=1,4,16,64,256] [ROUNDS=7] [PRODUCTS=all]; threads: LibTorch's
//        (OMP_NUM_THREADS). PRODUCTS times only some of the step's products
//        (the bound and the rates then count their weights alone): all,
//        attention (q, k, v, o), up (H -> 4H), down (4H -> H) or head.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "kolos/core/packed_linear.h"
#include "kolos/kernels/activation.h"
#include "kolos/kernels/isa.h"

using kolos::PackedLinear;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  auto arg = [&](int i, int64_t fallback) { return argc > i ? std::atoll(argv[i]) : fallback; };
  const int64_t hidden = arg(1, 768), layers = arg(2, 12), vocab = arg(3, 32000);
  std::vector<int64_t> row_counts;
  {
    std::stringstream list(argc > 4 ? argv[4] : "1,4,16,64,256");
    for (std::string item; std::getline(list, item, ',');) row_counts.push_back(std::stoll(item));
  }
  const int rounds = static_cast<int>(arg(5, 7));
  const std::string products = argc > 6 ? argv[6] : "all";
  if (products != "all" && products != "attention" && products != "up" && products != "down" &&
      products != "head") {
    std::fprintf(stderr,
                 "bench_packed_linear: PRODUCTS must be all, attention, up, down or head, "
                 "got \"%s\"\n",
                 products.c_str());
    return 2;
  }
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  struct Layer {
    at::Tensor weight, bias;
    PackedLinear panels, onednn;
  };
  std::vector<Layer> stack;
  auto add = [&](int64_t out, int64_t in, bool bias, const char* kind) {
    if (products != "all" && products != kind) return;
    Layer l;
    l.weight = torch::randn({out, in}) * 0.02;
    if (bias) l.bias = torch::randn({out}) * 0.02;
    if (PackedLinear::available(PackedLinear::Kernel::kPanels))
      l.panels = PackedLinear(l.weight, PackedLinear::Kernel::kPanels);
    if (PackedLinear::available(PackedLinear::Kernel::kOneDnn))
      l.onednn = PackedLinear(l.weight, PackedLinear::Kernel::kOneDnn);
    stack.push_back(std::move(l));
  };
  for (int64_t i = 0; i < layers; ++i) {
    for (int j = 0; j < 4; ++j) add(hidden, hidden, true, "attention");
    add(4 * hidden, hidden, true, "up");
    add(hidden, 4 * hidden, true, "down");
  }
  add(vocab, hidden, false, "head");
  if (stack.empty()) {
    std::fprintf(stderr, "bench_packed_linear: no %s products with %lld layers\n", products.c_str(),
                 static_cast<long long>(layers));
    return 2;
  }
  double weight_bytes = 0;
  for (const Layer& l : stack) weight_bytes += 4.0 * l.weight.numel();

  // Read bandwidth: the best of 5 sums over 1 GiB.
  const at::Tensor big = torch::ones({int64_t{1} << 28});
  double best_read = 1e30;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    (void)big.sum().item<float>();
    best_read = std::min(best_read, seconds_since(t0));
  }
  const double bandwidth = 4.0 * big.numel() / best_read;

  std::printf(
      "products of one step (%s): %lld linear layers of a GPT-2 (hidden %lld, %lld layers, "
      "vocab %lld), %.0f MiB of fp32 weights; %d threads, CPU kernels %s\n",
      products.c_str(), static_cast<long long>(stack.size()), static_cast<long long>(hidden),
      static_cast<long long>(layers), static_cast<long long>(vocab), weight_bytes / (1 << 20),
      at::get_num_threads(), kolos::kernels::isa_name(kolos::kernels::active_isa()));
  std::printf(
      "read bandwidth %.1f GB/s (LibTorch sum over 1 GiB): a step reads its weights in "
      "at least %.2f ms\n\n",
      bandwidth / 1e9, 1e3 * weight_bytes / bandwidth);
  std::printf(
      "| rows | panels (ms) | oneDNN (ms) | plain (ms) | panels / oneDNN | panels at the "
      "bound | GFLOP/s (panels) |\n|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const int64_t rows : row_counts) {
    const at::Tensor x_h = torch::randn({rows, hidden}), x_4h = torch::randn({rows, 4 * hidden});
    auto input = [&](const Layer& l) { return l.weight.size(1) == hidden ? x_h : x_4h; };
    enum { kPanels, kOneDnn, kPlain, kKinds };
    std::vector<std::vector<double>> times(kKinds);
    auto pass = [&](int kind) {
      const auto t0 = std::chrono::steady_clock::now();
      for (const Layer& l : stack) {
        if (kind == kPanels) (void)l.panels(input(l), l.bias);
        if (kind == kOneDnn) (void)l.onednn(input(l), l.bias);
        if (kind == kPlain) (void)at::linear(input(l), l.weight, l.bias);
      }
      return seconds_since(t0);
    };
    for (int round = -1; round < rounds; ++round) {  // round -1: warm-up
      for (int kind = 0; kind < kKinds; ++kind) {
        if (kind == kPanels && !stack[0].panels.defined()) continue;
        if (kind == kOneDnn && !stack[0].onednn.defined()) continue;
        const double t = pass(kind);
        if (round >= 0) times[kind].push_back(t);
      }
    }
    auto ms = [&](int kind) { return times[kind].empty() ? -1.0 : 1e3 * median(times[kind]); };
    const double panels = ms(kPanels), onednn = ms(kOneDnn), plain = ms(kPlain);
    const double flops = 2.0 * rows * weight_bytes / 4;
    std::printf("| %lld | %.2f | %.2f | %.2f | %.2f | %.0f%% | %.0f |\n",
                static_cast<long long>(rows), panels, onednn, plain,
                panels > 0 && onednn > 0 ? panels / onednn : 0.0,
                panels > 0 ? 100.0 * (1e3 * weight_bytes / bandwidth) / panels : 0.0,
                panels > 0 ? flops / (panels * 1e-3) / 1e9 : 0.0);
  }
  std::printf(
      "\nmedians of %d interleaved rounds; panels at the bound: the bound's time over "
      "the panels' (100%%: reading the weights once at the measured bandwidth)\n",
      rounds);

  // The MLP's activation of the same step: GELU's tanh form over
  // rows x 4 hidden, every layer, kolos's kernel (in place, as the engine
  // runs it) against LibTorch's torch::gelu(x, "tanh"), interleaved.
  std::printf(
      "\nGELU (tanh form) over the %lld layers' rows x %lld activations, kolos "
      "(kolos/kernels/activation.h) against torch::gelu:\n\n"
      "| rows | kolos (ms) | torch (ms) | kolos / torch |\n|---:|---:|---:|---:|\n",
      static_cast<long long>(layers), static_cast<long long>(4 * hidden));
  for (const int64_t rows : row_counts) {
    const at::Tensor x = torch::randn({rows, 4 * hidden});
    at::Tensor y = torch::empty_like(x);
    std::vector<double> ours, theirs;
    for (int round = -1; round < rounds; ++round) {
      auto t0 = std::chrono::steady_clock::now();
      for (int64_t l = 0; l < layers; ++l) {
        y.copy_(x);  // both sides copy once: ours works in place
        kolos::kernels::gelu_tanh(y.data_ptr<float>(), y.data_ptr<float>(), y.numel(),
                                  at::get_num_threads());
      }
      const double a = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
      for (int64_t l = 0; l < layers; ++l) {
        y.copy_(x);
        (void)torch::gelu(y, "tanh");
      }
      const double b = seconds_since(t0);
      if (round >= 0) ours.push_back(a), theirs.push_back(b);
    }
    std::printf("| %lld | %.3f | %.3f | %.2f |\n", static_cast<long long>(rows), 1e3 * median(ours),
                1e3 * median(theirs), median(ours) / median(theirs));
  }
  return 0;
}
