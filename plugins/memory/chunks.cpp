// The chunks plugin (chunked_memory.h): ChunkedMemory's set-up, from the
// [memory] and [parallel.zero] tables to the first step (the trainable
// parameters and their data domains, the chunk layout, which parameters
// each block reads, the trace, the placement plan, the optimizer over
// chunk-backed slots, the executor, the block hooks), its teardown, and the
// plugin's registration.
#include <malloc.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kolos/core/config_located.h"
#include "kolos/core/error.h"
#include "kolos/core/format.h"
#include "kolos/core/plugin_registry.h"
#include "kolos/core/settings.h"
#include "kolos/core/tensor_storage.h"

#include "chunked_memory.h"

namespace kolos::chunks {
namespace {

// Where the model waits while it is built into place: the NVMe tier's
// directory, else the temporary directory ($TMPDIR, else /tmp).
std::string spill_dir(const ChunkSettings& settings) {
  if (settings.offload == "nvme") return settings.nvme_dir;
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
}

}  // namespace

using memory::ChunkId;

void ChunkedMemory::configure(const PluginContext& context) {
  settings_ = read_chunk_settings(context);
  chunk_bytes_ = settings_.chunk_bytes;
  // It composes with data parallelism and ZeRO 1-3 (below), tensor and
  // sequence parallelism of every mode and every pipeline schedule (the
  // chunks hold this rank's pieces and follow its passes), in every
  // precision.
  const RunConfig& cfg = context.config;
  reduce_in_fp32_ = reduce_in_fp32(cfg);
  // ZeRO over chunks, chunk index k owned by rank k mod the size of its
  // domain (below): stage 1 shards the optimizer's chunks (moments and
  // masters), stage 2 also reduces each gradient to its chunk's owner
  // only, stage 3 also keeps each parameter chunk on its owner only
  // (gathered where a step needs it). The engine hands this plugin
  // [parallel.zero] in the gradients plugin's place.
  const ConfigSection zero = cfg.section("parallel.zero");
  zero_stage_ = cfg.parallel.zero.stage;
  zero.check_keys({"stage"}, context.owner + " (which serves parallel.zero under [memory])");
  accumulation_ = context.accumulation;
}

void ChunkedMemory::setup(Model& model, const DeviceMesh& mesh, const RunConfig& config) {
  model_ = &model;
  // As dp averages: each gradient over the data axes its parameter is not
  // held apart along (an expert under ep: dp x sp, then divided by ep).
  data_domain(domains_, mesh, AxisSet{});  // domains_[0]: the whole data group
  data_group_ = domains_[0].group;
  for (auto& p : model.placed_parameters()) {
    if (!p.tensor.requires_grad()) continue;
    const at::Tensor& t = p.tensor;
    if (params_.empty()) dtype_ = t.scalar_type();
    KOLOS_CHECK(t.scalar_type() == dtype_, name(), ": parameter ", p.name, " is ", t.scalar_type(),
                "; chunks hold ", dtype_, " tensors");
    // Those built into place were checked then, before their memory was freed.
    if (!spill_ || !spill_->has(t.unsafeGetTensorImpl())) check_owns_storage(p);
    params_.push_back(p);
    param_domain_.push_back(data_domain(domains_, mesh, p.placement.sharded()));
  }
  KOLOS_CHECK(!params_.empty(), name(), ": the model has no trainable parameters");
  low_ = dtype_ != at::kFloat;
  kinds_ = low_ ? kKinds : kMaster;
  lay_out_chunks(config);
  find_uses(config);
  build_trace();
  make_plan(config);
  make_optimizer(config);
  make_executor();
  install_hooks();
  // What set-up freed (the optimizer's and the parameters' own memory, the
  // executor's staging) goes back to the kernel rather than staying in
  // malloc's heap, where it would count in the resident memory while
  // training and be fragmented beyond reuse.
  malloc_trim(0);
}

BlockBuilt ChunkedMemory::placement_at_build(const DeviceMesh& mesh) {
  (void)mesh;
  return [this](const std::vector<PlacedParameter>& parameters) { spill_block(parameters); };
}

void ChunkedMemory::spill_block(const std::vector<PlacedParameter>& parameters) {
  if (!spill_) spill_ = std::make_unique<BuildSpill>(spill_dir(settings_));
  bool freed = false;
  for (const auto& p : parameters) {
    const at::Tensor& t = p.tensor;
    if (!t.requires_grad() || spill_->has(t.unsafeGetTensorImpl())) continue;
    check_owns_storage(p);
    spill_->put(t.unsafeGetTensorImpl(), t.data_ptr(), t.numel() * t.element_size());
    free_storage(t);
    freed = true;
  }
  // The freed pages go back to the kernel now (malloc_trim also releases
  // free pages inside the heap): left in malloc's heap, they would stay
  // resident until a later block happened to reuse them.
  if (freed) malloc_trim(0);
}

void ChunkedMemory::check_owns_storage(const PlacedParameter& p) const {
  const at::Tensor& t = p.tensor;
  KOLOS_CHECK(t.device().is_cpu(), name(), ": parameter ", p.name, " is on ", t.device(),
              "; chunks hold CPU tensors");
  KOLOS_CHECK(t.is_contiguous() && t.storage_offset() == 0 &&
                  static_cast<int64_t>(t.storage().nbytes()) == t.numel() * t.element_size(),
              name(), ": parameter ", p.name,
              " does not own its storage (a view of another tensor?); chunks replace each "
              "parameter's memory");
}

ChunkedMemory::~ChunkedMemory() {
  // The model's block hooks point here; the engine destroys the model
  // first. Unbind every tensor from the arena before it goes away.
  try {
    for (size_t c = 0; c < bound_.size(); ++c) {
      if (bound_[c]) bind(c, nullptr);
    }
  } catch (...) {
  }
}

// Parameter i's tensor (its TensorImpl) -> i.
std::map<const void*, size_t> ChunkedMemory::param_index() const {
  std::map<const void*, size_t> index;
  for (size_t i = 0; i < params_.size(); ++i) index[params_[i].tensor.unsafeGetTensorImpl()] = i;
  return index;
}

// ---- set-up -----------------------------------------------------------------

void ChunkedMemory::lay_out_chunks(const RunConfig& config) {
  std::vector<memory::TensorSpec> specs;
  // The fp32 layout; 2-byte kinds take it at half the offsets. Parameters
  // of different domains never share a chunk: a chunk is reduced (and
  // under ZeRO owned) within one domain.
  for (size_t i = 0; i < params_.size(); ++i) {
    specs.push_back(
        {params_[i].name, params_[i].tensor.numel() * 4, static_cast<int>(param_domain_[i])});
  }
  const int64_t align = memory::kDirectIoAlignment;
  if (chunk_bytes_ == 0) {
    // Searched, as Gemini does: the size that wastes least, between the
    // smallest that holds every tensor and a sixteenth of the budget (an
    // optimizer step needs four chunks at once, a backward step more).
    const int64_t least = memory::smallest_chunk_bytes(specs);
    const int64_t lo = (least + align - 1) / align * align;
    const int64_t hi = std::max(lo, settings_.compute_budget / 16 / align * align);
    const int64_t stride = std::max(align, (hi - lo) / 64 / align * align);
    search_ = memory::search_chunk_bytes(specs, lo, hi, stride);
    chunk_bytes_ = search_.chunk_bytes;
  }
  try {
    layout_ = memory::pack(specs, chunk_bytes_);
  } catch (const Error& e) {
    throw ConfigError(
        located(config, "memory.chunk_size", quote_toml(settings_.chunk_size) + ": " + e.what()));
  }
  num_chunks_ = layout_.num_chunks();
  chunk_params_.assign(num_chunks_, {SIZE_MAX, 0});
  chunk_domain_.assign(num_chunks_, 0);
  for (size_t i = 0; i < params_.size(); ++i) {
    chunk_domain_[layout_.slots[i].chunk] = param_domain_[i];
    auto& range = chunk_params_[layout_.slots[i].chunk];
    if (range.first == SIZE_MAX) range.first = i;
    KOLOS_CHECK(range.second == 0 || range.second == i, "internal error: chunk ",
                layout_.slots[i].chunk, " holds parameters out of order");
    range.second = i + 1;
  }
}

// Which parameters each block reads (a block may read another's: tied
// weights), found by one probe forward, as ZeRO-3 does.
void ChunkedMemory::find_uses(const RunConfig& config) {
  if (!model_->has_block_reads()) {
    // A micro-batch's shape: tensor 2d splits the batch over its grid.
    model_->find_block_reads(
        torch::zeros({config.train.micro_batch, config.model.seq_len}, torch::kInt64));
  }
  const std::map<const void*, size_t> index = param_index();
  const size_t blocks = model_->blocks().size();
  uses_.assign(blocks, {});
  for (size_t b = 0; b < blocks; ++b) {
    for (const void* impl : model_->block_reads()[b]) {
      const auto it = index.find(impl);
      if (it != index.end()) uses_[b].push_back(it->second);
    }
    std::sort(uses_[b].begin(), uses_[b].end());
    uses_[b].erase(std::unique(uses_[b].begin(), uses_[b].end()), uses_[b].end());
  }
}

// The trace (chunk_trace.h) of this rank's passes over the blocks.
void ChunkedMemory::build_trace() {
  TraceInputs in;
  in.chunks = num_chunks_;
  in.kinds = kinds_;
  for (size_t i = 0; i < params_.size(); ++i) {
    in.names.push_back(params_[i].name);
    in.chunk_of.push_back(layout_.slots[i].chunk);
  }
  in.uses = uses_;
  // The passes of blocks: the pipeline's order on this rank, else every
  // block forward then backward, per micro-batch.
  std::vector<Model::BlockPass> passes = model_->block_passes();
  if (passes.empty()) {
    for (int64_t m = 0; m < accumulation_; ++m) {
      passes.push_back({false, 0, uses_.size()});
      passes.push_back({true, 0, uses_.size()});
    }
  }
  for (const Model::BlockPass& pass : passes) {
    in.passes.push_back({pass.backward, pass.first, pass.last,
                         pass.backward && pass.part == Model::BlockPass::kInput});
  }
  // Tied weights: a stage's copies of parameters other stages hold too
  // (not sharded along pp), summed by the pipeline after backward.
  if (model_->pipelined()) {
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!params_[i].placement.sharded().contains(Axis::kPP)) in.tied.push_back(i);
    }
  }
  in.kind_bytes = [this](size_t kind) { return kind_bytes(kind); };
  in.owns = [this](size_t k) { return owns(k); };
  in.keeps_params = [this](size_t k) { return zero_stage_ < 3 || owns(k); };
  in.gathered = [this](size_t k) { return zero_stage_ == 3 && shards(k) > 1; };
  in.reduced = [this](size_t k) { return domain(k).ranks > 1; };
  t_ = ChunkTrace(std::move(in));
  norms_.assign(params_.size(), at::Tensor());
  finite_.assign(params_.size(), true);
  shared_norms_.assign(domains_.size(), {});
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!t_.norm_everywhere[i]) shared_norms_[param_domain_[i]].push_back(i);
  }
}

