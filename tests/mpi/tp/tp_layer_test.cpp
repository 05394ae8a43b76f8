// Every layer of every tensor-parallel mode against the dense layer of the
// serial factory: both draw the same global weights (same seed), every rank
// takes its block of one master input, and the rank's forward output, input
// gradient and parameter gradients must equal the blocks of the dense
// layer's (within 1e-5) — the parameter blocks named by each parameter's
// Placement, so a placement that names the wrong slice fails here too.
//
// Layouts of [batch, seq, features] (tp_grid.h): "A" is the residual
// stream's, "C" a column layer's output (A except under 3d).
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "equivalence.h"
#include "kolos/core/layer_factory.h"
#include "kolos/core/mesh.h"
#include "kolos/core/plugin_registry.h"

namespace kolos {
namespace {

constexpr int64_t kBatch = 4, kSeq = 6, kHidden = 16, kHeads = 4, kInner = 32, kVocab = 37;

using testing::world_size;

// A block of a [batch, seq, features] tensor: batch block `b` of `nb`,
// feature block `f` of `nf`.
struct Block {
  int64_t b = 0, nb = 1, f = 0, nf = 1;
  at::Tensor of(const at::Tensor& t) const {
    at::Tensor x = t.narrow(0, b * t.size(0) / nb, t.size(0) / nb);
    return x.narrow(-1, f * t.size(-1) / nf, t.size(-1) / nf).contiguous();
  }
  at::Tensor features_of(const at::Tensor& t) const {  // no batch dimension
    return t.narrow(-1, f * t.size(-1) / nf, t.size(-1) / nf).contiguous();
  }
};

struct Mode {
  std::string name;  // tp.mode
  int size;
  int depth;
};

void PrintTo(const Mode& m, std::ostream* os) { *os << m.name << " at " << m.size; }

class TpLayers : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override {
    const Mode m = GetParam();
    if (world_size() != m.size) GTEST_SKIP() << "runs at " << m.size << " ranks";
    std::vector<std::string> overrides = {"model.hidden=" + std::to_string(kHidden),
                                          "model.heads=" + std::to_string(kHeads),
                                          "model.vocab=" + std::to_string(kVocab),
                                          "model.seq_len=" + std::to_string(kSeq),
                                          "train.micro_batch=" + std::to_string(kBatch),
                                          "train.global_batch=" + std::to_string(kBatch),
                                          "parallel.tensor.size=" + std::to_string(m.size),
                                          "parallel.tensor.mode=" + m.name};
    if (m.name == "2.5d") overrides.push_back("parallel.tensor.depth=" + std::to_string(m.depth));
    config_ = testing::tiny_gpt_config(overrides);
    mesh_ =
        std::make_unique<DeviceMesh>(testing::world_group(), resolve_mesh_shape(config_, m.size));
    factory_ = plan_run(config_, m.size).layers;  // loaded and configured
    factory_->setup(*mesh_, config_);
    dense_ = make_serial_layer_factory();
    dense_->setup(*mesh_, config_);

    const int64_t t = mesh_->coord(Axis::kTP), n = m.size;
    if (m.name == "1d") {
      a_ = Block{};
      c_ = Block{0, 1, t, n};
    } else if (m.name == "2d" || m.name == "2.5d") {
      int64_t q = 1;
      while (q * q * m.depth < n) ++q;
      a_ = Block{t / q, n / q, t % q, q};  // batch over (k, i), features over j
      c_ = a_;
    } else {
      int64_t q = 1;
      while (q * q * q < n) ++q;
      const int64_t i = t / (q * q), j = (t / q) % q, l = t % q;
      a_ = Block{i * q + j, q * q, l, q};
      c_ = Block{i * q + l, q * q, j, q};
    }
  }

  // Builds the dense and the parallel layer from the same seed.
  std::pair<LayerPtr, LayerPtr> make(const std::function<LayerPtr(LayerFactory&)>& build) {
    torch::manual_seed(11);
    LayerPtr dense = build(*dense_);
    torch::manual_seed(11);
    LayerPtr parallel = build(*factory_);
    return {dense, parallel};
  }

