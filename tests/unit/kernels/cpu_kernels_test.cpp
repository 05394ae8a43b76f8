// The CPU kernels (kolos/kernels) on every ISA level the CPU has, against the
// plain C++ reference: bit-identical (0 ulp) on sizes around the vector
// widths, zero-size buffers, NaN/Inf gradients, all dtype combinations and
// thread counts. Torch-free (see kernels_torch_test.cpp for LibTorch).
//
// Run with KOLOS_CPU_ISA=<level> (CTest does, once per level): the default
// level must follow it; a level the CPU lacks is skipped, by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kolos/kernels/activation.h"
#include "kolos/kernels/adamw.h"
#include "kolos/kernels/convert.h"
#include "kolos/kernels/grad_norm.h"
#include "kolos/kernels/isa.h"
#include "kolos/kernels/linear.h"

namespace kolos::kernels {
namespace {

const int64_t kSizes[] = {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1000, (1 << 15) + 5, 100003};

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (int i = 0; i <= static_cast<int>(detected_isa()); ++i) out.push_back(static_cast<Isa>(i));
  return out;
}

// Restores the level the environment chose after a test that forces others.
class IsaTest : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = active_isa(); }
  void TearDown() override { force_isa(saved_); }
  Isa saved_ = Isa::kScalar;
};

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// Equal bits, or both NaN (NaN payloads may differ between LibTorch ops;
// ours are compared bit-exactly where it matters, in the conversions).
::testing::AssertionResult same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (bits(a[i]) != bits(b[i]))
      return ::testing::AssertionFailure()
             << "element " << i << " of " << a.size() << ": " << a[i] << " vs " << b[i]
             << " (bits " << std::hex << bits(a[i]) << " vs " << bits(b[i]) << ")";
  }
  return ::testing::AssertionSuccess();
}

std::vector<float> randn(int64_t n, std::mt19937& rng, float scale = 1.f) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(Isa, EnvironmentChoosesTheLevel) {
  const char* env = std::getenv("KOLOS_CPU_ISA");
  if (env == nullptr || *env == '\0') {
    EXPECT_EQ(active_isa(), detected_isa());
    return;
  }
  const Isa requested = parse_isa(env);
  if (static_cast<int>(requested) > static_cast<int>(detected_isa()))
    GTEST_SKIP() << "KOLOS_CPU_ISA=" << env << " but this CPU supports at most "
                 << isa_name(detected_isa());
  EXPECT_EQ(active_isa(), requested);
}

TEST(Isa, NamesRoundTripAndUnknownNamesAreRefused) {
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(parse_isa(isa_name(static_cast<Isa>(i))), static_cast<Isa>(i));
  try {
    parse_isa("sse9");
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("valid: scalar, avx2, avx512, avx512_bf16"),
              std::string::npos)
        << e.what();
  }
  if (detected_isa() != Isa::kAvx512Bf16)
    EXPECT_THROW(force_isa(Isa::kAvx512Bf16), std::invalid_argument);
}

// ---- conversions ------------------------------------------------------------

std::vector<float> interesting_floats() {
  std::vector<float> v = {0.f, -0.f, 1.f, -1.f, 1.00390625f, 1.01171875f, 65504.f, 65520.f,
                          65519.99f, 1e-8f, 5.96e-8f, 2.98e-8f, 6.1e-5f, 3.4e38f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::denorm_min(), -1e-40f,
                          std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::max(),
                          from_bits(0x7FC00000u), from_bits(0xFFC00001u),
                          from_bits(0x7F800001u),  // signalling NaN
                          from_bits(0x7FFFFFFFu), from_bits(0x3F808000u),  // tie, even
                          from_bits(0x3F818000u),                          // tie, odd
                          from_bits(0x7F7F8000u)};  // rounds to inf in bf16
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 200000; ++i) v.push_back(from_bits(any(rng)));
  return v;
}

