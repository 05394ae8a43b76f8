// What each plugin knows about itself (the memory a rank holds, the layouts
// it runs, the collectives it issues), and the one function that adds up
// the memory.
//
// A plugin's terms live in its own folder (plugins/<dir>/*_terms.cpp),
// torch-free, and register under the plugin's name with KOLOS_PLUGIN_TERMS.
// plugins/CMakeLists.txt's kolos_plugin_terms() compiles them into
// libkolos_plugin_terms, beside the registry and rank_memory(). The core's
// estimate (memory_estimate.h: the engine's refusal, `kolos check`,
// `kolos plan --memory`) and the planner (planner/, its search and its
// printed plans) both describe a rank as a MemoryQuery and call
// rank_memory(): they agree because there is one function, and neither
// names a plugin.
//
// What rank_memory() knows itself is the model's: parameters per block, the
// embedding and the head, the tensors autograd keeps per block, the logits,
// the allocator's allowance. What it asks:
//   the layers role     how a block's saved tensors divide over the tensor
//                       group (TensorCut);
//   the sequence role   what attention keeps and backward's high point of
//                       its core (AttentionMemory);
//   the pipeline role   the micro-batches a stage holds at once;
//   the gradients role  the model states: parameters, gradients, optimizer;
//   the memory role     the model states instead of the gradients role.
// A chosen plugin that registered no terms is named in the result as "not
// counted", never estimated as another plugin.
//
// The planner (planner/src/search.cpp, cost_model.cpp) also asks the
// layers' and sequence plugins which layouts they offer for a mesh
// (layouts, layout_problem) and every role's plugin what it sends
// (traffic, gradient_traffic): it times the calls, and names no plugin.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kolos {

struct MemoryTerm {
  std::string name;    // "parameters", "gradients", ...
  double bytes = 0;    // double: a config may ask for more than int64 can count
  std::string detail;  // how it was computed, for the table
  // Held in host memory beside a device (the memory role's host tier). On
  // a CPU run that is the same memory and the estimate adds it; the planner
  // counts it against the host, not the device.
  bool host = false;
};

// The model, whole. Every count is a double: the point of an estimate is to
// say that 1e11 layers do not fit before anything is allocated.
struct ModelDims {
  double layers = 0, hidden = 0, heads = 0, kv_heads = 0, seq = 0, vocab = 0;
  double inner = 0;    // the MLP's width
  bool llama = false;  // no biases, SwiGLU, RMSNorm, untied head, no position table
  // A mixture of experts: the share of blocks whose MLP is `experts` SwiGLU
  // experts, each token through top_k of them, plus `shared` always-on ones.
  double moe_share = 0, experts = 0, top_k = 1, shared = 0;
};

// One run, as the estimate sees it: the model, the mesh, the roles' plugins
// and what the run sets. Built from a RunConfig by the core
// (memory_estimate.cpp) and from a Candidate by the planner.
struct MemoryQuery {
  ModelDims model;
  int64_t pp = 1, dp = 1, sp = 1, tp = 1, ep = 1;
  // The plugin of each role ("" none); names as roles.h's RoleChoice.
  std::string layers, sequence, pipeline, gradients, memory;
  // The plugins' own keys, as text, by their full name
  // ("parallel.pipeline.schedule", "memory.compute_budget").
  std::map<std::string, std::string> settings;
  double element_bytes = 4;  // parameters and activations: 2 under bf16/fp16
  int64_t micro_batch = 1;
  int64_t accumulation = 1;  // micro-batches per step on each rank
  std::string recompute = "none";
  int64_t recompute_every = 1;
  int zero_stage = 0;        // parallel.zero.stage (the memory role shards by it)
  double bucket_bytes = 0;   // [parallel] bucket size
  double runtime_bytes = 0;  // the process before the model exists
  std::string runtime_source = "measured in this process";  // for the table
  // Whether training runs with kolos's tuned heap (malloc_tuning.h,
  // KOLOS_MALLOC=tuned); the estimate and the planner set it from
  // training_malloc().
  bool heap_tuned = false;
  // The terms' texts (MemoryTerm::detail and the like); the planner's search
  // asks for the bytes alone, a million times.
  bool details = true;

