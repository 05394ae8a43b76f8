// Engine: turns a RunConfig into a training run, and is the C++ API.
//
//   config -> mesh -> plugins (layers, pipeline, gradients) -> model (through
//   the layer factory) -> gradient strategy + optimizer -> data -> steps
//
// Construction is collective over `world`. Errors that every rank can find
// on its own (config, plugins, model shape, data) are agreed on before any
// other communication: every rank then throws the same kolos::Error (the one
// the lowest failing rank raised), so a bad run ends on all ranks at once.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kolos/core/data_source.h"
#include "kolos/core/gradient_strategy.h"
#include "kolos/core/mesh.h"
#include "kolos/core/model.h"
#include "kolos/core/precision.h"
#include "kolos/core/roles.h"
#include "kolos/core/run_config.h"
#include "kolos/core/schedule.h"
#include "kolos/core/training_state.h"

namespace kolos {

class SequenceStrategy;  // kolos/core/sequence.h

struct StepMetrics {
  int64_t step = 0;  // 1-based number of the optimizer step just taken
  double loss = 0.0;
  double lr = 0.0;
  double grad_norm = 0.0;  // before clipping
  double step_time_s = 0.0;
  double tokens_per_s = 0.0;
  double idle_fraction = 0.0;
  int64_t peak_rss_bytes = 0;  // max over ranks
  MemoryStats memory;          // this rank's model states
  // This rank's gradient reductions: the fraction of their bytes launched
  // while backward ran (overlap_fraction()) and the time finish_backward()
  // waited for them.
  ReductionStats reduction;
  // ZeRO-3's parameter gathers on this rank: the fraction of their bytes
  // launched ahead of the block that needs them, and the time blocks waited.
  GatherStats gather;
  bool stop = false;  // some rank was asked to stop (signals.h)
  // fp16: the loss scale this step's backward used (0: no loss scaling),
  // and whether the step was skipped because a gradient overflowed.
  double loss_scale = 0.0;
  bool skipped = false;
  // [eval] at this step (Engine::evaluate); < 0: no evaluation ran.
  double eval_loss = -1.0;
  double eval_accuracy = -1.0;  // classifiers only
  // Mixture of experts (moe_blocks > 0): the step's routing over every
  // rank, as the serial run would route it. Over each mixture block's
  // experts, the fewest and most assignments one expert took, and their
  // coefficient of variation (std / mean), averaged over the blocks; the
  // assignments a capacity dropped; the auxiliary losses (coefficients
  // applied) summed over the blocks, mean over the micro-batches.
  int64_t moe_blocks = 0;
  int64_t expert_tokens_min = 0;
  int64_t expert_tokens_max = 0;
  double expert_cv = 0.0;
  int64_t tokens_dropped = 0;
  double aux_loss = 0.0;
};

// A held-out evaluation (forward only), the same on every rank.
struct EvalResult {
  double loss = 0.0;       // mean over the samples
  double accuracy = -1.0;  // classifiers (one prediction per sample); -1 otherwise
  int64_t samples = 0;
};

struct TrainSummary {
  int64_t steps = 0;
  double first_loss = 0.0;
  double final_loss = 0.0;
  double seconds = 0.0;
  double tokens_per_s = 0.0;
  int64_t peak_rss_bytes = 0;
  std::vector<double> losses;  // per step
  bool stopped = false;        // ended early on a stop request
};

// Everything one rank can check on its own, before any communication: the
// mesh for `world_size` ranks, the plugin of every role (choose_plugins,
// loaded from the config's plugin path), each plugin's settings (its
// configure()), and how a step splits into micro-batches. The engine starts
// from it; `kolos check` runs only it. Throws ConfigError / PluginError.
struct RunPlan {
  MeshShape shape;
  RoleChoice roles;
  int64_t accumulation = 1;  // micro-batches per step on each rank
  std::shared_ptr<LayerFactory> layers;
  std::shared_ptr<PipelineSchedule> pipeline;
  std::shared_ptr<GradientStrategy> gradients;
  std::shared_ptr<SequenceStrategy> sequence;  // null when sp = 1; also set on `layers`
};
RunPlan plan_run(const RunConfig& config, int64_t world_size);

class Engine {
 public:
  using DataFactory = std::function<std::unique_ptr<data::TokenSource>(const RunConfig&)>;

