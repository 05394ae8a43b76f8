// The public CPU kernel functions: argument checks, the ISA table of
// active_isa(), and the split of work into fixed chunks over OpenMP threads.
//
// Chunks are cut at fixed element offsets (kChunk, a multiple of 16) inside
// each buffer, independent of the thread count, and every reduction combines
// chunk results in chunk order: results are the same for any `threads`.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernel_table.h"
#include "kolos/kernels/activation.h"
#include "kolos/kernels/adamw.h"
#include "kolos/kernels/convert.h"
#include "kolos/kernels/grad_norm.h"
#include "kolos/kernels/isa.h"
#include "kolos/kernels/linear.h"
#include "scalar_math.h"

namespace kolos::kernels {
namespace detail {
namespace {

// 32768 fp32 elements: 128 KiB per buffer, enough to amortise scheduling,
// small enough that a few MB spread over every thread.
constexpr int64_t kChunk = 1 << 15;

const KernelTable& table() {
  switch (active_isa()) {
    case Isa::kAvx512Bf16: return avx512_bf16_table();
    case Isa::kAvx512: return avx512_table();
    case Isa::kAvx2: return avx2_table();
    case Isa::kScalar: break;
  }
  return scalar_table();
}

struct Piece {
  size_t buffer;
  int64_t begin, end;
};

// Cuts `count` buffers of sizes numel(i) into chunk pieces.
template <typename Numel>
std::vector<Piece> pieces_of(size_t count, Numel numel) {
  std::vector<Piece> pieces;
  for (size_t b = 0; b < count; ++b)
    for (int64_t begin = 0, n = numel(b); begin < n; begin += kChunk)
      pieces.push_back(Piece{b, begin, std::min(n, begin + kChunk)});
  return pieces;
}

int thread_count(int threads, size_t pieces) {
#ifdef _OPENMP
  int t = threads > 0 ? threads : omp_get_max_threads();
  if (static_cast<size_t>(t) > pieces) t = static_cast<int>(pieces);
  return t < 1 ? 1 : t;
#else
  (void)threads;
  (void)pieces;
  return 1;
#endif
}

// Runs body(piece index) for every piece, on up to `threads` threads. With
// `run` 0 each thread takes a contiguous range of pieces (streams memory in
// order); otherwise the threads take runs of consecutive pieces, each the
// next one left when it is free: first long runs (the pieces left over the
// threads, OpenMP's guided schedule), then shorter ones down to `run`, so
// that a thread the machine slows down (another thread of the process,
// another process) does less of the work, where with fixed ranges the
// others would wait for it at the end.
template <typename Body>
void run_pieces(size_t n, int threads, Body body, size_t run = 0) {
  const int t = thread_count(threads, n);
  if (t <= 1) {
    for (size_t i = 0; i < n; ++i) body(i);
    return;
  }
#ifdef _OPENMP
  const long long total = static_cast<long long>(n);
  if (run == 0) {
#pragma omp parallel for num_threads(t) schedule(static)
    for (long long i = 0; i < total; ++i) body(static_cast<size_t>(i));
  } else {
    const int chunk = static_cast<int>(run);
#pragma omp parallel for num_threads(t) schedule(guided, chunk)
    for (long long i = 0; i < total; ++i) body(static_cast<size_t>(i));
  }
#endif
}

void check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("kolos kernels: " + what);
}

void check_dtype(DType d, const char* what) {
  check(d == DType::kFloat32 || d == DType::kBFloat16 || d == DType::kFloat16,
        std::string(what) + ": unknown dtype " + std::to_string(static_cast<int>(d)));
}

}  // namespace

AdamWScalars adamw_scalars(const AdamWConfig& c) {
  check(c.step >= 1, "adamw_step: step must be >= 1 (1-based), got " + std::to_string(c.step));
  const double bc1 = 1 - std::pow(c.beta1, static_cast<double>(c.step));
  const double bc2 = 1 - std::pow(c.beta2, static_cast<double>(c.step));
  AdamWScalars s;
  s.weight_decay_factor = static_cast<float>(1 - c.lr * c.weight_decay);
  s.beta1 = static_cast<float>(c.beta1);
  s.one_minus_beta1 = static_cast<float>(1 - c.beta1);
  s.beta2 = static_cast<float>(c.beta2);
  s.one_minus_beta2 = static_cast<float>(1 - c.beta2);
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bc2));
  s.eps = static_cast<float>(c.eps);
  s.neg_step_size = static_cast<float>(-(c.lr / bc1));
  s.grad_scale = static_cast<float>(c.grad_scale);
  return s;
}

