#include "kolos/core/engine.h"

#include <sys/resource.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <map>
#include <sstream>

#include "kolos/core/error.h"
#include "kolos/core/plugin.h"
#include "kolos/core/runtime.h"
#include "kolos/core/signals.h"
#include "engine_detail.h"

namespace kolos {
namespace {

constexpr const char* kBuiltinLayers = "serial";
constexpr const char* kBuiltinPipeline = "single-stage";

std::string tensor_plugin_name(const TensorParallelConfig& tp) {
  if (tp.mode == "1d") return "tp1d";
  if (tp.mode == "2d") return "tp2d";
  if (tp.mode == "2.5d") return "tp2p5d";
  if (tp.mode == "3d") return "tp3d";
  return "tp" + tp.mode;
}

int64_t peak_rss_bytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

// Runs `body`; then every rank of `world` learns whether any rank failed.
// If one did, every rank throws the error of the lowest failing rank.
template <typename Body>
void agreed(MPI_Comm world, Body&& body) {
  std::string error;
  int kind = static_cast<int>(ErrorKind::kGeneric);
  try {
    body();
  } catch (const Error& e) {
    error = e.what();
    kind = static_cast<int>(e.kind());
  } catch (const std::exception& e) {
    error = error_text(e);
  }
  detail::agree_on_error(world, error, kind);
}

// Global L2 norm when stages hold different parameters (and some hold copies
// of tied ones): each piece is counted by one rank of the ranks that hold the
// same piece, the one at coordinate 0 on every axis the piece is not sharded
// along (the rank that checkpoints it), and the squares are summed over the
// world.
double pipelined_grad_norm(const std::vector<GradPiece>& pieces, const DeviceMesh& mesh) {
  const Coords coords = mesh.layout().coords(mesh.rank());
  std::vector<at::Tensor> norms;
  for (const auto& piece : pieces) {
    if (!piece.grad.defined() || piece.grad.numel() == 0) continue;
    bool counts = true;
    for (int a = 0; a < kNumAxes; ++a) {
      if (!piece.placement.sharded().contains(static_cast<Axis>(a)) && coords[a] != 0) {
        counts = false;
      }
    }
    if (counts) norms.push_back(piece.grad.norm().to(torch::kDouble));
  }
  at::Tensor sum = norms.empty() ? torch::zeros({1}, torch::kDouble)
                                 : torch::stack(norms).pow(2).sum().reshape({1});
  mesh.world()->all_reduce(sum, comm::ReduceOp::kSum)->wait();
  return std::sqrt(sum.item<double>());
}

}  // namespace

RoleChoice choose_plugins(const RunConfig& config) {
  RoleChoice choice;
  const auto& p = config.parallel;
  choice.layers = p.tensor.size > 1 ? tensor_plugin_name(p.tensor) : kBuiltinLayers;
  choice.pipeline = p.pipeline.size > 1 ? "pipeline" : kBuiltinPipeline;
  choice.gradients = p.zero.stage > 0 ? "zero" + std::to_string(p.zero.stage) : "dp";
  choice.sequence = p.sequence.size > 1 ? "sequence" : "";
  const auto& by_role = config.plugins.by_role;
  if (by_role.count("layers")) choice.layers = by_role.at("layers");
  if (by_role.count("pipeline")) choice.pipeline = by_role.at("pipeline");
  if (by_role.count("gradients")) choice.gradients = by_role.at("gradients");
  if (by_role.count("sequence")) choice.sequence = by_role.at("sequence");
  return choice;
}

Engine::Engine(RunConfig config, MPI_Comm world, DataFactory make_data)
    : config_(std::move(config)), world_(world) {
  int world_size = 1;
  MPI_Comm_size(world_, &world_size);
  MeshShape shape;
  PluginRegistry registry(config_.plugins.path);

  // Phase 1, local only: everything a rank can check on its own.
  agreed(world_, [&] {
    shape = resolve_mesh_shape(config_, world_size);
    const int64_t per_step = config_.train.micro_batch * shape.dp;
    if (config_.train.global_batch % per_step != 0) {
      throw ConfigError(config_.source + ": train.global_batch = " +
                        std::to_string(config_.train.global_batch) +
                        " is not a multiple of train.micro_batch (" +
                        std::to_string(config_.train.micro_batch) + ") x data-parallel size (" +
                        std::to_string(shape.dp) + ") = " + std::to_string(per_step) +
                        "; use a global_batch of " + std::to_string(per_step) + " or " +
                        std::to_string(2 * per_step));
    }
    accumulation_ = config_.train.global_batch / per_step;
    const int64_t pipeline_micro = config_.parallel.pipeline.microbatches;
    if (pipeline_micro > 0 && pipeline_micro != accumulation_) {
      // The batch settings decide; microbatches is a check (or 0: derived).
      throw ConfigError(
          config_.source + ": parallel.pipeline.microbatches = " + std::to_string(pipeline_micro) +
          ", but train.global_batch = " + std::to_string(config_.train.global_batch) +
          " / (train.micro_batch = " + std::to_string(config_.train.micro_batch) +
          " x data-parallel size " + std::to_string(shape.dp) + ") gives " +
          std::to_string(accumulation_) +
          " micro-batches per step; set microbatches = " + std::to_string(accumulation_) +
          " (or 0 to derive it), or global_batch = " + std::to_string(pipeline_micro * per_step));
    }
    if (config_.train.precision != "fp32") {
      throw ConfigError(config_.source + ": train.precision = \"" + config_.train.precision +
                        "\" is not available yet; this version trains in fp32 only");
    }
    roles_ = choose_plugins(config_);
    if (!roles_.sequence.empty()) {
      registry.create<void>("sequence", roles_.sequence);  // no interface yet: fails by name
      throw PluginError("plugin `" + roles_.sequence +
                        "` (role sequence) was found, but this core has no sequence role yet");
    }
    factory_ = roles_.layers == kBuiltinLayers
                   ? make_serial_layer_factory()
                   : registry.create<LayerFactory>("layers", roles_.layers);
    schedule_ = roles_.pipeline == kBuiltinPipeline
                    ? make_single_stage_schedule()
                    : registry.create<PipelineSchedule>("pipeline", roles_.pipeline);
    gradients_ = registry.create<GradientStrategy>("gradients", roles_.gradients);
    data_ = make_data(config_);
    KOLOS_CHECK_KIND(kData, data_ != nullptr, "no data source for data.kind = ",
                     config_.data.kind);
    KOLOS_CHECK_EQ(data_->seq_len(), config_.model.seq_len, "the data source's sample length");
  });

  // Collective: communicators for every axis set.
  mesh_ = std::make_unique<DeviceMesh>(world_, shape);

  // Phase 2: the model, identically initialised on every rank.
  agreed(world_, [&] {
    factory_->setup(*mesh_, config_);
    torch::manual_seed(config_.train.seed);
    model_ = build_model(config_.model, *factory_);
    schedule_->setup(*model_, *mesh_, config_);
  });
  gradients_->setup(*model_, *mesh_, config_);
}

Engine::~Engine() = default;

double Engine::lr_at(int64_t step) const {
  const auto& o = config_.optim;
  if (step < o.warmup_steps) return o.lr * static_cast<double>(step + 1) / o.warmup_steps;
  const int64_t decay = std::max<int64_t>(1, config_.train.steps - o.warmup_steps);
  const double progress =
      std::min(1.0, static_cast<double>(step - o.warmup_steps) / static_cast<double>(decay));
  return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(M_PI * progress));
}