  // `make_data`: opens the run's data (kolos::data::make_source from the
  // modules library in `kolos train`).
  Engine(RunConfig config, comm::ProcessGroupPtr world, DataFactory make_data);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // One optimizer step (collective).
  StepMetrics step();
  // The remaining steps of the run with progress on rank 0 and the metrics
  // file; `on_step` (optional) sees every step's metrics on every rank.
  // Ends early, on every rank after the same step, when any rank was asked
  // to stop (SIGTERM/SIGUSR1/SIGINT once install_stop_handlers() ran).
  TrainSummary train(const std::function<void(const StepMetrics&)>& on_step = {});

  // [eval]: the mean loss (and a classifier's accuracy) over the held-out
  // samples, forward only, each sample read by one data-parallel rank and
  // the sums reduced over the mesh; under pipelining each stage runs its
  // blocks and the last stage scores. Collective. ConfigError without an
  // [eval] section.
  EvalResult evaluate();

  // Every parameter as its global tensor, by name, in model order
  // (collective: gathers the pieces of sharded parameters).
  std::vector<std::pair<std::string, at::Tensor>> gathered_parameters();

  const RunConfig& config() const { return config_; }
  const DeviceMesh& mesh() const { return *mesh_; }
  Model& model() { return *model_; }
  const RoleChoice& roles() const { return roles_; }
  int64_t steps_done() const { return step_; }
  int64_t accumulation() const { return accumulation_; }
  std::string describe() const;  // one line: model size, mesh, plugins, batch
  // A JSON object written as the metrics file's first line, {"header": ...}
  // (kolos train writes the plan parallel.auto chose); empty: none.
  void set_metrics_header(std::string json) { metrics_header_ = std::move(json); }

  // What a run resumes from (see training_state.h): this rank's pieces,
  // live, and the scalars. Local (no communication).
  TrainingState state();
  // Applies a state (local): pieces that are not this engine's own live
  // tensors are copied into them (same names and placements required), then
  // the step (and with it the data position: data is addressed by step),
  // the optimizer's step count and, when present, this rank's generator
  // state. A data position that the step and this run's global batch do
  // not reproduce is reported on stderr by mesh rank 0: data continues at
  // step x global batch.
  void load_state(const TrainingState& state);

  // Test hook: the backward of step `step` (0-based) gets its loss
  // multiplied by infinity on this rank, as an fp16 overflow would, so a
  // test can check that every rank skips it. -1 (the default): none.
  void inject_overflow_at_step(int64_t step) { overflow_step_ = step; }

 private:
  std::string metrics_header_;
  std::vector<MicroBatch> next_micro_batches();
  // The step's mixture-of-experts routing into `m` (collective; nothing
  // for a model without mixture blocks). Returns the assignments each
  // expert of each mixture block took, over every rank ([blocks, experts];
  // undefined without mixture blocks).
  at::Tensor add_routing(StepMetrics& m);

  RunConfig config_;
  comm::ProcessGroupPtr world_;
  RoleChoice roles_;
  std::unique_ptr<DeviceMesh> mesh_;
  std::shared_ptr<LayerFactory> factory_;
  std::shared_ptr<PipelineSchedule> schedule_;
  std::shared_ptr<GradientStrategy> gradients_;
  std::shared_ptr<SequenceStrategy> sequence_;  // null when sp = 1
  std::shared_ptr<Model> model_;
  // The mixture blocks' balancing biases (router_biases(), experts.h).
  std::vector<std::pair<std::string, at::Tensor>> router_biases_;
  std::unique_ptr<data::TokenSource> data_;
  std::unique_ptr<data::TokenSource> eval_data_;  // [eval]; null without one
  bool eval_short_noted_ = false;  // the note on unscored held-out rows, printed once
  EvalConfig eval_;
  int64_t accumulation_ = 1;
  int64_t step_ = 0;
  std::unique_ptr<LossScaler> scaler_;  // fp16 only
  at::Device device_{at::kCPU};         // runtime.device
  int64_t overflow_step_ = -1;
};

// The learning rate of step `step` (0-based): linear warm-up over
// optim.warmup_steps, then cosine decay from optim.lr to optim.min_lr at
// train.steps.
double learning_rate_at(const RunConfig& config, int64_t step);

}  // namespace kolos