TEST_F(IsaTest, Fp32ToHalfTypesIsBitIdenticalOnEveryLevel) {
  const std::vector<float> src = interesting_floats();
  const int64_t n = static_cast<int64_t>(src.size());
  std::vector<uint16_t> want_bf(n), want_h(n);
  for (int64_t i = 0; i < n; ++i) {
    want_bf[i] = bf16_from_float(src[i]);
    want_h[i] = fp16_from_float(src[i]);
  }
  for (Isa isa : supported_isas()) {
    force_isa(isa);
    for (int64_t len : {n, int64_t{0}, int64_t{1}, int64_t{13}, int64_t{40}}) {
      std::vector<uint16_t> bf(len + 1, 0xABCD), h(len + 1, 0xABCD);
      fp32_to_bf16(src.data(), bf.data(), len, 3);
      fp32_to_fp16(src.data(), h.data(), len, 3);
      for (int64_t i = 0; i < len; ++i) {
        ASSERT_EQ(bf[i], want_bf[i]) << isa_name(isa) << " bf16 of bits " << std::hex
                                     << bits(src[i]);
        ASSERT_EQ(h[i], want_h[i]) << isa_name(isa) << " fp16 of bits " << std::hex
                                   << bits(src[i]);
      }
      EXPECT_EQ(bf[len], 0xABCD) << "wrote past the end";
      EXPECT_EQ(h[len], 0xABCD) << "wrote past the end";
    }
  }
}

TEST(Convert, ElementRulesAreTheDocumentedOnes) {
  EXPECT_EQ(bf16_from_float(1.f), 0x3F80);
  EXPECT_EQ(bf16_from_float(from_bits(0x3F808000u)), 0x3F80);  // tie to even
  EXPECT_EQ(bf16_from_float(from_bits(0x3F818000u)), 0x3F82);
  EXPECT_EQ(bf16_from_float(from_bits(0x3F808001u)), 0x3F81);
  EXPECT_EQ(bf16_from_float(from_bits(0x7F7F8000u)), 0x7F80);  // overflow to inf
  EXPECT_EQ(bf16_from_float(-1e-40f), 0x8000);                  // subnormal to -0
  EXPECT_EQ(bf16_from_float(from_bits(0x7F800001u)), 0x7FC0);   // sNaN quieted
  EXPECT_EQ(fp16_from_float(65504.f), 0x7BFF);
  EXPECT_EQ(fp16_from_float(65520.f), 0x7C00);  // rounds to inf
  EXPECT_EQ(fp16_from_float(from_bits(0x33000000u)), 0x0000);  // 2^-25: tie to even (0)
  EXPECT_EQ(fp16_from_float(from_bits(0x33000001u)), 0x0001);
  EXPECT_EQ(fp16_from_float(-5.9604645e-8f), 0x8001);  // smallest subnormal
  EXPECT_EQ(float_from_fp16(0x0001), 5.9604645e-8f);
  EXPECT_EQ(float_from_fp16(0x3C00), 1.f);
  EXPECT_TRUE(std::isnan(float_from_fp16(0x7C01)));
  EXPECT_EQ(float_from_bf16(0x3F80), 1.f);
}