  bool mixed() const { return element_bytes < 4; }  // fp32 masters beside bf16/fp16
  // A plugin key's text, or `fallback` when the run does not set it.
  std::string setting(const std::string& key, const std::string& fallback = "") const;
};

// What the rank at one pipeline stage holds.
struct RankPiece {
  int64_t stage = 0;
  double blocks = 0;   // transformer blocks on this stage
  double params = 0;   // local parameters after the tensor cut, before any sharding
  double block = 0;    // one block's local parameters
  double largest = 0;  // the largest global tensor (built whole to initialise)
  bool embeddings = false, head = false;
  bool details = true;  // MemoryQuery::details
  // "1.2M local parameters": for the terms' details ("" without them).
  std::string count() const;
};

// The layers role: divisors over the tensor group of a block's saved
// tensors. The norms' inputs and outputs, everything else (projections,
// MLP, attention), and the input a fully recomputed block keeps.
struct TensorCut {
  double norms = 1, rest = 1, kept_input = 1;
};

// The sequence role: what the attention core of one block keeps for one
// micro-batch of `tokens` positions per rank (elements), how much of that
// selective recomputation drops (the probabilities), backward's high point
// of the core (bytes, over the tensor group), and whether the norms'
// tensors split over the tensor group but for the two a column layer
// gathers whole (megatron).
struct AttentionMemory {
  double saved = 0;
  double probabilities = 0;
  double backward = 0;
  bool norms_over_tensor = false;
  std::string kernel;  // for the details: "dense", "ring kernel"
};

// A layout the planner considers for the layers and sequence roles: the
// model's divisible sizes and the mesh's. micro_batch 0: not chosen yet
// (the search asks again with each micro-batch).
struct LayoutQuery {
  int64_t heads = 0, kv_heads = 0, inner = 0, seq = 0;
  int64_t tp = 1, sp = 1;
  std::string tensor_mode = "1d";  // [parallel.tensor] mode
  int64_t depth = 1;               // 2.5d: d of d x q x q
  int64_t ulysses = 1;             // hybrid: the Ulysses degree a of sp = a x r
  std::string sequence_mode;       // [parallel.sequence] mode ("" none)
  int64_t micro_batch = 0;
};

// What the planner prices (planner/cost_model.h): each role's collectives,
// as data. The plugin says what it sends, over which ranks and when; the
// planner's cost model times each call on its cluster.
enum class Collective { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kSendRecv };
// With fewer cores than ranks, what a collective waits for its peers to be
// scheduled, by the pattern its plugin issues it in (the calibration's sync
// tables): alone (kGroup: by its own group's size), as one of a tensor
// grid's row and column collectives (kGrid), as a ring's hop (kRing).
enum class SyncPattern { kGroup, kGrid, kRing };
// Where a call is issued: per micro-batch, but kStep.
enum class CallSite {
  kBlock,       // layers, sequence: in each transformer block
  kEmbedding,   // layers: at the embedding (the first pipeline stage)
  kHead,        // layers: at the head (the last pipeline stage)
  kMicroBatch,  // gradients: over one pipeline stage's parameters
  kStep,        // gradients: once per step, over the rank's parameters
};
// What a call's time may hide behind.
enum class Hides {
  kNothing,    // on the critical path
  kAttention,  // the attention core it feeds (a ring's hops)
  kPass,       // its pass, up to the planner's overlap share (kStep: the last backward)
};
struct CollectiveCall {
  Collective op = Collective::kAllReduce;
  // The whole buffer: the all-reduce's input, the all-gather's output, the
  // reduce-scatter's input, the all-to-all's send buffer; kSendRecv: the
  // message.
  double bytes = 0;
  int64_t n = 1, stride = 1;  // the group: n ranks spaced stride apart in rank order
  CallSite site = CallSite::kBlock;
  bool backward = false;  // issued in the backward pass, else the forward (kStep: unused)
  double count = 1;       // calls per site and pass
  Hides hides = Hides::kNothing;
  SyncPattern sync = SyncPattern::kGroup;
  int64_t span = 0;  // kGrid, kRing: the grid's or the ring's ranks
  // Bytes the rank reads and writes in its own memory around each call,
  // per byte of `bytes` (unpacking a gathered buffer into the parameters,
  // packing gradients into a staging buffer): the planner prices them at
  // the machine's elementwise rate, on the computing thread, never hidden.
  double copy = 0;
  // Bytes one rank sends for all `count` calls.
  double sent() const;
};

