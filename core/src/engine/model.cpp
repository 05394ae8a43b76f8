#include "kolos/core/model.h"
#include "kolos/core/config_located.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/torch.h>

#include <algorithm>

#include <map>
#include <mutex>
#include <unordered_set>

#include "kolos/core/error.h"
#include "kolos/core/recompute.h"
#include "kolos/core/sequence.h"
#include "kolos/core/tensor_storage.h"

namespace kolos {
namespace {
// build_model's BlockBuilt while its builder runs on this thread.
thread_local const BlockBuilt* t_block_built = nullptr;

// While it lives, every parameter in `parameters` whose memory is freed
// (tensor_storage.h) reads zeros: its storage points into one shared
// buffer, as large as the largest of them. Freed again on destruction.
class ZerosForFreed {
 public:
  explicit ZerosForFreed(const std::vector<PlacedParameter>& parameters) {
    int64_t largest = 0;
    for (const auto& p : parameters) {
      const at::Tensor& t = p.tensor;
      if (t.numel() == 0 || t.storage().nbytes() != 0) continue;
      freed_.push_back(t);
      largest = std::max<int64_t>(largest, t.numel() * static_cast<int64_t>(t.element_size()));
    }
    if (freed_.empty()) return;
    zeros_ = torch::zeros({largest}, freed_.front().options().dtype(at::kByte));
    for (const auto& t : freed_) {
      c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
      KOLOS_CHECK(t.device() == zeros_.device(), "the probe forward: freed parameters on ",
                  zeros_.device(), " and ", t.device());
      s->set_data_ptr_noswap(at::DataPtr(zeros_.data_ptr(), t.device()));
      s->set_nbytes(static_cast<size_t>(t.numel()) * t.element_size());
    }
  }
  ~ZerosForFreed() {
    for (const auto& t : freed_) free_storage(t);
  }
  ZerosForFreed(const ZerosForFreed&) = delete;
  ZerosForFreed& operator=(const ZerosForFreed&) = delete;

