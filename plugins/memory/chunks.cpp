// chunks: the memory role's plugin. Parameters, gradients and AdamW's two
// moments live in fixed-size chunks; a budgeted compute tier holds the
// chunks the current part of the step needs, host memory or NVMe files
// hold the rest (docs/memory.md).
//
// It serves in the gradients role's place: it keeps the gradients and the
// optimizer states itself. One iteration (optimizer step) is a fixed
// sequence of trace steps, known before training:
//   per micro-batch: forward of block 0 .. B-1 (the parameters each block
//     reads), backward of block B-1 .. 0 (those parameters and their
//     gradients);
//   then per chunk k: the optimizer step of chunk k (its parameters,
//     gradients and moments).
// The placement plan (memory/placement.h) is made from that trace, and the
// executor (memory/chunk_executor.h) carries it out: before a trace step
// begins, its chunks are in the compute tier. The model's parameter tensors
// and their .grad tensors, and the optimizer's moments, keep their identity
// throughout; only the memory under them changes: a tensor's storage points
// into its chunk while the chunk is in a step that needs it, and holds no
// memory otherwise (kolos/core/tensor_storage.h's technique, so views and
// tensors autograd saved follow). Block hooks advance the trace: a block's
// forward begins a forward step, the hook on its output (before its
// backward) a backward step; the optimizer's chunk steps are run by step().
//
// Results are bit-equal to the in-memory run (dp on one rank): autograd
// accumulates into the same .grad values, the gradient norm is the same sum
// of the same per-tensor norms, clipping multiplies the same tensors by the
// same factors, and the optimizer is the same kolos::AdamW applied to one
// chunk's slots at a time (its update is element-wise).
#include <fcntl.h>
#include <malloc.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kolos/core/comm/process_group.h"
#include "kolos/core/config_located.h"
#include "kolos/core/data_domains.h"
#include "kolos/core/error.h"
#include "kolos/core/format.h"
#include "kolos/core/gradient_strategy.h"
#include "kolos/core/mesh.h"
#include "kolos/core/optimizer.h"
#include "kolos/core/plugin_registry.h"
#include "kolos/core/settings.h"
#include "kolos/core/tensor_storage.h"
#include "kolos/memory/chunk_executor.h"
#include "kolos/memory/chunk_layout.h"
#include "kolos/memory/placement.h"

#include "chunk_settings.h"
#include "chunk_trace.h"

namespace kolos {
namespace {

using memory::ChunkId;

// Fault injection, compiled only into the test copy of this plugin
// (lib/kolos/fault-plugins of the build tree, never installed): with
// KOLOS_CHUNKS_TEST_DIE_STEP=S the process kills itself with SIGKILL
// halfway through optimizer step S's chunks, some of them updated (and
// written back to host or NVMe) and some not: a power loss at the worst
// point, reached without a timer.
#ifdef KOLOS_FAULT_INJECTION
void maybe_die_mid_step(int64_t step, size_t chunk, size_t chunks) {
  const char* at = std::getenv("KOLOS_CHUNKS_TEST_DIE_STEP");
  if (at == nullptr || std::atoll(at) != step || chunk != chunks / 2) return;
  std::fprintf(stderr, "kolos: test hook: killed in optimizer step %lld at chunk %zu of %zu\n",
               static_cast<long long>(step), chunk, chunks);
  std::fflush(stderr);
  std::raise(SIGKILL);
}
#else
void maybe_die_mid_step(int64_t, size_t, size_t) {}
#endif

// The kinds of state (chunk_trace.h): a kind of 2-byte elements packs at
// half the offsets into chunks of half the bytes (rounded up to the
// direct-I/O alignment).
using chunks::Kind;
using chunks::kParam;
using chunks::kGrad;
using chunks::kExpAvg;
using chunks::kExpAvgSq;
using chunks::kMaster;
using chunks::kKinds;
using chunks::TraceStep;

class ChunkedMemory : public GradientStrategy {
 public:
  std::string name() const override { return "chunks"; }