namespace {

int copy_kind(const AdamWBuffer& b) {
  if (b.param_copy == nullptr) return kNoCopy;
  return 1 + static_cast<int>(b.copy_dtype);
}

// Sum of 16 lanes in a fixed tree.
double reduce_lanes(const double l[16]) {
  double s8[8], s4[4];
  for (int i = 0; i < 8; ++i) s8[i] = l[2 * i] + l[2 * i + 1];
  for (int i = 0; i < 4; ++i) s4[i] = s8[2 * i] + s8[2 * i + 1];
  return (s4[0] + s4[1]) + (s4[2] + s4[3]);
}

void check_grad_buffers(const GradBuffer* buffers, size_t count, const char* fn) {
  check(count == 0 || buffers != nullptr, std::string(fn) + ": null buffer list");
  for (size_t i = 0; i < count; ++i) {
    const GradBuffer& b = buffers[i];
    check(b.numel >= 0, std::string(fn) + ": buffer " + std::to_string(i) + " has numel " +
                            std::to_string(b.numel));
    check(b.numel == 0 || b.data != nullptr,
          std::string(fn) + ": buffer " + std::to_string(i) + " is null");
    check_dtype(b.dtype, fn);
  }
}

}  // namespace
}  // namespace detail

using namespace detail;

void adamw_step(const AdamWBuffer* buffers, size_t count, const AdamWConfig& config,
                int threads) {
  const AdamWScalars s = adamw_scalars(config);
  check(count == 0 || buffers != nullptr, "adamw_step: null buffer list");
  for (size_t i = 0; i < count; ++i) {
    const AdamWBuffer& b = buffers[i];
    const std::string which = "adamw_step: buffer " + std::to_string(i);
    check(b.numel >= 0, which + " has numel " + std::to_string(b.numel));
    check(b.numel == 0 || (b.param && b.grad && b.exp_avg && b.exp_avg_sq),
          which + ": param, grad, exp_avg and exp_avg_sq must not be null");
    check_dtype(b.grad_dtype, "adamw_step grad");
    check_dtype(b.copy_dtype, "adamw_step param_copy");
  }
  const KernelTable& t = table();
  const std::vector<Piece> pieces = pieces_of(count, [&](size_t b) { return buffers[b].numel; });
  run_pieces(pieces.size(), threads, [&](size_t i) {
    const Piece& pc = pieces[i];
    const AdamWBuffer& b = buffers[pc.buffer];
    const int64_t gsize = dtype_size(b.grad_dtype);
    void* copy = b.param_copy == nullptr
                     ? nullptr
                     : static_cast<char*>(b.param_copy) + pc.begin * dtype_size(b.copy_dtype);
    t.adamw[static_cast<int>(b.grad_dtype)][copy_kind(b)](
        b.param + pc.begin, static_cast<const char*>(b.grad) + pc.begin * gsize,
        b.exp_avg + pc.begin, b.exp_avg_sq + pc.begin, copy, pc.end - pc.begin, s);
  });
}

void adamw_step_fp32(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                     int64_t numel, const AdamWConfig& config, int threads) {
  AdamWBuffer b;
  b.param = param;
  b.grad = grad;
  b.exp_avg = exp_avg;
  b.exp_avg_sq = exp_avg_sq;
  b.numel = numel;
  adamw_step(&b, 1, config, threads);
}

