#include "kolos/core/engine.h"
#include "kolos/core/planner.h"
#include "kolos/core/memory_estimate.h"

#include <sys/resource.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "engine_detail.h"
#include "kolos/core/comm/watchdog.h"
#include "kolos/core/config_located.h"
#include "kolos/core/device.h"
#include "kolos/core/error.h"
#include "kolos/core/experts.h"
#include "kolos/core/optimizer.h"
#include "kolos/core/plugin_registry.h"
#include "kolos/core/runtime.h"
#include "kolos/core/sequence.h"
#include "kolos/core/signals.h"

namespace kolos {
namespace {

int64_t peak_rss_bytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

// registry.create, with a failure for a plugin named in `[plugins] <role>`
// located at that key (file:line:col), as the config reader's own errors are.
template <typename Interface>
std::shared_ptr<Interface> create_plugin(const PluginRegistry& registry, const RunConfig& config,
                                         const std::string& role, const std::string& name) {
  try {
    return registry.create<Interface>(role, name);
  } catch (const PluginError& e) {
    const auto named = config.plugins.by_role.find(role);
    if (named == config.plugins.by_role.end() || named->second != name) throw;
    throw PluginError(located(config, "plugins." + role, e.what()));
  }
}

}  // namespace

// runtime.device = "cuda": what runs there so far. The rest is refused
// here, where `kolos check` sees it too, naming what does run.
void check_device_mix(const RunConfig& config, const RoleChoice& roles) {
  if (config.runtime.device != "cuda") return;
  if (!device::cuda_backend_built()) {
    throw ConfigError(located(config, "runtime.device",
                              "device = \"cuda\": this kolos was built without its CUDA backend "
                              "(libkolos_cuda.so needs nvcc, NCCL and a LibTorch with CUDA when "
                              "kolos is configured; docs/devices.md)"));
  }
  std::vector<std::string> not_yet;
  if (roles.layers != role_spec("layers").builtin) not_yet.push_back("tensor parallelism");
  if (roles.pipeline != role_spec("pipeline").builtin) not_yet.push_back("pipeline parallelism");
  if (!roles.sequence.empty()) not_yet.push_back("sequence parallelism");
  if (roles.gradients != role_spec("gradients").builtin) not_yet.push_back("ZeRO");
  if (!roles.memory.empty()) not_yet.push_back("the memory role");
  if (!config.checkpoint.dir.empty()) not_yet.push_back("checkpoints");
  if (!not_yet.empty()) {
    std::string list;
    for (size_t i = 0; i < not_yet.size(); ++i) list += (i ? ", " : "") + not_yet[i];
    throw ConfigError(located(config, "runtime.device",
                              "device = \"cuda\" runs data parallelism (plugin `" +
                                  role_spec("gradients").builtin +
                                  "`) in fp32, bf16 or fp16 so far; not yet with " + list +
                                  " (docs/devices.md)"));
  }
}

RunPlan plan_run(const RunConfig& config, int64_t world_size) {
  RunPlan plan;
  plan.shape = resolve_mesh_shape(config, world_size);
  int64_t per_step = 0;
  const int64_t data_ranks = plan.shape.batch_ranks();  // dp (x ep)
  const bool overflow = __builtin_mul_overflow(config.train.micro_batch, data_ranks, &per_step);
  if (overflow || config.train.global_batch % per_step != 0) {
    std::string fix = "use a smaller train.micro_batch";
    if (!overflow) {
      fix = "use a global_batch of " + std::to_string(per_step);
      if (per_step <= std::numeric_limits<int64_t>::max() / 2)
        fix += " or " + std::to_string(2 * per_step);
    }
    throw ConfigError(config.source + ": train.global_batch = " +
                      std::to_string(config.train.global_batch) +
                      " is not a multiple of train.micro_batch (" +
                      std::to_string(config.train.micro_batch) + ") x data-parallel size (" +
                      std::to_string(data_ranks) + ") = " +
                      (overflow ? std::string("more than 2^63") : std::to_string(per_step)) +
                      "; " + fix);
  }
  plan.accumulation = config.train.global_batch / per_step;
  plan.roles = choose_plugins(config);
  check_device_mix(config, plan.roles);
  if (config.runtime.device != "cuda") check_precision_runs(config);  // a CPU probe
  PluginRegistry registry(config.plugins.path);
  const auto& layers = role_spec("layers");
  const auto& pipeline = role_spec("pipeline");
  plan.layers = plan.roles.layers == layers.builtin
                    ? make_serial_layer_factory()
                    : create_plugin<LayerFactory>(registry, config, "layers", plan.roles.layers);
  plan.pipeline =
      plan.roles.pipeline == pipeline.builtin
          ? make_single_stage_schedule()
          : create_plugin<PipelineSchedule>(registry, config, "pipeline", plan.roles.pipeline);
  // The memory role's plugin keeps the gradients and the optimizer states
  // in its chunks: it serves in the gradients role's place.
  // parallel.zero.stage reaches it then: it shards its own chunks (or
  // refuses the stage, at its line).
  const bool memory = !plan.roles.memory.empty();
  if (memory && plan.roles.gradients != role_spec("gradients").builtin &&
      config.plugins.by_role.count("gradients") != 0) {
    throw ConfigError(located(
        config, config.plugins.by_role.count("gradients") ? "plugins.gradients" : "parallel.zero",
        "the memory plugin `" + plan.roles.memory +
            "` keeps gradients and optimizer states itself and does not run with the gradients "
            "plugin `" +
            plan.roles.gradients + "`; remove [plugins] gradients (parallel.zero.stage = 1 " +
            "shards the chunks over dp) or remove [memory]."));
  }
  plan.gradients = memory ? create_plugin<GradientStrategy>(registry, config, "memory",
                                                            plan.roles.memory)
                          : create_plugin<GradientStrategy>(registry, config, "gradients",
                                                            plan.roles.gradients);
  if (!plan.roles.sequence.empty()) {
    plan.sequence =
        create_plugin<SequenceStrategy>(registry, config, "sequence", plan.roles.sequence);
    // The one way the layers reach the sequence plugin (kolos/core/sequence.h).
    plan.layers->set_sequence(plan.sequence);
  }
  const auto configure = [&](RolePlugin& plugin, const std::string& role) {
    const RoleSpec& spec = role_spec(role);
    const std::string& name = plan.roles.of(role);
    const std::string owner = name == spec.builtin && (role == "layers" || role == "pipeline")
                                  ? "the built-in " + role + " `" + name + "`"
                                  : role + " plugin `" + name + "`";
    plugin.configure(PluginContext{config, config.section(spec.section), spec.core_keys, owner,
                                   plan.shape, plan.accumulation});
  };
  configure(*plan.layers, "layers");
  configure(*plan.pipeline, "pipeline");
  if (memory) {
    const RoleSpec& zero = role_spec("gradients");
    config.section(zero.section)
        .check_keys(zero.core_keys, "the memory plugin `" + plan.roles.memory + "`");
  }
  configure(*plan.gradients, memory ? "memory" : "gradients");
  if (plan.sequence) configure(*plan.sequence, "sequence");
  // The planner acts before a run (parallel.auto, kolos plan); loading it
  // here checks its [planner] keys wherever a run is checked.
  if (!plan.roles.planner.empty()) {
    configure(*create_plugin<Planner>(registry, config, "planner", plan.roles.planner), "planner");
  }
  return plan;
}

Engine::Engine(RunConfig config, comm::ProcessGroupPtr world, DataFactory make_data)
    : config_(std::move(config)), world_(std::move(world)) {
  KOLOS_CHECK(world_ != nullptr, "an engine needs a world group");
  if (config_.runtime.comm_timeout_s > 0) {
    comm::set_watchdog_timeout(std::chrono::milliseconds(
        std::max<int64_t>(1, std::llround(config_.runtime.comm_timeout_s * 1000))));
  }
  const int world_size = world_->size();
  MeshShape shape;

  // Phase 1, local only: everything a rank can check on its own.
  agreed(*world_, [&] {
    if (config_.parallel.auto_plan) {
      throw ConfigError(located(config_, "parallel.auto",
                                "parallel.auto = true: the plan is not resolved yet; `kolos train` "
                                "resolves it through the planner role before the engine starts "
                                "(kolos/core/planner.h)"));
    }
    check_model_name(config_);
    RunPlan plan = plan_run(config_, world_size);
    shape = plan.shape;
    accumulation_ = plan.accumulation;
    roles_ = plan.roles;
    factory_ = std::move(plan.layers);
    schedule_ = std::move(plan.pipeline);
    gradients_ = std::move(plan.gradients);
    sequence_ = std::move(plan.sequence);
    // Before anything large exists: a run that cannot fit is refused here,
    // with the numbers, instead of dying in the allocator.
    const MemoryEstimate memory = estimate_memory(config_, world_size, resident_bytes());
    check_memory_fits(config_, memory, memory_budget(config_, ranks_on_this_node(world_size)),
                      world_size);
    data_ = make_data(config_);
    KOLOS_CHECK_KIND(kData, data_ != nullptr, "no data source for data.kind = ", config_.data.kind);
    KOLOS_CHECK_EQ(data_->seq_len(), config_.model.seq_len, "the data source's sample length");
    eval_ = read_eval_config(config_);
    if (eval_.enabled) {
      // The held-out source: eval.path in data.kind's format, without
      // augmentation; synthetic data draws its held-out samples from
      // another seed.
      RunConfig held_out = config_;
      held_out.data.path = eval_.path;
      held_out.data.crop_pad = 0;
      held_out.data.flip = false;
      if (held_out.data.kind == "synthetic") held_out.train.seed = config_.train.seed + 1000003;
      try {
        eval_data_ = make_data(held_out);
      } catch (const DataError& e) {
        // The source names data.path, which held_out set from eval.path.
        std::string message = e.what();
        if (message.rfind("data.path: ", 0) == 0) message.replace(0, 9, "eval.path");
        throw DataError(message);
      }
      KOLOS_CHECK_KIND(kData, eval_data_ != nullptr, "no data source for eval.path");
      KOLOS_CHECK_EQ(eval_data_->seq_len(), config_.model.seq_len,
                     "the eval source's sample length");
    }
    if (config_.runtime.device == "cuda") {
      const int index = device::cuda_backend().open(node_local_rank(), node_host());
      device_ = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
    }
  });
  // CUDA tensors go to NCCL over every group of the mesh, CPU ones to MPI.
  if (device_.is_cuda()) world_ = device::route_by_device(world_);

  try {
    // Collective: communicators for every axis set.
    mesh_ = std::make_unique<DeviceMesh>(world_, shape);

    // Phase 2: the model, identically initialised on every rank.
    agreed(*world_, [&] {
      factory_->setup(*mesh_, config_);
      if (sequence_) sequence_->setup(*mesh_, config_);
      torch::manual_seed(config_.train.seed);
      // Initialised in fp32 (the same values as an fp32 run), then rounded
      // and moved: block by block as they are built when the strategy takes
      // its part of each then (placement_at_build), else once the model is
      // whole.
      const at::ScalarType dtype = precision_dtype(config_);
      const BlockBuilt place = gradients_->placement_at_build(*mesh_);
      BlockBuilt built;
      if (place) {
        built = [&](const std::vector<PlacedParameter>& parameters) {
          cast_parameters(parameters, dtype);
          if (device_.is_cuda()) move_parameters(parameters, device_);
          place(parameters);
        };
      }
      model_ = build_model(config_.model, *factory_, built);
      if (!place) {
        cast_parameters(*model_, dtype);
        if (device_.is_cuda()) move_parameters(*model_, device_);
      }
      model_->set_recompute(config_.train.recompute, config_.train.recompute_every);
      router_biases_ = router_biases(*model_);
      schedule_->setup(*model_, *mesh_, config_);
    });
    gradients_->setup(*model_, *mesh_, config_);
    if (config_.train.precision == "fp16") {
      scaler_ = std::make_unique<LossScaler>(config_.train.loss_scale_init,
                                             config_.train.loss_scale_growth_interval);
    }
  } catch (const AgreedError&) {
    throw;  // every rank has it
  } catch (const std::exception& e) {
    // One rank failed where the others may already wait in a collective
    // (mesh splits, the strategy's set-up): no agreement can reach them.
    // This rank reports and ends the job now, before unwinding.
    if (world_->size() == 1) throw;
    detail::abort_job(e, "during set-up");
  }
}

Engine::~Engine() = default;

double learning_rate_at(const RunConfig& config, int64_t step) {
  const auto& o = config.optim;
  if (step < o.warmup_steps) return o.lr * static_cast<double>(step + 1) / o.warmup_steps;
  const int64_t decay = std::max<int64_t>(1, config.train.steps - o.warmup_steps);
  const double progress =
      std::min(1.0, static_cast<double>(step - o.warmup_steps) / static_cast<double>(decay));
  return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(M_PI * progress));
}

