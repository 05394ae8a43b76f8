// The process-grid tensor-parallel factories: 2D (SUMMA / Optimus, q x q),
// 2.5D (Tesseract, depth x q x q) and 3D (q x q x q).
//
// The tp axis is laid out as a grid (rank index row-major over the grid's
// dimensions). Activations [batch, seq, hidden] are cut on it: the batch
// over the grid dimensions B, the hidden features over F:
//
//   mode   grid (t = row-major)   B (batch, vocabulary)   F (features)
//   2d     (i, j)                 i            q           j   q
//   2.5d   (k, i, j)              k, i         d*q         j   q
//   3d     (i, j, l)              i, j         q^2         l   q
//
// A linear layer computes its block of Y = X W^T from gathered blocks
// (differentiable all-gathers, whose backward is the reduce-scatter that
// sums the partial gradients):
//   2d, 2.5d  gather X's row over F (the SUMMA row broadcasts, all k steps
//             in one collective), gather W's block column over B (the
//             column broadcasts); Y keeps the layout. Same for column and
//             row roles.
//   3d        column: gather X over j (batch), gather W_(l,j) over i,
//             multiply, reduce-scatter the partial sum over l (batch): Y's
//             batch is then cut over (i, l) and its features over j. A row
//             layer swaps j and l, so attention and the MLP (column then
//             row) return to the layout they started from.
// Every weight, bias and norm parameter of a column or row layer, an
// embedding or a norm is cut over the whole grid (its block, cut again over
// the grid dimensions that would otherwise hold copies, padded where it
// does not divide), so each global element lives on exactly one tp rank and
// the placements name disjoint slices. Layer norms
// all-reduce their statistics over F (RMSNorm its mean square). Embeddings
// cut the vocabulary over B and features over F, reduce-scatter lookups over
// B to the batch layout; the tied LM head (and the untied one, whose weight
// is such a table: LayerFactory::lm_head) gathers the hidden state over B,
// multiplies by the rank's vocabulary rows and reduce-scatters over F, so
// the loss is a vocabulary-parallel cross entropy over B, averaged over F.
// A linear layer of the replicated role is whole on every rank and works on
// whole activations: a model moves them out of and into the layout with
// to_whole() and to_local() (ViT's patch projection, DiT's timestep and
// adaLN layers), so their gradients are equal on every tp rank.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kolos/core/layer_factory.h"
#include "kolos/core/mesh.h"

namespace kolos::tp {

enum class GridMode { k2d, k2p5d, k3d };

using Mask = unsigned;  // a set of grid dimensions, bit d = dimension d

// The tp axis as a grid, with one process group per non-empty set of its
// dimensions (created collectively at setup, through the mesh).
class Grid {
 public:
  // Collective over the mesh (MPI_Comm_split through DeviceMesh::split).
  void build(const DeviceMesh& mesh, std::vector<int64_t> dims, const std::string& names);
  comm::ProcessGroup& group(Mask m) const { return *groups_.at(m); }
  // Row-major index of this rank over the dimensions in `m`.
  int64_t index(Mask m) const {
    int64_t i = 0;
    for (size_t d = 0; d < dims_.size(); ++d) {
      if (m & (1u << d)) i = i * dims_[d] + coord_[d];
    }
    return i;
  }
  int64_t size(Mask m) const {
    int64_t n = 1;
    for (size_t d = 0; d < dims_.size(); ++d) {
      if (m & (1u << d)) n *= dims_[d];
    }
    return n;
  }

 private:
  std::vector<int64_t> dims_, coord_;
  std::vector<comm::ProcessGroupPtr> groups_;
};

// How one linear layer cuts and moves its operands (see above).
struct LinearPlan {
  Mask x_gather = 0;   // X gathered over these dimensions...
  int64_t x_dim = 0;   // ...along this dimension of [batch, seq, features]
  Mask out = 0;        // output features cut over
  Mask in = 0;         // input features cut over (0: whole)
  Mask w_rest = 0;     // the weight block cut again over (gathered before use)
  Mask y_scatter = 0;  // partial output reduce-scattered over, along batch (0: none)
  Mask bias_rest = 0;  // the bias block cut again over
};

class GridFactory : public LayerFactory {
 public:
  explicit GridFactory(GridMode mode) : mode_(mode) {}
  std::string name() const override;
  void configure(const PluginContext& context) override;
  void setup(const DeviceMesh& mesh, const RunConfig& config) override;
  LayerPtr linear(const LinearSpec& spec) override;
  LayerPtr embedding(int64_t num, int64_t dim, double init_std) override;
  LayerPtr layer_norm(int64_t dim, double eps) override;
  LayerPtr rms_norm(int64_t dim, double eps) override;
  at::Tensor column_input(const at::Tensor& x) override;
  at::Tensor to_local(const at::Tensor& whole) override;
  at::Tensor to_whole(const at::Tensor& local) override;
  at::Tensor normalize(const at::Tensor& x, double eps) override;
  at::Tensor whole_logits(const at::Tensor& logits, int64_t vocab) override;
  int64_t batch_multiple() const override { return grid_.size(batch_); }
  int64_t local_heads(int64_t heads) const override { return heads / q_; }
  at::Tensor tied_logits(const at::Tensor& hidden, Layer& embedding) override;
  at::Tensor loss(const at::Tensor& logits, const at::Tensor& targets) override;

  const Grid& grid() const { return grid_; }

 private:
  std::string mode_name() const;

  GridMode mode_;
  int64_t q_ = 1;
  int64_t depth_ = 1;  // 2.5d: from [parallel.tensor] depth
  Grid grid_;
  Mask batch_ = 0, features_ = 0;
  LinearPlan column_{}, row_{};
  int64_t vocab_offset_ = 0;
};

}  // namespace kolos::tp