TEST_F(IsaTest, HalfTypesToFp32IsExactForAll65536Patterns) {
  std::vector<uint16_t> all(65536);
  for (int i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> want_bf(65536), want_h(65536);
  for (int i = 0; i < 65536; ++i) {
    want_bf[i] = float_from_bf16(all[i]);
    want_h[i] = float_from_fp16(all[i]);
    if (!std::isnan(want_h[i])) {
      ASSERT_EQ(fp16_from_float(want_h[i]), all[i]) << "fp16 round trip of " << i;
    }
    if (!std::isnan(want_bf[i]) && (i & 0x7F80) != 0) {
      ASSERT_EQ(bf16_from_float(want_bf[i]), all[i]) << "bf16 round trip of " << i;
    }
  }
  for (Isa isa : supported_isas()) {
    force_isa(isa);
    std::vector<float> bf(65536), h(65536);
    bf16_to_fp32(all.data(), bf.data(), 65536, 2);
    fp16_to_fp32(all.data(), h.data(), 65536, 2);
    for (int i = 0; i < 65536; ++i) {
      ASSERT_EQ(bits(bf[i]), bits(want_bf[i])) << isa_name(isa) << " bf16 " << i;
      ASSERT_EQ(bits(h[i]), bits(want_h[i])) << isa_name(isa) << " fp16 " << i;
    }
    // bf16 <-> fp16 through fp32, and same-dtype copies.
    std::vector<uint16_t> out(65536);
    convert(all.data(), DType::kBFloat16, out.data(), DType::kFloat16, 65536);
    for (int i = 0; i < 65536; ++i)
      ASSERT_EQ(out[i], fp16_from_float(want_bf[i])) << isa_name(isa) << " bf16->fp16 " << i;
    convert(all.data(), DType::kFloat16, out.data(), DType::kFloat16, 65536);
    EXPECT_EQ(out, all);
  }
}

// ---- AdamW ------------------------------------------------------------------

struct AdamWCase {
  DType grad_dtype;
  bool copy;
  DType copy_dtype;
};

// Runs `steps` AdamW steps of n elements with the kernels (on the active
// level, `threads` threads) and with adamw_reference; returns false on the
// first difference.
void check_adamw(int64_t n, const AdamWCase& c, int threads, const std::string& where) {
  std::mt19937 rng(static_cast<unsigned>(n) * 31 + static_cast<unsigned>(c.grad_dtype));
  std::vector<float> p = randn(n, rng), m(n, 0.f), v(n, 0.f);
  std::vector<float> p_ref = p, m_ref = m, v_ref = v;
  std::vector<uint16_t> copy(n + 1, 0), copy_ref(n + 1, 0);
  std::vector<float> copy32(n + 1, 0.f), copy32_ref(n + 1, 0.f);
  AdamWConfig cfg;
  cfg.lr = 1e-2;
  cfg.beta1 = 0.9;
  cfg.beta2 = 0.95;
  cfg.eps = 1e-8;
  cfg.weight_decay = 0.1;
  for (int step = 1; step <= 4; ++step) {
    cfg.step = step;
    cfg.grad_scale = step == 3 ? 0.5 : 1.0;
    std::vector<float> g = randn(n, rng, step == 2 ? 1e-3f : 1.f);
    if (n > 5 && step == 2) {  // NaN and Inf gradients propagate element-wise
      g[1] = std::numeric_limits<float>::quiet_NaN();
      g[n - 2] = std::numeric_limits<float>::infinity();
      g[n / 2] = -std::numeric_limits<float>::infinity();
    }
    std::vector<uint16_t> g16(n);
    if (c.grad_dtype == DType::kBFloat16)
      for (int64_t i = 0; i < n; ++i) g16[i] = bf16_from_float(g[i]);
    if (c.grad_dtype == DType::kFloat16)
      for (int64_t i = 0; i < n; ++i) g16[i] = fp16_from_float(g[i]);
    const void* grad = c.grad_dtype == DType::kFloat32 ? static_cast<const void*>(g.data())
                                                       : static_cast<const void*>(g16.data());
    AdamWBuffer b;
    b.param = p.data();
    b.grad = grad;
    b.exp_avg = m.data();
    b.exp_avg_sq = v.data();
    b.numel = n;
    b.grad_dtype = c.grad_dtype;
    if (c.copy) {
      b.param_copy = c.copy_dtype == DType::kFloat32 ? static_cast<void*>(copy32.data())
                                                     : static_cast<void*>(copy.data());
      b.copy_dtype = c.copy_dtype;
    }
    AdamWBuffer r = b;
    r.param = p_ref.data();
    r.exp_avg = m_ref.data();
    r.exp_avg_sq = v_ref.data();
    if (c.copy)
      r.param_copy = c.copy_dtype == DType::kFloat32 ? static_cast<void*>(copy32_ref.data())
                                                     : static_cast<void*>(copy_ref.data());
    adamw_step(&b, 1, cfg, threads);
    adamw_reference(r, cfg);
    ASSERT_TRUE(same_floats(p, p_ref)) << where << " param, step " << step;
    ASSERT_TRUE(same_floats(m, m_ref)) << where << " exp_avg, step " << step;
    ASSERT_TRUE(same_floats(v, v_ref)) << where << " exp_avg_sq, step " << step;
    ASSERT_EQ(copy, copy_ref) << where << " param copy, step " << step;
    ASSERT_TRUE(same_floats(copy32, copy32_ref)) << where << " fp32 param copy, step " << step;
    ASSERT_EQ(copy[n], 0) << where << " wrote past the copy's end";
  }
  if (n > 5) {
    EXPECT_TRUE(std::isnan(p[1])) << where << " NaN gradient must poison its element";
    EXPECT_FALSE(std::isnan(p[0])) << where << " ... and only its element";
  }
}

TEST_F(IsaTest, AdamWMatchesTheReferenceBitForBitOnEveryLevel) {
  const AdamWCase cases[] = {{DType::kFloat32, false, DType::kFloat32},
                             {DType::kFloat32, true, DType::kBFloat16},
                             {DType::kFloat32, true, DType::kFloat16},
                             {DType::kFloat32, true, DType::kFloat32},
                             {DType::kBFloat16, true, DType::kBFloat16},
                             {DType::kFloat16, true, DType::kFloat16},
                             {DType::kBFloat16, false, DType::kFloat32}};
  for (Isa isa : supported_isas()) {
    force_isa(isa);
    for (int64_t n : kSizes)
      for (const AdamWCase& c : cases)
        for (int threads : {1, 3}) {
          check_adamw(n, c, threads,
                      std::string(isa_name(isa)) + " n=" + std::to_string(n) + " grad " +
                          dtype_name(c.grad_dtype) + " copy " +
                          (c.copy ? dtype_name(c.copy_dtype) : "none") +
                          " threads=" + std::to_string(threads));
          if (HasFatalFailure()) return;
        }
  }
}

TEST(AdamW, ManyBuffersInOneCallEqualOneCallEach) {
  std::mt19937 rng(11);
  const int64_t sizes[] = {0, 3, 70000, 17, 40000};
  std::vector<std::vector<float>> p, g, m, v;
  for (int64_t n : sizes) {
    p.push_back(randn(n, rng));
    g.push_back(randn(n, rng));
    m.push_back(std::vector<float>(n, 0.1f));
    v.push_back(std::vector<float>(n, 0.2f));
  }
  auto p2 = p, m2 = m, v2 = v;
  AdamWConfig cfg;
  cfg.step = 5;
  cfg.weight_decay = 0.01;
  std::vector<AdamWBuffer> bufs;
  for (size_t i = 0; i < p.size(); ++i) {
    AdamWBuffer b;
    b.param = p[i].data();
    b.grad = g[i].data();
    b.exp_avg = m[i].data();
    b.exp_avg_sq = v[i].data();
    b.numel = sizes[i];
    bufs.push_back(b);
  }
  adamw_step(bufs.data(), bufs.size(), cfg, 4);
  for (size_t i = 0; i < p.size(); ++i)
    adamw_step_fp32(p2[i].data(), g[i].data(), m2[i].data(), v2[i].data(), sizes[i], cfg, 1);
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_TRUE(same_floats(p[i], p2[i])) << "buffer " << i;
    EXPECT_TRUE(same_floats(m[i], m2[i])) << "buffer " << i;
    EXPECT_TRUE(same_floats(v[i], v2[i])) << "buffer " << i;
  }
}