  static at::Tensor master(std::vector<int64_t> shape, int seed) {
    torch::manual_seed(seed);
    return torch::randn(shape);
  }

  // Each parameter's gradient is the dense one's slice named by its placement.
  void expect_param_grads(Layer& dense, Layer& parallel) {
    auto dense_params = dense.named_parameters();
    for (const auto& item : parallel.named_modules()) {
      const auto* layer = dynamic_cast<const Layer*>(item.value().get());
      for (const auto& p : item.value()->named_parameters(false)) {
        const std::string name = item.key().empty() ? p.key() : item.key() + "." + p.key();
        ASSERT_TRUE(dense_params.contains(name)) << name;
        const at::Tensor& reference = dense_params[name].grad();
        Placement placement = layer != nullptr && layer->placements().count(p.key())
                                  ? layer->placements().at(p.key())
                                  : Placement::replicated(p.value().sizes().vec());
        ASSERT_TRUE(p.value().grad().defined()) << name << " got no gradient";
        EXPECT_TRUE(
            torch::allclose(p.value().grad(), local_piece(reference, placement), 1e-4, 1e-5))
            << GetParam().name << " " << name << " gradient differs, placement "
            << placement.to_string() << ", rank " << mesh_->rank();
      }
    }
  }

  // Forward and backward of a [batch, seq, in] -> [batch, seq, out] layer.
  void check(const std::string& what, const std::function<LayerPtr(LayerFactory&)>& build,
             int64_t in, int64_t out, const Block& in_block, const Block& out_block) {
    auto [dense, parallel] = make(build);
    at::Tensor x = master({kBatch, kSeq, in}, 1).requires_grad_(true);
    at::Tensor grad = master({kBatch, kSeq, out}, 2);
    at::Tensor local_x = in_block.of(x.detach()).requires_grad_(true);
    at::Tensor y = dense->forward(x);
    at::Tensor local_y = parallel->forward(local_x);
    ASSERT_EQ(local_y.sizes(), out_block.of(y.detach()).sizes()) << what;
    EXPECT_TRUE(torch::allclose(local_y, out_block.of(y.detach()), 1e-4, 1e-5))
        << GetParam().name << " " << what << " forward differs on rank " << mesh_->rank();
    y.backward(grad);
    local_y.backward(out_block.of(grad));
    EXPECT_TRUE(torch::allclose(local_x.grad(), in_block.of(x.grad()), 1e-4, 1e-5))
        << GetParam().name << " " << what << " input gradient differs on rank " << mesh_->rank();
    expect_param_grads(*dense, *parallel);
  }

