#include "tp_grid.h"

#include <torch/torch.h>

#include <array>

#include "kolos/core/error.h"
#include "kolos/core/mesh.h"
#include "tp_common.h"
#include "tp_ops.h"

namespace kolos::tp {
namespace {

constexpr AxisSet kTp{Axis::kTP};

}  // namespace

void Grid::build(const DeviceMesh& mesh, std::vector<int64_t> dims, const std::string& names) {
  dims_ = std::move(dims);
  int64_t t = mesh.coord(Axis::kTP);
  coord_.assign(dims_.size(), 0);
  for (size_t d = dims_.size(); d-- > 0;) {
    coord_[d] = t % dims_[d];
    t /= dims_[d];
  }
  const Mask all = (1u << dims_.size()) - 1;
  groups_.assign(all + 1, nullptr);
  for (Mask m = 1; m <= all; ++m) {
    std::string label = "tp[";
    for (size_t d = 0; d < dims_.size(); ++d) {
      if (m & (1u << d)) label += names[d];
    }
    label += "]";
    groups_[m] = mesh.split(kTp, index(all & ~m), index(m), label);
  }
}

namespace {
class GridLinear : public Layer {
 public:
  GridLinear(const LinearSpec& spec, const Grid& grid, const LinearPlan& plan)
      : grid_(&grid), plan_(plan), input_ready_(spec.input_ready) {
    Placement w = Placement::replicated({spec.out, spec.in})
                      .split(0, grid.index(plan.out), grid.size(plan.out), kTp);
    if (plan.in != 0) w = w.split(1, grid.index(plan.in), grid.size(plan.in), kTp);
    out_rows_ = w.slice(0).length;
    w = w.shard(0, grid.index(plan.w_rest), grid.size(plan.w_rest), kTp);
    weight_ = register_placed("weight",
                              local_piece(torch::randn({spec.out, spec.in}) * spec.init_std, w), w);
    if (spec.bias) {
      Placement b = Placement::replicated({spec.out})
                        .split(0, grid.index(plan.out), grid.size(plan.out), kTp)
                        .shard(0, grid.index(plan.bias_rest), grid.size(plan.bias_rest), kTp);
      bias_ = register_placed("bias", local_piece(torch::zeros({spec.out}), b), b);
    }
  }

  at::Tensor forward(const at::Tensor& x) override {
    const at::Tensor input =
        input_ready_ ? x : gather(x, grid_->group(plan_.x_gather), plan_.x_dim);
    at::Tensor w = gather(weight_, grid_->group(plan_.w_rest), 0).narrow(0, 0, out_rows_);
    at::Tensor y = torch::matmul(input, w.t());
    if (plan_.y_scatter != 0) y = scatter_sum(y, grid_->group(plan_.y_scatter), 0);
    if (bias_.defined()) {
      y = y + gather(bias_, grid_->group(plan_.bias_rest), 0).narrow(0, 0, out_rows_);
    }
    return y;
  }

 private:
  const Grid* grid_;
  LinearPlan plan_;
  bool input_ready_;
  int64_t out_rows_ = 0;
  at::Tensor weight_, bias_;
};

// (x - mean) / sqrt(var + eps) over the whole feature dimension of `dim`
// features, which `features` cuts: the statistics all-reduced over it.
at::Tensor grid_normalize(const at::Tensor& x, int64_t dim, double eps,
                          comm::ProcessGroup& features) {
  const double n = static_cast<double>(dim);
  at::Tensor mean = all_reduce_2(x.sum(-1, /*keepdim=*/true), features) / n;
  at::Tensor centred = x - mean;
  at::Tensor var = all_reduce_2((centred * centred).sum(-1, true), features) / n;
  return centred * torch::rsqrt(var + eps);
}

// LayerNorm (weight and bias) or RMSNorm (weight only) on the grid: the
// statistics over the whole feature dimension (all-reduced over F, which
// cuts it); the parameters cut as the features are, and sharded over the
// batch group B, gathered for each forward.
class GridNorm : public Layer {
 public:
  enum class Kind { kLayer, kRms };
  GridNorm(Kind kind, int64_t dim, double eps, const Grid& grid, Mask features, Mask batch)
      : kind_(kind), grid_(&grid), features_(features), batch_(batch), dim_(dim), eps_(eps) {
    Placement p =
        Placement::replicated({dim}).split(0, grid.index(features), grid.size(features), kTp);
    rows_ = p.slice(0).length;
    p = p.shard(0, grid.index(batch), grid.size(batch), kTp);
    weight_ = register_placed("weight", local_piece(torch::ones({dim}), p), p);
    if (kind == Kind::kLayer) {
      bias_ = register_placed("bias", local_piece(torch::zeros({dim}), p), p);
    }
  }