TEST(AdamW, RejectsBadArguments) {
  float x = 0;
  AdamWConfig cfg;
  cfg.step = 0;
  EXPECT_THROW(adamw_step_fp32(&x, &x, &x, &x, 1, cfg), std::invalid_argument);
  cfg.step = 1;
  EXPECT_THROW(adamw_step_fp32(nullptr, &x, &x, &x, 1, cfg), std::invalid_argument);
  EXPECT_THROW(adamw_step_fp32(&x, &x, &x, &x, -1, cfg), std::invalid_argument);
  EXPECT_NO_THROW(adamw_step_fp32(nullptr, nullptr, nullptr, nullptr, 0, cfg));
  EXPECT_NO_THROW(adamw_step(nullptr, 0, cfg));
}

// ---- gradient norm ----------------------------------------------------------

TEST_F(IsaTest, GradNormIsTheSameBitsOnEveryLevelAndThreadCount) {
  std::mt19937 rng(5);
  std::vector<std::vector<float>> f32;
  std::vector<std::vector<uint16_t>> h16;
  std::vector<GradBuffer> bufs;
  long double exact = 0;
  for (int64_t n : kSizes) {
    f32.push_back(randn(n, rng, 3.f));
    for (float x : f32.back()) exact += static_cast<long double>(x) * x;
  }
  for (int64_t n : {int64_t{77}, int64_t{40001}}) {
    std::vector<float> x = randn(n, rng);
    std::vector<uint16_t> h(n);
    for (int64_t i = 0; i < n; ++i) {
      h[i] = bf16_from_float(x[i]);
      const long double d = float_from_bf16(h[i]);
      exact += d * d;
    }
    h16.push_back(std::move(h));
  }
  for (auto& x : f32)
    bufs.push_back(GradBuffer{x.data(), static_cast<int64_t>(x.size()), DType::kFloat32});
  for (auto& h : h16)
    bufs.push_back(GradBuffer{h.data(), static_cast<int64_t>(h.size()), DType::kBFloat16});

  force_isa(Isa::kScalar);
  const double want = sum_of_squares(bufs.data(), bufs.size(), 1);
  EXPECT_NEAR(want, static_cast<double>(exact), 1e-12 * static_cast<double>(exact));
  for (Isa isa : supported_isas()) {
    force_isa(isa);
    for (int threads : {1, 2, 5}) {
      const double got = sum_of_squares(bufs.data(), bufs.size(), threads);
      EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0)
          << isa_name(isa) << " threads " << threads << ": " << got << " vs " << want;
    }
  }
  f32[3][2] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(l2_norm(bufs.data(), bufs.size())));
  f32[3][2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(l2_norm(bufs.data(), bufs.size())));
  EXPECT_EQ(sum_of_squares(nullptr, 0), 0.0);
}

