// The CUDA kernels (kolos/kernels/cuda.h) against the CPU: AdamW against the
// CPU kernel (bit-identical: same formula, explicit rounding), LayerNorm and
// causal softmax against plain double-precision references (relative 1e-5).
// Without a GPU every test fails at set-up: this executable has label `gpu`
// and is not part of CPU CI.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <tuple>
#include <random>
#include <vector>

#include "kolos/kernels/adamw.h"
#include "kolos/kernels/cuda.h"

namespace kolos::kernels {
namespace {

#define CUDA_OK(expr)                                                                   \
  do {                                                                                  \
    const cudaError_t err_ = (expr);                                                    \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_);          \
  } while (0)

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    ASSERT_TRUE(err == cudaSuccess && n > 0)
        << "no usable CUDA device (" << cudaGetErrorString(err)
        << "): the gpu-labelled tests need one; CPU CI runs ctest -LE gpu";
  }
};

// A device copy of a host vector, freed at scope exit.
struct DeviceBuffer {
  float* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(const std::vector<float>& h) : n(h.size()) {
    if (cudaMalloc(reinterpret_cast<void**>(&ptr), std::max<size_t>(1, n) * sizeof(float)) != cudaSuccess) ptr = nullptr;
    if (ptr && n) cudaMemcpy(ptr, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  }
  explicit DeviceBuffer(size_t count) : DeviceBuffer(std::vector<float>(count, 0.f)) {}
  ~DeviceBuffer() { cudaFree(ptr); }
  std::vector<float> get() const {
    std::vector<float> h(n);
    if (n) cudaMemcpy(h.data(), ptr, n * sizeof(float), cudaMemcpyDeviceToHost);
    return h;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

std::vector<float> randn(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rtol,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], rtol * (1 + std::abs(want[i]))) << what << " element " << i;
}

TEST_F(Gpu, MultiTensorAdamWIsBitIdenticalToTheCpuKernel) {
  std::mt19937 rng(1);
  const size_t sizes[] = {0, 1, 17, 1000, 65536 + 3, 300000};
  const size_t count = 40;  // more tensors than one launch takes
  std::vector<std::vector<float>> p, g, m, v;
  for (size_t i = 0; i < count; ++i) {
    const size_t n = sizes[i % 6];
    p.push_back(randn(n, rng));
    g.push_back(randn(n, rng));
    if (n > 3) g.back()[2] = std::numeric_limits<float>::quiet_NaN();
    m.push_back(std::vector<float>(n, 0.f));
    v.push_back(std::vector<float>(n, 0.f));
  }
  std::vector<std::unique_ptr<DeviceBuffer>> dev;
  std::vector<cuda::AdamWTensor> tensors;
  for (size_t i = 0; i < count; ++i) {
    for (auto* h : {&p[i], &g[i], &m[i], &v[i]}) dev.push_back(std::make_unique<DeviceBuffer>(*h));
    const size_t k = dev.size() - 4;
    tensors.push_back(cuda::AdamWTensor{dev[k]->ptr, dev[k + 1]->ptr, dev[k + 2]->ptr,
                                        dev[k + 3]->ptr, static_cast<int64_t>(p[i].size())});
  }
  AdamWConfig cfg;
  cfg.lr = 1e-2;
  cfg.beta2 = 0.95;
  cfg.weight_decay = 0.1;
  for (int step = 1; step <= 3; ++step) {
    cfg.step = step;
    cuda::adamw_step(tensors.data(), tensors.size(), cfg);
    for (size_t i = 0; i < count; ++i)
      adamw_step_fp32(p[i].data(), g[i].data(), m[i].data(), v[i].data(),
                      static_cast<int64_t>(p[i].size()), cfg, 1);
  }
  CUDA_OK(cudaDeviceSynchronize());
  for (size_t i = 0; i < count; ++i) {
    const std::vector<float> got = dev[4 * i]->get();
    for (size_t j = 0; j < got.size(); ++j) {
      if (std::isnan(got[j]) && std::isnan(p[i][j])) continue;
      ASSERT_EQ(std::memcmp(&got[j], &p[i][j], 4), 0)
          << "tensor " << i << " element " << j << ": " << got[j] << " vs " << p[i][j];
    }
  }
}

TEST_F(Gpu, LayerNormForwardAndBackwardMatchTheReference) {
  std::mt19937 rng(2);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {7, 33}, {64, 1024}, {3, 5000}}) {
    const float eps = 1e-5f;
    std::vector<float> x = randn(rows * cols, rng), gamma = randn(cols, rng),
                       beta = randn(cols, rng), dy = randn(rows * cols, rng);
    for (auto& e : x) e = e * 3 + 10;  // a large mean
    std::vector<double> y(rows * cols), dx(rows * cols), dgamma(cols, 0), dbeta(cols, 0);
    for (int64_t r = 0; r < rows; ++r) {
      double mu = 0, var = 0;
      for (int64_t j = 0; j < cols; ++j) mu += x[r * cols + j];
      mu /= cols;
      for (int64_t j = 0; j < cols; ++j) var += (x[r * cols + j] - mu) * (x[r * cols + j] - mu);
      var /= cols;
      const double rs = 1 / std::sqrt(var + eps);
      double mg = 0, mgx = 0;
      for (int64_t j = 0; j < cols; ++j) {
        const double xh = (x[r * cols + j] - mu) * rs, d = dy[r * cols + j];
        y[r * cols + j] = xh * gamma[j] + beta[j];
        mg += d * gamma[j];
        mgx += d * gamma[j] * xh;
        dgamma[j] += d * xh;
        dbeta[j] += d;
      }
      mg /= cols;
      mgx /= cols;
      for (int64_t j = 0; j < cols; ++j) {
        const double xh = (x[r * cols + j] - mu) * rs;
        dx[r * cols + j] = rs * (dy[r * cols + j] * gamma[j] - mg - xh * mgx);
      }
    }
    DeviceBuffer dx_in(x), dgm(gamma), dbt(beta), ddy(dy), dy_out(x.size()), dmean(rows),
        drstd(rows), ddx(x.size()), ddg(cols), ddb(cols);
    cuda::layer_norm_forward(dx_in.ptr, dgm.ptr, dbt.ptr, dy_out.ptr, dmean.ptr, drstd.ptr, rows,
                             cols, eps);
    cuda::layer_norm_backward(ddy.ptr, dx_in.ptr, dmean.ptr, drstd.ptr, dgm.ptr, ddx.ptr,
                              ddg.ptr, ddb.ptr, rows, cols);
    CUDA_OK(cudaDeviceSynchronize());
    expect_close(dy_out.get(), y, 1e-4, "y");
    expect_close(ddx.get(), dx, 1e-3, "dx");
    expect_close(ddg.get(), dgamma, 1e-4, "dgamma");
    expect_close(ddb.get(), dbeta, 1e-4, "dbeta");
  }
}