 private:
  std::vector<at::Tensor> freed_;
  at::Tensor zeros_;
};
}  // namespace

void Model::add_block(const std::string& name, LayerPtr block, bool repeated) {
  // "h.3" is registered as child "3" of a container "h", as torch's
  // ModuleList would, so parameter names read "h.3.attn.q_proj.weight".
  torch::nn::Module* parent = this;
  std::string rest = name;
  for (size_t dot; (dot = rest.find('.')) != std::string::npos; rest = rest.substr(dot + 1)) {
    const std::string part = rest.substr(0, dot);
    auto children = parent->named_children();
    if (auto* found = children.find(part)) {
      parent = found->get();
    } else {
      parent = parent->register_module(part, std::make_shared<torch::nn::Module>()).get();
    }
  }
  parent->register_module(rest, block);
  blocks_.emplace_back(name, std::move(block));
  repeated_.push_back(repeated);
  recompute_.push_back(false);
  if (t_block_built != nullptr && *t_block_built) {
    (*t_block_built)(block_parameters(blocks_.size() - 1));
  }
}

void Model::set_recompute(const std::string& mode, int64_t every) {
  KOLOS_CHECK(mode == "none" || mode == "full" || mode == "selective", "recompute mode `", mode,
              "`: valid are none, full, selective");
  KOLOS_CHECK(every >= 1, "recompute every ", every, " blocks: must be >= 1");
  recompute_mode_ = mode;
  int64_t nth = 0;
  for (size_t b = 0; b < blocks_.size(); ++b) {
    recompute_[b] = mode != "none" && repeated_[b] && nth % every == 0;
    if (repeated_[b]) ++nth;
  }
}

at::Tensor Model::forward(const at::Tensor& input, size_t first, size_t last) {
  last = std::min(last, blocks_.size());
  at::Tensor x = input;
  for (size_t i = first; i < last; ++i) {
    if (hooks_.before_forward) hooks_.before_forward(i, x);
    if (recompute_[i] && recompute_mode_ == "full") {
      // Owns the block (backward calls it later). Its parameters are the
      // ones registered under it: a repeated block reads only its own.
      LayerPtr block = blocks_[i].second;
      x = recomputed([block](const std::vector<at::Tensor>& in) {
            return std::vector<at::Tensor>{block->forward(in[0])};
          }, {x}, block->parameters()).at(0);
    } else {
      AttentionRecomputeScope selective(recompute_[i] && recompute_mode_ == "selective");
      x = blocks_[i].second->forward(x);
    }
    if (hooks_.after_forward) hooks_.after_forward(i, x);
  }
  return x;
}

at::Tensor Model::loss(const at::Tensor& output, const at::Tensor& targets) const {
  KOLOS_CHECK(static_cast<bool>(loss_), "the model has no loss function (Model::set_loss)");
  return loss_(output, targets);
}

namespace {

// `placement` marked as held by this rank alone along `axes`, without
// cutting it: its first uncut dimension sharded into one part.
Placement held_apart(Placement placement, AxisSet axes, const std::string& name) {
  for (int d = 0; d < placement.dim(); ++d) {
    const DimSlice& s = placement.slice(d);
    if (s.length == s.padded) return placement.shard(d, 0, 1, axes);
  }
  KOLOS_CHECK(placement.dim() == 0, "parameter ", name, " (", placement.to_string(),
              ") cannot be marked as held apart along ", axes.to_string());
  return placement;
}

}  // namespace

std::vector<PlacedParameter> Model::block_parameters(size_t block) const {
  // A parameter an earlier block registered too (a tied weight) is that
  // block's.
  std::unordered_set<const void*> seen;
  for (size_t b = 0; b < block; ++b) {
    for (const auto& p : blocks_[b].second->parameters()) seen.insert(p.unsafeGetTensorImpl());
  }
  std::vector<PlacedParameter> out;
  append_parameters(block, seen, out);
  return out;
}

std::vector<PlacedParameter> Model::all_parameters() const {
  std::vector<PlacedParameter> out;
  std::unordered_set<const void*> seen;
  for (size_t b = 0; b < blocks_.size(); ++b) append_parameters(b, seen, out);
  return out;
}

void Model::append_parameters(size_t b, std::unordered_set<const void*>& seen,
                              std::vector<PlacedParameter>& out) const {
  const auto& [block_name, block] = blocks_[b];
  // Layers held apart (Layer::held_apart): their prefixes and axes.
  std::vector<std::pair<std::string, AxisSet>> apart;
  for (const auto& item : block->named_modules(block_name)) {
    const auto* layer = dynamic_cast<const Layer*>(item.value().get());
    if (layer != nullptr && !layer->held_apart().empty()) {
      apart.emplace_back(item.key() + ".", layer->held_apart());
    }
  }
  for (const auto& item : block->named_modules(block_name)) {
    const std::string& prefix = item.key();
    AxisSet apart_along;
    for (const auto& [under, axes] : apart) {
      if ((prefix + ".").compare(0, under.size(), under) == 0) apart_along = apart_along | axes;
    }
    const auto* layer = dynamic_cast<const Layer*>(item.value().get());
    for (const auto& param : item.value()->named_parameters(/*recurse=*/false)) {
      if (!seen.insert(param.value().unsafeGetTensorImpl()).second) continue;
      Placement placement;
      if (layer != nullptr && layer->placements().count(param.key())) {
        placement = layer->placements().at(param.key());
      } else {
        placement = Placement::replicated(param.value().sizes().vec());
      }
      if (!apart_along.empty()) {
        placement = held_apart(std::move(placement), apart_along, prefix + "." + param.key());
      }
      out.push_back(PlacedParameter{prefix + "." + param.key(), param.value(),
                                    std::move(placement), static_cast<int>(b)});
    }
  }
}

std::vector<PlacedParameter> Model::placed_parameters() const {
  std::vector<PlacedParameter> all = all_parameters();
  if (!pipelined()) return all;
  std::vector<PlacedParameter> out;
  for (auto& p : all) {
    const std::vector<int> holders = holders_of(p);
    if (std::find(holders.begin(), holders.end(), stage_) == holders.end()) continue;
    if (holders.size() == 1) {
      // Held by this stage only: mark pp sharded (norms sum it over pp,
      // checkpoints write it from this stage) without cutting it.
      p.placement = held_apart(std::move(p.placement), AxisSet{Axis::kPP}, p.name);
    }
    out.push_back(std::move(p));
  }
  return out;
}

void Model::set_stages(std::vector<int> stage_of_block, int stage) {
  KOLOS_CHECK(stage_of_block.size() == blocks_.size(), "set_stages: ", stage_of_block.size(),
              " stages given for ", blocks_.size(), " blocks");
  stage_of_ = std::move(stage_of_block);
  stage_ = stage;
}

std::vector<int> Model::holders_of(const PlacedParameter& parameter) const {
  std::vector<int> holders{stage_of(static_cast<size_t>(parameter.block))};
  const void* impl = parameter.tensor.unsafeGetTensorImpl();
  for (size_t b = 0; b < block_reads_.size(); ++b) {
    const auto& reads = block_reads_[b];
    if (std::find(reads.begin(), reads.end(), impl) == reads.end()) continue;
    if (std::find(holders.begin(), holders.end(), stage_of(b)) == holders.end()) {
      holders.push_back(stage_of(b));
    }
  }
  std::sort(holders.begin(), holders.end());
  return holders;
}

void Model::find_block_reads(const at::Tensor& sample) {
  std::unordered_set<const void*> parameters;
  const std::vector<PlacedParameter> all = all_parameters();
  for (const auto& p : all) parameters.insert(p.tensor.unsafeGetTensorImpl());
  const ZerosForFreed zeros_for_freed(all);
  std::vector<std::vector<const void*>> reads(blocks_.size());
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  const at::Tensor rng_state = generator.get_state();
  const BlockHooks saved = hooks_;
  std::vector<at::Tensor> inputs(blocks_.size());
  BlockHooks probe;
  probe.before_forward = [&](size_t block, const at::Tensor& input) { inputs[block] = input; };
  probe.after_forward = [&](size_t block, const at::Tensor& output) {
    if (!output.requires_grad()) return;
    torch::autograd::Node* stop = inputs[block].defined() ? inputs[block].grad_fn().get() : nullptr;
    std::vector<torch::autograd::Node*> stack{output.grad_fn().get()};
    std::unordered_set<torch::autograd::Node*> seen;
    while (!stack.empty()) {
      torch::autograd::Node* node = stack.back();
      stack.pop_back();
      if (node == nullptr || node == stop || !seen.insert(node).second) continue;
      if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(node)) {
        const void* impl = acc->variable.unsafeGetTensorImpl();
        auto& list = reads[block];
        if (parameters.count(impl) && std::find(list.begin(), list.end(), impl) == list.end()) {
          list.push_back(impl);
        }
        continue;
      }
      for (const auto& edge : node->next_edges()) stack.push_back(edge.function.get());
    }
  };
  // Blocks run one at a time on a detached input, so each walk stops at its
  // own block.
  try {
    torch::AutoGradMode grad_mode(true);
    // The sample is a whole sequence on each rank alone: no sp collectives.
    SequenceBypassScope whole_sequence;
    hooks_ = {};
    at::Tensor x = sample;
    for (size_t b = 0; b < blocks_.size(); ++b) {
      inputs[b] = x;
      at::Tensor y = blocks_[b].second->forward(x);
      probe.after_forward(b, y);
      x = y.detach();
      if (x.is_floating_point()) x.requires_grad_(true);
    }
  } catch (const std::exception& e) {
    hooks_ = saved;
    generator.set_state(rng_state);
    throw Error(
        "the probe forward (one batch of token 0) that finds which parameters each "
        "block reads failed: " +
        std::string(e.what()));
  }
  hooks_ = saved;
  generator.set_state(rng_state);
  block_reads_ = std::move(reads);
}