TEST_F(IsaTest, ScaleAndClipMatchElementwiseMultiplication) {
  for (Isa isa : supported_isas()) {
    force_isa(isa);
    std::mt19937 rng(9);
    for (int64_t n : kSizes) {
      std::vector<float> x = randn(n, rng), want(n);
      std::vector<uint16_t> h(n), want_h(n);
      for (int64_t i = 0; i < n; ++i) {
        want[i] = x[i] * 0.3f;
        h[i] = bf16_from_float(x[i]);
        want_h[i] = bf16_from_float(float_from_bf16(h[i]) * 0.3f);
      }
      GradBuffer bufs[] = {{x.data(), n, DType::kFloat32}, {h.data(), n, DType::kBFloat16}};
      scale(bufs, 2, 0.3f, 2);
      ASSERT_TRUE(same_floats(x, want)) << isa_name(isa) << " n=" << n;
      ASSERT_EQ(h, want_h) << isa_name(isa) << " n=" << n;
    }
    std::vector<float> g = {3.f, 4.f};  // norm 5
    GradBuffer b{g.data(), 2, DType::kFloat32};
    EXPECT_DOUBLE_EQ(clip_grad_norm(&b, 1, 1.0), 5.0);
    EXPECT_NEAR(g[0], 0.6f, 1e-6f);
    EXPECT_NEAR(g[1], 0.8f, 1e-6f);
    EXPECT_NEAR(clip_grad_norm(&b, 1, 10.0), 1.0, 1e-6);  // below max_norm: unchanged
    EXPECT_NEAR(g[1], 0.8f, 1e-6f);
  }
}

// ---- packed linear ----------------------------------------------------------

// y = x w^T + b by its definition: for each output, fma over k in order from
// the bias (the rule every level follows, linear.h).
std::vector<float> linear_reference(const std::vector<float>& x, int64_t rows,
                                    const std::vector<float>& w, const float* bias, int64_t out,
                                    int64_t in) {
  std::vector<float> y(rows * out);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t n = 0; n < out; ++n) {
      float acc = bias != nullptr ? bias[n] : 0.f;
      for (int64_t k = 0; k < in; ++k) acc = std::fma(x[r * in + k], w[n * in + k], acc);
      y[r * out + n] = acc;
    }
  return y;
}

