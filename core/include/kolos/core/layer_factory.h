// Layers and the layer factory: the "layers" role.
//
// Models in modules/ are written once against LayerFactory: they ask it for
// a linear layer of a given role, an embedding, a norm, attention and MLP
// blocks, the tied LM head and the loss. The serial factory (built into the
// core) returns plain dense layers; tensor-parallel plugins return layers
// whose weights are slices of the global weights, with a Placement naming
// each slice. So one model definition runs under every layers plugin.
//
// Weights are initialised from LibTorch's default generator in creation
// order, as the serial model would be, so every plugin can start from the
// same global weights (a parallel factory draws the global weight and keeps
// its slice).
#pragma once

#include <torch/nn/module.h>

#include <map>
#include <memory>
#include <string>

#include "kolos/core/packed_linear.h"
#include "kolos/core/placement.h"
#include "kolos/core/roles.h"
#include "kolos/core/run_config.h"

namespace kolos {

class DeviceMesh;
class SequenceStrategy;  // kolos/core/sequence.h

// A module built by a LayerFactory: one tensor in, one tensor out, and a
// Placement for each parameter registered directly on it. Parameters a Layer
// registers without a placement are whole and replicated.
class Layer : public torch::nn::Module {
 public:
  using torch::nn::Module::Module;
  virtual at::Tensor forward(const at::Tensor& input) = 0;
  const std::map<std::string, Placement>& placements() const { return placements_; }
  // The parameters of this layer and of the layers inside it are held by
  // this rank alone along `axes` (an expert of an expert-parallel mixture,
  // along ep): Model::all_parameters() marks their placements sharded along
  // them without cutting them, so checkpoints write them from here and the
  // gradient norm and the dp plugin treat them as this rank's own.
  void hold_apart_along(AxisSet axes) { held_apart_ = axes; }
  AxisSet held_apart() const { return held_apart_; }

  // Inference on the CPU: packs this layer's own float32 matrix weights for
  // repeated small products (PackedLinear), releasing a weight only the
  // packed copy reads. forward() then gives the same results to rounding,
  // without gradients. Returns whether it packed a linear layer's weight
  // (by default it packs nothing); pack_for_inference(Module&) calls it on
  // every layer of a model once its weights are loaded.
  virtual bool pack_for_inference() { return false; }
  // After pack_for_inference(): the packed table a tied LM head multiplies
  // by (an embedding's weight, [rows, dim]), packed at the first call; null
  // where there is none.
  virtual const PackedLinear* packed_table() const { return nullptr; }

 protected:
  // register_parameter + its placement (local shape must match).
  at::Tensor register_placed(const std::string& name, at::Tensor tensor, Placement placement);

 private:
  std::map<std::string, Placement> placements_;
  AxisSet held_apart_;
};
using LayerPtr = std::shared_ptr<Layer>;

// Layer::pack_for_inference() on every Layer in `root`, itself included.
// Returns how many linear layers it packed (0 where PackedLinear is not
// available).
int64_t pack_for_inference(torch::nn::Module& root);

// Column: output features split across tensor-parallel ranks; row: input
// features split (its output reduced); replicated: whole on every rank.
enum class LinearRole { kColumn, kRow, kReplicated };

struct LinearSpec {
  int64_t in = 0;
  int64_t out = 0;
  bool bias = true;
  LinearRole role = LinearRole::kReplicated;
  double init_std = 0.02;  // weight ~ N(0, init_std), bias = 0
  // The input was already passed through LayerFactory::column_input() (one
  // input shared by several column layers, as attention's q, k and v).
  bool input_ready = false;
};

struct AttentionSpec {
  int64_t hidden = 0;
  int64_t heads = 0;
  double init_std = 0.02;
  double out_init_std = 0.02;  // output projection (scaled for residual depth)
  // Grouped-query attention: k and v have kv_heads heads (0: heads), each
  // shared by heads / kv_heads query heads (LLaMA 2/3).
  int64_t kv_heads = 0;
  bool bias = true;  // biases on the q/k/v/o projections
  // > 0: rotary position embedding of q and k with this base (LLaMA), in
  // Hugging Face's rotate_half layout (see CausalSelfAttention).
  double rope_theta = 0.0;
  // false: bidirectional attention (every token sees every token; ViT). The
  // sequence role refuses it (its strategies run causal attention only).
  bool causal = true;
};

// The MLP's activation between its up and down projections.
enum class Activation {
  kGeluTanh,  // GELU's tanh approximation (torch::gelu(x, "tanh")): GPT-2, kolos's default
  kGelu,      // exact GELU, x * Phi(x) through erf (torch::gelu(x)): Hugging Face ViT's default
};

struct MlpSpec {
  int64_t hidden = 0;
  int64_t inner = 0;
  double init_std = 0.02;
  double out_init_std = 0.02;
  Activation activation = Activation::kGeluTanh;
};

class LayerFactory : public RolePlugin {
 public:
  virtual ~LayerFactory() = default;
  virtual std::string name() const = 0;
  // Called once before any layer is made.
  virtual void setup(const DeviceMesh& mesh, const RunConfig& config);