std::vector<MicroBatch> Engine::next_micro_batches() {
  const int64_t mb = config_.train.micro_batch;
  const int64_t seq = config_.model.seq_len;
  // The ranks that read different samples: dp, and ep when experts are split.
  const int64_t dp = mesh_->layout().size(batch_axes());
  const int64_t dp_index = mesh_->layout().index_in_group(mesh_->rank(), batch_axes());
  const int64_t first = step_ * config_.train.global_batch;
  // Sequence parallelism: the ranks of one sp group read the same samples
  // and each keeps its positions of every sample's tokens and targets.
  const at::Tensor positions = sequence_ ? sequence_->local_positions(seq) : at::Tensor();
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
    at::Tensor inputs = tokens.narrow(1, 0, seq);
    at::Tensor targets = tokens.narrow(1, 1, seq);
    if (positions.defined()) {
      inputs = inputs.index_select(1, positions);
      targets = targets.index_select(1, positions);
    }
    if (device_.is_cuda()) {
      inputs = inputs.to(device_, /*non_blocking=*/false, /*copy=*/false,
                         at::MemoryFormat::Contiguous);
      targets = targets.to(device_, false, false, at::MemoryFormat::Contiguous);
    }
    batches.push_back(MicroBatch{inputs.contiguous(), targets.contiguous()});
  }
  return batches;
}

