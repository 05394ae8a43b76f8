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
//
// Under sequence mode "megatron" (plugins/sequence/megatron.cpp) the tensor
// group also splits the sequence outside attention and the MLP: the
// embedding's all-reduce becomes a reduce-scatter along the sequence, so the
// residual stream, the norms and the residual adds hold T/n positions; a
// column layer's entry gathers the sequence (all-gather forward,
// reduce-scatter backward) and a row layer's all-reduce becomes a
// reduce-scatter (all-gather backward): the same bytes as the all-reduce
// they replace. The tied LM head gathers the hidden state, so the logits and
// the loss see every position. Parameters whole on every rank that act on
// the split positions (norm weights and biases, row-layer biases) get a
// partial gradient on each rank: copy_in on the parameter where it is used
// sums it over the group. Inside a SequenceBypassScope (probes that run
// whole samples) the layers run as plain 1D.
#include <torch/torch.h>

#include "kolos/core/error.h"
#include "kolos/core/layer_factory.h"
#include "kolos/core/mesh.h"
#include "kolos/core/plugin_registry.h"
#include "kolos/core/roles.h"
#include "kolos/core/sequence.h"
#include "tp_common.h"
#include "tp_ops.h"

namespace kolos::tp {
namespace {

constexpr AxisSet kTp{Axis::kTP};

// Whether activations outside attention and the MLP are split along the
// sequence now: under sequence mode "megatron", outside probes.
bool split_now(bool megatron) { return megatron && !SequenceBypassScope::active(); }

// The sequence dimension of an activation [.., T, features].
int64_t seq_dim(const at::Tensor& x) { return x.dim() - 2; }

// A parameter whole on every rank, as a sequence-split layer uses it: its
// gradient summed over the group's parts of the sequence.
at::Tensor whole(const at::Tensor& p, comm::ProcessGroup& group, bool split) {
  return split && p.defined() ? copy_in(p, group) : p;
}

// A column layer's input entering the parallel region.
at::Tensor enter(const at::Tensor& x, comm::ProcessGroup& group, bool split) {
  return split ? gather(x, group, seq_dim(x)) : copy_in(x, group);
}

class Tp1dLinear : public Layer {
 public:
  Tp1dLinear(const LinearSpec& spec, comm::ProcessGroup& group, int64_t rank, bool megatron)
      : role_(spec.role), input_ready_(spec.input_ready), group_(&group), megatron_(megatron) {
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
    const bool split = split_now(megatron_);
    switch (role_) {
      case LinearRole::kColumn: {
        const at::Tensor input = input_ready_ ? x : enter(x, *group_, split);
        if (packed_.defined()) return packed_(input, bias_);
        return torch::nn::functional::linear(input, weight_, bias_);
      }
      case LinearRole::kRow: {
        at::Tensor partial = packed_.defined() ? packed_(x) : torch::matmul(x, weight_.t());
        at::Tensor y =
            split ? scatter_sum(partial, *group_, seq_dim(partial)) : reduce_out(partial, *group_);
        return bias_.defined() ? y + whole(bias_, *group_, split) : y;
      }
      case LinearRole::kReplicated:
        break;
    }
    // Replicated: whole on every rank, acting on what every rank holds (the
    // residual stream: its slice of it under megatron).
    return torch::nn::functional::linear(x, whole(weight_, *group_, split),
                                         whole(bias_, *group_, split));
  }
  // A column or row layer multiplies by its own slice: packed, it replaces
  // the slice. A replicated one reads the whole weight through whole().
  bool pack_for_inference() override {
    if (role_ == LinearRole::kReplicated || !PackedLinear::packs(weight_)) return false;
    packed_ = PackedLinear(weight_);
    weight_.set_data(torch::empty({0}, weight_.options()));
    return true;
  }

 private:
  LinearRole role_;
  bool input_ready_;
  comm::ProcessGroup* group_;
  bool megatron_;
  at::Tensor weight_, bias_;
  PackedLinear packed_;
};

class Tp1dEmbedding : public Layer {
 public:
  Tp1dEmbedding(int64_t num, int64_t dim, double init_std, comm::ProcessGroup& group, int64_t rank,
                bool megatron)
      : group_(&group), megatron_(megatron) {
    Placement p = Placement::replicated({num, dim}).shard(0, rank, group.size(), kTp);
    weight_ = register_placed("weight", local_piece(torch::randn({num, dim}) * init_std, p), p);
    offset_ = p.slice(0).offset;
    length_ = p.slice(0).length;
  }
  at::Tensor forward(const at::Tensor& ids) override {
    at::Tensor partial = masked_embedding(weight_, ids, offset_, length_);
    // The sequence is the ids' last dimension ([B, T] tokens, [T] positions).
    return split_now(megatron_) ? scatter_sum(partial, *group_, ids.dim() - 1)
                                : reduce_out(partial, *group_);
  }
  // The rows this rank holds, without padding: the LM head's vocabulary slice.
  at::Tensor rows() const { return weight_.narrow(0, 0, length_); }
  int64_t offset() const { return offset_; }
  // The lookup keeps reading the dense slice. A tied head reads a packed
  // copy of the rows, made when it first asks.
  bool pack_for_inference() override {
    // (A pipeline stage that does not hold the table has released it.)
    pack_table_ = PackedLinear::packs(weight_) && length_ > 0;
    return false;
  }
  const PackedLinear* packed_table() const override {
    if (!pack_table_) return nullptr;
    if (!packed_.defined()) packed_ = PackedLinear(rows());
    return &packed_;
  }