// The plan for the budget, with the overlaps augment() found room for;
// where the policy cannot place them (static placement's pinned chunks)
// the gathers ahead go first, then the reductions' overlap. Gathers are
// collective: under ZeRO-3 the group agrees to launch them ahead on every
// rank or on none.
void ChunkedMemory::make_plan(const RunConfig& config) {
  const int64_t budget = settings_.compute_budget;
  const auto any = [](const std::vector<bool>& v) {
    return std::any_of(v.begin(), v.end(), [](bool b) { return b; });
  };
  const auto refuse = [&](const std::string& why) {
    return ConfigError(located(config, "memory.compute_budget",
                               detail::format_bytes(static_cast<double>(budget)) + " (chunks of " +
                                   detail::format_bytes(static_cast<double>(chunk_bytes_)) + ", " +
                                   std::to_string(num_chunks_) +
                                   " per kind of state) cannot run this model: " + why));
  };
  std::string error;
  bool planned = false;
  for (const auto& [reductions, gathers] :
       {std::pair{true, true}, std::pair{true, false}, std::pair{false, false}}) {
    t_.augment(reductions, gathers, settings_.compute_budget);
    try {
      plan_for(budget);
      planned = true;
      break;
    } catch (const Error& e) {
      error = e.what();
    }
  }
  if (zero_stage_ == 3 && data_group_->size() > 1) {
    // -1: no plan here; 0: a plan without gathers ahead; 1: with them.
    double mine = !planned ? -1.0 : any(t_.ahead) ? 1.0 : 0.0;
    data_group_->all_reduce(at::from_blob(&mine, {1}, at::kDouble), comm::ReduceOp::kMin)->wait();
    // A rank without a plan refuses the budget below, and its error ends
    // the job (the engine's set-up aborts it); the others go on without
    // gathers ahead until then.
    if (mine <= 0 && planned && any(t_.ahead)) {
      t_.augment(any(t_.overlap), false, settings_.compute_budget);
      try {
        plan_for(budget);
      } catch (const Error& e) {
        throw refuse(e.what());
      }
    }
  }
  if (!planned) throw refuse(error);
  t_.drop_block_trace();
}