TEST_F(Gpu, CausalSoftmaxMatchesTheReference) {
  std::mt19937 rng(3);
  for (auto [batch, q_len, cols] :
       {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {2, 16, 16}, {3, 5, 37}, {2, 300, 300}}) {
    const int64_t rows = batch * q_len;
    const float scale = 0.125f;
    std::vector<float> x = randn(rows * cols, rng), dy = randn(rows * cols, rng);
    std::vector<double> y(rows * cols, 0), dx(rows * cols, 0);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = r % q_len + (cols - q_len) + 1;
      double mx = -1e300, sum = 0, dot = 0;
      for (int64_t j = 0; j < n; ++j) mx = std::max(mx, double(x[r * cols + j]) * scale);
      for (int64_t j = 0; j < n; ++j) sum += std::exp(double(x[r * cols + j]) * scale - mx);
      for (int64_t j = 0; j < n; ++j)
        y[r * cols + j] = std::exp(double(x[r * cols + j]) * scale - mx) / sum;
      for (int64_t j = 0; j < n; ++j) dot += y[r * cols + j] * dy[r * cols + j];
      for (int64_t j = 0; j < n; ++j) dx[r * cols + j] = scale * y[r * cols + j] * (dy[r * cols + j] - dot);
    }
    DeviceBuffer dxin(x), ddy(dy), dyout(x.size()), ddx(x.size());
    cuda::softmax_causal_forward(dxin.ptr, dyout.ptr, rows, cols, q_len, scale);
    std::vector<float> yf;
    CUDA_OK(cudaDeviceSynchronize());
    yf = dyout.get();
    expect_close(yf, y, 1e-5, "y");
    cuda::softmax_causal_backward(dyout.ptr, ddy.ptr, ddx.ptr, rows, cols, q_len, scale);
    CUDA_OK(cudaDeviceSynchronize());
    expect_close(ddx.get(), dx, 1e-5, "dx");
    // In place (y = x) gives the same.
    cuda::softmax_causal_forward(dxin.ptr, dxin.ptr, rows, cols, q_len, scale);
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(dxin.get(), yf);
  }
}

TEST(GpuLaunchers, RejectBadShapesBeforeLaunching) {
  EXPECT_THROW(cuda::softmax_causal_forward(nullptr, nullptr, 1, 4, 5, 1.f), std::invalid_argument);
  EXPECT_THROW(cuda::layer_norm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 0,
                                        1e-5f),
               std::invalid_argument);
}

}  // namespace
}  // namespace kolos::kernels
