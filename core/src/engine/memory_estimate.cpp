// Per-rank memory estimate (memory_estimate.h). Every term is computed in
// double: a config may ask for 1e11 layers, and the point is to say so
// before anything is allocated.
//
// The model of each term follows what the code holds (docs/reliability.md,
// "Memory estimate"):
//   parameters   the rank's local parameters (tensor-parallel layers cut
//                their matrices and embeddings by tp; a pipeline stage has
//                its blocks, the first the embeddings, the last the final
//                norm and the tied head's copy of the token embedding);
//                zero3: the shard, plus two blocks gathered (the current
//                one and the prefetched next).
//   gradients    dp, zero1: whole (the bucket engine's flat buffers);
//                zero2: the shard plus one bucket of staging; zero3: the
//                shard plus one block of staging and one block of .grad.
//   optimizer    AdamW's m and v in fp32; zero1-3 shard them over dp, and
//                zero1/2 keep a working copy of the parameter shard (in the
//                parameters' dtype); under bf16/fp16 every optimizer slot
//                adds its fp32 master (docs/precision.md).
//   activations  what autograd saves per block for one micro-batch, times
//                the micro-batches a stage holds at once (1 without a
//                pipeline; gpipe: all; 1f1b and zb: up to the stages;
//                interleaved: its warm-up), plus the loss's logits.
//                train.recompute: a "full" block keeps its input only, plus
//                one block's activations while it is recomputed; a
//                "selective" one drops the attention probabilities.
//                Sequence parallelism: seq/sp positions per rank, and 1/sp
//                of the attention probabilities.
//   temporaries  backward's high point: the attention core's gradients and
//                the two largest weight gradients before they are added.
//   allocator    an allowance of 25% of the tensors above for what the
//                allocator keeps and MPI's buffers: fitted, not derived.
//   runtime      measured: the process before the model exists.
#include "kolos/core/memory_estimate.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "kolos/core/error.h"
#include "kolos/core/format.h"
#include "kolos/core/settings.h"
#include "kolos/schedules/plan.h"

