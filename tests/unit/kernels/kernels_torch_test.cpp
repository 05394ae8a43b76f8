// The CPU kernels against LibTorch: the fused AdamW kernel against
// torch::optim::AdamW on the same buffers (every ISA level), kolos::AdamW
// fused against its LibTorch-ops path, bf16 conversion against
// Tensor::to(kBFloat16).
//
// ULP bound: 0. ATen's AVX2 and AVX-512 kernels compute AdamW's moments with
// fused multiply-adds, as ours do, so on those CPUs the results are the same
// bits. ATen's "default" kernels (ATEN_CPU_CAPABILITY=default, or a CPU
// without AVX2) round twice: there the bound is 1 ulp per step on the
// moments, which the test allows as 1e-6 * max(|p|, 1) after its 10 steps
// (p near zero loses its relative precision to cancellation), and
// kolos::AdamW does not use the kernel (it probes LibTorch once). The same
// bound holds where LibTorch's sqrt is not correctly rounded: the PyPI
// wheels (LibTorch 2.x, built with MKL) take large float tensors through
// MKL's vsSqrt, 1 ulp off on about 0.7% of inputs; the kernel's sqrt is
// exact, so AdamW's denominators differ now and then by an ulp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "kolos/core/optimizer.h"
#include "kolos/kernels/adamw.h"
#include "kolos/kernels/convert.h"
#include "kolos/kernels/isa.h"

namespace kolos::kernels {
namespace {

bool aten_default_kernels() {
  const char* cap = std::getenv("ATEN_CPU_CAPABILITY");
  return (cap != nullptr && std::string(cap) == "default") || detected_isa() == Isa::kScalar;
}

// Whether LibTorch's sqrt of a large float tensor is correctly rounded.
bool libtorch_sqrt_exact() {
  torch::manual_seed(3);
  at::Tensor x = torch::rand({100000});
  at::Tensor r = x.sqrt();
  const float* in = x.data_ptr<float>();
  const float* out = r.data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (std::sqrt(in[i]) != out[i]) return false;
  }
  return true;
}

// 0: the same bits; else the bound of the comment above.
double adamw_rtol() {
  static const double rtol = aten_default_kernels() || !libtorch_sqrt_exact() ? 1e-6 : 0;
  return rtol;
}

// Same bits (NaN == NaN), or within rtol when ATen's default kernels run.
::testing::AssertionResult close(const at::Tensor& a, const at::Tensor& b, double rtol) {
  const float* x = a.data_ptr<float>();
  const float* y = b.data_ptr<float>();
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::isnan(x[i]) && std::isnan(y[i])) continue;
    if (std::memcmp(&x[i], &y[i], 4) == 0) continue;
    if (rtol > 0 && std::abs(x[i] - y[i]) <= rtol * std::max(1.0f, std::abs(y[i]))) continue;
    return ::testing::AssertionFailure() << "element " << i << " of " << a.numel() << ": " << x[i]
                                         << " vs " << y[i];
  }
  return ::testing::AssertionSuccess();
}

class TorchIsaTest : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = active_isa(); }
  void TearDown() override { force_isa(saved_); }
  Isa saved_ = Isa::kScalar;
};

TEST_F(TorchIsaTest, FusedAdamWMatchesTorchOptimAdamW) {
  const double rtol = adamw_rtol();
  for (int i = 0; i <= static_cast<int>(detected_isa()); ++i) {
    const Isa isa = static_cast<Isa>(i);
    force_isa(isa);
    for (int64_t n : {0, 1, 15, 17, 1000, 100003}) {
      for (double wd : {0.0, 0.1}) {
        torch::manual_seed(n + 1);
        at::Tensor ours = torch::randn({n});
        at::Tensor theirs = ours.clone().requires_grad_(true);
        at::Tensor m = torch::zeros({n}), v = torch::zeros({n});
        torch::optim::AdamW opt({theirs}, torch::optim::AdamWOptions(1e-2)
                                              .betas({0.9, 0.95})
                                              .eps(1e-8)
                                              .weight_decay(wd));
        AdamWConfig cfg;
        cfg.lr = 1e-2;
        cfg.beta1 = 0.9;
        cfg.beta2 = 0.95;
        cfg.eps = 1e-8;
        cfg.weight_decay = wd;
        for (int step = 1; step <= 10; ++step) {
          at::Tensor g = torch::randn({n});
          if (n > 4 && step == 3) {
            g[2] = std::numeric_limits<float>::quiet_NaN();
            g[n - 1] = std::numeric_limits<float>::infinity();
          }
          theirs.mutable_grad() = g.clone();
          opt.step();
          cfg.step = step;
          adamw_step_fp32(ours.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(),
                          v.data_ptr<float>(), n, cfg, 2);
          ASSERT_TRUE(close(ours, theirs.detach(), rtol))
              << isa_name(isa) << " n=" << n << " wd=" << wd << " step " << step;
        }
      }
    }
  }
}