void adamw_reference(const AdamWBuffer& b, const AdamWConfig& config) {
  const AdamWScalars s = adamw_scalars(config);
  for (int64_t i = 0; i < b.numel; ++i) {
    float g;
    switch (b.grad_dtype) {
      case DType::kFloat32: g = static_cast<const float*>(b.grad)[i]; break;
      case DType::kBFloat16: g = from_bf16(static_cast<const uint16_t*>(b.grad)[i]); break;
      default: g = from_fp16(static_cast<const uint16_t*>(b.grad)[i]); break;
    }
    g = g * s.grad_scale;
    const float p = b.param[i] * s.weight_decay_factor;
    const float m = std::fma(g, s.one_minus_beta1, b.exp_avg[i] * s.beta1);
    const float v = std::fma(g * s.one_minus_beta2, g, b.exp_avg_sq[i] * s.beta2);
    const float denom = std::sqrt(v) / s.bias_correction2_sqrt + s.eps;
    b.param[i] = p + (s.neg_step_size * m) / denom;
    b.exp_avg[i] = m;
    b.exp_avg_sq[i] = v;
    if (b.param_copy == nullptr) continue;
    switch (b.copy_dtype) {
      case DType::kFloat32: static_cast<float*>(b.param_copy)[i] = b.param[i]; break;
      case DType::kBFloat16: static_cast<uint16_t*>(b.param_copy)[i] = to_bf16(b.param[i]); break;
      default: static_cast<uint16_t*>(b.param_copy)[i] = to_fp16(b.param[i]); break;
    }
  }
}

// ---- conversion ------------------------------------------------------------

namespace {
template <typename Src, typename Dst, typename Fn>
void convert_chunks(const Src* src, Dst* dst, int64_t n, int threads, Fn fn, const char* name) {
  check(n >= 0, std::string(name) + ": negative n");
  check(n == 0 || (src && dst), std::string(name) + ": null buffer");
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  run_pieces(static_cast<size_t>(chunks), threads, [&](size_t c) {
    const int64_t begin = static_cast<int64_t>(c) * kChunk;
    fn(src + begin, dst + begin, std::min(kChunk, n - begin));
  });
}
}  // namespace

void fp32_to_bf16(const float* src, uint16_t* dst, int64_t n, int threads) {
  convert_chunks(src, dst, n, threads, table().fp32_to_bf16, "fp32_to_bf16");
}
void bf16_to_fp32(const uint16_t* src, float* dst, int64_t n, int threads) {
  convert_chunks(src, dst, n, threads, table().bf16_to_fp32, "bf16_to_fp32");
}
void fp32_to_fp16(const float* src, uint16_t* dst, int64_t n, int threads) {
  convert_chunks(src, dst, n, threads, table().fp32_to_fp16, "fp32_to_fp16");
}
void fp16_to_fp32(const uint16_t* src, float* dst, int64_t n, int threads) {
  convert_chunks(src, dst, n, threads, table().fp16_to_fp32, "fp16_to_fp32");
}