  void configure(const PluginContext& context) override {
    settings_ = chunks::read_chunk_settings(context);
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

  void setup(Model& model, const DeviceMesh& mesh, const RunConfig& config) override {
    model_ = &model;
    // As dp averages: each gradient over the data axes its parameter is not
    // held apart along (an expert under ep: dp x sp, then divided by ep).
    data_domain(domains_, mesh, AxisSet{});  // domains_[0]: the whole data group
    data_group_ = domains_[0].group;
    for (auto& p : model.placed_parameters()) {
      if (!p.tensor.requires_grad()) continue;
      const at::Tensor& t = p.tensor;
      if (params_.empty()) dtype_ = t.scalar_type();
      KOLOS_CHECK(t.scalar_type() == dtype_ && t.device().is_cpu(), name(), ": parameter ", p.name,
                  " is ", t.scalar_type(), " on ", t.device(), "; chunks hold ", dtype_,
                  " CPU tensors");
      KOLOS_CHECK(t.is_contiguous() && t.storage_offset() == 0 &&
                      static_cast<int64_t>(t.storage().nbytes()) == t.numel() * t.element_size(),
                  name(), ": parameter ", p.name,
                  " does not own its storage (a view of another tensor?); chunks replace each "
                  "parameter's memory");
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
    // The model was built whole in memory; from here on the budget holds.
    // Peak RSS (the metrics' peak_rss_bytes) counts from now on.
    reset_peak_rss();
  }

  // ---- one step -----------------------------------------------------------

  ReductionStats reduction_stats() const override {
    // bytes: the gradients' reductions (ZeRO's parameter broadcasts are
    // not reductions); bytes_during_backward: those that ran while the
    // next block step computed.
    ReductionStats stats;
    stats.bytes = reduced_bytes_;
    stats.bytes_during_backward = overlapped_bytes_;
    stats.reductions = reductions_;
    stats.completed_before_finish = completed_before_finish_;
    stats.wait_s = finish_wait_s_;
    return stats;
  }

  GatherStats gather_stats() const override {
    GatherStats stats;
    stats.bytes = gathered_bytes_;
    stats.bytes_ahead = gathered_ahead_bytes_;
    stats.wait_s = gather_wait_s_;
    return stats;
  }

  void zero_grad() override {
    gathered_bytes_ = 0;
    gathered_ahead_bytes_ = 0;
    gather_wait_s_ = 0;
    reduced_bytes_ = 0;
    reductions_ = 0;
    overlapped_bytes_ = 0;
    completed_before_finish_ = 0;
    finish_wait_s_ = 0;
    finish_skipped_step();
    KOLOS_CHECK(cursor_ == 0, name(), ": a step began at trace step ", cursor_, " of ",
                t_.steps.size(), " (the previous step did not finish)");
    materialized_.clear();  // copies made for a checkpoint
    std::fill(norms_.begin(), norms_.end(), at::Tensor());
    std::fill(finite_.begin(), finite_.end(), true);
    tied_done_ = false;
    norms_shared_ = false;
    unscale_.reset();
    scales_.clear();
  }

  void prepare_backward(bool) override {}

  void finish_backward() override {
    // The last backward step ends here: its gradients' reductions and norms.
    const auto start = std::chrono::steady_clock::now();
    finish_reductions();  // the step before's
    finishing_ = true;
    end_current_step();
    finish_reductions();
    finishing_ = false;
    finish_wait_s_ =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (size_t i : t_.unused) norms_[i] = torch::zeros({}, dtype_);
    if (t_.tied_step != chunks::ChunkTrace::kNoStep) begin(t_.tied_step);
    KOLOS_CHECK(cursor_ == t_.optimizer_begin, name(), ": backward ended at trace step ", cursor_,
                ", expected ", t_.optimizer_begin,
                " (the blocks did not run in the order the trace was made for)");
  }

  // Under pipelining, the tied weights' gradients (resident in the tied
  // step): the pipeline sums them over their holders in place; their norms
  // are taken after (tied_norms). Every other gradient is final already.
  std::vector<GradPiece> grad_pieces() override {
    std::vector<GradPiece> pieces;
    if (t_.tied_step == chunks::ChunkTrace::kNoStep || current_ != t_.tied_step) return pieces;
    for (size_t i : t_.tied)
      pieces.push_back(GradPiece{params_[i].tensor.grad(), params_[i].placement});
    return pieces;
  }

  void set_loss_scale(double scale) override { unscale_ = 1.0 / scale; }

  bool gradients_finite(const std::vector<GradPiece>&) override {
    tied_norms();
    share_norms();
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!finite_[i]) return false;
    }
    return true;
  }

  double gradient_norm(const std::vector<GradPiece>&, const DeviceMesh& mesh) override {
    tied_norms();
    share_norms();
    // global_grad_norm()'s arithmetic on the norms taken where each
    // gradient became final: replicated pieces counted once, sharded ones
    // (tensor parallelism) summed over their group.
    std::vector<at::Tensor> norms;
    std::vector<Placement> placements;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (params_[i].tensor.numel() == 0) continue;
      KOLOS_CHECK(norms_[i].defined(), "internal error: no gradient norm for ", params_[i].name);
      norms.push_back(norms_[i]);
      placements.push_back(params_[i].placement);
    }
    return global_grad_norm(norms, placements, mesh);
  }

  void scale_gradients(std::vector<GradPiece>&, double factor) override {
    scales_.push_back(factor);  // applied chunk by chunk in step()
  }

