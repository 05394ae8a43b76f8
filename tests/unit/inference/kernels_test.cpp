// The inference engine's CPU fast paths against plain LibTorch arithmetic:
// the packed linear layers (kolos's panels and oneDNN's blocked weights) and the in-place
// attention over the paged KV cache (both dtypes, grouped-query heads, the
// AVX2 and portable loops, mixed with gathered prefill chunks).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kolos/core/layer_factory.h"
#include "kolos/core/model.h"
#include "kolos/core/packed_linear.h"
#include "kolos/inference/kv_cache.h"
#include "kolos/inference/paged_attention.h"
#include "kolos/modules/gpt.h"
#include "kolos/modules/llama.h"

namespace kolos::inference {
namespace {

double max_error(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

TEST(PackedLinear, BothKernelsEqualLinear) {
  // kolos builds against LibTorch wheels, which carry oneDNN's operators, and
  // the machines that build it have AVX2: either missing is a failure.
  ASSERT_TRUE(PackedLinear::available(PackedLinear::Kernel::kOneDnn))
      << "this LibTorch has no oneDNN linear operators";
  ASSERT_TRUE(PackedLinear::available(PackedLinear::Kernel::kPanels)) << "no AVX2 on this CPU";
  EXPECT_EQ(PackedLinear::kernel(), PackedLinear::Kernel::kPanels);
  EXPECT_NE(PackedLinear::kernel_name().find("kolos panels"), std::string::npos);
  torch::manual_seed(0);
  for (const auto kernel : {PackedLinear::Kernel::kPanels, PackedLinear::Kernel::kOneDnn}) {
    const char* name = kernel == PackedLinear::Kernel::kPanels ? "panels" : "oneDNN";
    for (const int64_t rows : {1, 3, 16, 70}) {
      // 40 outputs: one whole panel and a part of one; a non-contiguous input.
      const at::Tensor w = torch::randn({40, 24}), b = torch::randn({40});
      const at::Tensor x = torch::randn({2, 24, rows}).transpose(1, 2);
      const PackedLinear packed(w, kernel);
      EXPECT_LT(max_error(packed(x, b), at::linear(x, w, b)), 1e-5) << name << ", " << rows;
      EXPECT_LT(max_error(packed(x), at::linear(x, w)), 1e-5)
          << name << ", " << rows << ", no bias";
      EXPECT_EQ(packed(x).sizes(), (std::vector<int64_t>{2, rows, 40}));
    }
    const PackedLinear packed(torch::randn({8, 4}), kernel);
    EXPECT_THROW(packed(torch::randn({3, 4}).to(at::kBFloat16)), std::exception) << name;
    EXPECT_THROW(packed(torch::randn({3, 5})), std::exception) << name;
    EXPECT_THROW(packed(torch::randn({3, 4}), torch::randn({7})), std::exception) << name;
  }
  EXPECT_FALSE(PackedLinear::packs(torch::randn({8, 4}).to(at::kBFloat16)));
}

ModelConfig tiny(const std::string& name) {
  ModelConfig c;
  c.name = name;
  c.layers = 2;
  c.hidden = 32;
  c.heads = 4;
  c.kv_heads = name == "llama" ? 2 : 0;
  c.ffn_hidden = name == "llama" ? 64 : 0;
  c.seq_len = 16;
  c.vocab = 50;
  return c;
}

// A model's logits are the same (to rounding) after pack_for_inference, and
// the packed linear layers no longer hold their dense weights.
TEST(PackedLinear, ModelPacksEveryLinearLayer) {
  // kolos builds against LibTorch wheels (oneDNN) on CPUs with AVX2 (panels): neither is a failure.
  ASSERT_TRUE(PackedLinear::available()) << "neither kolos's panels nor oneDNN pack here";
  for (const std::string name : {"gpt", "llama"}) {
    auto factory = make_serial_layer_factory();
    torch::manual_seed(1);
    std::shared_ptr<Model> model = name == "gpt" ? modules::build_gpt(tiny(name), *factory)
                                                 : modules::build_llama(tiny(name), *factory);
    model->eval();
    torch::NoGradGuard no_grad;
    const at::Tensor tokens = torch::randint(50, {2, 16}, torch::kInt64);
    const at::Tensor before = model->forward(tokens);
    // GPT: q, k, v, o, up, down per layer; LLaMA: q, k, v, o, gate, up,
    // down. (The head's table is packed when the head first reads it.)
    const int64_t expected = name == "gpt" ? 2 * 6 : 2 * 7;
    EXPECT_EQ(pack_for_inference(*model), expected) << name;
    const at::Tensor after = model->forward(tokens);
    EXPECT_LT(max_error(before, after), 1e-4) << name;
    int64_t released = 0;
    for (const auto& item : model->named_parameters()) {
      if (item.key().find("_proj.weight") != std::string::npos) {
        EXPECT_EQ(item.value().numel(), 0)
            << name << ": " << item.key() << " kept its dense weight";
        ++released;
      }
    }
    EXPECT_EQ(released, name == "gpt" ? 2 * 6 : 2 * 7) << name;
  }
}

// softmax(q.k / sqrt(d)) v in double over positions [0, position].
at::Tensor reference(const at::Tensor& q /*[h, d]*/, const at::Tensor& keys,
                     const at::Tensor& values /*[rows, kvh, d]*/, const std::vector<int64_t>& rows,
                     int64_t position) {
  const int64_t heads = q.size(0), kv_heads = keys.size(1);
  const at::Tensor index =
      torch::tensor(std::vector<int64_t>(rows.begin(), rows.begin() + position + 1));
  at::Tensor k = keys.index_select(0, index).to(at::kDouble).repeat_interleave(heads / kv_heads, 1);
  at::Tensor v =
      values.index_select(0, index).to(at::kDouble).repeat_interleave(heads / kv_heads, 1);
  at::Tensor scores =
      torch::einsum("hd,phd->hp", {q.to(at::kDouble), k}) / std::sqrt(double(q.size(1)));
  return torch::einsum("hp,phd->hd", {torch::softmax(scores, -1), v});  // [h, d]
}

// `sharpness` scales the queries: at 8 the scores of one token span
// hundreds, so that most weights underflow to 0.
void check_kernel(int64_t heads, int64_t kv_heads, int64_t d, at::ScalarType dtype, int threads,
                  float sharpness = 1) {
  torch::manual_seed(2);
  const int64_t rows = 64;
  const at::Tensor keys = torch::randn({rows, kv_heads, d}).to(dtype);
  const at::Tensor values = torch::randn({rows, kv_heads, d}).to(dtype);
  // Four chunks: positions scattered over the rows (as block tables place
  // them); contexts of 1 to 45 positions (vector loops and their tails).
  std::vector<int64_t> long_table(45);
  for (int64_t i = 0; i < 45; ++i) long_table[i] = (i * 37 + 11) % rows;
  const std::vector<std::vector<int64_t>> tables = {
      {5, 6, 7, 40, 41, 42, 43, 1, 2}, {60}, {10, 11, 12, 13, 30, 31}, long_table};
  const std::vector<int64_t> lengths = {2, 1, 3, 4};
  const int64_t tokens = 10;
  const at::Tensor q = torch::randn({heads, tokens, d}) * sharpness;
  at::Tensor out = torch::full({heads, tokens, d}, std::nan(""));
  std::vector<PagedAttentionChunk> chunks;
  int64_t token = 0;
  for (size_t c = 0; c < tables.size(); ++c) {
    const auto context = static_cast<int64_t>(tables[c].size());
    chunks.push_back({token, context - lengths[c], lengths[c], tables[c].data()});
    token += lengths[c];
  }
  PagedAttentionArgs args;
  args.q = q.data_ptr<float>();
  args.out = out.data_ptr<float>();
  args.heads = heads;
  args.tokens = tokens;
  args.head_dim = d;
  args.keys = keys.data_ptr();
  args.values = values.data_ptr();
  args.kv_heads = kv_heads;
  args.dtype = dtype == at::kFloat ? CacheDType::kFloat32 : CacheDType::kBFloat16;
  args.scale = static_cast<float>(1.0 / std::sqrt(double(d)));
  paged_attention(args, chunks.data(), chunks.size(), threads);
  for (const auto& c : chunks) {
    for (int64_t i = 0; i < c.length; ++i) {
      const int64_t t = c.token + i;
      const std::vector<int64_t> table(c.rows, c.rows + c.start + c.length);
      const at::Tensor expected = reference(q.select(1, t), keys, values, table, c.start + i);
      EXPECT_LT(max_error(out.select(1, t), expected), 2e-5)
          << "token " << t << ", heads " << heads << "/" << kv_heads << ", d " << d << ", " << dtype
          << ", " << threads << " threads";
    }
  }
}

TEST(PagedAttention, EqualsSoftmaxAttention) {
  for (const int threads : {1, 2, 3}) {
    for (const auto dtype : {at::kFloat, at::kBFloat16}) {
      check_kernel(4, 4, 16, dtype, threads);  // AVX-512 (else AVX2) where the CPU has them
      check_kernel(2, 2, 24, dtype, threads);  // not a multiple of 16: AVX2 where the CPU has it
      check_kernel(6, 2, 16, dtype, threads);  // grouped-query heads
      check_kernel(4, 1, 12, dtype, threads);  // head_dim not a multiple of 8: portable loops
      check_kernel(4, 2, 16, dtype, threads, 8);  // scores spanning hundreds
    }
  }
}

// A NaN among a token's scores makes its output NaN on every path (the
// vector exp must not turn it into a weight of 0).
TEST(PagedAttention, ANanScoreShows) {
  for (const int64_t d : {16, 8, 12}) {  // AVX-512, AVX2 (where the CPU has them), portable
    const int64_t heads = 2, rows = 20;
    const at::Tensor keys = torch::randn({rows, heads, d});
    const at::Tensor values = torch::randn({rows, heads, d});
    keys[13][1][0] = std::nan("");  // position 13, head 1
    std::vector<int64_t> table(rows);
    for (int64_t i = 0; i < rows; ++i) table[i] = i;
    const at::Tensor q = torch::randn({heads, 1, d});
    at::Tensor out = torch::zeros({heads, 1, d});
    PagedAttentionArgs args;
    args.q = q.data_ptr<float>();
    args.out = out.data_ptr<float>();
    args.heads = heads;
    args.tokens = 1;
    args.head_dim = d;
    args.keys = keys.data_ptr();
    args.values = values.data_ptr();
    args.kv_heads = heads;
    args.scale = 0.25f;
    const PagedAttentionChunk chunk{0, rows - 1, 1, table.data()};
    paged_attention(args, &chunk, 1, 1);
    EXPECT_TRUE(out[0].isfinite().all().item<bool>()) << "d " << d << ": head 0 has no NaN";
    EXPECT_TRUE(out[1].isnan().all().item<bool>()) << "d " << d << ": head 1 read the NaN key";
  }
}

TEST(PagedAttention, RefusesWhatItCannotRun) {
  PagedAttentionArgs args;
  const std::vector<int64_t> rows = {0};
  const PagedAttentionChunk chunk{0, 0, 1, rows.data()};
  EXPECT_THROW(paged_attention(args, &chunk, 1), std::invalid_argument);  // null pointers
}

// The cache's attend(): decoding chunks in place and a prefill chunk
// gathered, in one step, against the reference over each chunk's context.
TEST(PagedKvCache, InPlaceAndGatheredChunksAgree) {
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    torch::manual_seed(3);
    const int64_t heads = 4, kv_heads = 2, d = 8, block = 4;
    PagedKvCache cache(1, 16, block, kv_heads, d, dtype);
    // q, k and v of a step's tokens, in the cache's dtype (q) as the model hands them over.
    struct Step {
      at::Tensor q, k, v, y;
    };
    auto run = [&](const StepBatch& batch) {
      cache.begin_step(batch);
      const auto tokens = static_cast<int64_t>(batch.tokens.size());
      Step step{torch::randn({1, heads, tokens, d}).to(dtype),
                torch::randn({1, kv_heads, tokens, d}), torch::randn({1, kv_heads, tokens, d})};
      step.y = cache.attend(step.q, step.k, step.v);
      return step;
    };
    // Step 1: a prefill of 12 tokens (gathered) for sequence A in blocks 3, 9, 5.
    StepBatch prefill;
    prefill.tokens.assign(12, 0);
    prefill.chunks.push_back(StepChunk{0, 12, true, {3, 9, 5}});
    const Step first = run(prefill);
    const at::Tensor &q1 = first.q, &k1 = first.k, &v1 = first.v, &y1 = first.y;
    // Step 2: A decodes one token (in place), B prefills 10 (gathered).
    StepBatch mixed;
    mixed.tokens.assign(11, 0);
    mixed.chunks.push_back(StepChunk{12, 1, true, {3, 9, 5, 7}});
    mixed.chunks.push_back(StepChunk{0, 10, true, {0, 1, 2}});
    const Step second = run(mixed);
    const at::Tensor &q2 = second.q, &k2 = second.k, &v2 = second.v, &y2 = second.y;
    // The reference: each sequence's keys and values in position order.
    const at::Tensor ka = torch::cat({k1[0], k2[0].narrow(1, 0, 1)}, 1).transpose(0, 1);
    const at::Tensor va = torch::cat({v1[0], v2[0].narrow(1, 0, 1)}, 1).transpose(0, 1);
    const at::Tensor kb = k2[0].narrow(1, 1, 10).transpose(0, 1),
                     vb = v2[0].narrow(1, 1, 10).transpose(0, 1);
    std::vector<int64_t> order(13);
    for (int64_t p = 0; p < 13; ++p) order[p] = p;
    const double tolerance = dtype == at::kFloat ? 2e-5 : 5e-2;
    for (int64_t p = 0; p < 12; ++p) {
      EXPECT_LT(max_error(y1[0].select(1, p),
                          reference(q1[0].select(1, p), ka.to(dtype), va.to(dtype), order, p)),
                tolerance)
          << dtype << " prefill position " << p;
    }
    EXPECT_LT(max_error(y2[0].select(1, 0),
                        reference(q2[0].select(1, 0), ka.to(dtype), va.to(dtype), order, 12)),
              tolerance)
        << dtype << " decode";
    for (int64_t p = 0; p < 10; ++p) {
      EXPECT_LT(max_error(y2[0].select(1, 1 + p),
                          reference(q2[0].select(1, 1 + p), kb.to(dtype), vb.to(dtype), order, p)),
                tolerance)
          << dtype << " second prefill position " << p;
    }
  }
}

}  // namespace
}  // namespace kolos::inference