namespace kolos {

namespace {

using detail::format_bytes;

constexpr double kAllowance = 0.25;

std::string fmt_count(double n) {
  std::ostringstream out;
  if (n >= 1e12) {
    out.precision(3);
    out << n;  // scientific beyond a trillion
    return out.str();
  }
  return detail::format_count(n);
}

// Bytes per element of the run's parameters and activations.
double element_bytes(const RunConfig& config) {
  const std::string& p = config.train.precision;
  if (p == "bf16" || p == "fp16") return 2;
  return 4;
}

struct Shape {
  double layers, hidden, heads, seq, vocab, inner;
  double kv_heads;     // key/value heads (llama's grouped-query attention)
  bool llama = false;  // modules/'s llama: no biases, SwiGLU, RMSNorm, untied head, no wpe
  // mixtral: the share of blocks whose MLP is `experts` SwiGLU experts, each
  // token through top_k of them (0 share for the dense models).
  double moe_share = 0, experts = 0, top_k = 1;
  double local_experts = 0;  // experts held by one rank: experts / parallel.expert.size
  double shared = 0;         // shared experts (one MLP of shared x inner)
};

Shape shape_of(const RunConfig& c) {
  const ModelConfig& m = c.model;
  Shape s{static_cast<double>(m.layers), static_cast<double>(m.hidden),
          static_cast<double>(m.heads),  static_cast<double>(m.seq_len),
          static_cast<double>(m.vocab),  static_cast<double>(m.mlp_ratio * m.hidden),
          static_cast<double>(m.heads)};
  if (llama_family(m)) {
    s.llama = true;
    if (m.name == "mixtral") {
      int64_t moe = 0;
      for (int64_t b = 0; b < m.layers; ++b) moe += is_moe_block(m, b) ? 1 : 0;
      s.moe_share = static_cast<double>(moe) / static_cast<double>(m.layers);
      s.experts = static_cast<double>(m.experts);
      s.local_experts = s.experts / static_cast<double>(std::max<int64_t>(1, c.parallel.expert.size));
      s.top_k = static_cast<double>(m.top_k);
      s.shared = static_cast<double>(m.shared_experts);
    }
    s.inner = static_cast<double>(m.ffn_hidden > 0 ? m.ffn_hidden : default_ffn_hidden(m.hidden));
    s.kv_heads = static_cast<double>(m.kv_heads > 0 ? m.kv_heads : m.heads);
  }
  return s;
}

// Parameters of one transformer block. GPT: q, k, v, o with biases, a GELU
// MLP with biases, two layer norms. LLaMA: q and o, k and v of kv_heads
// heads, the SwiGLU MLP's three matrices, two RMSNorms; no biases.
double block_params(const Shape& s) {
  if (s.llama) {
    const double kv = s.kv_heads * s.hidden / s.heads;
    // A mixture block's MLP: this rank's experts and the router (mean over
    // blocks).
    const double mlp =
        (1 - s.moe_share) * 3 * s.hidden * s.inner +
        s.moe_share * ((s.local_experts + s.shared) * 3 * s.hidden * s.inner +
                       s.hidden * s.experts);
    return 2 * s.hidden * s.hidden + 2 * s.hidden * kv + mlp + 2 * s.hidden;
  }
  return 4 * (s.hidden * s.hidden + s.hidden) + 2 * s.hidden * s.inner + s.inner + s.hidden +
         4 * s.hidden;
}

// The embedding block's parameters (GPT: token and position tables; LLaMA:
// tokens only) and the head block's own (GPT: the final norm, the head
// reading wte; LLaMA: the final RMSNorm and the untied head).
double embedding_params(const Shape& s) {
  return s.llama ? s.vocab * s.hidden : (s.vocab + s.seq) * s.hidden;
}
double head_params(const Shape& s) {
  return s.llama ? s.hidden + s.vocab * s.hidden : 2 * s.hidden;
}

std::string pipeline_schedule(const RunConfig& config) {
  std::string schedule = "1f1b";
  const ConfigSection section = config.section("parallel.pipeline");
  if (section.has("schedule")) section.read("schedule", schedule);
  return schedule;
}

int64_t pipeline_chunks(const RunConfig& config) {
  int64_t chunks = 1;
  const ConfigSection section = config.section("parallel.pipeline");
  if (section.has("chunks")) section.read("chunks", chunks);
  return std::max<int64_t>(1, chunks);
}

// Micro-batches whose activations one stage (the first, which holds the
// most) keeps at once, in units of the whole stage: the schedules' own
// count (libkolos_schedules), the one the planner uses too.
double in_flight(const std::string& schedule, int64_t pp, int64_t chunks, int64_t accumulation) {
  if (pp <= 1) return 1;
  return pipeline::stage_activations_in_flight(pipeline::parse_schedule(schedule),
                                               static_cast<int>(pp), static_cast<int>(accumulation),
                                               static_cast<int>(chunks), /*rank=*/0);
}

struct Piece {
  double params = 0;      // the rank's local parameters (before zero3)
  double block = 0;       // one block's local parameters
  double largest = 0;     // the largest global tensor built (initialisation)
  double blocks = 0;      // blocks on this stage
  bool embeddings = false, head = false;
};

// What the rank at pipeline stage `stage` of `pp` holds.
Piece piece_of(const Shape& s, const MeshShape& mesh, int64_t stage) {
  Piece p;
  const double tp = static_cast<double>(mesh.tp);
  p.blocks = std::ceil(s.layers / static_cast<double>(mesh.pp));
  if (stage == mesh.pp - 1) p.blocks = s.layers - p.blocks * (mesh.pp - 1);
  p.blocks = std::max(0.0, p.blocks);
  p.embeddings = stage == 0;
  p.head = stage == mesh.pp - 1;
  p.block = block_params(s) / tp;
  p.params = p.blocks * p.block;
  if (p.embeddings) p.params += embedding_params(s) / tp;
  if (p.head) {
    p.params += head_params(s) / tp;
    // GPT's head reads wte: a stage without the embedding holds a copy.
    if (!p.embeddings && !s.llama) p.params += s.vocab * s.hidden / tp;
  }
  p.largest = std::max({s.vocab * s.hidden, s.hidden * s.inner, s.hidden * s.hidden});
  return p;
}

// Bytes autograd keeps for one micro-batch through one block: the inputs of
// the two norms and their outputs, q, k, v, the attention output, the MLP's
// input to its activation and the activation's output, and the softmax's
// probabilities (batch x heads x seq x seq). tp1d keeps the norms' tensors
// whole and cuts the rest by tp; the grid modes cut everything by tp.
// Sequence parallelism: a rank holds seq/sp positions, and its attention
// (ulysses: heads/sp over the whole sequence) heads x seq x seq / sp
// probabilities. ring and hybrid attend through the ring kernel, which keeps
// no seq x seq tensor (q, k, v and the output, counted, and a float32
// log-sum-exp per query and head). megatron (sp = 1 in the mesh) splits the
// norms' tensors over the tensor group, but each column layer keeps its
// gathered input whole for its backward: the two norm outputs stay whole.
bool ring_kernel(const std::string& sequence) { return sequence == "ring" || sequence == "hybrid"; }

double block_activations(const Shape& s, const MeshShape& mesh, const std::string& layers,
                         const std::string& sequence, double micro, double elem) {
  const double tp = static_cast<double>(mesh.tp);
  const double tokens = s.seq / static_cast<double>(mesh.sp);
  const double bsh = micro * tokens * s.hidden;
  // LayerNorm (one fused op) keeps its input and output; RMSNorm, written
  // as ops, also the normalised product before the weight.
  double norms = (s.llama ? 6 : 4) * bsh;
  if (sequence == "megatron") norms = (norms - 2 * bsh) / tp + 2 * bsh;
  // SwiGLU keeps four inner-wide tensors (gate, silu(gate), up, their
  // product), GELU two.
  // A mixture block runs each token through top_k experts.
  const double wide = (s.llama ? 4 : 2) * (1 + s.moe_share * (s.top_k + s.shared - 1));
  // The ring kernel saves contiguous copies of q, k and v (the serial core
  // reads them as views of the projection's output) besides the output
  // (counted), and the log-sum-exp.
  const double attention = ring_kernel(sequence) ? micro * s.heads * tokens * 4 / elem + 3 * bsh
                                                 : micro * s.heads * tokens * s.seq;
  const double cut = 4 * bsh + wide * micro * tokens * s.inner + attention;
  if (layers == "tp1d") return elem * (norms + cut / tp);
  return elem * (norms + cut) / tp;
}

// The blocks of pipeline stage `stage` that train.recompute acts on: every
// recompute_every-th block, counting from the model's first; the stage's
// blocks are taken as the ceil(layers / pp) after the previous stages'.
double recomputed_blocks(const RunConfig& config, const MeshShape& mesh, int64_t stage,
                         double blocks) {
  if (config.train.recompute == "none" || blocks <= 0) return 0;
  const double k = static_cast<double>(config.train.recompute_every);
  const double first = static_cast<double>(stage) *
                       std::ceil(static_cast<double>(config.model.layers) / mesh.pp);
  return std::ceil((first + blocks) / k) - std::ceil(first / k);  // multiples of k among them
}

void add(std::vector<MemoryTerm>& terms, std::string name, double bytes, std::string detail) {
  terms.push_back(MemoryTerm{std::move(name), bytes, std::move(detail)});
}

MemoryEstimate estimate_stage(const RunConfig& config, const MeshShape& mesh,
                              const RoleChoice& roles, int64_t accumulation, int64_t stage,
                              double runtime_bytes) {
  MemoryEstimate e;
  e.shape = mesh;
  e.roles = roles;
  e.accumulation = accumulation;
  e.rank = mesh.pp > 1 ? "pipeline stage " + std::to_string(stage) : "every rank";
  const Shape s = shape_of(config);
  const double elem = element_bytes(config);
  const double dp = static_cast<double>(mesh.dp);
  const Piece p = piece_of(s, mesh, stage);
  Shape whole = s;  // every expert, not this rank's share
  whole.local_experts = whole.experts;
  e.model_parameters = s.layers * block_params(whole) + embedding_params(s) + head_params(s);
  const std::string& g = roles.gradients;
  const std::string count = fmt_count(p.params) + " local parameters";

  // The memory role keeps parameters, gradients and AdamW's moments (fp32)
  // in chunks: at most compute_budget of them in the compute tier, every
  // chunk's copy in host memory unless they go to NVMe.
  if (!roles.memory.empty()) {
    const ConfigSection m = config.section("memory");
    std::string text, offload = "host";
    double budget = 0;
    if (m.read("compute_budget", text)) {
      try {
        budget = static_cast<double>(parse_byte_size(text));
      } catch (const std::invalid_argument&) {
      }  // the plugin refuses it, with the key's place
    }
    m.read("offload", offload);
    add(e.terms, "chunks, compute tier", budget,
        "memory.compute_budget: parameters, gradients, AdamW m and v resident");
    // Parameters and gradients in the run's dtype; m, v and (bf16/fp16) the
    // masters in fp32, spread over dp x sp under parallel.zero.stage >= 1,
    // and the parameters too under stage 3. Gradient chunks of other
    // ranks' indices take no tier copy with one micro-batch per step (they
    // stay resident from their first use to their reduction, but for a
    // chunk blocks far apart read, such as a tied embedding's, which a
    // tight budget may evict in between: not counted); with several,
    // every rank may hold every gradient chunk.
    const int64_t stage = config.parallel.zero.stage;
    const double shards = stage >= 1 ? double(mesh.dp * mesh.sp) : 1.0;
    const double optim = (8 + (elem < 4 ? 4 : 0)) / shards;
    const bool grads_sharded = shards > 1 && accumulation == 1;
    const double per_param =
        (stage == 3 ? elem / shards : elem) + (grads_sharded ? elem / shards : elem) + optim;
    const std::string sharded = stage == 3 ? "parameter, " : "";
    add(e.terms, "chunks, host tier", offload == "nvme" ? 0.0 : per_param * p.params,
        offload == "nvme"
            ? "on NVMe (memory.offload = \"nvme\")"
            : "every chunk's copy: " + count + " x " + fmt_count(per_param) + " B" +
                  (shards == 1     ? ""
                   : grads_sharded ? " (" + sharded + "gradient and optimizer chunks / dp x sp)"
                                   : " (" + sharded + "optimizer chunks / dp x sp)"));
  } else if (g == "zero3") {
    add(e.terms, "parameters", elem * (p.params / dp + 2 * p.block),
        count + " / dp " + std::to_string(mesh.dp) + " + 2 blocks gathered");
  } else {
    add(e.terms, "parameters", elem * p.params, count + " x " + fmt_count(elem) + " B");
  }
  // Gradients.
  const double bucket = static_cast<double>(config.parallel.bucket_kb > 0
                                                ? config.parallel.bucket_kb * 1024
                                                : config.parallel.bucket_mb * 1024 * 1024);
  if (!roles.memory.empty()) {
    // in the chunks above
  } else if (g == "zero3") {
    add(e.terms, "gradients", elem * (p.params / dp + 2 * p.block),
        "shard + one block of staging and of .grad");
  } else if (g == "zero2") {
    add(e.terms, "gradients", elem * p.params / dp + std::min(bucket, elem * p.params),
        "shard + one bucket of staging");
  } else {
    add(e.terms, "gradients", elem * p.params, "whole, in the bucket engine's buffers");
  }
  // Optimizer states: AdamW m and v in fp32 (plus zero1/2's working copy,
  // in the parameters' dtype), and under bf16/fp16 every slot's fp32 master.
  const bool mixed = elem < 4;
  const double masters = mixed ? 4 : 0;
  const std::string master_note = mixed ? " + fp32 masters" : "";
  if (!roles.memory.empty()) {
    // in the chunks above
  } else if (g == "zero1" || g == "zero2") {
    add(e.terms, "optimizer states", (4 * 2 + elem + masters) * p.params / dp,
        "AdamW m, v (fp32), the working copy of the shard" + master_note + " / dp " +
            std::to_string(mesh.dp));
  } else if (g == "zero3") {
    add(e.terms, "optimizer states", (4 * 2 + masters) * p.params / dp,
        "AdamW m, v (fp32)" + master_note + " / dp " + std::to_string(mesh.dp));
  } else {
    add(e.terms, "optimizer states", (4 * 2 + masters) * p.params, "AdamW m, v (fp32)" + master_note);
  }
  // Activations.
  const double micro = static_cast<double>(config.train.micro_batch);
  const double sp = static_cast<double>(mesh.sp);  // positions per rank: seq / sp
  const std::string schedule = mesh.pp > 1 ? pipeline_schedule(config) : "";
  const double flight = in_flight(schedule, mesh.pp, pipeline_chunks(config), accumulation);
  const double per_block = block_activations(s, mesh, roles.layers, roles.sequence, micro, elem);
  double act = p.blocks * per_block * flight;
  std::string detail = "micro-batch " + std::to_string(config.train.micro_batch) + ", " +
                       fmt_count(p.blocks) + " blocks";
  const double chosen = recomputed_blocks(config, mesh, stage, p.blocks);
  if (chosen > 0 && config.train.recompute == "full") {
    // A recomputed block keeps its input only; in backward one block at a
    // time holds its activations again.
    const double tp = roles.layers == "tp1d" ? 1 : static_cast<double>(mesh.tp);
    const double input = elem * micro * s.seq / sp * s.hidden / tp;
    act = (chosen * input + (p.blocks - chosen) * per_block) * flight + per_block;
    detail += " (" + fmt_count(chosen) + " recomputed: their inputs + one block)";
  } else if (chosen > 0 && config.train.recompute == "selective" && !ring_kernel(roles.sequence)) {
    // A recomputed attention core keeps q, k, v (counted) but not the
    // batch x heads x seq x seq probabilities (the ring kernel keeps none
    // to drop).
    const double probs = elem * micro * s.heads * s.seq * s.seq / static_cast<double>(mesh.tp) / sp;
    act -= chosen * probs * flight;
    detail += " (" + fmt_count(chosen) + " without attention probabilities)";
  }
  if (mesh.pp > 1) detail += ", " + fmt_count(flight) + " micro-batches in flight (" + schedule + ")";
  if (p.head) {
    // The logits, their log-softmax and its gradient (vocabulary cut by tp).
    // Under bf16/fp16 the loss widens the logits: the low-precision logits
    // and its gradient, and the fp32 copy, its log-softmax and its gradient.
    const double per_logit = mixed ? 2 * elem + 3 * 4 : 3 * elem;
    const double logits = per_logit * micro * s.seq / sp * s.vocab / static_cast<double>(mesh.tp);
    act += logits;
    detail += " + logits " + format_bytes(logits);
  }
  add(e.terms, "activations", act, detail);
  // Backward's temporaries, at their high point: the attention core's
  // gradients (scores and probabilities, three batch x heads x seq x seq
  // tensors) and the gradients of the largest weights (the embedding's
  // dense gradient and the tied head's) before they are added into the
  // buffers that keep them.
  // The ring kernel's backward holds one tile pair's float32 scores,
  // probabilities and their gradients at a time (tiles of at most 512 rows;
  // a rank's two zigzag chunks are separate tiles), and float32 blocks of
  // the rank's size X = micro x seq/sp x hidden/tp: the output gradient, dq,
  // two stacked K/V blocks (sent and arriving) and two stacked dK/dV
  // accumulators, ten X.
  const double tp = static_cast<double>(mesh.tp);
  const double tile = std::min(512.0, s.seq / sp / 2);
  const double ring_blocks = 10 * 4 * micro * s.seq / sp * s.hidden / tp;
  const double scores = ring_kernel(roles.sequence)
                            ? 4 * 4 * micro * s.heads / tp * tile * tile + ring_blocks
                            : 3 * elem * micro * s.heads * s.seq * s.seq / tp / sp;
  const double weights = 2 * elem * p.largest / tp;
  add(e.terms, "temporaries", scores + weights,
      "attention gradients " + format_bytes(scores) + " + 2 largest weight gradients " +
          format_bytes(weights));
  // What the process holds beyond the live tensors: the allocator's freed
  // but kept memory (glibc malloc keeps heap chunks), MPI's internal buffers
  // for the large collectives, dp/zero1's bucket rebuild after the first
  // backward (new flat buffers while the old exist). One allowance, 25% of
  // the tensors above, fitted to the seven runs of e2e_memory_accuracy on
  // glibc malloc and OpenMPI 4.1 (docs/reliability.md); not derived.
  double tensors = 0;
  for (const auto& t : e.terms) tensors += t.bytes;
  add(e.terms, "allocator, buffers", kAllowance * tensors,
      "25% of the tensors: freed memory the allocator keeps, MPI buffers (fitted)");
  add(e.terms, "runtime", runtime_bytes, "LibTorch, MPI, plugins: measured in this process");

  // Building: every local parameter whole (zero3 shards after building),
  // plus the initialisation's temporary of the largest global tensor.
  e.build_peak = runtime_bytes + elem * p.params + 2 * elem * p.largest;
  return e;
}

std::string budget_suffix(const MemoryBudget& budget) { return " (" + budget.source + ")"; }

}  // namespace

double MemoryEstimate::training_peak() const {
  double total = 0;
  for (const auto& t : terms) total += t.bytes;
  return total;
}

double MemoryEstimate::peak() const { return std::max(training_peak(), build_peak); }

const MemoryTerm& MemoryEstimate::largest() const {
  return *std::max_element(terms.begin(), terms.end(),
                           [](const MemoryTerm& a, const MemoryTerm& b) { return a.bytes < b.bytes; });
}

int64_t fewest_ranks(const RunConfig& config) {
  const int64_t data = config.parallel.data > 0 ? config.parallel.data : config.parallel.expert.size;
  return std::max<int64_t>(data, 1) * non_data_ranks(config);
}

int64_t non_data_ranks(const RunConfig& config) {
  const auto& p = config.parallel;
  return p.pipeline.size * (p.sequence.mode == "megatron" ? 1 : p.sequence.size) * p.tensor.size;
}

MemoryEstimate estimate_memory(const RunConfig& config, int64_t world_size, double runtime_bytes) {
  const MeshShape mesh = resolve_mesh_shape(config, world_size);
  const RoleChoice roles = choose_plugins(config);
  const int64_t per_step = config.train.micro_batch * mesh.batch_ranks();
  const int64_t accumulation = std::max<int64_t>(1, config.train.global_batch / std::max<int64_t>(1, per_step));
  // The first stage holds the embeddings and the most micro-batches; the
  // last the head and the logits: the larger of the two.
  MemoryEstimate first = estimate_stage(config, mesh, roles, accumulation, 0, runtime_bytes);
  if (mesh.pp == 1) return first;
  MemoryEstimate last =
      estimate_stage(config, mesh, roles, accumulation, mesh.pp - 1, runtime_bytes);
  return last.peak() > first.peak() ? last : first;
}

int64_t ranks_on_this_node(int64_t world_size) {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}) {
    const char* value = std::getenv(name);
    if (value == nullptr) continue;
    char* end = nullptr;
    const long n = std::strtol(value, &end, 10);
    if (end != value && n >= 1 && n <= world_size) return n;
  }
  return world_size;
}

double resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  double pages_total = 0, pages_resident = 0;
  if (!(statm >> pages_total >> pages_resident)) return 0;
  return pages_resident * static_cast<double>(sysconf(_SC_PAGESIZE));
}

namespace {

// A number from a one-line file ("max" and unreadable files: none).
bool read_number(const std::string& path, double& out) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return false;
  try {
    out = std::stod(word);
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

}  // namespace

MemoryBudget memory_budget(const RunConfig& config, int64_t ranks_per_node) {
  MemoryBudget budget;
  if (config.runtime.memory_limit > 0) {
    budget.bytes = static_cast<double>(config.runtime.memory_limit);
    budget.source = "[runtime] memory_limit";
    return budget;
  }
  ranks_per_node = std::max<int64_t>(1, ranks_per_node);
  double available = 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double value = 0;
  std::string unit;
  while (meminfo >> key >> value) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") available = value * 1024;
  }
  std::string what = "MemAvailable " + format_bytes(available);
  // A container's limit (cgroup v2, then v1) when it is tighter.
  double limit = 0, used = 0;
  if ((read_number("/sys/fs/cgroup/memory.max", limit) &&
       read_number("/sys/fs/cgroup/memory.current", used)) ||
      (read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes", limit) &&
       read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes", used))) {
    if (limit < 1e18 && limit - used < available) {
      available = std::max(0.0, limit - used);
      what = "cgroup limit " + format_bytes(limit) + " - " + format_bytes(used) + " used";
    }
  }
  // What this process holds is already out of MemAvailable.
  budget.bytes = available / static_cast<double>(ranks_per_node) + resident_bytes();
  budget.source = what + " / " + std::to_string(ranks_per_node) +
                  (ranks_per_node == 1 ? " rank" : " ranks") + " on this node";
  return budget;
}

namespace {

struct Alternative {
  std::string what;
  double peak;
};

// Estimates of variants of `config` on `world` ranks that fit `budget`.
std::vector<Alternative> alternatives(const RunConfig& config, int64_t world, double runtime,
                                      double budget) {
  std::vector<Alternative> out;
  auto try_variant = [&](RunConfig variant, int64_t ranks, const std::string& what) {
    try {
      const MemoryEstimate e = estimate_memory(variant, ranks, runtime);
      if (e.peak() <= budget) out.push_back(Alternative{what, e.peak()});
      return e.peak() <= budget;
    } catch (const std::exception&) {
      return false;  // that mesh does not divide: not an alternative
    }
  };
  const RoleChoice roles = choose_plugins(config);
  if (roles.gradients != "zero3") {
    RunConfig v = config;
    v.parallel.zero.stage = 3;
    try_variant(v, world, "parallel.zero.stage = 3");
  }
  for (int64_t tp = 2; tp <= world && tp <= 64; tp *= 2) {
    if (tp <= config.parallel.tensor.size || config.model.heads % tp != 0) continue;
    RunConfig v = config;
    v.parallel.tensor.size = tp;
    if (try_variant(v, world, "parallel.tensor.size = " + std::to_string(tp))) break;
  }
  for (int64_t pp = 2; pp <= world && pp <= 64; ++pp) {
    if (pp <= config.parallel.pipeline.size || config.model.layers % pp != 0) continue;
    RunConfig v = config;
    v.parallel.pipeline.size = pp;
    if (try_variant(v, world, "parallel.pipeline.size = " + std::to_string(pp))) break;
  }
  for (int64_t micro = config.train.micro_batch / 2; micro >= 1; micro /= 2) {
    RunConfig v = config;
    v.train.micro_batch = micro;
    if (try_variant(v, world, "train.micro_batch = " + std::to_string(micro))) break;
  }
  // More ranks with zero3: the fewest (a multiple of the non-dp axes) up to 4096.
  RunConfig v = config;
  v.parallel.zero.stage = 3;
  v.parallel.data = 0;
  const int64_t others = non_data_ranks(config);
  for (int64_t ranks = world * 2; ranks <= 4096; ranks *= 2) {
    if (ranks % others != 0) continue;
    if (try_variant(v, ranks, std::to_string(ranks) + " ranks with parallel.zero.stage = 3 (" +
                                  std::to_string(ranks / others) + "-way data parallel)")) {
      break;
    }
  }
  return out;
}

}  // namespace

void check_memory_fits(const RunConfig& config, const MemoryEstimate& estimate,
                       const MemoryBudget& budget, int64_t world_size) {
  if (estimate.peak() <= budget.bytes) return;
  const MemoryTerm& largest = estimate.largest();
  const bool building = estimate.build_peak > estimate.training_peak();
  std::ostringstream msg;
  msg << (config.source.empty() ? "<config>" : config.source) << ": the model does not fit: "
      << fmt_count(estimate.model_parameters) << " parameters need about "
      << format_bytes(estimate.peak()) << " per rank on " << world_size
      << (world_size == 1 ? " rank" : " ranks")
      << (building                           ? " (while building the model)"
          : estimate.shape.pp > 1            ? " (" + estimate.rank + ")"
                                             : std::string())
      << ", but "
      << format_bytes(budget.bytes) << " is available" << budget_suffix(budget)
      << ". Largest: " << largest.name << ", " << format_bytes(largest.bytes) << " ("
      << largest.detail << ").";
  const auto fits = alternatives(config, world_size, estimate.terms.back().bytes, budget.bytes);
  if (fits.empty()) {
    msg << " Nothing tried fits (zero3, tensor or pipeline parallelism on these ranks, a smaller "
           "micro-batch, up to 4096 ranks with zero3).";
  } else {
    msg << " Would fit:";
    for (size_t i = 0; i < fits.size(); ++i) {
      msg << (i ? ";" : "") << " " << fits[i].what << " (" << format_bytes(fits[i].peak) << ")";
    }
    msg << ".";
  }
  msg << " `kolos plan --memory` prints the table; [runtime] memory_limit sets the budget.";
  throw ConfigError(msg.str());
}

std::string format_memory_table(const MemoryEstimate& e, const MemoryBudget& budget) {
  std::ostringstream out;
  char line[256];
  auto row = [&](const std::string& name, double bytes, const std::string& detail) {
    std::snprintf(line, sizeof line, "  %-18s %12s  %s\n", name.c_str(), format_bytes(bytes).c_str(),
                  detail.c_str());
    out << line;
  };
  out << "mesh " << MeshLayout(e.shape).describe() << " | layers " << e.roles.layers << ", pipeline " << e.roles.pipeline
      << ", gradients " << e.roles.gradients
      << (e.roles.sequence.empty() ? "" : ", sequence " + e.roles.sequence)
      << (e.roles.memory.empty() ? "" : ", memory " + e.roles.memory) << " | "
      << fmt_count(e.model_parameters) << " parameters | per rank, " << e.rank << ":\n";
  for (const auto& t : e.terms) row(t.name, t.bytes, t.detail);
  row("training peak", e.training_peak(), "the sum");
  row("building peak", e.build_peak, "runtime + local parameters whole + initialisation temporaries");
  row("budget", budget.bytes, budget.source);
  out << (e.peak() <= budget.bytes ? "fits: " : "does not fit: ") << format_bytes(e.peak())
      << " of " << format_bytes(budget.bytes) << " per rank\n";
  return out.str();
}

}  // namespace kolos