namespace {

constexpr int kEvalTag = 7301;  // eval's stage-to-stage activations (between steps)

// An activation to the stage `dst` of the pp group: its shape and dtype,
// then its values.
void send_activation(comm::ProcessGroup& group, const at::Tensor& x, int dst) {
  KOLOS_CHECK(x.dim() <= 4, "eval: a stage's output has ", x.dim(), " dimensions (at most 4)");
  at::Tensor header = torch::zeros({6}, torch::kInt64);
  header[0] = x.dim();
  for (int64_t d = 0; d < x.dim(); ++d) header[1 + d] = x.size(d);
  header[5] = static_cast<int64_t>(x.scalar_type());
  group.send(header, dst, kEvalTag)->wait();
  group.send(x.contiguous(), dst, kEvalTag + 1)->wait();
}

at::Tensor receive_activation(comm::ProcessGroup& group, int src, at::Device device) {
  at::Tensor header = torch::zeros({6}, torch::kInt64);
  group.recv(header, src, kEvalTag)->wait();
  std::vector<int64_t> shape;
  for (int64_t d = 0; d < header[0].item<int64_t>(); ++d) shape.push_back(header[1 + d].item<int64_t>());
  at::Tensor x = torch::empty(
      shape, at::TensorOptions()
                 .dtype(static_cast<at::ScalarType>(header[5].item<int64_t>()))
                 .device(device));
  group.recv(x, src, kEvalTag + 1)->wait();
  return x;
}

}  // namespace