TEST_F(IsaTest, PackedLinearIsItsDefinitionBitForBitOnEveryLevelAndThreadCount) {
  std::mt19937 rng(11);
  // Rows around the tiles (6, 12) and row blocks (48); outputs around the
  // panel (32) and its halves (8, 16); inputs past the prefetch distance
  // and around the blocks of inputs (256) the AVX2 tiles go through.
  for (int64_t rows : {0, 1, 5, 6, 7, 12, 13, 16, 25, 48, 49, 100}) {
    for (int64_t out : {1, 7, 8, 9, 16, 17, 31, 32, 33, 70}) {
      for (int64_t in : {1, 3, 16, 67, 200, 256, 257, 600}) {
        const std::vector<float> x = randn(rows * in, rng), w = randn(out * in, rng),
                                 b = randn(out, rng);
        std::vector<float> packed(packed_linear_size(out, in), -1.f);
        pack_linear(w.data(), out, in, packed.data());
        for (const bool with_bias : {true, false}) {
          const float* bias = with_bias ? b.data() : nullptr;
          const std::vector<float> want = linear_reference(x, rows, w, bias, out, in);
          for (Isa isa : supported_isas()) {
            force_isa(isa);
            for (int threads : {1, 3}) {
              std::vector<float> y(rows * out, -7.f);
              packed_linear(x.data(), rows, packed.data(), bias, out, in, y.data(), threads);
              ASSERT_TRUE(same_floats(y, want))
                  << isa_name(isa) << " threads " << threads << ": rows " << rows << ", out " << out
                  << ", in " << in << (with_bias ? ", bias" : ", no bias");
            }
          }
        }
      }
    }
  }
}

TEST(PackedLinear, LayoutIsPanelsOf32ZeroPadded) {
  // w[n, k] = 100 n + k, 40 x 3: two panels, the second with 8 live columns.
  std::vector<float> w(40 * 3);
  for (int n = 0; n < 40; ++n)
    for (int k = 0; k < 3; ++k) w[n * 3 + k] = static_cast<float>(100 * n + k);
  ASSERT_EQ(packed_linear_size(40, 3), 64 * 3);
  std::vector<float> packed(64 * 3, -1.f);
  pack_linear(w.data(), 40, 3, packed.data());
  for (int p = 0; p < 2; ++p)
    for (int k = 0; k < 3; ++k)
      for (int c = 0; c < 32; ++c) {
        const int n = 32 * p + c;
        EXPECT_EQ(packed[(p * 3 + k) * 32 + c], n < 40 ? 100.f * n + k : 0.f)
            << "panel " << p << " k " << k << " column " << c;
      }
}

TEST(PackedLinear, RejectsBadArguments) {
  std::vector<float> buf(64);
  EXPECT_THROW(packed_linear_size(0, 4), std::invalid_argument);
  EXPECT_THROW(packed_linear_size(4, -1), std::invalid_argument);
  EXPECT_THROW(pack_linear(nullptr, 2, 2, buf.data()), std::invalid_argument);
  EXPECT_THROW(pack_linear(buf.data(), 2, 2, nullptr), std::invalid_argument);
  EXPECT_THROW(packed_linear(buf.data(), -1, buf.data(), nullptr, 2, 2, buf.data()),
               std::invalid_argument);
  EXPECT_THROW(packed_linear(nullptr, 1, buf.data(), nullptr, 2, 2, buf.data()),
               std::invalid_argument);
  EXPECT_NO_THROW(packed_linear(nullptr, 0, buf.data(), nullptr, 2, 2, nullptr));
}

// ---- GELU (tanh form) ---------------------------------------------------------

// Inputs over GELU's whole range: normal samples at three scales, then the
// edges (zeros, infinities, a NaN, subnormals, both tails).
std::vector<float> gelu_inputs(int64_t n, std::mt19937& rng) {
  std::vector<float> x = randn(n, rng, n % 3 == 0 ? 1.f : (n % 3 == 1 ? 4.f : 30.f));
  const float edges[] = {0.f,
                         -0.f,
                         1e-30f,
                         -1e-30f,
                         1e-42f,
                         -1e-42f,
                         3.f,
                         -3.f,
                         10.f,
                         -10.f,
                         -12.f,
                         -50.f,
                         100.f,
                         -100.f,
                         1e30f,
                         -1e30f,
                         std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity(),
                         std::nanf("")};
  for (size_t i = 0; i < std::size(edges) && i < x.size(); ++i) x[i * 7 % x.size()] = edges[i];
  return x;
}