TEST_F(TorchIsaTest, KolosAdamWFusedEqualsItsLibTorchPath) {
  const double rtol = adamw_rtol();
  for (int i = 0; i <= static_cast<int>(detected_isa()); ++i) {
    force_isa(static_cast<Isa>(i));
    torch::manual_seed(4);
    AdamWSettings fused_s{1e-2, 0.9, 0.95, 1e-8, 0.1};
    AdamWSettings plain_s = fused_s;
    plain_s.fused = false;
    ASSERT_TRUE(fused_s.fused) << "fused is the default";
    at::Tensor a = torch::randn({37, 5}), b = a.clone();
    at::Tensor odd = torch::randn({3, 4}).t();  // not contiguous: LibTorch path either way
    at::Tensor odd2 = odd.clone().t().contiguous().t();
    at::Tensor ga = torch::zeros_like(a), gb = torch::zeros_like(b);
    at::Tensor go = torch::zeros_like(odd), go2 = torch::zeros_like(odd2);
    AdamW fused(fused_s), plain(plain_s);
    fused.add("w", a, ga, Placement::replicated({37, 5}));
    fused.add("odd", odd, go, Placement::replicated({4, 3}));
    plain.add("w", b, gb, Placement::replicated({37, 5}));
    plain.add("odd", odd2, go2, Placement::replicated({4, 3}));
    for (int step = 0; step < 10; ++step) {
      at::Tensor g = torch::randn({37, 5});
      ga.copy_(g);
      gb.copy_(g);
      at::Tensor h = torch::randn({4, 3});
      go.copy_(h);
      go2.copy_(h);
      const double lr = 1e-2 * (step + 1) / 10;  // a schedule: lr changes per step
      fused.step(lr);
      plain.step(lr);
      ASSERT_TRUE(close(a, b, rtol)) << isa_name(static_cast<Isa>(i)) << " step " << step;
      ASSERT_TRUE(close(fused.slots()[0].exp_avg_sq, plain.slots()[0].exp_avg_sq, rtol));
      ASSERT_TRUE(torch::equal(odd, odd2));
    }
  }
}

TEST(Convert, Bf16MatchesLibTorchExceptForSubnormals) {
  torch::manual_seed(2);
  at::Tensor x = torch::cat({torch::randn({100003}) * 1e3, torch::randn({1000}) * 1e-30,
                             torch::tensor({0.f, -0.f, 1e-40f, -1e-40f, 3.4e38f})});
  at::Tensor want = x.to(torch::kBFloat16);
  std::vector<uint16_t> got(x.numel());
  fp32_to_bf16(x.data_ptr<float>(), got.data(), x.numel());
  const auto* w = static_cast<const uint16_t*>(want.data_ptr());
  const float* src = x.data_ptr<float>();
  int64_t subnormals = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (std::fpclassify(src[i]) == FP_SUBNORMAL) {
      ++subnormals;
      EXPECT_EQ(got[i], std::signbit(src[i]) ? 0x8000 : 0x0000) << "subnormal " << src[i];
      continue;
    }
    ASSERT_EQ(got[i], w[i]) << "element " << i << " = " << src[i];
  }
  EXPECT_EQ(subnormals, 2);
  std::vector<float> back(x.numel());
  bf16_to_fp32(got.data(), back.data(), x.numel());
  EXPECT_TRUE(torch::equal(torch::from_blob(back.data(), {x.numel()}).narrow(0, 0, 100003),
                           want.to(torch::kFloat).narrow(0, 0, 100003)));
}

}  // namespace
}  // namespace kolos::kernels