  at::Tensor forward(const at::Tensor& x) override {
    comm::ProcessGroup& b = grid_->group(batch_);
    comm::ProcessGroup& f = grid_->group(features_);
    at::Tensor gamma = gather(weight_, b, 0).narrow(0, 0, rows_);
    if (kind_ == Kind::kRms) {
      const double n = static_cast<double>(dim_);
      at::Tensor mean_square =
          all_reduce_2(x.to(at::kFloat).pow(2).sum(-1, /*keepdim=*/true), f) / n;
      return rms_normalize(x, mean_square, eps_) * gamma;
    }
    at::Tensor beta = gather(bias_, b, 0).narrow(0, 0, rows_);
    return grid_normalize(x, dim_, eps_, f) * gamma + beta;
  }

 private:
  Kind kind_;
  const Grid* grid_;
  Mask features_, batch_;
  int64_t dim_;
  double eps_;
  int64_t rows_ = 0;
  at::Tensor weight_, bias_;
};

class GridEmbedding : public Layer {
 public:
  GridEmbedding(int64_t num, int64_t dim, double init_std, const Grid& grid, Mask features,
                Mask batch)
      : grid_(&grid), batch_(batch) {
    Placement p = Placement::replicated({num, dim})
                      .shard(0, grid.index(batch), grid.size(batch), kTp)
                      .split(1, grid.index(features), grid.size(features), kTp);
    weight_ = register_placed("weight", local_piece(torch::randn({num, dim}) * init_std, p), p);
    offset_ = p.slice(0).offset;
    length_ = p.slice(0).length;
  }

  // ids [batch, seq] -> [batch/B, seq, features/F]; ids [seq] (no batch,
  // e.g. positions) -> [seq, features/F] on every rank.
  at::Tensor forward(const at::Tensor& ids) override {
    at::Tensor partial = masked_embedding(weight_, ids, offset_, length_);
    comm::ProcessGroup& b = grid_->group(batch_);
    return ids.dim() >= 2 ? scatter_sum(partial, b, 0) : all_reduce_2(partial, b);
  }
  at::Tensor rows() const { return weight_.narrow(0, 0, length_); }
  int64_t offset() const { return offset_; }

