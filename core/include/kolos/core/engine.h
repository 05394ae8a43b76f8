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

#include <mpi.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kolos/core/data_source.h"
#include "kolos/core/gradients.h"
#include "kolos/core/mesh.h"
#include "kolos/core/model.h"
#include "kolos/core/run_config.h"
#include "kolos/core/schedule.h"

namespace kolos {

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
  bool stop = false;           // some rank was asked to stop (signals.h)
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

// Which plugin serves each role for a config (built-ins: "serial",
// "single-stage"), honouring [plugins] overrides.
struct RoleChoice {
  std::string layers, pipeline, gradients, sequence;
};
RoleChoice choose_plugins(const RunConfig& config);

class Engine {
 public:
  using DataFactory = std::function<std::unique_ptr<data::TokenSource>(const RunConfig&)>;

  // `make_data`: opens the run's data (kolos::data::make_source from the
  // modules library in `kolos train`).
  Engine(RunConfig config, MPI_Comm world, DataFactory make_data);
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

  // Every parameter as its global tensor, by name, in model order
  // (collective: gathers the pieces of sharded parameters).
  std::vector<std::pair<std::string, at::Tensor>> gathered_parameters();

  const RunConfig& config() const { return config_; }
  const DeviceMesh& mesh() const { return *mesh_; }
  Model& model() { return *model_; }
  const RoleChoice& roles() const { return roles_; }
  int64_t steps_done() const { return step_; }
  // Checkpoints (libkolos_checkpoint): the gradients strategy holds the
  // parameters at rest and the optimizer state; the communicator the engine
  // was built on; setting the step moves the data position with it (data is
  // addressed by step, see next_micro_batches).
  GradientStrategy& gradients() { return *gradients_; }
  MPI_Comm comm() const { return world_; }
  void set_steps_done(int64_t step) { step_ = step; }
  int64_t accumulation() const { return accumulation_; }
  std::string describe() const;  // one line: model size, mesh, plugins, batch

 private:
  std::vector<MicroBatch> next_micro_batches();
  double lr_at(int64_t step) const;

  RunConfig config_;
  MPI_Comm world_;
  RoleChoice roles_;
  std::unique_ptr<DeviceMesh> mesh_;
  std::shared_ptr<LayerFactory> factory_;
  std::shared_ptr<PipelineSchedule> schedule_;
  std::shared_ptr<GradientStrategy> gradients_;
  std::shared_ptr<Model> model_;
  std::unique_ptr<data::TokenSource> data_;
  int64_t accumulation_ = 1;
  int64_t step_ = 0;
};

// Global tensor of a local piece (collective over the placement's sharded
// axes; the whole tensor when it is not sharded).
at::Tensor gather_global(const at::Tensor& local, const Placement& placement,
                         const DeviceMesh& mesh);
// The same over `axes` only, a subset of the sharded axes whose other
// pieces this rank's group holds (a pipeline stage gathers its parameters
// over the axes besides pp).
at::Tensor gather_global(const at::Tensor& local, const Placement& placement,
                         const DeviceMesh& mesh, AxisSet axes);

}  // namespace kolos
