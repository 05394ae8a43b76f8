// Activation recomputation (kolos/core/recompute.h, Model::set_recompute):
// bit-equal gradients for "full" and "selective", random draws replayed, the
// blocks recompute_every chooses, and the activation memory "full" saves,
// measured with a counting CPU allocator; the attention core it recomputes
// (causal_attention) against a whole-mask reference, and what it keeps.
#include "kolos/core/recompute.h"

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>

#include "kolos/core/model.h"
#include "kolos/core/sequence.h"
#include "kolos/modules/gpt.h"

namespace kolos {
namespace {

ModelConfig gpt(int64_t layers) {
  ModelConfig c;
  c.layers = layers;
  c.hidden = 32;
  c.heads = 4;
  c.seq_len = 16;
  c.vocab = 64;
  return c;
}

struct Pass {
  at::Tensor loss;
  std::vector<std::pair<std::string, at::Tensor>> grads;
};

// One forward and backward of a freshly built model (same seed, same batch
// every time) with train.recompute = mode.
Pass one_pass(const ModelConfig& config, const std::string& mode, int64_t every) {
  auto factory = make_serial_layer_factory();
  torch::manual_seed(3);
  auto model = modules::build_gpt(config, *factory);
  model->set_recompute(mode, every);
  const at::Tensor tokens = torch::randint(config.vocab, {4, config.seq_len}, torch::kInt64);
  const at::Tensor targets = torch::randint(config.vocab, {4, config.seq_len}, torch::kInt64);
  Pass pass;
  // Two micro-batches, so that the second one's gradients add into .grad.
  for (int m = 0; m < 2; ++m) {
    at::Tensor loss = model->loss(model->forward(tokens.roll(m, 1)), targets.roll(m, 1));
    loss.backward();
    if (m == 0) pass.loss = loss.detach();
  }
  for (const auto& p : model->all_parameters()) pass.grads.emplace_back(p.name, p.tensor.grad());
  return pass;
}

void expect_bit_equal(const Pass& reference, const Pass& candidate, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_TRUE(torch::equal(reference.loss, candidate.loss));
  ASSERT_EQ(reference.grads.size(), candidate.grads.size());
  for (size_t i = 0; i < reference.grads.size(); ++i) {
    const auto& [name, g] = reference.grads[i];
    ASSERT_TRUE(g.defined()) << name;
    ASSERT_TRUE(candidate.grads[i].second.defined()) << name << " has no gradient";
    EXPECT_TRUE(torch::equal(g, candidate.grads[i].second))
        << name << ": max |diff| " << (g - candidate.grads[i].second).abs().max().item<double>();
  }
}

TEST(Recompute, FullAndSelectiveGradientsAreBitEqual) {
  const ModelConfig config = gpt(3);
  const Pass none = one_pass(config, "none", 1);
  expect_bit_equal(none, one_pass(config, "full", 1), "full");
  expect_bit_equal(none, one_pass(config, "selective", 1), "selective");
  expect_bit_equal(none, one_pass(config, "full", 2), "full, every 2nd block");
  expect_bit_equal(none, one_pass(config, "selective", 2), "selective, every 2nd block");
}

TEST(Recompute, EveryChoosesEveryKthRepeatedBlockFromTheFirst) {
  auto factory = make_serial_layer_factory();
  auto model = modules::build_gpt(gpt(5), *factory);  // embed, h.0 .. h.4, head
  auto chosen = [&] {
    std::string s;
    for (size_t b = 0; b < model->blocks().size(); ++b) s += model->recomputes(b) ? '1' : '0';
    return s;
  };
  EXPECT_EQ(chosen(), "0000000");
  model->set_recompute("full", 1);
  EXPECT_EQ(chosen(), "0111110");
  model->set_recompute("selective", 2);
  EXPECT_EQ(chosen(), "0101010");
  model->set_recompute("full", 3);
  EXPECT_EQ(chosen(), "0100100");
  model->set_recompute("full", 9);
  EXPECT_EQ(chosen(), "0100000");
  model->set_recompute("none", 1);
  EXPECT_EQ(chosen(), "0000000");
}

TEST(Recompute, RandomDrawsAreReplayedAndTheGeneratorLeftAsFound) {
  // A dropout-like function: kolos's blocks draw nothing today, but a block
  // that does must see the same draws when it is recomputed.
  torch::manual_seed(11);
  const at::Tensor w = torch::randn({8}).requires_grad_(true);
  RecomputeFn fn = [w](const std::vector<at::Tensor>& in) {
    const at::Tensor keep = (torch::rand_like(in[0]) > 0.3).to(in[0].scalar_type());
    return std::vector<at::Tensor>{(in[0] * w).tanh() * keep};
  };
  const at::Tensor x0 = torch::randn({4, 8});

  torch::manual_seed(5);
  at::Tensor x = x0.clone().requires_grad_(true);
  at::Tensor y = fn({x})[0];
  y.pow(2).sum().backward();
  const at::Tensor gx = x.grad().clone(), gw = w.grad().clone();
  w.mutable_grad().reset();

  torch::manual_seed(5);
  at::Tensor x2 = x0.clone().requires_grad_(true);
  at::Tensor y2 = recomputed(fn, {x2}, {w})[0];
  EXPECT_TRUE(torch::equal(y, y2));
  torch::rand({3});  // the generator moves on before backward
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  const at::Tensor before = generator.get_state();
  y2.pow(2).sum().backward();
  EXPECT_TRUE(torch::equal(generator.get_state(), before));
  EXPECT_TRUE(torch::equal(x2.grad(), gx));
  EXPECT_TRUE(torch::equal(w.grad(), gw));
}

TEST(Recompute, InputGradientAloneThenWeightGradientsAlone) {
  // The zero-bubble pipeline's split: autograd::grad of the input with the
  // graph kept, then backward restricted to the parameters. Each half
  // recomputes; the weight gradients must come out once.
  torch::manual_seed(2);
  const at::Tensor w = torch::randn({8, 8}).requires_grad_(true);
  RecomputeFn fn = [w](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{torch::gelu(torch::matmul(in[0], w))};
  };
  const at::Tensor x0 = torch::randn({4, 8});
  at::Tensor x = x0.clone().requires_grad_(true);
  fn({x})[0].sum().backward();
  const at::Tensor gx = x.grad().clone(), gw = w.grad().clone();
  w.mutable_grad().reset();

  at::Tensor x2 = x0.clone().requires_grad_(true);
  at::Tensor y = recomputed(fn, {x2}, {w})[0].sum();
  const at::Tensor gx2 = torch::autograd::grad({y}, {x2}, {}, /*retain_graph=*/true)[0];
  EXPECT_FALSE(w.grad().defined());
  torch::autograd::backward({y}, {}, /*retain_graph=*/false, /*create_graph=*/false, {w});
  EXPECT_FALSE(x2.grad().defined());
  EXPECT_TRUE(torch::equal(gx2, gx));
  EXPECT_TRUE(torch::equal(w.grad(), gw));
}

// ---- memory -------------------------------------------------------------------

// Live and peak bytes of every CPU tensor allocation, counted by wrapping
// LibTorch's CPU allocator.
std::atomic<int64_t> live_bytes{0}, peak_bytes{0};

struct Counted {
  c10::DataPtr inner;
  int64_t bytes;
};

void release_counted(void* context) {
  auto* counted = static_cast<Counted*>(context);
  live_bytes -= counted->bytes;
  delete counted;
}

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
#if TORCH_VERSION_MAJOR >= 2
  c10::DataPtr allocate(size_t n) override { return counted(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t n) const override { return counted(n); }
#endif

 private:
  c10::DataPtr counted(size_t n) const {
    auto* context = new Counted{base_->allocate(n), static_cast<int64_t>(n)};
    const int64_t now = live_bytes += context->bytes;
    int64_t peak = peak_bytes.load();
    while (now > peak && !peak_bytes.compare_exchange_weak(peak, now)) {
    }
    return c10::DataPtr(context->inner.get(), context, &release_counted, context->inner.device());
  }
  c10::Allocator* base_;
};

struct Activations {
  int64_t after_forward = 0;  // bytes held when the forward has returned
  int64_t peak = 0;           // the most held at once, forward and backward
};

// One forward and backward of a 12-layer GPT, measured above what is held
// before it (parameters, their gradients from a first pass, the batch).
Activations measure(const std::string& mode) {
  ModelConfig c;
  c.layers = 12;
  c.hidden = 64;
  c.heads = 4;
  c.seq_len = 64;
  c.vocab = 64;
  auto factory = make_serial_layer_factory();
  torch::manual_seed(3);
  auto model = modules::build_gpt(c, *factory);
  model->set_recompute(mode, 1);
  const at::Tensor tokens = torch::randint(c.vocab, {8, c.seq_len}, torch::kInt64);
  const at::Tensor targets = torch::randint(c.vocab, {8, c.seq_len}, torch::kInt64);
  model->loss(model->forward(tokens), targets).backward();  // allocates .grad

  c10::Allocator* base = c10::GetCPUAllocator();
  CountingAllocator counting(base);
  c10::SetCPUAllocator(&counting, /*priority=*/UINT8_MAX);
  Activations a;
  const int64_t start = live_bytes.load();
  peak_bytes = start;
  {
    at::Tensor loss = model->loss(model->forward(tokens), targets);
    a.after_forward = live_bytes.load() - start;
    loss.backward();
  }
  a.peak = peak_bytes.load() - start;
  c10::SetCPUAllocator(base, /*priority=*/UINT8_MAX);
  return a;
}

TEST(RecomputeMemory, FullHoldsAtMostAThirdOfTheActivations) {
  const Activations none = measure("none");
  const Activations full = measure("full");
  const Activations selective = measure("selective");
  auto mib = [](int64_t b) { return static_cast<double>(b) / (1 << 20); };
  std::cout << "12-layer GPT (hidden 64, 4 heads, seq 64, vocab 64), micro-batch 8, measured "
               "with a counting CPU allocator, above parameters and gradients:\n";
  for (const auto& [name, a] : {std::pair<const char*, Activations>{"none", none},
                                {"full", full},
                                {"selective", selective}}) {
    std::cout << "  recompute = " << name << ": held after forward " << mib(a.after_forward)
              << " MiB, peak over forward and backward " << mib(a.peak) << " MiB\n";
  }
  std::cout << "  full / none: peak " << static_cast<double>(full.peak) / none.peak
            << ", after forward " << static_cast<double>(full.after_forward) / none.after_forward
            << std::endl;
  ASSERT_GT(none.peak, 0);
  EXPECT_LE(3 * full.peak, none.peak);
  EXPECT_LE(3 * full.after_forward, none.after_forward);
  EXPECT_LT(selective.peak, none.peak);
  EXPECT_LT(full.peak, selective.peak);
}

// ---- the attention core ------------------------------------------------------

struct Attended {
  at::Tensor out, dq, dk, dv;
  int64_t after_forward = 0;  // bytes held when the forward has returned
};

at::Tensor whole_mask_attention(const std::vector<at::Tensor>& qkv) {
  const int64_t seq = qkv[0].size(2);
  at::Tensor scores =
      torch::matmul(qkv[0], qkv[1].transpose(-2, -1)) / std::sqrt(double(qkv[0].size(3)));
  scores = scores.masked_fill(torch::ones({seq, seq}, torch::kBool).triu(1),
                              -std::numeric_limits<float>::infinity());
  return torch::matmul(torch::softmax(scores, -1), qkv[2]);
}

// `attend` on [2, 3, seq, 8] q, k, v, forward and backward, counting what
// the forward leaves held (its output and what autograd keeps).
template <typename Attend>
Attended attend_counted(Attend attend, int64_t seq) {
  torch::manual_seed(5);
  std::vector<at::Tensor> qkv;
  for (int i = 0; i < 3; ++i) qkv.push_back(torch::randn({2, 3, seq, 8}).requires_grad_(true));
  const at::Tensor grad_out = torch::randn({2, 3, seq, 8});
  c10::Allocator* base = c10::GetCPUAllocator();
  CountingAllocator counting(base);
  c10::SetCPUAllocator(&counting, /*priority=*/UINT8_MAX);
  Attended a;
  const int64_t start = live_bytes.load();
  a.out = attend(qkv);
  a.after_forward = live_bytes.load() - start;
  a.out.backward(grad_out);
  c10::SetCPUAllocator(base, /*priority=*/UINT8_MAX);
  a.dq = qkv[0].grad(), a.dk = qkv[1].grad(), a.dv = qkv[2].grad();
  return a;
}

// The causal mask applied a band of rows at a time (a length of two whole
// bands and a part) gives bit for bit what a whole [T, T] mask gives, in
// forward and backward, and keeps no [T, T] mask for backward.
TEST(CausalAttention, BitEqualToAWholeMaskAndKeepsNoMask) {
  const int64_t seq = 600;
  const Attended banded = attend_counted(&causal_attention, seq);
  const Attended whole = attend_counted(&whole_mask_attention, seq);
  EXPECT_TRUE(torch::equal(banded.out, whole.out));
  EXPECT_TRUE(torch::equal(banded.dq, whole.dq));
  EXPECT_TRUE(torch::equal(banded.dk, whole.dk));
  EXPECT_TRUE(torch::equal(banded.dv, whole.dv));
  std::cout << "held after forward, seq " << seq << ": banded " << banded.after_forward
            << " B, whole mask " << whole.after_forward << " B" << std::endl;
  // The whole mask is seq * seq bool bytes; both keep the probabilities.
  EXPECT_LE(banded.after_forward + seq * seq, whole.after_forward);
  EXPECT_GE(banded.after_forward, 2 * 3 * seq * seq * 4);
}

}  // namespace
}  // namespace kolos
