// The engine's state as checkpoints and exports see it: every parameter
// gathered whole (gathered_parameters), and the training state a run
// resumes from (state, load_state), with the CPU generator's state in it.
#include "kolos/core/engine.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "kolos/core/error.h"
#include "kolos/core/experts.h"
#include "kolos/core/optimizer.h"

namespace kolos {
namespace {

std::vector<uint8_t> cpu_rng_state() {
  at::Tensor state = at::detail::getDefaultCPUGenerator().get_state();
  const auto* p = state.data_ptr<uint8_t>();
  return std::vector<uint8_t>(p, p + state.numel());
}

void set_cpu_rng_state(const std::vector<uint8_t>& bytes) {
  at::Tensor state = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  std::memcpy(state.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

// `mine` (this rank's parameters, whole, in model order; `apart[i]`: held
// by this rank alone along the group's axis, an expert under ep) with the
// other ranks' held-apart ones added: each run of consecutive held-apart
// entries becomes the runs of every rank of `group` in rank order (rank r
// holds the r-th share of the experts, so that is the serial order). Every
// rank of the group has the same runs, by position; each rank broadcasts
// its runs' names, dtypes and shapes, then the tensors.
std::vector<std::pair<std::string, at::Tensor>> share_held_apart(
    const std::vector<std::pair<std::string, at::Tensor>>& mine, const std::vector<bool>& apart,
    comm::ProcessGroup& group) {
  // The runs: [begin, end) of mine.
  std::vector<std::pair<size_t, size_t>> runs;
  for (size_t i = 0; i < mine.size();) {
    if (!apart[i]) {
      ++i;
      continue;
    }
    size_t e = i;
    while (e < mine.size() && apart[e]) ++e;
    runs.emplace_back(i, e);
    i = e;
  }
  // Every rank's runs: names and tensors.
  std::vector<std::vector<std::vector<std::pair<std::string, at::Tensor>>>> theirs(group.size());
  for (int root = 0; root < group.size(); ++root) {
    std::ostringstream header;
    if (root == group.rank()) {
      for (const auto& [b, e] : runs) {
        header << e - b << "\n";
        for (size_t i = b; i < e; ++i) {
          const at::Tensor& t = mine[i].second;
          header << mine[i].first << " " << static_cast<int>(t.scalar_type()) << " " << t.dim();
          for (int64_t d : t.sizes()) header << " " << d;
          header << "\n";
        }
      }
    }
    std::string text = header.str();
    at::Tensor length = torch::tensor({static_cast<int64_t>(text.size())}, torch::kInt64);
    group.broadcast(length, root)->wait();
    at::Tensor bytes = torch::empty({length.item<int64_t>()}, torch::kUInt8);
    if (root == group.rank()) std::memcpy(bytes.data_ptr(), text.data(), text.size());
    group.broadcast(bytes, root)->wait();
    text.assign(reinterpret_cast<const char*>(bytes.data_ptr()), bytes.numel());
    std::istringstream in(text);
    auto& runs_of_root = theirs[root];
    for (size_t r = 0; r < runs.size(); ++r) {
      size_t count = 0;
      in >> count;
      KOLOS_CHECK(static_cast<bool>(in), "gathered_parameters: rank ", root,
                  " of the expert group has fewer runs of experts than this one");
      std::vector<std::pair<std::string, at::Tensor>> run;
      for (size_t i = 0; i < count; ++i) {
        std::string name;
        int dtype = 0, dims = 0;
        in >> name >> dtype >> dims;
        std::vector<int64_t> shape(dims);
        for (auto& d : shape) in >> d;
        at::Tensor t = root == group.rank()
                           ? mine[runs[r].first + i].second.contiguous()
                           : torch::empty(shape, at::TensorOptions().dtype(
                                                     static_cast<at::ScalarType>(dtype)));
        group.broadcast(t, root)->wait();
        run.emplace_back(name, t);
      }
      runs_of_root.push_back(std::move(run));
    }
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  size_t next_run = 0;
  for (size_t i = 0; i < mine.size();) {
    if (!apart[i]) {
      out.push_back(mine[i]);
      ++i;
      continue;
    }
    for (const auto& runs_of_root : theirs) {
      for (const auto& entry : runs_of_root[next_run]) out.push_back(entry);
    }
    i = runs[next_run].second;
    ++next_run;
  }
  return out;
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> Engine::gathered_parameters() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::vector<bool> apart;  // held by this rank alone along ep (an expert)
  torch::NoGradGuard no_grad;
  const AxisSet ep{expert_axis()};
  // Held apart along ep: by the model's placement (ZeRO may shard any
  // parameter over ep as well, which is gathered as usual).
  std::set<std::string> held_apart;
  for (const auto& p : model_->all_parameters()) {
    if (p.placement.sharded().contains(expert_axis())) held_apart.insert(p.name);
  }
  const auto gather_axes = [&](const PlacedParameter& p) {
    return held_apart.count(p.name) ? p.placement.sharded().without(ep) : p.placement.sharded();
  };
  // The gradients role knows where parameters live at rest (ZeRO-3: shards
  // only; the model's own tensors are empty between uses).
  if (!model_->pipelined()) {
    for (const auto& p : gradients_->parameters_at_rest()) {
      out.emplace_back(p.name, gather_global(p.tensor.detach(), p.placement, *mesh_, gather_axes(p)));
      apart.push_back(held_apart.count(p.name) > 0);
    }
  } else {
    // Pipelined: each stage assembles its own parameters over the other
    // sharded axes, then every parameter is broadcast over pp, in model
    // order, from the first stage that holds it (stages of one ep
    // coordinate hold the same experts).
    const AxisSet pp{Axis::kPP};
    std::map<std::string, at::Tensor> mine;
    for (const auto& p : gradients_->parameters_at_rest()) {
      mine[p.name] = gather_global(p.tensor.detach(), p.placement, *mesh_,
                                   gather_axes(p).without(pp));
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
      apart.push_back(held_apart.count(p.name) > 0);
    }
  }
  if (mesh_->size(expert_axis()) == 1) return out;
  return share_held_apart(out, apart, *mesh_->group(expert_axis()));
}

TrainingState Engine::state() {
  TrainingState state;
  for (auto& p : gradients_->parameters_at_rest()) {
    at::Tensor tensor = p.tensor.detach();
    // Mixed precision: the fp32 master is the parameter's truth, and what
    // is saved (so a checkpoint loads into a run of any precision).
    // (zero3's shards at rest do not require grad themselves; their masters
    // are found all the same.)
    if (tensor.scalar_type() != at::kFloat && tensor.is_floating_point()) {
      at::Tensor master = gradients_->master_of(p.tensor);
      KOLOS_CHECK(master.defined() || !p.tensor.requires_grad(),
                  "checkpoint: the gradients plugin `", gradients_->name(),
                  "` holds no fp32 master for parameter ", p.name, " at rest (",
                  config_.train.precision,
                  "); its parameters at rest must be what its optimizer steps");
      if (master.defined()) tensor = master;
    }
    state.pieces.push_back(StatePiece{"model/" + p.name, tensor, p.placement});
  }
  for (auto& s : gradients_->optimizer_state()) {
    state.pieces.push_back(StatePiece{"optim/" + s.name, s.tensor, s.placement});
  }
  for (const auto& [name, bias] : router_biases_) {
    state.pieces.push_back(StatePiece{std::string(kStatePrefix) + name, bias,
                                      Placement::replicated(bias.sizes().vec())});
  }
  state.step = step_;
  state.data_position = step_ * config_.train.global_batch;
  state.optimizer_steps = gradients_->optimizer_steps();
  if (scaler_) {
    state.loss_scale = scaler_->scale();
    state.loss_scale_good_steps = scaler_->good_steps();
  }
  state.rng_cpu = cpu_rng_state();
  state.config_toml = to_toml(config_);
  state.mesh = mesh_->layout().shape();
  return state;
}

void Engine::load_state(const TrainingState& state) {
  const TrainingState live = this->state();
  std::map<std::string, const StatePiece*> by_name;
  for (const auto& p : live.pieces) by_name[p.name] = &p;
  torch::NoGradGuard no_grad;
  for (const auto& p : state.pieces) {
    const auto it = by_name.find(p.name);
    KOLOS_CHECK(it != by_name.end(), "load_state: this engine holds no piece ", p.name);
    const StatePiece& mine = *it->second;
    // This engine's own tensor (a state from state(), read into in place).
    if (p.tensor.data_ptr() == mine.tensor.data_ptr() && p.tensor.sizes() == mine.tensor.sizes()) {
      continue;
    }
    KOLOS_CHECK(p.placement == mine.placement && p.tensor.sizes() == mine.tensor.sizes(),
                "load_state: piece ", p.name, " is placed as ", p.placement.to_string(), " (",
                p.tensor.sizes(), "), this engine's as ", mine.placement.to_string(), " (",
                mine.tensor.sizes(), ")");
    mine.tensor.copy_(p.tensor);
  }
  if (AdamW* optimizer = gradients_->adamw()) optimizer->copy_masters_to_params();
  gradients_->after_load();
  step_ = state.step;
  gradients_->set_optimizer_steps(state.optimizer_steps);
  // A state without a scale (an fp32 or bf16 run's) starts fp16 at its
  // configured scale.
  if (scaler_ && state.loss_scale > 0) {
    scaler_->restore(state.loss_scale, state.loss_scale_good_steps);
  }
  if (!state.rng_cpu.empty()) set_cpu_rng_state(state.rng_cpu);
  const int64_t batch = config_.train.global_batch;
  if (mesh_->rank() == 0 && state.data_position != state.step * batch) {
    std::fprintf(stderr,
                 "kolos: warning: the state consumed %lld samples in %lld steps; with this run's "
                 "global batch of %lld, data continues at sample %lld\n",
                 static_cast<long long>(state.data_position), static_cast<long long>(state.step),
                 static_cast<long long>(batch), static_cast<long long>(state.step * batch));
  }
}

}  // namespace kolos
