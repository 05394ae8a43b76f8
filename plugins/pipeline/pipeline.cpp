// pipeline: the "pipeline" role. Cuts the model's block list into stages and
// runs a plan (plan.h) of forwards, backwards and transfers on each rank.
//
// Set-up (every rank alike, no communication except balance = "time"):
//   1. one probe forward finds which parameters each block reads
//      (Model::find_block_reads), so tied weights are known;
//   2. the blocks are cut into P*V consecutive virtual stages: the explicit
//      layers_per_stage, equal counts for the interleaved schedule, else
//      balanced by parameter count or by measured forward+backward time;
//      virtual stage s runs on pp rank s % P;
//   3. Model::set_stages() makes placed_parameters() return only what this
//      rank holds (its blocks' parameters marked sharded along pp, plus
//      copies of tied weights its blocks read); every other parameter's
//      storage is freed, so the gradient strategy, the optimizer and
//      checkpoints see this stage only.
//
// A step runs this rank's action list in order. Activations and their
// gradients move with send/recv on the mesh's pp group (asynchronous Work;
// the group's communication thread posts them in order). Before each compute
// the receives that the next compute needs are posted, so transfers overlap
// computation; sends are waited for at the end of the step. The first
// activation across each stage boundary is preceded by a small header
// (dtype, shape), cached on both sides: later steps send data only.
// Gradient shapes equal the activation shapes the sender already knows.
//
// Backward: B runs autograd from the chunk's output with the received
// gradient (the last virtual stage from its loss, scaled by 1/M). The
// zero-bubble schedule splits it: BI computes only the input gradient
// (autograd::grad with the graph retained), W later accumulates the weight
// gradients (autograd::backward restricted to the chunk's parameters). The
// gradient strategy's prepare_backward(sync) precedes every pass that
// accumulates weight gradients (B or W), sync on the last one of the step.
//
// Tied weights (a parameter read by blocks of different stages, e.g. GPT's
// token embedding in "embed" on the first stage and "head" on the last):
// every holding stage keeps a copy, trained by its own strategy; after
// finish_backward the copies' gradients are summed over the holders
// (sync_tied_gradients), so the copies take identical optimizer steps.
// Their placement stays replicated along pp, so norms and checkpoints count
// the copy of the first holder only (which must be stage 0).
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <numeric>
#include <set>
#include <unordered_map>

#include "kolos/core/aux_loss.h"
#include "kolos/core/comm/watchdog.h"
#include "kolos/core/error.h"
#include "kolos/core/mesh.h"
#include "kolos/core/plugin_registry.h"
#include "kolos/core/schedule.h"
#include "kolos/core/sequence.h"
#include "kolos/core/tensor_storage.h"
#include "kolos/schedules/plan.h"
#include "kolos/schedules/pipeline_settings.h"