// A plugin's terms. A role's plugin fills the hooks of its role.
struct PluginTerms {
  std::string name;                                // the plugin's name ("zero3")
  std::string role;                                // its role ("gradients")
  TensorCut (*cut)(const MemoryQuery&) = nullptr;  // layers
  AttentionMemory (*attention)(const MemoryQuery&, double micro,
                               double tokens) = nullptr;             // sequence
  // pipeline: the micro-batches whose activations `stage` holds at once,
  // and (when the pointer is given) the schedule that says so, in words.
  double (*in_flight)(const MemoryQuery&, int64_t stage, std::string* schedule) = nullptr;
  // gradients, memory: appends "parameters", "gradients", "optimizer
  // states" (or the memory role's tiers) for `piece`.
  void (*states)(const MemoryQuery&, const RankPiece&, std::vector<MemoryTerm>&) = nullptr;
  // layers, sequence: "" when the plugin runs `layout`, else why not (the
  // planner's reason for dropping the candidates that have it).
  std::string (*layout_problem)(const LayoutQuery& layout) = nullptr;
  // gradients, memory: what a rank holds once the model is built, when the
  // plugin takes its part of each block as it is built (bytes; the build
  // peak adds the initialisation's temporaries and the runtime). Without
  // it every local parameter is built whole.
  double (*built)(const MemoryQuery&, const RankPiece&) = nullptr;

  // For the planner.
  // layers, sequence: the word that selects the plugin in its section
  // ([parallel.tensor] mode "2.5d", [parallel.sequence] mode "ring").
  std::string mode;
  // layers, sequence: appends the layouts the plugin offers for the mesh
  // sizes of `mesh` (the sequence role also sees the tensor mode), each
  // with its mode and variant filled in (tensor_mode and depth, or
  // sequence_mode and ulysses). The planner asks layout_problem about the
  // model's sizes afterwards.
  void (*layouts)(const LayoutQuery& mesh, std::vector<LayoutQuery>& out) = nullptr;
  // layers, sequence: one rank's collectives for one micro-batch (sites
  // kBlock, kEmbedding, kHead).
  void (*traffic)(const MemoryQuery&, std::vector<CollectiveCall>& out) = nullptr;
  // gradients: the collectives over `parameter_bytes` of parameters, per
  // micro-batch (kMicroBatch) and per step (kStep), their bytes in
  // proportion to parameter_bytes (the planner asks once, per byte).
  void (*gradient_traffic)(const MemoryQuery&, double parameter_bytes,
                           std::vector<CollectiveCall>& out) = nullptr;
  // gradients: the share of a rank's parameters its optimizer steps
  // (nullptr: all of them).
  double (*optimizer_share)(const MemoryQuery&) = nullptr;
};

// Registers `terms` (at load, through KOLOS_PLUGIN_TERMS); a second
// registration of one name throws.
void register_plugin_terms(const PluginTerms& terms);
// The terms registered under `name`, or nullptr.
const PluginTerms* plugin_terms(const std::string& name);
// Every registered name, sorted.
std::vector<std::string> plugin_terms_names();

// n's exact k-th root, or 0 when it has none (the tensor grids' sides).
int64_t exact_root(int64_t n, int k);

// The attention core without the ring kernel: it keeps the batch x heads x
// tokens x seq probabilities (the serial core, ulysses after its all-to-all,
// megatron).
AttentionMemory dense_attention_memory(const MemoryQuery& q, double micro, double tokens);

// A layers' or sequence plugin's terms for the planner: its name, role,
// mode word, layout rules, offered layouts and traffic (the caller adds
// its role's memory hook).
PluginTerms layout_plugin_terms(const std::string& name, const std::string& role,
                                const std::string& mode, std::string (*problem)(const LayoutQuery&),
                                void (*layouts)(const LayoutQuery&, std::vector<LayoutQuery>&),
                                void (*traffic)(const MemoryQuery&, std::vector<CollectiveCall>&));
// Appends `mesh` as a plugin of `role` offers it: its mode word and its
// variant (layers: the tensor mode and the depth; sequence: the sequence
// mode and the Ulysses degree).
void offer_layout(const LayoutQuery& mesh, const std::string& role, const char* mode,
                  int64_t variant, std::vector<LayoutQuery>& out);