  void step(double lr) override {
    torch::NoGradGuard no_grad;
    const int64_t t = optimizer_->step_count() + 1;
    for (size_t k = 0; k < num_chunks_; ++k) {
      maybe_die_mid_step(t, k, num_chunks_);
      begin(t_.optimizer_begin + k);
      if (owns(k)) {
        const auto [first, last] = chunk_params_[k];
        for (size_t i = first; i < last; ++i) {
          for (double f : scales_) params_[i].tensor.mutable_grad().mul_(f);
        }
        optimizer_->update(lr, first, last, t);
        for (Kind kind : {kExpAvg, kExpAvgSq, kMaster}) {
          if (kind < kinds_) executor_->mark_dirty(id(kind, k));
        }
      }
      if (shards(k) > 1 && zero_stage_ < 3) {
        // ZeRO-1/2: the chunk's owner stepped it; every rank takes its
        // parameters (the whole chunk, padding and all). Under ZeRO-3 the
        // owner alone keeps them; the others gather them where used.
        broadcast_from_owner(id(kParam, k))->wait();
      }
      if (holds(kParam, k)) executor_->mark_dirty(id(kParam, k));
    }
    end_current_step();
    optimizer_->set_step_count(t);
    scales_.clear();
    KOLOS_CHECK(cursor_ == t_.steps.size(), "internal error: step ended at trace step ", cursor_);
    cursor_ = 0;
  }

  // ---- state ----------------------------------------------------------------

  MemoryStats memory() const override {
    MemoryStats m;
    m.parameter_bytes = peak_by_kind_[kParam];
    m.gradient_bytes = peak_by_kind_[kGrad];
    m.optimizer_bytes = peak_by_kind_[kExpAvg] + peak_by_kind_[kExpAvgSq] + peak_by_kind_[kMaster];
    return m;
  }

  // Checkpoints: copies of the states, read from whichever tier holds each
  // chunk (they live until the next step; loading writes them back). Under
  // bf16/fp16 a checkpoint saves a parameter's fp32 master (master_of).
  std::vector<PlacedParameter> parameters_at_rest() override {
    materialize();
    std::vector<PlacedParameter> out;
    std::map<const void*, size_t> index;
    for (size_t i = 0; i < params_.size(); ++i) index[params_[i].tensor.unsafeGetTensorImpl()] = i;
    for (const auto& p : model_->placed_parameters()) {
      const auto it = index.find(p.tensor.unsafeGetTensorImpl());
      if (it == index.end()) {
        out.push_back(p);
        continue;
      }
      out.push_back(
          PlacedParameter{p.name, materialized_[kParam][it->second], p.placement, p.block});
    }
    return out;
  }

  at::Tensor master_of(const at::Tensor& param) override {
    if (!low_ || materialized_.empty()) return at::Tensor();
    const auto it = materialized_index_.find(param.unsafeGetTensorImpl());
    return it == materialized_index_.end() ? at::Tensor() : materialized_[kMaster][it->second];
  }

  std::vector<StatePiece> optimizer_state() override {
    materialize();
    std::vector<StatePiece> pieces;
    for (size_t i = 0; i < params_.size(); ++i) {
      const auto& p = params_[i];
      pieces.push_back(StatePiece{"exp_avg/" + p.name, materialized_[kExpAvg][i], p.placement});
      pieces.push_back(
          StatePiece{"exp_avg_sq/" + p.name, materialized_[kExpAvgSq][i], p.placement});
    }
    return pieces;
  }

  void after_load() override {
    KOLOS_CHECK(!materialized_.empty(), "internal error: ", name(),
                ": after_load() without the state it was loaded into");
    torch::NoGradGuard no_grad;
    if (low_) {
      // The masters were loaded; the parameters are their roundings.
      for (size_t i = 0; i < params_.size(); ++i) {
        materialized_[kParam][i].copy_(materialized_[kMaster][i]);
      }
    }
    for (Kind kind : {kParam, kExpAvg, kExpAvgSq, kMaster}) {
      if (kind >= kinds_) continue;
      std::vector<std::byte> bytes(static_cast<size_t>(kind_bytes(kind)));
      for (size_t k = 0; k < num_chunks_; ++k) {
        if (!holds(kind, k)) continue;  // another rank's
        std::fill(bytes.begin(), bytes.end(), std::byte{0});
        const auto [first, last] = chunk_params_[k];
        for (size_t i = first; i < last; ++i) {
          const at::Tensor& t = materialized_[kind][i];
          std::memcpy(bytes.data() + slot_offset(kind, i), t.data_ptr(),
                      static_cast<size_t>(slot_bytes(kind, i)));
        }
        executor_->write_chunk(id(kind, k), bytes.data());
      }
    }
    materialized_.clear();
  }

  int64_t optimizer_steps() const override { return optimizer_->step_count(); }
  void set_optimizer_steps(int64_t steps) override { optimizer_->set_step_count(steps); }