EvalResult Engine::evaluate() {
  KOLOS_CHECK_KIND(kConfig, eval_data_ != nullptr,
                   "evaluate(): the run has no [eval] section (see docs/configuration.md)");
  torch::NoGradGuard no_grad;
  const int64_t seq = config_.model.seq_len;
  const int64_t size = eval_data_->size();
  int64_t total = eval_.samples > 0 ? eval_.samples : (size > 0 ? size : 256);
  if (size > 0) total = std::min(total, size);
  // Data rank r (of dp, x ep) reads held-out samples r, r + dp, r + 2 dp, ...
  const int64_t dp = mesh_->layout().size(batch_axes());
  const int64_t dp_index = mesh_->layout().index_in_group(mesh_->rank(), batch_axes());
  const int64_t mine = total / dp + (dp_index < total % dp ? 1 : 0);
  // Every rank runs as many batches as the rank with the most samples
  // (ZeRO-3's gathers are collective over dp); rows past its own share are
  // read (sources wrap) and run, but not scored.
  const int64_t most = (total + dp - 1) / dp;
  const int64_t mb = config_.train.micro_batch;
  const size_t blocks = model_->blocks().size();
  const int stage = model_->stage();
  const int last = model_->stage_of(blocks - 1);
  comm::ProcessGroup& pp = *mesh_->group(Axis::kPP);
  double loss_sum = 0.0, correct = 0.0, scored = 0.0, classifier = 0.0;
  // The tensor-parallel grids cut a batch's rows into blocks: a batch runs
  // a multiple of them. Ranks of one tp group and one pipeline share
  // dp_index, so they run the same rows.
  const int64_t multiple = factory_->batch_multiple();
  // Sequence parallelism: each rank scores its positions of every sample;
  // every strategy keeps equal shares, so the mean of the ranks' means is
  // the mean over the sequence.
  const at::Tensor positions = sequence_ ? sequence_->local_positions(seq) : at::Tensor();
  for (int64_t start = 0; start < most; start += mb) {
    const int64_t n = std::min(mb, most - start);
    const int64_t real = std::max<int64_t>(0, std::min(n, mine - start)) / multiple * multiple;
    // A batch with no rows to score still runs (wrapped rows), for the
    // collectives of its peers along dp (ZeRO-3's gathers).
    const int64_t rows = real > 0 ? real : multiple;
    at::Tensor tokens = torch::empty({rows, seq + 1}, torch::kInt64);
    int64_t* out = tokens.data_ptr<int64_t>();
    for (int64_t i = 0; i < rows; ++i) {
      eval_data_->sample((start + i) * dp + dp_index, out + i * (seq + 1));
    }
    at::Tensor x = tokens.narrow(1, 0, seq).contiguous();
    at::Tensor targets = tokens.narrow(1, 1, seq).contiguous();
    if (positions.defined()) {  // this rank's positions, as in training
      x = x.index_select(1, positions);
      targets = targets.index_select(1, positions);
    }
    if (device_.is_cuda()) {
      x = x.to(device_);
      targets = targets.to(device_);
    }
    // Each run of consecutive blocks on one stage: that stage receives its
    // input from the previous run's stage, runs it, and sends it on.
    int previous = -1;
    for (size_t b = 0; b < blocks;) {
      const int owner = model_->stage_of(b);
      size_t e = b;
      while (e < blocks && model_->stage_of(e) == owner) ++e;
      if (owner == stage) {
        if (previous >= 0 && previous != stage) x = receive_activation(pp, previous, device_);
        x = model_->forward(x, b, e);
        if (e < blocks && model_->stage_of(e) != stage) send_activation(pp, x, model_->stage_of(e));
      }
      previous = owner;
      b = e;
    }
    if (stage != last || real == 0) continue;
    loss_sum += model_->loss(x, targets).item<double>() * static_cast<double>(real);
    scored += static_cast<double>(real);
    if (x.dim() == 2 && config_.model.classes > 0) {
      // A classifier: one row of logits per sample (cut over the classes,
      // and by the grids over the rows: whole_logits gathers them), the
      // label the sample's last value.
      classifier = 1.0;
      const at::Tensor logits = factory_->whole_logits(x, config_.model.classes).to(at::kFloat);
      const at::Tensor labels = targets.select(1, seq - 1);
      correct += logits.argmax(1).eq(labels).sum().item<double>();
    }
  }
  // Sums over every rank that scored (the last stage's; tensor- and
  // sequence-parallel peers score the same samples and count in every sum
  // alike).
  at::Tensor sums = torch::tensor({loss_sum, correct, scored, classifier}, torch::kDouble);
  mesh_->world()->all_reduce(sums, comm::ReduceOp::kSum)->wait();
  EvalResult result;
  const double count = std::max(1.0, sums[2].item<double>());
  result.loss = sums[0].item<double>() / count;
  result.accuracy = sums[3].item<double>() > 0 ? sums[1].item<double>() / count : -1.0;
  const int64_t copies = mesh_->world()->size() / (dp * pp.size());
  result.samples = std::llround(sums[2].item<double>()) / copies;
  if (result.samples < total && !eval_short_noted_ && mesh_->rank() == 0) {
    eval_short_noted_ = true;
    std::fprintf(stderr,
                 "eval: %lld of %lld held-out samples scored: %s cuts a batch's rows into "
                 "blocks of %lld, and the rest of a rank's share does not fill one\n",
                 static_cast<long long>(result.samples), static_cast<long long>(total),
                 factory_->name().c_str(), static_cast<long long>(multiple));
  }
  return result;
}