// The layouts every registered plugin of `role` ("layers", "sequence")
// offers for `mesh` (PluginTerms::layouts), in the order of their names.
std::vector<LayoutQuery> offered_layouts(const std::string& role, const LayoutQuery& mesh);
// The collectives of the plugin `name` for one micro-batch
// (PluginTerms::traffic); none for "" or a plugin without the hook, and
// then `*priced` (when given) is false.
std::vector<CollectiveCall> plugin_traffic(const std::string& name, const MemoryQuery& q,
                                           bool* priced = nullptr);
// The gradients plugin's collectives over `parameter_bytes`, and the share
// of the parameters its optimizer steps.
std::vector<CollectiveCall> gradient_traffic(const MemoryQuery& q, double parameter_bytes,
                                             bool* priced = nullptr);
double optimizer_share(const MemoryQuery& q);
// The divisor over the tensor group of the tensors at a block's boundary
// and its norms (what a pipeline stage sends, what the norms compute on):
// the layers plugin's cut, or the whole tensor group when the sequence
// plugin splits them over it.
double boundary_split(const MemoryQuery& q);
// What one block's attention keeps, by the sequence plugin (the dense core
// without one).
AttentionMemory attention_memory(const MemoryQuery& q, double micro, double tokens);

// One rank's memory at its high point.
struct RankMemory {
  std::string rank;               // "every rank", "pipeline stage 3"
  std::vector<MemoryTerm> terms;  // the training peak is their sum
  double states = 0;              // of which the model states' terms
  // Building: every local parameter whole (or what the states' plugin
  // keeps of them, PluginTerms::built), plus the initialisation's
  // temporaries of the largest global tensor, plus the runtime.
  double build_peak = 0;
  std::string build_detail;     // what the build peak holds, for the table
  double model_parameters = 0;  // the whole model, every rank together
  double training_peak() const;
  double peak() const;  // max(training, build)
  double host() const;  // the terms held in host memory beside a device
};

// The worst rank: the first pipeline stage (the embeddings, the most
// micro-batches in flight) or the last (the head, the logits), whichever is
// higher.
RankMemory rank_memory(const MemoryQuery& query);
// The rank at pipeline stage `stage`.
RankMemory rank_memory_at(const MemoryQuery& query, int64_t stage);

// What a process holds beyond its live tensors and the runtime measured
// before the model exists, fitted to measured runs (bench/run_memory_fit.sh;
// docs/reliability.md, "Memory estimate"), one set of constants per heap.
//
// Under kolos's tuned heap (malloc_tuning.h, KOLOS_MALLOC=tuned): a fixed part (MPI's and the
// threads' buffers that appear once the ranks compute and communicate),
// measured on the fit set's tiniest run, and a share of each side of the
// tensors, fitted on the rest of the fit set: the states' side (parameters,
// gradients, optimizer states, chunk tiers: the buckets' and the shards'
// staging beyond them) and the activations' side (activations and
// temporaries, which the terms count at a high point that not all of them
// reach together; the share is negative).
inline constexpr double kHeapStatesShare = 0.19;
inline constexpr double kHeapActivationsShare = -0.20;
inline constexpr double kHeapBuffers = 19.0 * 1024 * 1024;
// Under glibc's defaults (the default heap): a share of the tensors
// (freed memory the heap keeps) and a fixed part, fitted together.
inline constexpr double kAllocatorShare = 0.18;
inline constexpr double kProcessBuffers = 69.0 * 1024 * 1024;

namespace detail {
struct PluginTermsRegistrar {
  explicit PluginTermsRegistrar(const PluginTerms& terms) { register_plugin_terms(terms); }
};
}  // namespace detail

}  // namespace kolos

#define KOLOS_TERMS_CONCAT_(a, b) a##b
#define KOLOS_TERMS_CONCAT(a, b) KOLOS_TERMS_CONCAT_(a, b)
// KOLOS_PLUGIN_TERMS(make_terms()): registers the PluginTerms the
// expression returns when libkolos_plugin_terms loads.
#define KOLOS_PLUGIN_TERMS(...)                                                       \
  static const ::kolos::detail::PluginTermsRegistrar KOLOS_TERMS_CONCAT(kolos_terms_, \
                                                                        __LINE__)(__VA_ARGS__)