void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
             int threads) {
  check_dtype(src_dtype, "convert source");
  check_dtype(dst_dtype, "convert destination");
  const auto* s16 = static_cast<const uint16_t*>(src);
  auto* d16 = static_cast<uint16_t*>(dst);
  const auto* s32 = static_cast<const float*>(src);
  auto* d32 = static_cast<float*>(dst);
  if (src_dtype == dst_dtype) {
    check(n >= 0 && (n == 0 || (src && dst)), "convert: bad buffer");
    const int64_t bytes = n * dtype_size(src_dtype);
    const auto* s = static_cast<const char*>(src);
    auto* d = static_cast<char*>(dst);
    std::copy(s, s + bytes, d);
  } else if (src_dtype == DType::kFloat32) {
    if (dst_dtype == DType::kBFloat16) fp32_to_bf16(s32, d16, n, threads);
    else fp32_to_fp16(s32, d16, n, threads);
  } else if (dst_dtype == DType::kFloat32) {
    if (src_dtype == DType::kBFloat16) bf16_to_fp32(s16, d32, n, threads);
    else fp16_to_fp32(s16, d32, n, threads);
  } else {  // bf16 <-> fp16 through fp32, chunk by chunk
    const DType from = src_dtype, to = dst_dtype;
    convert_chunks(s16, d16, n, threads,
                   [from, to](const uint16_t* s, uint16_t* d, int64_t len) {
                     float tmp[1024];
                     for (int64_t i = 0; i < len; i += 1024) {
                       const int64_t m = std::min<int64_t>(1024, len - i);
                       const KernelTable& t = table();
                       (from == DType::kBFloat16 ? t.bf16_to_fp32 : t.fp16_to_fp32)(s + i, tmp, m);
                       (to == DType::kBFloat16 ? t.fp32_to_bf16 : t.fp32_to_fp16)(tmp, d + i, m);
                     }
                   },
                   "convert");
  }
}

uint16_t bf16_from_float(float x) { return to_bf16(x); }
float float_from_bf16(uint16_t h) { return from_bf16(h); }
uint16_t fp16_from_float(float x) { return to_fp16(x); }
float float_from_fp16(uint16_t h) { return from_fp16(h); }

// ---- gradient norm ---------------------------------------------------------

double sum_of_squares(const GradBuffer* buffers, size_t count, int threads) {
  check_grad_buffers(buffers, count, "sum_of_squares");
  const KernelTable& t = table();
  const std::vector<Piece> pieces = pieces_of(count, [&](size_t b) { return buffers[b].numel; });
  std::vector<double> partial(pieces.size());
  run_pieces(pieces.size(), threads, [&](size_t i) {
    const Piece& pc = pieces[i];
    const GradBuffer& b = buffers[pc.buffer];
    double lanes[16] = {};
    t.sum_squares[static_cast<int>(b.dtype)](
        static_cast<const char*>(b.data) + pc.begin * dtype_size(b.dtype), pc.end - pc.begin,
        lanes);
    partial[i] = reduce_lanes(lanes);
  });
  double sum = 0;
  for (double p : partial) sum += p;
  return sum;
}

double l2_norm(const GradBuffer* buffers, size_t count, int threads) {
  return std::sqrt(sum_of_squares(buffers, count, threads));
}

void scale(const GradBuffer* buffers, size_t count, float factor, int threads) {
  check_grad_buffers(buffers, count, "scale");
  const KernelTable& t = table();
  const std::vector<Piece> pieces = pieces_of(count, [&](size_t b) { return buffers[b].numel; });
  run_pieces(pieces.size(), threads, [&](size_t i) {
    const Piece& pc = pieces[i];
    const GradBuffer& b = buffers[pc.buffer];
    t.scale[static_cast<int>(b.dtype)](static_cast<char*>(b.data) + pc.begin * dtype_size(b.dtype),
                                       pc.end - pc.begin, factor);
  });
}

double clip_grad_norm(const GradBuffer* buffers, size_t count, double max_norm, int threads) {
  const double norm = l2_norm(buffers, count, threads);
  if (!std::isfinite(norm)) return norm;
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1) scale(buffers, count, static_cast<float>(coef), threads);
  return norm;
}

int64_t packed_linear_size(int64_t out, int64_t in) {
  // The message is built only on failure: packed_linear runs per product.
  if (out < 1 || in < 1) {
    check(false, "packed_linear_size: sizes must be >= 1, got out " + std::to_string(out) +
                     ", in " + std::to_string(in));
  }
  return (out + kLinearPanel - 1) / kLinearPanel * kLinearPanel * in;
}