  ~ChunkedMemory() override {
    // The model's block hooks point here; the engine destroys the model
    // first. Unbind every tensor from the arena before it goes away.
    try {
      for (size_t c = 0; c < bound_.size(); ++c) {
        if (bound_[c]) bind(c, nullptr);
      }
    } catch (...) {
    }
  }

 private:
  // The executor's chunks: kind `kind`, index k. Under ZeRO-1 a rank holds
  // the optimizer's chunks (moments, masters) of the indices it owns only.
  ChunkId id(Kind kind, size_t k) const { return t_.id(kind, k); }
  bool has(Kind kind, size_t k) const { return t_.has(kind, k); }
  // This rank keeps chunk k of `kind` between uses: not another rank's
  // optimizer chunk (ZeRO-1 and up) nor its parameter chunk (ZeRO-3).
  bool holds(Kind kind, size_t k) const {
    return has(kind, k) && (kind != kParam || zero_stage_ < 3 || owns(k));
  }
  // Launches the broadcast of chunk c (resident) from its index's owner to
  // every other rank of the group; c must stay resident until it completes.
  // Not a reduction: not in reduction_stats().
  comm::WorkPtr broadcast_from_owner(ChunkId c) {
    at::Tensor bytes = at::from_blob(executor_->chunk(c), {kind_bytes(t_.kind_of[c])},
                                     at::TensorOptions().dtype(at::kByte));
    return domain(t_.index_of[c]).group->broadcast(bytes, owner(t_.index_of[c]));
  }
  // The ranks chunk index k's gradients are averaged over.
  const DataDomain& domain(size_t k) const { return domains_[chunk_domain_[k]]; }
  // ZeRO: the ranks chunk index k is spread over (1 without ZeRO), its
  // owner and this rank's place among them.
  int shards(size_t k) const {
    return zero_stage_ >= 1 ? static_cast<int>(domain(k).ranks) : 1;
  }
  int shard_rank(size_t k) const {
    return zero_stage_ >= 1 ? static_cast<int>(domain(k).index) : 0;
  }
  int owner(size_t k) const { return static_cast<int>(k % static_cast<size_t>(shards(k))); }
  bool owns(size_t k) const { return owner(k) == shard_rank(k); }
  // Bytes of one element, of a chunk, and of parameter i's slot, in a kind.
  int64_t elem_bytes(size_t kind) const {
    return kind == kParam || kind == kGrad ? static_cast<int64_t>(c10::elementSize(dtype_)) : 4;
  }
  int64_t kind_bytes(size_t kind) const {
    const int64_t align = memory::kDirectIoAlignment;
    return (chunk_bytes_ / 4 * elem_bytes(kind) + align - 1) / align * align;
  }
  int64_t slot_offset(size_t kind, size_t i) const {
    return layout_.slots[i].offset / 4 * elem_bytes(kind);
  }
  int64_t slot_bytes(size_t kind, size_t i) const {
    return layout_.slots[i].bytes / 4 * elem_bytes(kind);
  }

  // A step whose backward ended but whose optimizer step the engine skipped
  // (fp16's loss scaler found an overflow): the optimizer's trace steps run
  // all the same, since the plan expects them (what is resident where), but
  // nothing is updated or marked changed.
  void finish_skipped_step() {
    if (cursor_ != t_.optimizer_begin) return;
    for (size_t k = 0; k < num_chunks_; ++k) begin(t_.optimizer_begin + k);
    end_current_step();
    scales_.clear();
    cursor_ = 0;
  }

  // ---- set-up -----------------------------------------------------------------