namespace {
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, ModelBuilder>& registry() {
  static std::map<std::string, ModelBuilder> r;
  return r;
}
}  // namespace

void register_model(const std::string& name, ModelBuilder builder) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[name] = std::move(builder);
}

std::vector<std::string> registered_models() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<std::string> names;
  for (const auto& [name, builder] : registry()) names.push_back(name);
  return names;
}

namespace {
// "" when `name` is registered, else what is wrong and what would be valid.
std::string unknown_model(const std::string& name) {
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    if (registry().count(name)) return "";
  }
  std::string known;
  for (const auto& n : registered_models()) known += (known.empty() ? "" : ", ") + n;
  std::string hint = closest_match(name, registered_models());
  return "no model named `" + name + "`" + (hint.empty() ? "" : " (did you mean `" + hint + "`?)") +
         "; known models: " + (known.empty() ? "none" : known);
}
}  // namespace

void check_model_name(const ModelConfig& config) {
  const std::string problem = unknown_model(config.name);
  if (!problem.empty()) throw ConfigError("model.name: " + problem);
}

void check_model_name(const RunConfig& config) {
  const std::string problem = unknown_model(config.model.name);
  if (!problem.empty()) throw ConfigError(located(config, "model.name", problem));
}

std::shared_ptr<Model> build_model(const ModelConfig& config, LayerFactory& factory,
                                   const BlockBuilt& built) {
  check_model_name(config);
  ModelBuilder builder;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    builder = registry().at(config.name);
  }
  struct Scope {
    const BlockBuilt* saved = t_block_built;
    ~Scope() { t_block_built = saved; }
  } scope;
  t_block_built = &built;
  return builder(config, factory);
}

}  // namespace kolos