 private:
  const Grid* grid_;
  Mask batch_;
  at::Tensor weight_;
  int64_t offset_ = 0, length_ = 0;
};

}  // namespace

std::string GridFactory::name() const {
  switch (mode_) {
    case GridMode::k2d:
      return "tp2d";
    case GridMode::k2p5d:
      return "tp2p5d";
    case GridMode::k3d:
      return "tp3d";
  }
  return "tp";
}

std::string GridFactory::mode_name() const {
  return mode_ == GridMode::k2d ? "2d" : mode_ == GridMode::k2p5d ? "2.5d" : "3d";
}

void GridFactory::configure(const PluginContext& context) {
  depth_ = configure_tp(context, mode_name()).depth;
}

void GridFactory::setup(const DeviceMesh& mesh, const RunConfig& config) {
  LayerFactory::setup(mesh, config);
  const int64_t depth = depth_;
  q_ = grid_side(mode_name(), depth, mesh.size(Axis::kTP));
  KOLOS_CHECK(q_ > 0, name(), ": setup() on a tp axis of ", mesh.size(Axis::kTP),
              " ranks, which configure() did not check");
  std::vector<int64_t> dims;
  std::string names;
  // Bits: dimension d of `dims` is bit d (see tp_grid.h for the layouts).
  switch (mode_) {
    case GridMode::k2d:
      dims = {q_, q_}, names = "ij", batch_ = 0b01, features_ = 0b10;
      column_ = row_ = {features_, -1, features_, 0, batch_, 0, batch_};
      break;
    case GridMode::k2p5d:
      dims = {depth, q_, q_}, names = "kij", batch_ = 0b011, features_ = 0b100;
      column_ = row_ = {features_, -1, features_, 0, batch_, 0, batch_};
      break;
    case GridMode::k3d: {
      dims = {q_, q_, q_}, names = "ijl", batch_ = 0b011, features_ = 0b100;
      const Mask i = 0b001, j = 0b010, l = 0b100;
      column_ = {j, 0, j, l, i, l, i | l};
      row_ = {l, 0, l, j, i, j, i | j};
      break;
    }
  }
  // The groups are created once, collectively (every rank runs setup).
  grid_.build(mesh, dims, names);
}

LayerPtr GridFactory::linear(const LinearSpec& spec) {
  // Replicated: whole on every rank, fed whole inputs (to_whole()).
  if (spec.role == LinearRole::kReplicated) return LayerFactory::linear(spec);
  return std::make_shared<GridLinear>(spec, grid_, spec.role == LinearRole::kRow ? row_ : column_);
}
LayerPtr GridFactory::embedding(int64_t num, int64_t dim, double init_std) {
  return std::make_shared<GridEmbedding>(num, dim, init_std, grid_, features_, batch_);
}
LayerPtr GridFactory::layer_norm(int64_t dim, double eps) {
  return std::make_shared<GridNorm>(GridNorm::Kind::kLayer, dim, eps, grid_, features_, batch_);
}
LayerPtr GridFactory::rms_norm(int64_t dim, double eps) {
  return std::make_shared<GridNorm>(GridNorm::Kind::kRms, dim, eps, grid_, features_, batch_);
}
at::Tensor GridFactory::column_input(const at::Tensor& x) {
  return gather(x, grid_.group(column_.x_gather), column_.x_dim);
}

at::Tensor GridFactory::to_local(const at::Tensor& whole) {
  return split(split(whole, grid_.group(batch_), 0), grid_.group(features_), -1);
}

at::Tensor GridFactory::to_whole(const at::Tensor& local) {
  return gather_replicated(gather_replicated(local, grid_.group(features_), -1),
                           grid_.group(batch_), 0);
}

at::Tensor GridFactory::normalize(const at::Tensor& x, double eps) {
  const int64_t features = x.size(-1) * grid_.size(features_);
  return grid_normalize(x, features, eps, grid_.group(features_));
}

at::Tensor GridFactory::whole_logits(const at::Tensor& logits, int64_t vocab) {
  // [rows/F, .., vocab/B]: the vocabulary cut over B as the embedding
  // table's rows, the rows over F as loss() reads them.
  torch::NoGradGuard no_grad;
  return gather(gather_vocabulary(logits, vocab, grid_.group(batch_)), grid_.group(features_), 0);
}

at::Tensor GridFactory::tied_logits(const at::Tensor& hidden, Layer& embedding) {
  auto* table = dynamic_cast<GridEmbedding*>(&embedding);
  KOLOS_CHECK(table != nullptr, name(), ": the tied LM head needs an embedding made by ", name());
  vocab_offset_ = table->offset();
  at::Tensor whole_batch = gather(hidden, grid_.group(batch_), 0);
  at::Tensor partial = torch::matmul(whole_batch, table->rows().t());
  return scatter_sum(partial, grid_.group(features_), 0);  // [batch/F, seq, vocab/B]
}

at::Tensor GridFactory::loss(const at::Tensor& logits, const at::Tensor& targets) {
  // This rank's logits are batch block index(F) of the micro-batch.
  const int64_t rows = targets.size(0) / grid_.size(features_);
  at::Tensor mine = targets.narrow(0, grid_.index(features_) * rows, rows);
  at::Tensor ce =
      vocab_parallel_cross_entropy(logits.flatten(0, -2), mine.reshape({-1}),
                                   vocab_offset_, grid_.group(batch_));
  return average(ce, grid_.group(features_));
}

}  // namespace kolos::tp