std::vector<MicroBatch> Engine::next_micro_batches() {
  const int64_t mb = config_.train.micro_batch;
  const int64_t seq = config_.model.seq_len;
  const int64_t dp = mesh_->size(Axis::kDP);
  const int64_t dp_index = mesh_->coord(Axis::kDP);
  const int64_t first = step_ * config_.train.global_batch;
  std::vector<MicroBatch> batches;
  batches.reserve(accumulation_);
  for (int64_t m = 0; m < accumulation_; ++m) {
    at::Tensor tokens = torch::empty({mb, seq + 1}, torch::kInt64);
    int64_t* out = tokens.data_ptr<int64_t>();
    // Micro-batch m of the step holds global samples [m*dp*mb, (m+1)*dp*mb);
    // dp rank r reads its mb of them.
    for (int64_t i = 0; i < mb; ++i) {
      data_->sample(first + (m * dp + dp_index) * mb + i, out + i * (seq + 1));
    }
    batches.push_back(MicroBatch{tokens.narrow(1, 0, seq).contiguous(),
                                 tokens.narrow(1, 1, seq).contiguous()});
  }
  return batches;
}

StepMetrics Engine::step() {
  const auto start = std::chrono::steady_clock::now();
  StepMetrics metrics;
  metrics.lr = lr_at(step_);

  std::vector<MicroBatch> micro = next_micro_batches();
  gradients_->zero_grad();
  StepContext context{model_.get(), gradients_.get(), &micro};
  StepLoss loss = schedule_->run(context);
  gradients_->finish_backward();

  std::vector<GradPiece> pieces = gradients_->grad_pieces();
  schedule_->sync_tied_gradients(pieces);
  metrics.grad_norm =
      model_->pipelined() ? pipelined_grad_norm(pieces, *mesh_) : global_grad_norm(pieces, *mesh_);
  const double clip = config_.optim.grad_clip;
  if (clip > 0 && metrics.grad_norm > clip) {
    const double scale = clip / (metrics.grad_norm + 1e-6);
    torch::NoGradGuard no_grad;
    for (auto& piece : pieces) {
      if (piece.grad.defined()) piece.grad.mul_(scale);
    }
  }
  gradients_->step(metrics.lr);
  ++step_;

  // Mean loss over every rank that computed one; slowest rank's time.
  // Mean loss over every rank that computed one (under pipelining: the last
  // stage's ranks); idle fraction averaged over all ranks.
  at::Tensor sums = torch::tensor(
      {loss.sum, static_cast<double>(loss.count), schedule_->idle_fraction()}, torch::kDouble);
  mesh_->world()->all_reduce(sums, comm::ReduceOp::kSum)->wait();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  at::Tensor maxes = torch::tensor({seconds, static_cast<double>(peak_rss_bytes()),
                                    stop_requested() ? 1.0 : 0.0},
                                   torch::kDouble);
  mesh_->world()->all_reduce(maxes, comm::ReduceOp::kMax)->wait();

  metrics.step = step_;
  metrics.loss = sums[0].item<double>() / std::max(1.0, sums[1].item<double>());
  metrics.step_time_s = maxes[0].item<double>();
  metrics.peak_rss_bytes = static_cast<int64_t>(maxes[1].item<double>());
  metrics.stop = maxes[2].item<double>() > 0;
  metrics.tokens_per_s = static_cast<double>(config_.train.global_batch * config_.model.seq_len) /
                         std::max(1e-9, metrics.step_time_s);
  metrics.idle_fraction =
      sums[2].item<double>() / static_cast<double>(mesh_->layout().world_size());
  metrics.memory = gradients_->memory();
  metrics.reduction = gradients_->reduction_stats();
  return metrics;
}