void pack_linear(const float* weight, int64_t out, int64_t in, float* packed, int threads) {
  packed_linear_size(out, in);  // checks the sizes
  check(weight != nullptr && packed != nullptr, "pack_linear: null weight or packed buffer");
  const int64_t panels = (out + kLinearPanel - 1) / kLinearPanel;
  run_pieces(static_cast<size_t>(panels), threads, [&](size_t i) {
    const int64_t p = static_cast<int64_t>(i);
    float* panel = packed + p * kLinearPanel * in;
    for (int64_t c = 0; c < kLinearPanel; ++c) {
      const int64_t n = p * kLinearPanel + c;
      for (int64_t k = 0; k < in; ++k)
        panel[k * kLinearPanel + c] = n < out ? weight[n * in + k] : 0.f;
    }
  });
}

void packed_linear(const float* x, int64_t rows, const float* packed, const float* bias,
                   int64_t out, int64_t in, float* y, int threads) {
  packed_linear_size(out, in);
  if (rows < 0) check(false, "packed_linear: rows must be >= 0, got " + std::to_string(rows));
  if (rows == 0) return;
  check(x != nullptr && packed != nullptr && y != nullptr, "packed_linear: null x, weight or y");
  const KernelTable& t = table();
  const int64_t panels = (out + kLinearPanel - 1) / kLinearPanel;
  // Work items: (panel, block of rows), panel-major, so that a thread's
  // contiguous range reads each of its panels from memory once and reuses
  // it from the cache for the panel's blocks. 48 rows: whole tiles of every
  // level (12 and 6), a panel's block of y (6 KiB) in the first-level cache.
  constexpr int64_t kBlockRows = 48;
  const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
  // Below ~64K multiply-adds the threads cost more than they save.
  const int use = rows * out * in < (int64_t{1} << 16) ? 1 : threads;
  // Runs of consecutive panels, long ones first and then shorter ones down
  // to one panel (a guided schedule): within a run each panel's prefetch of
  // the next one is for the same thread, and the weights stream in order;
  // the last short runs even out what the threads got done (in `kolos
  // serve`, the HTTP threads take turns on the same cores; with fixed
  // ranges, 16% of its samples were OpenMP's waits at the end of a
  // product). Short runs alone start cold (their first rows not
  // prefetched) and prefetch panels another thread then computes
  // (docs/inference.md, "Threads take runs of panels"). Below
  // kLinearFewRows rows a product streams the weights at the memory's
  // speed, and every run's start stalls that stream: one range a thread.
  const int64_t run = rows < kLinearFewRows ? 0 : blocks;
  run_pieces(
      static_cast<size_t>(panels * blocks), use,
      [&](size_t i) {
        const int64_t p = static_cast<int64_t>(i) / blocks, b = static_cast<int64_t>(i) % blocks;
        const int64_t first = b * kBlockRows, count = std::min(kBlockRows, rows - first);
        const int64_t col = p * kLinearPanel, cols = std::min(kLinearPanel, out - col);
        t.linear_panel(x + first * in, count, in, packed + p * kLinearPanel * in,
                       bias != nullptr ? bias + col : nullptr, cols, y + first * out + col, out);
      },
      static_cast<size_t>(run));
}

void gelu_tanh(const float* x, float* y, int64_t n, int threads) {
  if (n < 0) check(false, "gelu_tanh: n must be >= 0, got " + std::to_string(n));
  if (n == 0) return;
  check(x != nullptr && y != nullptr, "gelu_tanh: null x or y");
  const KernelTable& t = table();
  // Pieces of 16K elements (64 KiB), each a multiple of every level's
  // vector; below 64K elements one thread.
  constexpr int64_t kPiece = 1 << 14;
  const int64_t pieces = (n + kPiece - 1) / kPiece;
  run_pieces(static_cast<size_t>(pieces), n < (int64_t{1} << 16) ? 1 : threads, [&](size_t i) {
    const int64_t first = static_cast<int64_t>(i) * kPiece;
    t.gelu_tanh(x + first, y + first, std::min(kPiece, n - first));
  });
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat16: return "float16";
  }
  return "unknown";
}

}  // namespace kolos::kernels