  virtual LayerPtr linear(const LinearSpec& spec);
  virtual LayerPtr embedding(int64_t num, int64_t dim, double init_std);
  virtual LayerPtr layer_norm(int64_t dim, double eps = 1e-5);
  // RMSNorm (LLaMA): x / sqrt(mean(x^2) + eps) * weight, no bias. A factory
  // that cuts the hidden dimension overrides it as it does layer_norm.
  virtual LayerPtr rms_norm(int64_t dim, double eps = 1e-5);
  // Causal self-attention over [batch, seq, hidden] (q/k/v/o projections from
  // linear() with column/row roles and heads split as local_heads() says).
  virtual LayerPtr attention(const AttentionSpec& spec);
  // GELU MLP: up (column) -> spec.activation -> down (row). Built from
  // linear(), so every factory that cuts linear layers cuts it too.
  virtual LayerPtr mlp(const MlpSpec& spec);
  // Logits of `hidden` against the embedding's weight (tied LM head). May be
  // a slice of the vocabulary under tensor parallelism; loss() knows.
  virtual at::Tensor tied_logits(const at::Tensor& hidden, Layer& embedding);
  // An untied LM head: a bias-free linear hidden -> vocab whose weight
  // [vocab, hidden] is its one parameter "weight", and whose output loss()
  // understands. The default keeps that weight in a table made by
  // embedding() and multiplies through tied_logits(), so it is cut (and its
  // vocabulary padded) exactly as the tied head is under every factory:
  // column-parallel over the vocabulary.
  virtual LayerPtr lm_head(int64_t hidden, int64_t vocab, double init_std);
  // Mean cross entropy of logits [.., vocab(local)] against targets [..].
  virtual at::Tensor loss(const at::Tensor& logits, const at::Tensor& targets);
  // Attention heads held by this rank.
  virtual int64_t local_heads(int64_t heads) const { return heads; }
  // What column layers do to their input before their product (1D: mark
  // the entry of the tensor-parallel region; 2D/3D: gather the input's
  // blocks). A layer feeding one input to several column layers calls it
  // once and builds them with LinearSpec::input_ready. Identity by default.
  virtual at::Tensor column_input(const at::Tensor& x) { return x; }

  // Activations that leave and re-enter the factory's layout, for a model
  // that computes part of its work whole on every tensor-parallel rank (its
  // replicated linear layers: ViT's patch projection, DiT's timestep and
  // adaLN layers). to_local() takes an activation [batch, ..., features]
  // that is whole and equal on every rank to this rank's block of it as
  // the factory's layers lay activations out (its backward gathers the
  // blocks' gradients, so the whole work upstream sees the whole gradient);
  // to_whole() is its inverse (forward gathers, backward keeps this rank's
  // block of a gradient that is equal on every rank). Identity where
  // activations are whole (serial, tp1d).
  virtual at::Tensor to_local(const at::Tensor& whole) { return whole; }
  virtual at::Tensor to_whole(const at::Tensor& local) { return local; }
  // Affine-free layer norm over the features as the factory lays them out
  // (DiT's adaLN blocks): the statistics reduced over the ranks that cut
  // the features.
  virtual at::Tensor normalize(const at::Tensor& x, double eps);
  // The whole logits [rows, .., vocab] from the output of the LM head (or
  // a classifier's head), which may be cut over the vocabulary and the
  // rows; no gradient. Collective over the tensor-parallel ranks.
  virtual at::Tensor whole_logits(const at::Tensor& logits, int64_t vocab) {
    return logits.narrow(-1, 0, vocab);
  }
  // Rows in a batch must be a multiple of this (the grids cut the batch).
  virtual int64_t batch_multiple() const { return 1; }

  // The mesh setup() was given (null before, or for a factory used without
  // one): layers that need a group of their own (a mixture's experts over
  // ep) read it here.
  const DeviceMesh* mesh() const { return mesh_; }

  // The sequence role's strategy (plan_run sets it when sp > 1): the one way
  // layers reach it. sequence() is null without one, and inside a
  // SequenceBypassScope.
  void set_sequence(std::shared_ptr<SequenceStrategy> sequence) { sequence_ = std::move(sequence); }
  SequenceStrategy* sequence() const;
  // The global positions (int64) of the `length` tokens a layer is given:
  // 0..length-1 serially, this rank's slice under sequence parallelism.
  at::Tensor positions(int64_t length) const;

 protected:
  const DeviceMesh* mesh_ = nullptr;

 private:
  std::shared_ptr<SequenceStrategy> sequence_;
};

// The piece of `global` that `placement` names (padding filled with zeros),
// contiguous: how a parallel factory keeps its slice of a weight drawn whole.
at::Tensor local_piece(const at::Tensor& global, const Placement& placement);

// RMSNorm's x / sqrt(mean_square + eps), where mean_square is the mean of
// x^2 over the features computed in float32 (a tensor-parallel factory
// reduces it over its group first): the division is done in float32 and the
// result returned in x's dtype, as transformers' LlamaRMSNorm does. In fp16
// rsqrt's backward cubes its output, which overflows (past 65504) once the
// mean square is under about 6e-4, i.e. for activations of std 0.025 such
// as freshly initialised embeddings.
at::Tensor rms_normalize(const at::Tensor& x, const at::Tensor& mean_square, double eps);

// The built-in serial factory (the default of the "layers" role).
std::shared_ptr<LayerFactory> make_serial_layer_factory();

}  // namespace kolos
