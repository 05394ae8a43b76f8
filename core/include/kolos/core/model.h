// Model: an ordered list of blocks, each a Layer, plus a loss.
//
// The pipeline role cuts the list into stages, ZeRO-3 gathers parameters
// block by block, activation checkpointing wraps blocks. A user's own model
// joins by being expressed the same way (see docs/models.md). Models are
// registered by name so that `[model] name` picks one.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kolos/core/layer_factory.h"

namespace kolos {

struct PlacedParameter {
  std::string name;  // e.g. "h.0.attn.q_proj.weight"
  at::Tensor tensor;
  Placement placement;
  int block = 0;  // index of the block that owns it
};

// Callbacks around each block's forward, installed by a role that must act
// per block (ZeRO-3 gathers a block's parameters before its forward and
// frees them after; "before the backward of block i" is a hook on the
// output tensor that after_forward receives). Called on the forward's
// thread, for every block that Model::forward runs; either may be empty.
struct BlockHooks {
  std::function<void(size_t block, const at::Tensor& input)> before_forward;
  std::function<void(size_t block, const at::Tensor& output)> after_forward;
};

class Model : public torch::nn::Module {
 public:
  using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& targets)>;

  // `repeated`: one of the model's repeated (transformer) blocks, the ones
  // train.recompute acts on. Such a block must own every trainable
  // parameter it reads (recomputation differentiates the block's own).
  void add_block(const std::string& name, LayerPtr block, bool repeated = false);
  void set_loss(LossFn loss) { loss_ = std::move(loss); }

  const std::vector<std::pair<std::string, LayerPtr>>& blocks() const { return blocks_; }
  // Runs blocks [first, last) in order.
  at::Tensor forward(const at::Tensor& input, size_t first = 0, size_t last = SIZE_MAX);
  at::Tensor loss(const at::Tensor& output, const at::Tensor& targets) const;

  // One set of block hooks (a later call replaces it; {} removes it).
  void set_block_hooks(BlockHooks hooks) { hooks_ = std::move(hooks); }
  const BlockHooks& block_hooks() const { return hooks_; }

  // ---- activation recomputation (train.recompute) ---------------------------
  // mode "none", "full" (a chosen block keeps only its input; backward
  // re-runs it) or "selective" (a chosen block's attention core is
  // recomputed); chosen: every `every`-th repeated block, counting from the
  // first (every = 1: all of them). The hooks still run once per block in
  // the forward only: a recomputation does not call them again.
  void set_recompute(const std::string& mode, int64_t every);
  bool recomputes(size_t block) const { return recompute_.at(block); }

  // Every parameter this rank holds, once, in registration order, with its
  // placement (parameters without one are whole and replicated). Without
  // pipelining: every parameter (all_parameters()). With a stage assignment
  // (set_stages): the parameters of this rank's blocks, their placement
  // marked sharded along pp (each stage holds different ones), plus the
  // parameters of other blocks that this rank's blocks read (tied weights,
  // e.g. GPT's token embedding, which the head reads): those stay replicated
  // along pp, every stage that reads them holding a copy.
  std::vector<PlacedParameter> placed_parameters() const;
  // Every parameter of every block, ignoring any stage assignment.
  std::vector<PlacedParameter> all_parameters() const;
  // Those of all_parameters() that block `block` owns.
  std::vector<PlacedParameter> block_parameters(size_t block) const;

  // ---- pipeline parallelism -------------------------------------------------
  // `stage_of_block[b]`: the pp rank that runs block b; `stage`: this rank's.
  void set_stages(std::vector<int> stage_of_block, int stage);
  bool pipelined() const { return !stage_of_.empty(); }
  int stage() const { return stage_; }
  int stage_of(size_t block) const { return pipelined() ? stage_of_.at(block) : 0; }
  bool is_local(size_t block) const { return stage_of(block) == stage_; }
  // The pp ranks that hold a parameter: its block's stage and the stages of
  // every block that reads it (needs block reads for tied weights).
  std::vector<int> holders_of(const PlacedParameter& parameter) const;

  // Which parameters each block reads: one probe forward of every block on
  // `sample` (token ids) walks each block's autograd graph back to its input
  // and collects the parameters it reaches (a block may read another's:
  // tied weights). Only the graph matters, not the values: a parameter
  // whose memory is freed (tensor_storage.h; ZeRO-3 built it sharded, or
  // another pipeline stage holds it) reads zeros from one shared buffer
  // during the probe and is freed again after. Leaves the default CPU RNG
  // as it found it. Also records each block's output shape for `sample`.
  void find_block_reads(const at::Tensor& sample);
  // The forward and backward passes this rank runs in one step, in order,
  // each over blocks [first, last) for one micro-batch; set by a pipeline
  // (set_block_passes), empty otherwise (every block forward, then every
  // block backward, per micro-batch). A schedule that splits backward
  // (zero-bubble) lists an input pass (the input gradient only: the blocks'
  // parameters read, their gradients untouched) and a later weight pass
  // (the parameters' gradients), each running autograd over every block
  // of the pass; a pass that runs no autograd (the first stage's input
  // pass) is not listed.
  struct BlockPass {
    enum Part { kWhole, kInput, kWeight };
    bool backward = false;
    size_t first = 0, last = 0;
    Part part = kWhole;  // of a backward pass
  };
  void set_block_passes(std::vector<BlockPass> passes) { block_passes_ = std::move(passes); }
  const std::vector<BlockPass>& block_passes() const { return block_passes_; }
  bool has_block_reads() const { return !block_reads_.empty(); }
  // [block] -> TensorImpls of the parameters it reads.
  const std::vector<std::vector<const void*>>& block_reads() const { return block_reads_; }

 private:
  // Block b's parameters not in `seen` (added to it), onto `out`.
  void append_parameters(size_t b, std::unordered_set<const void*>& seen,
                         std::vector<PlacedParameter>& out) const;

  std::vector<std::pair<std::string, LayerPtr>> blocks_;
  LossFn loss_;
  BlockHooks hooks_;
  std::vector<bool> repeated_;
  std::vector<bool> recompute_;  // [block]: recomputed under recompute_mode_
  std::string recompute_mode_ = "none";
  std::vector<int> stage_of_;
  int stage_ = 0;
  std::vector<std::vector<const void*>> block_reads_;
  std::vector<BlockPass> block_passes_;
};

using ModelBuilder =
    std::function<std::shared_ptr<Model>(const ModelConfig& config, LayerFactory& factory)>;

// Called by build_model with each block's parameters (Model::block_parameters)
// as soon as the builder adds the block (Model::add_block), before the
// builder builds the next: a role that keeps only part of each parameter
// (ZeRO-3) takes its part there and frees the rest, so that the whole model
// never sits in one process.
using BlockBuilt = std::function<void(const std::vector<PlacedParameter>& parameters)>;

// Registers a model under `name` (the modules library registers "gpt").
void register_model(const std::string& name, ModelBuilder builder);
// Builds `[model] name`; ConfigError listing the known models otherwise.
// `built`, when given, sees each block as it is added (BlockBuilt).
std::shared_ptr<Model> build_model(const ModelConfig& config, LayerFactory& factory,
                                   const BlockBuilt& built = nullptr);
std::vector<std::string> registered_models();
// ConfigError unless a model named config.name is registered.
void check_model_name(const ModelConfig& config);

}  // namespace kolos