TrainSummary Engine::train(const std::function<void(const StepMetrics&)>& on_step) {
  const bool root = mesh_->rank() == 0;
  detail::MetricsWriter writer(root ? config_.log.metrics : std::string());
  detail::Progress progress(root ? config_.log.progress : "off", config_.train.steps,
                            config_.log.every);
  TrainSummary summary;
  const auto start = std::chrono::steady_clock::now();
  while (step_ < config_.train.steps) {
    StepMetrics m = step();
    if (summary.losses.empty()) summary.first_loss = m.loss;
    summary.losses.push_back(m.loss);
    summary.final_loss = m.loss;
    summary.peak_rss_bytes = std::max(summary.peak_rss_bytes, m.peak_rss_bytes);
    writer.write(m);
    progress.update(m);
    if (on_step) on_step(m);
    if (m.stop && step_ < config_.train.steps) {
      summary.stopped = true;
      break;
    }
  }
  summary.steps = static_cast<int64_t>(summary.losses.size());
  summary.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  summary.tokens_per_s = static_cast<double>(summary.steps * config_.train.global_batch *
                                             config_.model.seq_len) /
                         std::max(1e-9, summary.seconds);
  progress.finish();
  return summary;
}

std::vector<std::pair<std::string, at::Tensor>> Engine::gathered_parameters() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  torch::NoGradGuard no_grad;
  // The gradients role knows where parameters live at rest (ZeRO-3: shards
  // only; the model's own tensors are empty between uses).
  if (!model_->pipelined()) {
    for (const auto& p : gradients_->parameters_at_rest()) {
      out.emplace_back(p.name, gather_global(p.tensor.detach(), p.placement, *mesh_));
    }
    return out;
  }
  // Pipelined: each stage assembles its own parameters over the other
  // sharded axes, then every parameter is broadcast over pp, in model order,
  // from the first stage that holds it.
  const AxisSet pp{Axis::kPP};
  std::map<std::string, at::Tensor> mine;
  for (const auto& p : gradients_->parameters_at_rest()) {
    mine[p.name] =
        gather_global(p.tensor.detach(), p.placement, *mesh_, p.placement.sharded().without(pp));
  }
  const auto& group = mesh_->group(Axis::kPP);
  for (const auto& p : model_->all_parameters()) {
    const int root = model_->holders_of(p).front();
    at::Tensor t;
    if (root == model_->stage()) {
      t = mine.at(p.name).contiguous();
    } else {
      t = torch::empty(p.placement.global_shape(), p.tensor.options().requires_grad(false));
    }
    group->broadcast(t, root)->wait();
    out.emplace_back(p.name, t);
  }
  return out;
}

std::string Engine::describe() const {
  int64_t params = 0;
  for (const auto& p : model_->all_parameters()) params += p.placement.global_numel();
  std::ostringstream out;
  out << config_.model.name << " " << std::fixed;
  out.precision(2);
  out << static_cast<double>(params) / 1e6 << "M params | mesh " << mesh_->layout().describe()
      << " | layers " << roles_.layers << ", pipeline " << roles_.pipeline << ", gradients "
      << roles_.gradients << " | batch " << config_.train.global_batch << " = "
      << config_.train.micro_batch << " x " << accumulation_ << " accum x "
      << mesh_->size(Axis::kDP) << " dp";
  return out.str();
}

}  // namespace kolos