StepMetrics Engine::step() {
  end_setup_phase();  // SIGTERM/SIGINT now stop at a step boundary (signals.h)
  comm::set_progress_step(step_);
  comm::set_progress_micro_batch(-1);
  const auto start = std::chrono::steady_clock::now();
  take_routing();  // what forwards outside a step routed is not this step's
  StepMetrics metrics;
  metrics.lr = learning_rate_at(config_, step_);

  std::vector<MicroBatch> micro = next_micro_batches();
  gradients_->zero_grad();
  StepContext context{model_.get(), gradients_.get(), &micro};
  if (scaler_) {
    context.loss_scale = scaler_->scale();
    gradients_->set_loss_scale(scaler_->scale());
  }
  if (step_ == overflow_step_) context.loss_scale *= std::numeric_limits<double>::infinity();
  StepLoss loss = schedule_->run(context);
  gradients_->finish_backward();

  std::vector<GradPiece> pieces = gradients_->grad_pieces();
  schedule_->sync_tied_gradients(pieces);
  bool skip = false;
  if (scaler_) {
    metrics.loss_scale = scaler_->scale();
    // One flag, max-reduced over the whole mesh: a rank whose own pieces
    // are finite must still skip when another rank's overflowed, or the
    // replicas would part.
    const bool overflow = !gradients_->gradients_finite(pieces);
    at::Tensor flag = torch::tensor({overflow ? 1.0 : 0.0}, torch::kDouble);
    mesh_->world()->all_reduce(flag, comm::ReduceOp::kMax)->wait();
    skip = flag.item<double>() > 0;
    scaler_->update(skip);
    if (!skip) gradients_->scale_gradients(pieces, 1.0 / metrics.loss_scale);
  }
  metrics.skipped = skip;
  if (skip) {
    // The step consumes its data and advances the schedule; the optimizer
    // and its step count are left as they are (torch's GradScaler does the same).
    metrics.grad_norm = 0.0;  // not computed (JSON has no inf)
  } else {
    metrics.grad_norm = gradients_->gradient_norm(pieces, *mesh_);
    const double clip = config_.optim.grad_clip;
    if (clip > 0 && metrics.grad_norm > clip) {
      gradients_->scale_gradients(pieces, clip / (metrics.grad_norm + 1e-6));
    }
    gradients_->step(metrics.lr);
  }
  ++step_;

  // Mean loss over every rank that computed one; slowest rank's time.
  // Mean loss over every rank that computed one (under pipelining: the last
  // stage's ranks); idle fraction averaged over all ranks.
  at::Tensor sums = torch::tensor(
      {loss.sum, static_cast<double>(loss.count), schedule_->idle_fraction()}, torch::kDouble);
  mesh_->world()->all_reduce(sums, comm::ReduceOp::kSum)->wait();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  at::Tensor maxes =
      torch::tensor({seconds, static_cast<double>(peak_rss_bytes()), stop_requested() ? 1.0 : 0.0},
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
  metrics.gather = gradients_->gather_stats();
  const at::Tensor load = add_routing(metrics);
  // Auxiliary-loss-free balancing: every rank moves every block's bias by
  // the same world-summed load, so the replicas stay equal.
  if (!router_biases_.empty() && !skip) {
    update_router_biases(router_biases_, load, config_.model.bias_update_rate);
  }
  return metrics;
}

at::Tensor Engine::add_routing(StepMetrics& m) {
  const ModelConfig& c = config_.model;
  std::vector<int64_t> blocks;
  for (int64_t b = 0; b < c.layers; ++b) {
    if (is_moe_block(c, b)) blocks.push_back(b);
  }
  if (blocks.empty()) return {};
  // Every rank's routing (each stage records its own blocks), summed over
  // the world; tensor-parallel peers route the same tokens and count alike.
  const RoutingRecord record = take_routing();
  const int64_t experts = c.experts;
  const int64_t cells = static_cast<int64_t>(blocks.size()) * experts;
  at::Tensor v = torch::zeros({cells + 2}, torch::kDouble);
  auto* at = v.data_ptr<double>();
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto it = record.kept.find(blocks[i]);
    if (it == record.kept.end()) continue;
    for (int64_t e = 0; e < experts && e < static_cast<int64_t>(it->second.size()); ++e) {
      at[i * experts + e] = static_cast<double>(it->second[e]);
    }
  }
  at[cells] = static_cast<double>(record.dropped);
  at[cells + 1] = record.aux_loss;
  mesh_->world()->all_reduce(v, comm::ReduceOp::kSum)->wait();
  v /= static_cast<double>(mesh_->size(Axis::kTP));
  const at::Tensor kept = v.narrow(0, 0, cells).view({static_cast<int64_t>(blocks.size()), experts});
  m.moe_blocks = static_cast<int64_t>(blocks.size());
  m.expert_tokens_min = std::llround(kept.min().item<double>());
  m.expert_tokens_max = std::llround(kept.max().item<double>());
  const at::Tensor mean = kept.mean(1);
  const at::Tensor cv = kept.std(1, /*unbiased=*/false) / mean.clamp_min(1e-12);
  m.expert_cv = cv.mean().item<double>();
  m.tokens_dropped = std::llround(v[cells].item<double>());
  const double micro_batches =
      static_cast<double>(mesh_->layout().size(batch_axes()) * accumulation_);
  m.aux_loss = v[cells + 1].item<double>() / micro_batches;
  return kept;
}

