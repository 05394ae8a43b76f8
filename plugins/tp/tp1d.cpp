// tp1d: Megatron-style tensor parallelism over the mesh's tp axis.
//
// Column layers keep rows [r*out/n, (r+1)*out/n) of the weight and bias;
// their input enters the parallel region through copy_in (identity forward,
// all-reduce of the input gradient backward). Row layers keep the matching
// columns of the weight, all-reduce their partial output forward (identity
// backward) and add the whole bias after. So attention (q, k, v column on
// one shared input; o row) and the MLP (up column, down row) each cost one
// all-reduce of [batch, seq, hidden] forward and one backward. Heads split
// n ways; layer norms are whole on every rank.
//
// Embeddings split their rows (the vocabulary) into n chunks of
// ceil(rows/n), the last padded (the placement says so); a lookup outside a
// rank's rows gives zeros and the partial rows are all-reduced. The tied LM
// head multiplies the hidden state by the rank's vocabulary rows, so each
// rank holds logits for its slice only, and the loss is the
// vocabulary-parallel cross entropy (three all-reduces of [batch*seq]).
#include <torch/torch.h>

#include "kolos/core/error.h"
#include "kolos/core/layer_factory.h"
#include "kolos/core/mesh.h"
#include "kolos/core/plugin_registry.h"
#include "tp_common.h"
#include "tp_ops.h"

namespace kolos::tp {
namespace {

constexpr AxisSet kTp{Axis::kTP};

class Tp1dLinear : public Layer {
 public:
  Tp1dLinear(const LinearSpec& spec, comm::ProcessGroup& group, int64_t rank)
      : role_(spec.role), input_ready_(spec.input_ready), group_(&group) {
    const int64_t n = group.size();
    Placement w = Placement::replicated({spec.out, spec.in});
    Placement b = Placement::replicated({spec.out});
    if (role_ == LinearRole::kColumn) {
      w = w.split(0, rank, n, kTp);
      b = b.split(0, rank, n, kTp);
    } else if (role_ == LinearRole::kRow) {
      w = w.split(1, rank, n, kTp);
    }
    // Drawn whole, as the serial layer draws it, then cut.
    weight_ = register_placed("weight",
                              local_piece(torch::randn({spec.out, spec.in}) * spec.init_std, w), w);
    if (spec.bias) bias_ = register_placed("bias", local_piece(torch::zeros({spec.out}), b), b);
  }

  at::Tensor forward(const at::Tensor& x) override {
    switch (role_) {
      case LinearRole::kColumn:
        return torch::nn::functional::linear(input_ready_ ? x : copy_in(x, *group_), weight_,
                                             bias_);
      case LinearRole::kRow: {
        at::Tensor y = reduce_out(torch::matmul(x, weight_.t()), *group_);
        return bias_.defined() ? y + bias_ : y;
      }
      case LinearRole::kReplicated:
        break;
    }
    return torch::nn::functional::linear(x, weight_, bias_);
  }

 private:
  LinearRole role_;
  bool input_ready_;
  comm::ProcessGroup* group_;
  at::Tensor weight_, bias_;
};

class Tp1dEmbedding : public Layer {
 public:
  Tp1dEmbedding(int64_t num, int64_t dim, double init_std, comm::ProcessGroup& group, int64_t rank)
      : group_(&group) {
    Placement p = Placement::replicated({num, dim}).shard(0, rank, group.size(), kTp);
    weight_ = register_placed("weight", local_piece(torch::randn({num, dim}) * init_std, p), p);
    offset_ = p.slice(0).offset;
    length_ = p.slice(0).length;
  }
  at::Tensor forward(const at::Tensor& ids) override {
    return reduce_out(masked_embedding(weight_, ids, offset_, length_), *group_);
  }
  // The rows this rank holds, without padding: the LM head's vocabulary slice.
  at::Tensor rows() const { return weight_.narrow(0, 0, length_); }
  int64_t offset() const { return offset_; }

 private:
  comm::ProcessGroup* group_;
  at::Tensor weight_;
  int64_t offset_ = 0, length_ = 0;
};

class Tp1dFactory : public LayerFactory {
 public:
  std::string name() const override { return "tp1d"; }

  void configure(const PluginContext& context) override { configure_tp(context, "1d"); }

  void setup(const DeviceMesh& mesh, const RunConfig& config) override {
    LayerFactory::setup(mesh, config);
    group_ = mesh.group(Axis::kTP).get();
    rank_ = mesh.coord(Axis::kTP);
  }

  LayerPtr linear(const LinearSpec& spec) override {
    return std::make_shared<Tp1dLinear>(spec, *group_, rank_);
  }
  LayerPtr embedding(int64_t num, int64_t dim, double init_std) override {
    return std::make_shared<Tp1dEmbedding>(num, dim, init_std, *group_, rank_);
  }
  at::Tensor column_input(const at::Tensor& x) override { return copy_in(x, *group_); }
  int64_t local_heads(int64_t heads) const override { return heads / group_->size(); }

  at::Tensor tied_logits(const at::Tensor& hidden, Layer& embedding) override {
    auto* table = dynamic_cast<Tp1dEmbedding*>(&embedding);
    KOLOS_CHECK(table != nullptr, "tp1d: the tied LM head needs an embedding made by tp1d");
    vocab_offset_ = table->offset();
    return torch::matmul(copy_in(hidden, *group_), table->rows().t());
  }

  at::Tensor loss(const at::Tensor& logits, const at::Tensor& targets) override {
    return vocab_parallel_cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                        targets.reshape({-1}), vocab_offset_, *group_);
  }

 private:
  comm::ProcessGroup* group_ = nullptr;
  int64_t rank_ = 0;
  int64_t vocab_offset_ = 0;
};

}  // namespace
}  // namespace kolos::tp

KOLOS_DEFINE_PLUGIN("tp1d", "layers", kolos::LayerFactory, kolos::tp::Tp1dFactory,
                    "1D (Megatron) tensor parallelism: column/row layers, vocabulary-parallel "
                    "embedding and loss")