namespace kolos::pipeline {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Contiguous partition of `weights` into `parts` non-empty runs that
// minimises the heaviest run (linear-partition dynamic programme).
std::vector<int64_t> balanced_cut(const std::vector<double>& weights, int parts) {
  const int n = static_cast<int>(weights.size());
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + weights[i];
  const double inf = std::numeric_limits<double>::infinity();
  // best[k][i]: the heaviest run when the first i blocks form k runs.
  std::vector<std::vector<double>> best(parts + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int>> from(parts + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0.0;
  for (int k = 1; k <= parts; ++k) {
    for (int i = k; i <= n; ++i) {
      for (int j = k - 1; j < i; ++j) {
        const double cost = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        // Ties go to the earlier cut, so equal weights split evenly from the front.
        if (cost < best[k][i] - 1e-12) {
          best[k][i] = cost;
          from[k][i] = j;
        }
      }
    }
  }
  std::vector<int64_t> counts(parts);
  for (int k = parts, i = n; k > 0; --k) {
    counts[k - 1] = i - from[k][i];
    i = from[k][i];
  }
  return counts;
}

std::string block_names(const Model& model) {
  std::string names;
  const auto& blocks = model.blocks();
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (i == 6 && blocks.size() > 8) {
      names += ", ..., " + blocks.back().first;
      break;
    }
    names += (i ? ", " : "") + blocks[i].first;
  }
  return names;
}

struct TraceEvent {
  std::string name;
  const char* category;
  double start_us;
  double duration_us;
  int64_t step;
};

class PipelineExecutor : public PipelineSchedule {
 public:
  std::string name() const override { return "pipeline"; }
  ~PipelineExecutor() override;

  void configure(const PluginContext& context) override {
    settings_ = read_pipeline_settings(context);
  }
  void setup(Model& model, const DeviceMesh& mesh, const RunConfig& config) override;
  StepLoss run(StepContext& context) override;
  double idle_fraction() const override { return idle_; }
  void sync_tied_gradients(std::vector<GradPiece>& pieces) override;

 private:
  struct Chunk {
    size_t first = 0, last = 0;  // blocks [first, last)
    int virtual_stage = 0;
    std::vector<at::Tensor> parameters;  // what W accumulates into
  };
  struct Slot {  // one (micro-batch, chunk) in flight
    at::Tensor input, output, grad_output, grad_input;
  };
  struct Transfer {
    at::Tensor tensor;
    comm::WorkPtr work;
    bool header = false;  // a header whose data receive is not posted yet
  };

  std::vector<int64_t> cut(Model& model, const DeviceMesh& mesh, const RunConfig& config);
  std::vector<double> measure_block_times(Model& model, const RunConfig& config);
  int tag(int kind, int micro, int receiver_stage) const {
    return (kind * plan_.virtual_stages() + receiver_stage) * plan_.micro + micro;
  }
  void post_receive(const Action& a);
  at::Tensor take_receive(const Action& a);
  void send(const Action& a, const at::Tensor& tensor);
  void record(const std::string& name, const char* category, Clock::time_point start,
              Clock::time_point end);
  void write_trace() noexcept;

  PipelineSettings settings_;
  Model* model_ = nullptr;
  comm::ProcessGroupPtr group_;
  Plan plan_;
  int rank_ = 0;        // in the pp group
  int world_rank_ = 0;  // trace file and process id
  std::vector<Chunk> chunks_;
  std::vector<Action> actions_;
  size_t last_weight_pass_ = 0;  // index of the action that gets sync = true
  // Shapes across boundaries, by the receiving virtual stage.
  std::map<int, std::vector<int64_t>> activation_shape_;
  std::map<int, at::ScalarType> activation_dtype_;
  std::set<int> header_sent_;
  std::map<std::tuple<int, int, int>, Transfer> receives_;  // (grad?, micro, chunk)
  std::vector<Transfer> sends_;
  // Tied weights this rank holds a copy of, in model order, and their holders.
  std::vector<std::pair<std::string, std::vector<int>>> tied_;
  double idle_ = 0.0;
  bool inject_no_tied_sync_ = false, inject_no_loss_scale_ = false;
  // Trace.
  bool trace_ = false;
  std::string trace_path_;
  int64_t step_ = 0;
  Clock::time_point origin_ = Clock::now();
  double origin_wall_us_ =
      std::chrono::duration<double, std::micro>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  std::vector<TraceEvent> events_;
  static constexpr size_t kMaxTraceEvents = 1 << 20;
};

PipelineExecutor::~PipelineExecutor() {
  try {
    for (auto& s : sends_) s.work->wait();
  } catch (...) {
  }
  write_trace();
}

void PipelineExecutor::setup(Model& model, const DeviceMesh& mesh, const RunConfig& config) {
  model_ = &model;
  group_ = mesh.group(Axis::kPP);
  // configure() checked the settings against this mesh and batch.
  const int P = static_cast<int>(mesh.size(Axis::kPP));
  const int V = static_cast<int>(settings_.chunks);
  rank_ = static_cast<int>(mesh.coord(Axis::kPP));
  world_rank_ = static_cast<int>(mesh.rank());
  const int64_t per_step = config.train.micro_batch * mesh.layout().size(batch_axes());
  const int M = static_cast<int>(config.train.global_batch / per_step);
  plan_ = make_plan(parse_schedule(settings_.schedule), P, M, V);

  const std::vector<int64_t> counts = cut(model, mesh, config);
  const int S = P * V;
  std::vector<int> stage_of;
  std::vector<size_t> bounds{0};
  for (int s = 0; s < S; ++s) {
    for (int64_t i = 0; i < counts[s]; ++i) stage_of.push_back(s % P);
    bounds.push_back(bounds.back() + static_cast<size_t>(counts[s]));
  }
  model.set_stages(stage_of, rank_);

  // Tied weights: held by every stage that reads them; the first holder
  // must be stage 0, whose copy norms and checkpoints count.
  std::unordered_map<const void*, at::Tensor> held;
  for (const auto& p : model.all_parameters()) {
    const std::vector<int> holders = model.holders_of(p);
    const bool mine = std::find(holders.begin(), holders.end(), rank_) != holders.end();
    if (holders.size() > 1) {
      KOLOS_CHECK_KIND(kConfig, holders.front() == 0, "pipeline: parameter ", p.name,
                       " is read by blocks of stages ", holders.front(), "..", holders.back(),
                       " but not by stage 0; tied weights across stages are supported when the "
                       "first stage holds one copy (cut the model so that it does)");
      if (mine) tied_.emplace_back(p.name, holders);
    }
    if (mine) {
      held[p.tensor.unsafeGetTensorImpl()] = p.tensor;
    } else {
      free_storage(p.tensor);  // another stage's: only its metadata stays
    }
  }

  for (int c = 0; c < V; ++c) {
    Chunk chunk;
    chunk.virtual_stage = plan_.virtual_stage(rank_, c);
    chunk.first = bounds[chunk.virtual_stage];
    chunk.last = bounds[chunk.virtual_stage + 1];
    std::set<const void*> seen;
    for (size_t b = chunk.first; b < chunk.last; ++b) {
      for (const void* impl : model.block_reads()[b]) {
        auto it = held.find(impl);
        if (it != held.end() && it->second.requires_grad() && seen.insert(impl).second) {
          chunk.parameters.push_back(it->second);
        }
      }
    }
    chunks_.push_back(std::move(chunk));
  }

  actions_ = plan_.ranks[rank_];
  for (size_t i = 0; i < actions_.size(); ++i) {
    if (actions_[i].op == Op::kBackward || actions_[i].op == Op::kBackwardWeight) {
      last_weight_pass_ = i;
    }
  }
  // The passes of blocks this rank runs per step, for a memory plugin that
  // plans from them.
  std::vector<Model::BlockPass> passes;
  for (const Action& action : actions_) {
    if (!is_compute(action.op)) continue;
    const Chunk& chunk = chunks_.at(static_cast<size_t>(action.chunk));
    // The first virtual stage's input pass computes nothing (no input
    // gradient to send): it runs no autograd.
    if (action.op == Op::kBackwardInput && chunk.virtual_stage == 0) continue;
    if (action.op == Op::kBackwardWeight && chunk.parameters.empty()) continue;
    const auto part = action.op == Op::kBackwardInput    ? Model::BlockPass::kInput
                      : action.op == Op::kBackwardWeight ? Model::BlockPass::kWeight
                                                         : Model::BlockPass::kWhole;
    passes.push_back({action.op != Op::kForward, chunk.first, chunk.last, part});
  }
  model.set_block_passes(std::move(passes));
  const int64_t largest_tag = tag(3, 0, 0) + static_cast<int64_t>(tied_.size()) * 2;
  KOLOS_CHECK_KIND(kConfig, largest_tag < (1 << 30), "pipeline: ", S, " virtual stages x ", M,
                   " micro-batches need more message tags than MPI offers");

#ifdef KOLOS_FAULT_INJECTION
  // Fault injection for the tests that show the equivalence check has teeth;
  // compiled only into the test copy of the plugin (libkolos_pipeline_faults).
  if (const char* fault = std::getenv("KOLOS_PIPELINE_INJECT")) {
    inject_no_tied_sync_ = std::string(fault) == "no-tied-sync";
    inject_no_loss_scale_ = std::string(fault) == "no-loss-scale";
  }
#endif

  trace_ = config.log.trace;
  if (trace_) {
    std::string dir = config.log.trace_dir;
    if (dir.empty()) {
      dir = config.log.metrics.empty()
                ? "."
                : std::filesystem::path(config.log.metrics).parent_path().string();
      if (dir.empty()) dir = ".";
    }
    trace_path_ = (std::filesystem::path(dir) /
                   ("pipeline-trace-rank" + std::to_string(mesh.rank()) + ".json"))
                      .string();
  }
}

std::vector<int64_t> PipelineExecutor::cut(Model& model, const DeviceMesh& mesh,
                                           const RunConfig& config) {
  const PipelineSettings& pc = settings_;
  const std::string where = (config.source.empty() ? "<config>" : config.source) + ": ";
  const int P = plan_.stages, V = plan_.chunks, S = P * V;
  const int64_t n = static_cast<int64_t>(model.blocks().size());
  const std::string model_blocks =
      "the model has " + std::to_string(n) + " blocks (" + block_names(model) + ")";
  if (P > n) {
    throw ConfigError(where + "parallel.pipeline.size = " + std::to_string(P) +
                      " is larger than the number of blocks: " + model_blocks +
                      "; every stage needs at least one block: use size <= " + std::to_string(n));
  }
  if (S > n) {
    throw ConfigError(where + "parallel.pipeline.size x chunks = " + std::to_string(P) + " x " +
                      std::to_string(V) + " = " + std::to_string(S) +
                      " virtual stages, more than the number of blocks: " + model_blocks);
  }
  // The probe runs the whole model once (batch of one sequence) while every
  // parameter is whole.
  model.find_block_reads(torch::zeros({1, config.model.seq_len}, torch::kInt64));

  if (!pc.layers_per_stage.empty()) {
    const auto& counts = pc.layers_per_stage;  // one per (virtual) stage: configure() checked
    const int64_t sum = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    if (sum != n || *std::min_element(counts.begin(), counts.end()) < 1) {
      std::string list;
      for (size_t i = 0; i < counts.size(); ++i)
        list += (i ? ", " : "") + std::to_string(counts[i]);
      throw ConfigError(where + "parallel.pipeline.layers_per_stage = [" + list + "] sums to " +
                        std::to_string(sum) + ", but " + model_blocks +
                        "; the counts must be >= 1 and sum to " + std::to_string(n));
    }
    return counts;
  }
  if (plan_.kind == ScheduleKind::kInterleaved) {
    if (n % S != 0) {
      throw ConfigError(where +
                        "schedule \"interleaved\" gives every virtual stage the same "
                        "number of blocks, but " +
                        model_blocks +
                        ", which does not divide into "
                        "size x chunks = " +
                        std::to_string(P) + " x " + std::to_string(V) + " = " + std::to_string(S) +
                        "; use a block count that is a multiple of " + std::to_string(S) +
                        " (e.g. " + std::to_string((n / S + 1) * S) +
                        " blocks), other chunks, or an explicit layers_per_stage");
    }
    return std::vector<int64_t>(S, n / S);
  }
  std::vector<double> weights(n, 0.0);
  if (pc.balance == "time") {
    weights = measure_block_times(model, config);
    // Every rank measured; the cut must be the same everywhere: use the mean.
    at::Tensor t = torch::tensor(weights, torch::kDouble);
    mesh.world()->all_reduce(t, comm::ReduceOp::kAvg)->wait();
    for (int64_t b = 0; b < n; ++b) weights[b] = t[b].item<double>();
  } else {
    for (const auto& p : model.all_parameters()) weights[p.block] += p.placement.global_numel();
  }
  return balanced_cut(weights, S);
}

// Forward + backward time of each block on a micro-batch-sized input (the
// best of three), run block by block on detached inputs.
std::vector<double> PipelineExecutor::measure_block_times(Model& model, const RunConfig& config) {
  const size_t n = model.blocks().size();
  std::vector<double> best(n, std::numeric_limits<double>::infinity());
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  const at::Tensor rng_state = generator.get_state();
  // Whole samples on this rank alone: under sequence parallelism the blocks
  // skip the sp group's collectives (the relative times are what counts).
  SequenceBypassScope whole_sequence;
  for (int rep = 0; rep < 3; ++rep) {
    at::Tensor x = torch::zeros({config.train.micro_batch, config.model.seq_len}, torch::kInt64);
    for (size_t b = 0; b < n; ++b) {
      const auto t0 = Clock::now();
      at::Tensor y = model.blocks()[b].second->forward(x);
      if (y.requires_grad()) y.sum().backward();
      best[b] = std::min(best[b], seconds_since(t0));
      x = y.detach();
      if (x.is_floating_point()) x.requires_grad_(true);
    }
  }
  for (const auto& p : model.all_parameters()) p.tensor.mutable_grad().reset();
  generator.set_state(rng_state);
  return best;
}

void PipelineExecutor::post_receive(const Action& a) {
  const bool grad = a.op == Op::kRecvGrad;
  const auto key = std::make_tuple(grad ? 1 : 0, a.micro, a.chunk);
  if (receives_.count(key)) return;
  const int vs = plan_.virtual_stage(rank_, a.chunk);
  // Activations arrive for this virtual stage; gradients for the activation
  // this stage sent to the next one (same shape).
  const int boundary = grad ? vs + 1 : vs;
  Transfer t;
  auto shape = activation_shape_.find(boundary);
  if (shape == activation_shape_.end()) {
    if (grad) return;  // not known before this stage's first send: posted when taken
    t.tensor = torch::empty({10}, torch::kInt64);
    t.work = group_->recv(t.tensor, a.peer, tag(2, 0, boundary));
    t.header = true;
  } else {
    t.tensor =
        torch::empty(shape->second, torch::TensorOptions().dtype(activation_dtype_[boundary]));
    t.work = group_->recv(t.tensor, a.peer, tag(grad ? 1 : 0, a.micro, boundary));
  }
  receives_[key] = std::move(t);
}

at::Tensor PipelineExecutor::take_receive(const Action& a) {
  const bool grad = a.op == Op::kRecvGrad;
  const auto key = std::make_tuple(grad ? 1 : 0, a.micro, a.chunk);
  const int vs = plan_.virtual_stage(rank_, a.chunk);
  const int boundary = grad ? vs + 1 : vs;
  const auto start = Clock::now();
  post_receive(a);  // no-op when prefetched
  KOLOS_CHECK(receives_.count(key), "pipeline: no shape known for the data of ", describe(a));
  Transfer t = std::move(receives_.at(key));
  receives_.erase(key);
  t.work->wait();
  if (t.header) {
    const int64_t* h = t.tensor.data_ptr<int64_t>();
    std::vector<int64_t> shape(h + 2, h + 2 + h[0]);
    activation_shape_[boundary] = shape;
    activation_dtype_[boundary] = static_cast<at::ScalarType>(h[1]);
    at::Tensor data =
        torch::empty(shape, torch::TensorOptions().dtype(activation_dtype_[boundary]));
    group_->recv(data, a.peer, tag(0, a.micro, boundary))->wait();
    t.tensor = data;
  }
  record(std::string(grad ? "wait grad " : "wait act ") + std::to_string(a.micro), "idle", start,
         Clock::now());
  return t.tensor;
}

void PipelineExecutor::send(const Action& a, const at::Tensor& tensor) {
  const bool grad = a.op == Op::kSendGrad;
  const int vs = plan_.virtual_stage(rank_, a.chunk);
  // Boundaries are named by the virtual stage that receives the activation:
  // a gradient crosses back over the boundary of the stage that sends it.
  const int boundary = grad ? vs : vs + 1;
  const auto start = Clock::now();
  at::Tensor data = tensor.detach().contiguous();
  if (!grad) {
    if (!activation_shape_.count(boundary)) {
      // This stage's own record: the gradients that come back have this shape.
      activation_shape_[boundary] = data.sizes().vec();
      activation_dtype_[boundary] = data.scalar_type();
    }
    if (a.peer != rank_ && header_sent_.insert(boundary).second) {
      KOLOS_CHECK(data.dim() <= 8, "pipeline: activations of more than 8 dimensions");
      at::Tensor header = torch::zeros({10}, torch::kInt64);
      header[0] = data.dim();
      header[1] = static_cast<int64_t>(data.scalar_type());
      for (int64_t d = 0; d < data.dim(); ++d) header[2 + d] = data.size(d);
      sends_.push_back({header, group_->send(header, a.peer, tag(2, 0, boundary))});
    }
  }
  sends_.push_back({data, group_->send(data, a.peer, tag(grad ? 1 : 0, a.micro, boundary))});
  record(std::string(grad ? "send grad " : "send act ") + std::to_string(a.micro), "send", start,
         Clock::now());
}

StepLoss PipelineExecutor::run(StepContext& context) {
  const auto& micro = *context.micro_batches;
  KOLOS_CHECK(static_cast<int>(micro.size()) == plan_.micro, "pipeline: the step has ",
              micro.size(), " micro-batches but the plan was made for ", plan_.micro);
  const double scale = context.loss_scale / static_cast<double>(plan_.micro);
  // Every stage's auxiliary losses (a router's) count as the last stage's
  // loss does.
  set_aux_loss_multiplier(scale);
  const int last_stage = plan_.virtual_stages() - 1;
  ++step_;
  StepLoss result;
  std::map<std::pair<int, int>, Slot> slots;
  double busy = 0.0;
  const auto step_start = Clock::now();

  // Posts the receives that the next compute after `i` consumes.
  auto prefetch = [&](size_t i) {
    for (size_t j = i + 1; j < actions_.size(); ++j) {
      const Action& a = actions_[j];
      if (a.op == Op::kRecvActivation || a.op == Op::kRecvGrad) post_receive(a);
      if (is_compute(a.op)) break;
    }
  };

  for (size_t i = 0; i < actions_.size(); ++i) {
    const Action& a = actions_[i];
    comm::set_progress_micro_batch(a.micro);
    const Chunk& chunk = chunks_[a.chunk];
    const int vs = chunk.virtual_stage;
    Slot& slot = slots[{a.micro, a.chunk}];
    switch (a.op) {
      case Op::kRecvActivation:
      case Op::kRecvGrad:
        post_receive(a);
        break;
      case Op::kSendActivation:
        send(a, slot.output);
        break;
      case Op::kSendGrad:
        send(a, slot.grad_input);
        slot.grad_input = at::Tensor();
        break;
      case Op::kForward: {
        at::Tensor x;
        if (vs == 0) {
          x = micro[a.micro].inputs;
        } else {
          x = take_receive({Op::kRecvActivation, a.micro, a.chunk, (vs - 1) % plan_.stages});
          x.requires_grad_(true);
        }
        prefetch(i);
        const auto start = Clock::now();
        at::Tensor y = model_->forward(x, chunk.first, chunk.last);
        if (vs == last_stage) {
          at::Tensor loss = model_->loss(y, micro[a.micro].targets);
          result.sum += loss.item<double>();
          result.count += 1;
          y = inject_no_loss_scale_ ? loss : loss * scale;
        }
        slot.input = x;
        slot.output = y;
        const auto end = Clock::now();
        busy += std::chrono::duration<double>(end - start).count();
        record(
            "F" + std::to_string(a.micro) + (plan_.chunks > 1 ? "c" + std::to_string(a.chunk) : ""),
            "forward", start, end);
        break;
      }
      case Op::kBackward:
      case Op::kBackwardInput:
      case Op::kBackwardWeight: {
        if (a.op != Op::kBackwardWeight && vs < last_stage) {
          slot.grad_output =
              take_receive({Op::kRecvGrad, a.micro, a.chunk, (vs + 1) % plan_.stages});
        }
        prefetch(i);
        const auto start = Clock::now();
        std::vector<at::Tensor> grads;
        if (slot.grad_output.defined()) grads.push_back(slot.grad_output);
        if (a.op == Op::kBackwardInput) {
          if (vs > 0) {
            slot.grad_input = torch::autograd::grad({slot.output}, {slot.input}, grads,
                                                    /*retain_graph=*/true)[0];
          }
        } else {
          context.gradients->prepare_backward(/*sync=*/i == last_weight_pass_);
          if (a.op == Op::kBackward) {
            torch::autograd::backward({slot.output}, grads);
            if (vs > 0) slot.grad_input = slot.input.grad();
          } else if (!chunk.parameters.empty()) {
            torch::autograd::backward({slot.output}, grads, /*retain_graph=*/false,
                                      /*create_graph=*/false, chunk.parameters);
          }
          slot.input = slot.output = slot.grad_output = at::Tensor();
        }
        const auto end = Clock::now();
        busy += std::chrono::duration<double>(end - start).count();
        const char* tag_name = a.op == Op::kBackward        ? "B"
                               : a.op == Op::kBackwardInput ? "BI"
                                                            : "W";
        record(tag_name + std::to_string(a.micro) +
                   (plan_.chunks > 1 ? "c" + std::to_string(a.chunk) : ""),
               "backward", start, end);
        break;
      }
    }
  }
  const auto wait_start = Clock::now();
  for (auto& s : sends_) s.work->wait();
  sends_.clear();
  if (!receives_.empty()) {
    throw Error("pipeline: " + std::to_string(receives_.size()) +
                " receives were posted but not consumed (a plan error)");
  }
  record("wait sends", "idle", wait_start, Clock::now());
  const double total = seconds_since(step_start);
  idle_ = total > 0 ? std::max(0.0, 1.0 - busy / total) : 0.0;
  return result;
}

void PipelineExecutor::sync_tied_gradients(std::vector<GradPiece>& pieces) {
  if (tied_.empty() || inject_no_tied_sync_) return;
  // This rank's copies of tied weights are exactly its pieces that are not
  // sharded along pp (every other parameter is), in model order on every
  // holder, so the i-th such piece is the i-th tied weight.
  std::vector<GradPiece*> copies;
  for (auto& piece : pieces) {
    if (!piece.placement.sharded().contains(Axis::kPP)) copies.push_back(&piece);
  }
  KOLOS_CHECK(copies.size() == tied_.size(), "pipeline: ", tied_.size(),
              " tied weights on this stage but ", copies.size(),
              " gradient pieces not sharded along pp");
  torch::NoGradGuard no_grad;
  const int base = tag(3, 0, 0);
  for (size_t i = 0; i < tied_.size(); ++i) {
    const std::vector<int>& holders = tied_[i].second;
    at::Tensor& grad = copies[i]->grad;
    at::Tensor buffer = grad.contiguous();
    const int up = base + 2 * static_cast<int>(i), down = up + 1;
    if (rank_ == holders.front()) {
      for (size_t h = 1; h < holders.size(); ++h) {
        at::Tensor other = torch::empty_like(buffer);
        group_->recv(other, holders[h], up)->wait();
        buffer.add_(other);
      }
      std::vector<comm::WorkPtr> works;
      for (size_t h = 1; h < holders.size(); ++h)
        works.push_back(group_->send(buffer, holders[h], down));
      for (auto& w : works) w->wait();
    } else {
      group_->send(buffer, holders.front(), up)->wait();
      group_->recv(buffer, holders.front(), down)->wait();
    }
    if (!buffer.is_same(grad)) grad.copy_(buffer);
  }
}

void PipelineExecutor::record(const std::string& name, const char* category,
                              Clock::time_point start, Clock::time_point end) {
  if (!trace_ || events_.size() >= kMaxTraceEvents) return;
  // Wall-clock microseconds (system clock at set-up plus steady time since),
  // so the traces of all ranks line up when merged.
  const double s =
      origin_wall_us_ + std::chrono::duration<double, std::micro>(start - origin_).count();
  const double d = std::chrono::duration<double, std::micro>(end - start).count();
  events_.push_back({name, category, s, d, step_});
}

void PipelineExecutor::write_trace() noexcept {
  if (!trace_) return;
  std::error_code ec;  // a missing trace_dir is created; failure is reported below
  const auto dir = std::filesystem::path(trace_path_).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  std::FILE* f = std::fopen(trace_path_.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "kolos: cannot write the pipeline trace %s\n", trace_path_.c_str());
    return;
  }
  // Chrome trace event format ("X" complete events), one process per rank.
  std::fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
  std::fprintf(f,
               "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, "
               "\"args\": {\"name\": \"rank %d (pp stage %d)\"}}",
               world_rank_, world_rank_, rank_);
  for (const auto& e : events_) {
    std::fprintf(f,
                 ",\n{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"ts\": %.3f, "
                 "\"dur\": %.3f, \"pid\": %d, \"tid\": 0, \"args\": {\"step\": %lld}}",
                 e.name.c_str(), e.category, e.start_us, e.duration_us, world_rank_,
                 static_cast<long long>(e.step));
  }
  std::fprintf(f, "\n]}\n");
  std::fclose(f);
}

}  // namespace
}  // namespace kolos::pipeline

KOLOS_DEFINE_PLUGIN("pipeline", "pipeline", kolos::PipelineSchedule,
                    kolos::pipeline::PipelineExecutor,
                    "pipeline parallelism: gpipe, 1f1b, interleaved 1F1B and zero-bubble "
                    "schedules over stages cut from the model's blocks")