TrainSummary Engine::train(const std::function<void(const StepMetrics&)>& on_step) {
  const bool root = mesh_->rank() == 0;
  detail::MetricsWriter writer(
      root ? config_.log.metrics : std::string(),
      detail::header_with(metrics_header_, "allreduce",
                          gradients_->reduction_stats().all_reduce_json));
  detail::Progress progress(root ? config_.log.progress : "off", config_.train.steps,
                            config_.log.every);
  TrainSummary summary;
  const auto start = std::chrono::steady_clock::now();
  while (step_ < config_.train.steps) {
    StepMetrics m = step();
    if (eval_data_ && ((eval_.every > 0 && step_ % eval_.every == 0) ||
                       step_ == config_.train.steps)) {
      const EvalResult r = evaluate();
      m.eval_loss = r.loss;
      m.eval_accuracy = r.accuracy;
      if (root && config_.log.progress != "off") {
        std::fprintf(stderr, "eval step %lld: loss %.4f", static_cast<long long>(step_), r.loss);
        if (r.accuracy >= 0) std::fprintf(stderr, " | accuracy %.2f%%", 100 * r.accuracy);
        std::fprintf(stderr, " | %lld held-out samples\n", static_cast<long long>(r.samples));
      }
    }
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
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  summary.tokens_per_s =
      static_cast<double>(summary.steps * config_.train.global_batch * config_.model.seq_len) /
      std::max(1e-9, summary.seconds);
  progress.finish();
  return summary;
}

std::string Engine::describe() const {
  int64_t params = 0;
  for (const auto& p : model_->all_parameters()) params += p.placement.global_numel();
  std::ostringstream out;
  out << config_.model.name << " " << std::fixed;
  out.precision(2);
  out << static_cast<double>(params) / 1e6 << "M params | mesh " << mesh_->layout().describe()
      << " | layers " << roles_.layers << ", pipeline " << roles_.pipeline
      << (roles_.memory.empty() ? ", gradients " + roles_.gradients
                                : ", memory " + roles_.memory + " (gradients and optimizer)")
      << (roles_.sequence.empty() ? "" : ", sequence " + roles_.sequence)
      << " | batch " << config_.train.global_batch << " = " << config_.train.micro_batch << " x "
      << accumulation_ << " accum x " << mesh_->size(Axis::kDP) << " dp"
      << (mesh_->size(expert_axis()) > 1
              ? " x " + std::to_string(mesh_->size(expert_axis())) + " ep"
              : std::string());
  if (device_.is_cuda()) out << " | " << device::cuda_backend().describe(device_.index());
  return out.str();
}

}  // namespace kolos