  RunConfig config_;
  std::unique_ptr<DeviceMesh> mesh_;
  std::shared_ptr<LayerFactory> factory_, dense_;
  Block a_, c_;
};

TEST_P(TpLayers, ColumnLinear) {
  check(
      "column linear",
      [](LayerFactory& f) {
        return f.linear(LinearSpec{kHidden, kInner, true, LinearRole::kColumn, 0.1});
      },
      kHidden, kInner, a_, c_);
}

TEST_P(TpLayers, RowLinear) {
  check(
      "row linear",
      [](LayerFactory& f) {
        return f.linear(LinearSpec{kInner, kHidden, true, LinearRole::kRow, 0.1});
      },
      kInner, kHidden, c_, a_);
}

TEST_P(TpLayers, Mlp) {
  check(
      "mlp",
      [](LayerFactory& f) {
        return f.mlp(MlpSpec{kHidden, kInner, 0.1, 0.05});
      },
      kHidden, kHidden, a_, a_);
}

// model.activation = "gelu" (Hugging Face ViT's): the exact GELU between the
// same cut projections.
TEST_P(TpLayers, MlpExactGelu) {
  check(
      "mlp (exact gelu)",
      [](LayerFactory& f) {
        MlpSpec spec{kHidden, kInner, 0.1, 0.05};
        spec.activation = Activation::kGelu;
        return f.mlp(spec);
      },
      kHidden, kHidden, a_, a_);
}

TEST_P(TpLayers, Attention) {
  check(
      "attention",
      [](LayerFactory& f) {
        return f.attention(AttentionSpec{kHidden, kHeads, 0.1, 0.05});
      },
      kHidden, kHidden, a_, a_);
}

TEST_P(TpLayers, LayerNorm) {
  check(
      "layer norm", [](LayerFactory& f) { return f.layer_norm(kHidden); }, kHidden, kHidden, a_,
      a_);
}

TEST_P(TpLayers, LayerNormWithViTsEps) {
  check(
      "layer norm (eps 1e-12)", [](LayerFactory& f) { return f.layer_norm(kHidden, 1e-12); },
      kHidden, kHidden, a_, a_);
}

TEST_P(TpLayers, EmbeddingOfTokensAndOfPositions) {
  auto [dense, parallel] = make([](LayerFactory& f) { return f.embedding(kVocab, kHidden, 0.1); });
  torch::manual_seed(3);
  at::Tensor ids = torch::randint(kVocab, {kBatch, kSeq}, torch::kInt64);
  at::Tensor positions = torch::arange(kSeq, torch::kInt64);
  at::Tensor grad = master({kBatch, kSeq, kHidden}, 4), grad_pos = master({kSeq, kHidden}, 5);
  at::Tensor y = dense->forward(ids), p = dense->forward(positions);
  at::Tensor local_y = parallel->forward(ids), local_p = parallel->forward(positions);
  EXPECT_TRUE(torch::allclose(local_y, a_.of(y.detach()), 1e-4, 1e-5)) << "token rows";
  EXPECT_TRUE(torch::allclose(local_p, a_.features_of(p.detach()), 1e-4, 1e-5)) << "position rows";
  // Under a batch split, every rank's positions are used by its own rows:
  // the position gradient is the sum over batch blocks, as dense.
  (y * grad).sum().add((p * grad_pos).sum()).backward();
  (local_y * a_.of(grad)).sum().add((local_p * a_.features_of(grad_pos)).sum() / a_.nb).backward();
  expect_param_grads(*dense, *parallel);
}

TEST_P(TpLayers, TiedLogitsAndVocabularyParallelLoss) {
  auto [dense, parallel] = make([](LayerFactory& f) { return f.embedding(kVocab, kHidden, 0.1); });
  at::Tensor h = master({kBatch, kSeq, kHidden}, 6).requires_grad_(true);
  torch::manual_seed(7);
  at::Tensor targets = torch::randint(kVocab, {kBatch, kSeq}, torch::kInt64);
  at::Tensor local_h = a_.of(h.detach()).requires_grad_(true);
  at::Tensor loss = dense_->loss(dense_->tied_logits(h, *dense), targets);
  at::Tensor local_loss = factory_->loss(factory_->tied_logits(local_h, *parallel), targets);
  EXPECT_NEAR(local_loss.item<double>(), loss.item<double>(), 1e-5 * std::abs(loss.item<double>()));
  loss.backward();
  local_loss.backward();
  EXPECT_TRUE(torch::allclose(local_h.grad(), a_.of(h.grad()), 1e-4, 1e-6)) << "hidden gradient";
  expect_param_grads(*dense, *parallel);
}

INSTANTIATE_TEST_SUITE_P(Modes, TpLayers,
                         ::testing::Values(Mode{"1d", 2, 1}, Mode{"1d", 4, 1}, Mode{"2d", 4, 1},
                                           Mode{"2.5d", 8, 2}, Mode{"3d", 8, 1}),
                         [](const ::testing::TestParamInfo<Mode>& info) {
                           std::string mode = info.param.name == "2.5d" ? "2p5d" : info.param.name;
                           return mode + "_" + std::to_string(info.param.size);
                         });

}  // namespace
}  // namespace kolos