  void lay_out_chunks(const RunConfig& config) {
    std::vector<memory::TensorSpec> specs;
    // The fp32 layout; 2-byte kinds take it at half the offsets. Parameters
    // of different domains never share a chunk: a chunk is reduced (and
    // under ZeRO owned) within one domain.
    for (size_t i = 0; i < params_.size(); ++i) {
      specs.push_back({params_[i].name, params_[i].tensor.numel() * 4,
                       static_cast<int>(param_domain_[i])});
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
  void find_uses(const RunConfig& config) {
    if (!model_->has_block_reads()) {
      // A micro-batch's shape: tensor 2d splits the batch over its grid.
      model_->find_block_reads(
          torch::zeros({config.train.micro_batch, config.model.seq_len}, torch::kInt64));
    }
    std::map<const void*, size_t> index;
    for (size_t i = 0; i < params_.size(); ++i) index[params_[i].tensor.unsafeGetTensorImpl()] = i;
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
  void build_trace() {
    chunks::TraceInputs in;
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
    t_ = chunks::ChunkTrace(std::move(in));
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
  void make_plan(const RunConfig& config) {
    const int64_t budget = settings_.compute_budget;
    const auto any = [](const std::vector<bool>& v) {
      return std::any_of(v.begin(), v.end(), [](bool b) { return b; });
    };
    const auto refuse = [&](const std::string& why) {
      return ConfigError(located(
          config, "memory.compute_budget",
          detail::format_bytes(static_cast<double>(budget)) + " (chunks of " +
              detail::format_bytes(static_cast<double>(chunk_bytes_)) + ", " +
              std::to_string(num_chunks_) + " per kind of state) cannot run this model: " + why));
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

  void plan_for(int64_t budget) {
    if (settings_.placement == "auto") {
      plan_ = memory::plan_auto(t_.access, budget, static_cast<size_t>(settings_.prefetch));
    } else {
      plan_ = memory::plan_static(
          t_.access, budget,
          {settings_.param_fraction, settings_.grad_fraction, settings_.optim_fraction});
    }
  }

  void make_optimizer(const RunConfig& config) {
    torch::NoGradGuard no_grad;
    optimizer_ = std::make_unique<AdamW>(adamw_settings(config.optim));
    for (auto& p : params_) {
      at::Tensor grad = torch::empty_like(p.tensor, at::MemoryFormat::Contiguous);
      free_storage(grad);
      p.tensor.mutable_grad() = grad;
      optimizer_->add(p.name, p.tensor, grad, p.placement);
      AdamWSlot& slot = optimizer_->slots().back();
      free_storage(slot.exp_avg);  // zeros: the chunks start zeroed
      free_storage(slot.exp_avg_sq);
      // The master (bf16/fp16) is the parameter widened, as the chunk's
      // initial contents are made (make_executor).
      if (slot.master.defined()) free_storage(slot.master);
    }
  }

  at::Tensor& tensor_of(size_t kind, size_t i) {
    AdamWSlot& slot = optimizer_->slots()[i];
    switch (kind) {
      case kParam:
        return slot.param;
      case kGrad:
        return slot.grad;
      case kExpAvg:
        return slot.exp_avg;
      case kExpAvgSq:
        return slot.exp_avg_sq;
      default:
        return slot.master;
    }
  }

  void make_executor() {
    memory::ExecutorOptions options;
    options.tier =
        settings_.offload == "nvme" ? memory::LowerTier::kNvme : memory::LowerTier::kHost;
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
        const at::Tensor& param = params_[i].tensor;
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
    // The chunks hold the parameters now: their own memory goes.
    for (auto& p : params_) free_storage(p.tensor);
    bound_.assign(t_.access.chunks.size(), false);
  }

  void install_hooks() {
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

  // ---- the trace ----------------------------------------------------------------

  // Points every tensor of chunk `c` into `base` (nullptr: no memory).
  void bind(ChunkId c, std::byte* base) {
    const size_t kind = t_.kind_of[c];
    const auto [first, last] = chunk_params_[t_.index_of[c]];
    for (size_t i = first; i < last; ++i) {
      c10::StorageImpl* s = tensor_of(kind, i).storage().unsafeGetStorageImpl();
      if (base == nullptr) {
        s->set_data_ptr_noswap(at::DataPtr(nullptr, s->device()));
        s->set_nbytes(0);
      } else {
        s->set_data_ptr_noswap(at::DataPtr(base + slot_offset(kind, i), s->device()));
        s->set_nbytes(static_cast<size_t>(slot_bytes(kind, i)));
      }
    }
    bound_[c] = base != nullptr;
  }

  // The hooks' way in: the next trace step must be `expected` (a backward
  // hook stands for either kind of backward step).
  void advance(TraceStep expected) {
    const char* names[] = {"forward", "backward", "backward (input)", "tied gradients",
                           "optimizer"};
    const bool matches = cursor_ < t_.optimizer_begin && t_.steps[cursor_].index == expected.index &&
                         (t_.steps[cursor_].type == expected.type ||
                          (expected.type == TraceStep::kBackward &&
                           t_.steps[cursor_].type == TraceStep::kBackwardInput));
    KOLOS_CHECK(matches, name(), ": the ", names[expected.type], " of block ", expected.index,
                " ran where the trace has step ", cursor_, " (",
                cursor_ < t_.steps.size() ? names[t_.steps[cursor_].type] : "past the end", " of ",
                cursor_ < t_.steps.size() ? std::to_string(t_.steps[cursor_].index) : "-",
                "); the blocks ran in another order than the trace was made for");
    begin(cursor_);
  }

  // Ends the step in progress (if any): the reductions launched at the end
  // of the step before are waited for and their gradients' norms taken;
  // the gradients this step made final are then launched, averaged over
  // their domain (every rank holds every gradient chunk; the trace, and so
  // the order of these collectives, is the same on every rank of the data
  // group), and run while the next step computes (their chunks are in its
  // trace step too, so they stay resident).
  void end_current_step() {
    if (!in_step_) return;
    finish_reductions();
    torch::NoGradGuard no_grad;
    for (size_t i : t_.norm_at[current_]) {
      const size_t k = layout_.slots[i].chunk;
      const DataDomain& d = domain(k);
      const bool to_owner = zero_stage_ >= 2 && !t_.is_tied[i];
      const int root = owner(k);
      if (d.ranks == 1) {
        if (d.factor != 1.0) params_[i].tensor.mutable_grad().mul_(d.factor);
        if (!t_.is_tied[i]) take_norm(i);
        continue;
      }
      // The gradient's bytes in its chunk, apart from the parameter's .grad
      // (whose storage is unbound when the chunk leaves a step).
      const at::Tensor& grad = params_[i].tensor.grad();
      at::Tensor in_chunk = at::from_blob(executor_->chunk(id(kGrad, k)) + slot_offset(kGrad, i),
                                          {grad.numel()}, grad.options());
      // train.reduce_dtype = "fp32" under bf16/fp16: averaged in fp32, as
      // the dp plugin's buckets do.
      at::Tensor reduced = reduce_in_fp32_ ? in_chunk.to(at::kFloat) : in_chunk;
      comm::WorkPtr work;
      if (to_owner) {
        // ZeRO-2/3: to the chunk's owner only (a reduce-scatter in which
        // every other rank's share is empty).
        std::vector<at::Tensor> inputs(static_cast<size_t>(d.ranks), reduced.narrow(0, 0, 0));
        inputs[static_cast<size_t>(root)] = reduced;
        work = d.group->reduce_scatter(d.index == root ? reduced : reduced.narrow(0, 0, 0), inputs,
                                       comm::ReduceOp::kAvg);
      } else {
        work = d.group->all_reduce(reduced, comm::ReduceOp::kAvg);
      }
      reduced_bytes_ += reduced.numel() * reduced.element_size();
      if (t_.overlap[current_]) overlapped_bytes_ += reduced.numel() * reduced.element_size();
      ++reductions_;
      pending_.push_back(
          Reduction{work, i, in_chunk, reduced, d.factor, to_owner && d.index != root});
    }
    if (!t_.overlap[current_]) finish_reductions();
    in_step_ = false;
  }

  // Waits for the reductions in flight: each gradient's result goes into
  // its chunk (from fp32 when reduced in fp32), times its domain's factor,
  // and its norm is taken where this rank has the result. (On ZeRO's other ranks the chunk's bytes are
  // dead once its last gradient is reduced: the executor writes nothing of
  // them back.)
  void finish_reductions() {
    if (pending_.empty()) return;
    torch::NoGradGuard no_grad;
    for (Reduction& r : pending_) {
      if (!finishing_ || r.work->is_completed()) ++completed_before_finish_;
      r.work->wait();
      if (r.reduced.data_ptr() != r.in_chunk.data_ptr()) r.in_chunk.copy_(r.reduced);
      if (r.factor != 1.0 && !r.elsewhere) r.in_chunk.mul_(r.factor);
      // A tied weight's norm after the pipeline's sum.
      if (!t_.is_tied[r.param] && !r.elsewhere) take_norm(r.param);
    }
    pending_.clear();
  }

  // As in memory: finiteness of the gradient as backward left it; the norm
  // after the engine's unscaling (fp16: 1 / loss scale, applied to this
  // copy here and to the gradient itself in step()).
  void take_norm(size_t i) {
    const at::Tensor& grad = params_[i].tensor.grad();
    finite_[i] = !unscale_ || torch::isfinite(grad).all().item<bool>();
    norms_[i] = (unscale_ ? grad * *unscale_ : grad).norm();
  }

  // ZeRO-2/3: each gradient's norm and finiteness were taken by its chunk's
  // owner; one sum over each domain gives them to every rank of it,
  // exactly (every other rank adds zero). Tied weights' and unused
  // parameters' are everywhere already.
  void share_norms() {
    if (zero_stage_ < 2 || norms_shared_) return;
    torch::NoGradGuard no_grad;
    for (size_t d = 0; d < domains_.size(); ++d) {
      if (domains_[d].ranks == 1) continue;
      const std::vector<size_t>& members = shared_norms_[d];
      const size_t n = members.size();
      // [0, n): norms; [n, 2n): 1 where a gradient is not finite.
      std::vector<double> values(2 * n, 0.0);
      for (size_t j = 0; j < n; ++j) {
        const size_t i = members[j];
        if (!norms_[i].defined()) continue;
        values[j] = norms_[i].item<double>();
        values[n + j] = finite_[i] ? 0.0 : 1.0;
      }
      domains_[d]
          .group
          ->all_reduce(at::from_blob(values.data(), {static_cast<int64_t>(2 * n)}, at::kDouble),
                       comm::ReduceOp::kSum)
          ->wait();
      for (size_t j = 0; j < n; ++j) {
        // Widened to double and back to the gradient's dtype: exact.
        norms_[members[j]] = torch::full({}, values[j], at::kDouble).to(dtype_);
        finite_[members[j]] = values[n + j] == 0.0;
      }
    }
    norms_shared_ = true;
  }

  // The tied weights' norms, once the pipeline has summed them (the engine
  // asks for finiteness or the norm only after that).
  void tied_norms() {
    if (t_.tied_step == chunks::ChunkTrace::kNoStep || tied_done_) return;
    KOLOS_CHECK(in_step_ && current_ == t_.tied_step, "internal error: ", name(),
                ": tied gradients asked for outside their step");
    torch::NoGradGuard no_grad;
    for (size_t i : t_.tied) take_norm(i);
    tied_done_ = true;
  }

  void begin(size_t s) {
    KOLOS_CHECK(s == cursor_, "internal error: trace step ", s, ", expected ", cursor_);
    end_current_step();
    executor_->begin_step(s);
    std::vector<bool> needed(bound_.size(), false);
    for (ChunkId c : t_.access.steps[s]) needed[c] = true;
    for (ChunkId c = 0; c < bound_.size(); ++c) {
      if (bound_[c] && !needed[c]) bind(c, nullptr);
    }
    for (ChunkId c : t_.access.steps[s]) bind(c, executor_->chunk(c));
    // ZeRO-3: this step's parameter chunks from their owners (launched
    // during the step before, or now), then the next step's, launched to
    // run while this one computes (their chunks are in this step's trace).
    if (!t_.gather_at[s].empty()) {
      const auto start = std::chrono::steady_clock::now();
      if (!t_.ahead[s]) launch_gathers(s, false);
      for (comm::WorkPtr& work : gathers_) work->wait();
      gathers_.clear();
      gather_wait_s_ +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    if (s + 1 < t_.steps.size() && t_.ahead[s + 1]) launch_gathers(s + 1, true);
    for (ChunkId c : t_.zero_at[s]) {
      std::memset(executor_->chunk(c), 0, static_cast<size_t>(kind_bytes(t_.kind_of[c])));
    }
    // Backward accumulates into gradient chunks; the tied step's pipeline
    // sum replaces them in place (a chunk written back and reloaded clean
    // in between must be written again).
    if (t_.steps[s].type == TraceStep::kBackward || t_.steps[s].type == TraceStep::kTied) {
      for (ChunkId c : t_.access.steps[s]) {
        if (t_.kind_of[c] == kGrad) executor_->mark_dirty(c);
      }
    }
    count_resident();
    current_ = s;
    in_step_ = true;
    cursor_ = s + 1;
  }

  // ZeRO-3: launches the gathers of step s's parameter chunks (`ahead`:
  // while the step before it computes), counted in the gather metrics.
  void launch_gathers(size_t s, bool ahead) {
    for (ChunkId c : t_.gather_at[s]) {
      gathers_.push_back(broadcast_from_owner(c));
      gathered_bytes_ += kind_bytes(t_.kind_of[c]);
      if (ahead) gathered_ahead_bytes_ += kind_bytes(t_.kind_of[c]);
    }
  }

  void count_resident() {
    int64_t by_kind[kKinds] = {0, 0, 0, 0, 0};
    int64_t total = 0;
    for (ChunkId c = 0; c < bound_.size(); ++c) {
      if (!executor_->resident(c)) continue;
      by_kind[t_.kind_of[c]] += kind_bytes(t_.kind_of[c]);
      total += kind_bytes(t_.kind_of[c]);
    }
    if (total > peak_total_) {
      peak_total_ = total;
      std::copy(by_kind, by_kind + kKinds, peak_by_kind_);
    }
  }

  void materialize() {
    if (!materialized_.empty()) return;
    finish_skipped_step();
    KOLOS_CHECK(cursor_ == 0, name(), ": a checkpoint was asked for in the middle of a step");
    materialized_.assign(kKinds, std::vector<at::Tensor>(params_.size()));
    materialized_index_.clear();
    for (Kind kind : {kParam, kExpAvg, kExpAvgSq, kMaster}) {
      if (kind >= kinds_) continue;
      std::vector<std::byte> bytes(static_cast<size_t>(kind_bytes(kind)));
      for (size_t k = 0; k < num_chunks_; ++k) {
        if (holds(kind, k)) executor_->read_chunk(id(kind, k), bytes.data());
        if (shards(k) > 1 && (kind != kParam || zero_stage_ == 3)) {
          // ZeRO: the owner's optimizer chunk (and ZeRO-3's parameter
          // chunk), to every rank (a checkpoint holds every piece on every
          // rank of the domain).
          at::Tensor t =
              at::from_blob(bytes.data(), {kind_bytes(kind)}, at::TensorOptions().dtype(at::kByte));
          domain(k).group->broadcast(t, owner(k))->wait();
        }
        const auto [first, last] = chunk_params_[k];
        for (size_t i = first; i < last; ++i) {
          at::Tensor t =
              torch::empty(params_[i].tensor.sizes(), kind == kParam ? dtype_ : at::kFloat);
          std::memcpy(t.data_ptr(), bytes.data() + slot_offset(kind, i),
                      static_cast<size_t>(slot_bytes(kind, i)));
          materialized_[kind][i] = t;
          if (kind == kParam) materialized_index_[t.unsafeGetTensorImpl()] = i;
        }
      }
    }
  }

  // The model's own memory, freed into malloc's heap, goes back to the
  // kernel (malloc_trim also releases free pages inside the heap); then
  // "5" in /proc/self/clear_refs resets the peak resident set size (VmHWM,
  // getrusage's ru_maxrss) to the current one (Linux).
  static void reset_peak_rss() {
    malloc_trim(0);
    const int fd = ::open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
    if (fd < 0) return;
    const ssize_t written = ::write(fd, "5", 1);
    (void)written;
    ::close(fd);
  }

  // The ranks a gradient is averaged over (kolos/core/data_domains.h);
  // domains_[0] is the whole data group.
  std::vector<DataDomain> domains_;
  std::vector<size_t> param_domain_;  // [parameter]
  std::vector<size_t> chunk_domain_;  // [chunk index]: its parameters' domain
  // [domain]: its parameters whose norms ZeRO-2/3 share (not tied or unused).
  std::vector<std::vector<size_t>> shared_norms_;
  comm::ProcessGroupPtr data_group_;  // dp x ep x sp
  int64_t reduced_bytes_ = 0;    // this step's
  int64_t reductions_ = 0;
  int64_t overlapped_bytes_ = 0;
  int64_t completed_before_finish_ = 0;
  double finish_wait_s_ = 0;
  bool finishing_ = false;  // in finish_backward()
  chunks::ChunkSettings settings_;
  int64_t accumulation_ = 1;
  int64_t chunk_bytes_ = 0;            // of an fp32 kind (kind_bytes: of any)
  at::ScalarType dtype_ = at::kFloat;  // of the parameters and gradients
  bool low_ = false;                   // bf16/fp16: master chunks too
  size_t kinds_ = kMaster;             // kinds in use: 4, or 5 with masters
  bool reduce_in_fp32_ = false;
  memory::ChunkSearchResult search_;
  memory::ChunkLayout layout_;
  size_t num_chunks_ = 0;  // per kind
  bool tied_done_ = false;
  int64_t zero_stage_ = 0;
  std::vector<PlacedParameter> params_;  // trainable, in model order
  std::vector<std::pair<size_t, size_t>> chunk_params_;  // [chunk]: parameters [first, last)
  std::vector<std::vector<size_t>> uses_;                // [block]: parameters it reads
  chunks::ChunkTrace t_;  // the steps of an iteration and their chunks
  memory::Plan plan_;
  // A gradient's reduction in flight: `reduced` (the chunk's bytes, or an
  // fp32 copy) is averaged, then multiplied by `factor` (its domain's);
  // `elsewhere`: onto another rank (ZeRO-2/3).
  struct Reduction {
    comm::WorkPtr work;
    size_t param;
    at::Tensor in_chunk, reduced;
    double factor;
    bool elsewhere;
  };
  std::vector<Reduction> pending_;                // launched at the end of the step before
  std::vector<comm::WorkPtr> gathers_;  // in flight, for the next step
  int64_t gathered_bytes_ = 0;          // this step's (GatherStats)
  int64_t gathered_ahead_bytes_ = 0;
  double gather_wait_s_ = 0;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<memory::ChunkExecutor> executor_;
  std::vector<bool> bound_;  // [chunk]: its tensors point into the arena
  size_t cursor_ = 0;        // the next trace step
  size_t current_ = 0;
  bool in_step_ = false;
  std::vector<at::Tensor> norms_;                      // [parameter]: its gradient's norm this step
  std::vector<bool> finite_;                           // [parameter]: fp16: its gradient is finite
  bool norms_shared_ = false;                          // ZeRO-2/3: share_norms() ran this step
  std::optional<double> unscale_;                      // fp16: 1 / this step's loss scale
  std::vector<double> scales_;                         // factors for the gradients, in order
  std::vector<std::vector<at::Tensor>> materialized_;  // [kind][parameter]
  std::map<const void*, size_t> materialized_index_;   // its parameter copies -> parameter
  int64_t peak_total_ = 0;
  int64_t peak_by_kind_[kKinds] = {0, 0, 0, 0, 0};
};

}  // namespace
}  // namespace kolos

KOLOS_DEFINE_PLUGIN("chunks", "memory", kolos::GradientStrategy, kolos::ChunkedMemory,
                    "parameters, gradients and AdamW states in chunks over a budgeted compute "
                    "tier, host memory and NVMe files")