TEST_F(IsaTest, GeluTanhIsTheSameBitsOnEveryLevelAndThreadCount) {
  std::mt19937 rng(5);
  for (int64_t n : kSizes) {
    const std::vector<float> x = gelu_inputs(n, rng);
    force_isa(Isa::kScalar);
    std::vector<float> want(n, -7.f);
    gelu_tanh(x.data(), want.data(), n, 1);
    for (Isa isa : supported_isas()) {
      force_isa(isa);
      for (int threads : {1, 3}) {
        std::vector<float> y(n, -7.f);
        gelu_tanh(x.data(), y.data(), n, threads);
        ASSERT_TRUE(same_floats(y, want)) << isa_name(isa) << " threads " << threads << ", n " << n;
        std::vector<float> in_place = x;
        gelu_tanh(in_place.data(), in_place.data(), n, threads);
        ASSERT_TRUE(same_floats(in_place, want))
            << isa_name(isa) << " threads " << threads << ", n " << n << ", in place";
      }
    }
  }
}

// Against GELU computed in double on a fine grid over [-15, 15]: within
// 2 (4 + |t|) 2^-23 relative, t = -2u (measured: 1.2 (4 + |t|) 2^-23;
// an exponential in float cannot do better than |t| times t's own
// rounding, which the negative tail's e^t magnifies), wherever GELU is
// above 1e-30 in magnitude, and under 2e-30 where it is below; x itself at
// 30, a tiny value at -30, infinity and NaN kept.
TEST_F(IsaTest, GeluTanhIsWithinAFewUlpOfTheValue) {
  std::vector<float> x;
  for (double v = -15; v <= 15; v += 1.0 / 1024) x.push_back(static_cast<float>(v));
  for (Isa isa : supported_isas()) {
    force_isa(isa);
    std::vector<float> y(x.size());
    gelu_tanh(x.data(), y.data(), static_cast<int64_t>(x.size()), 1);
    double worst = 0;
    float worst_x = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double xi = x[i];
      // 0.5 x (1 + tanh(u)) = x / (1 + e^-2u), the form without the
      // cancellation of 1 + tanh(u) at large negative u (even in double).
      const double u = 0.7978845608028654 * (xi + 0.044715 * xi * xi * xi);
      const double want = xi / (1 + std::exp(-2 * u));
      if (std::fabs(want) < 1e-30) {
        EXPECT_LE(std::fabs(y[i]), 2e-30) << isa_name(isa) << " x " << xi;
        continue;
      }
      // In units of 2^-23 relative, over what a float computation of
      // t = -2u can keep: e^t moves by |t| times t's own rounding.
      const double err =
          std::fabs(y[i] - want) / std::fabs(want) / (0x1p-23 * (4 + 2 * std::fabs(u)));
      if (err > worst) worst = err, worst_x = x[i];
    }
    EXPECT_LT(worst, 2.0) << isa_name(isa) << ": worst error " << worst << " units at x "
                          << worst_x;
    const float edge[] = {30.f, -30.f, std::numeric_limits<float>::infinity(), std::nanf("")};
    float out[4];
    gelu_tanh(edge, out, 4, 1);
    EXPECT_EQ(out[0], 30.f) << isa_name(isa);
    EXPECT_LE(std::fabs(out[1]), 1e-30f) << isa_name(isa);
    EXPECT_EQ(out[2], std::numeric_limits<float>::infinity()) << isa_name(isa);
    EXPECT_TRUE(std::isnan(out[3])) << isa_name(isa);
  }
}

TEST(GeluTanh, RejectsBadArguments) {
  std::vector<float> buf(4);
  EXPECT_THROW(gelu_tanh(buf.data(), buf.data(), -1), std::invalid_argument);
  EXPECT_THROW(gelu_tanh(nullptr, buf.data(), 4), std::invalid_argument);
  EXPECT_THROW(gelu_tanh(buf.data(), nullptr, 4), std::invalid_argument);
  EXPECT_NO_THROW(gelu_tanh(nullptr, nullptr, 0));
}

}  // namespace
}  // namespace kolos::kernels