 private:
  comm::ProcessGroup* group_;
  bool megatron_;
  bool pack_table_ = false;
  mutable PackedLinear packed_;
  at::Tensor weight_;
  int64_t offset_ = 0, length_ = 0;
};

// The norms of the serial factory, with their parameters whole on every rank
// and used through whole(): the same parameters, names and arithmetic.
class Tp1dLayerNorm : public Layer {
 public:
  Tp1dLayerNorm(int64_t dim, double eps, comm::ProcessGroup& group, bool megatron)
      : dim_(dim), eps_(eps), group_(&group), megatron_(megatron) {
    weight_ = register_placed("weight", torch::ones({dim}), Placement::replicated({dim}));
    bias_ = register_placed("bias", torch::zeros({dim}), Placement::replicated({dim}));
  }
  at::Tensor forward(const at::Tensor& x) override {
    const bool split = split_now(megatron_);
    return torch::layer_norm(x, {dim_}, whole(weight_, *group_, split),
                             whole(bias_, *group_, split), eps_);
  }

 private:
  int64_t dim_;
  double eps_;
  comm::ProcessGroup* group_;
  bool megatron_;
  at::Tensor weight_, bias_;
};

class Tp1dRmsNorm : public Layer {
 public:
  Tp1dRmsNorm(int64_t dim, double eps, comm::ProcessGroup& group, bool megatron)
      : eps_(eps), group_(&group), megatron_(megatron) {
    weight_ = register_placed("weight", torch::ones({dim}), Placement::replicated({dim}));
  }
  at::Tensor forward(const at::Tensor& x) override {
    return rms_normalize(x, x.to(at::kFloat).pow(2).mean(-1, /*keepdim=*/true), eps_) *
           whole(weight_, *group_, split_now(megatron_));
  }

 private:
  double eps_;
  comm::ProcessGroup* group_;
  bool megatron_;
  at::Tensor weight_;
};

class Tp1dFactory : public LayerFactory {
 public:
  std::string name() const override { return "tp1d"; }

  void configure(const PluginContext& context) override { configure_tp(context, "1d"); }

  void setup(const DeviceMesh& mesh, const RunConfig& config) override {
    LayerFactory::setup(mesh, config);
    group_ = mesh.group(Axis::kTP).get();
    rank_ = mesh.coord(Axis::kTP);
    // The megatron plugin checked, in its configure, that this is its group.
    megatron_ = choose_plugins(config).sequence == "megatron";
  }

  LayerPtr linear(const LinearSpec& spec) override {
    return std::make_shared<Tp1dLinear>(spec, *group_, rank_, megatron_);
  }
  LayerPtr embedding(int64_t num, int64_t dim, double init_std) override {
    return std::make_shared<Tp1dEmbedding>(num, dim, init_std, *group_, rank_, megatron_);
  }
  LayerPtr layer_norm(int64_t dim, double eps) override {
    if (!megatron_) return LayerFactory::layer_norm(dim, eps);
    return std::make_shared<Tp1dLayerNorm>(dim, eps, *group_, megatron_);
  }
  LayerPtr rms_norm(int64_t dim, double eps) override {
    if (!megatron_) return LayerFactory::rms_norm(dim, eps);
    return std::make_shared<Tp1dRmsNorm>(dim, eps, *group_, megatron_);
  }
  at::Tensor column_input(const at::Tensor& x) override {
    return enter(x, *group_, split_now(megatron_));
  }
  int64_t local_heads(int64_t heads) const override { return heads / group_->size(); }

  at::Tensor tied_logits(const at::Tensor& hidden, Layer& embedding) override {
    auto* table = dynamic_cast<Tp1dEmbedding*>(&embedding);
    KOLOS_CHECK(table != nullptr, "tp1d: the tied LM head needs an embedding made by tp1d");
    vocab_offset_ = table->offset();
    // Under megatron the hidden state is gathered: every rank's vocabulary
    // slice of the logits covers every position, against whole targets.
    const at::Tensor input = enter(hidden, *group_, split_now(megatron_));
    if (const PackedLinear* rows = table->packed_table()) return (*rows)(input);
    return torch::matmul(input, table->rows().t());
  }

  at::Tensor whole_logits(const at::Tensor& logits, int64_t vocab) override {
    return gather_vocabulary(logits, vocab, *group_);
  }

  at::Tensor loss(const at::Tensor& logits, const at::Tensor& targets) override {
    return vocab_parallel_cross_entropy(logits.flatten(0, -2),
                                        targets.reshape({-1}), vocab_offset_, *group_);
  }

 private:
  comm::ProcessGroup* group_ = nullptr;
  int64_t rank_ = 0;
  int64_t vocab_offset_ = 0;
  bool megatron_ = false;
};

}  // namespace
}  // namespace kolos::tp

KOLOS_DEFINE_PLUGIN("tp1d", "layers", kolos::LayerFactory, kolos::tp::Tp1dFactory,
                    "1D (Megatron) tensor parallelism: column/row layers, vocabulary-parallel "
                    "embedding and loss")