void ChunkedMemory::plan_for(int64_t budget) {
  if (settings_.placement == "auto") {
    plan_ = memory::plan_auto(t_.access, budget, static_cast<size_t>(settings_.prefetch));
  } else {
    plan_ = memory::plan_static(
        t_.access, budget,
        {settings_.param_fraction, settings_.grad_fraction, settings_.optim_fraction});
  }
}

void ChunkedMemory::make_optimizer(const RunConfig& config) {
  torch::NoGradGuard no_grad;
  optimizer_ = std::make_unique<AdamW>(adamw_settings(config.optim));
  for (auto& p : params_) {
    at::Tensor grad = torch::empty_like(p.tensor, at::MemoryFormat::Contiguous);
    free_storage(grad);
    p.tensor.mutable_grad() = grad;
    // AdamW widens a bf16/fp16 parameter into its master: a parameter
    // built into place lends it memory for that (the values do not matter:
    // the master is freed below and the chunks are filled from the spill).
    const bool freed = p.tensor.storage().nbytes() == 0 && p.tensor.numel() > 0;
    if (freed) allocate_storage(p.tensor);
    optimizer_->add(p.name, p.tensor, grad, p.placement);
    if (freed) free_storage(p.tensor);
    AdamWSlot& slot = optimizer_->slots().back();
    free_storage(slot.exp_avg);  // zeros: the chunks start zeroed
    free_storage(slot.exp_avg_sq);
    // The master (bf16/fp16) is the parameter widened, as the chunk's
    // initial contents are made (make_executor).
    if (slot.master.defined()) free_storage(slot.master);
  }
}

void ChunkedMemory::make_executor() {
  memory::ExecutorOptions options;
  options.tier = settings_.offload == "nvme" ? memory::LowerTier::kNvme : memory::LowerTier::kHost;
  options.nvme.dir = settings_.nvme_dir;
  options.nvme.threads = static_cast<int>(settings_.io_threads);
  options.scratch.assign(t_.access.chunks.size(), false);
  for (size_t k = 0; k < num_chunks_; ++k) {
    if (!holds(kParam, k)) options.scratch[id(kParam, k)] = true;
  }
  // A gradient chunk's bytes are dead from its last use (its optimizer
  // step, or under ZeRO-1/2/3 on the ranks that do not own it, its
  // reduction) to where the next iteration zeroes it: a chunk that the
  // plan keeps resident over that span takes no tier copy (every rank's
  // gradient chunks of other ranks' indices, with one micro-batch per
  // step, unless the budget evicts them mid-backward).
  options.fresh = t_.zero_at;
  options.init = [this](ChunkId c, std::byte* dst, int64_t bytes) {
    std::memset(dst, 0, static_cast<size_t>(bytes));
    const size_t kind = t_.kind_of[c];
    if (kind != kParam && kind != kMaster) return;
    const auto [first, last] = chunk_params_[t_.index_of[c]];
    for (size_t i = first; i < last; ++i) {
      at::Tensor param = params_[i].tensor;
      if (spill_ && spill_->has(param.unsafeGetTensorImpl())) {
        const at::Tensor built = at::empty(param.sizes(), param.options().requires_grad(false));
        spill_->get(param.unsafeGetTensorImpl(), built.data_ptr(),
                    built.numel() * built.element_size());
        param = built;
      }
      if (kind == kParam) {
        std::memcpy(dst + slot_offset(kind, i), param.data_ptr(),
                    static_cast<size_t>(slot_bytes(kind, i)));
      } else {
        at::from_blob(dst + slot_offset(kind, i), param.sizes(), at::kFloat).copy_(param);
      }
    }
  };
  try {
    executor_ = std::make_unique<memory::ChunkExecutor>(t_.access, plan_, options);
  } catch (const Error& e) {
    throw ConfigError(std::string("memory (") + name() + "): " + e.what());
  }
  // The chunks hold the parameters now: their own memory goes, and so
  // does the file of a model built into place.
  for (auto& p : params_) free_storage(p.tensor);
  spill_.reset();
  bound_.assign(t_.access.chunks.size(), false);
}

void ChunkedMemory::install_hooks() {
  BlockHooks hooks;
  hooks.before_forward = [this](size_t block, const at::Tensor&) {
    advance({TraceStep::kForward, block});
  };
  hooks.after_forward = [this](size_t block, const at::Tensor& output) {
    if (torch::GradMode::is_enabled() && output.requires_grad()) {
      // Fires in each autograd pass through the block: a whole backward,
      // or zero-bubble's input pass and then its weight pass.
      output.register_hook([this, block](const at::Tensor&) {
        advance({TraceStep::kBackward, block});
      });
    }
  };
  model_->set_block_hooks(std::move(hooks));
}

}  // namespace kolos::chunks

KOLOS_DEFINE_PLUGIN("chunks", "memory", kolos::GradientStrategy, kolos::chunks::ChunkedMemory,
                    "parameters, gradients and AdamW states in chunks over a budgeted compute "
                    "tier, host memory and NVMe files")
