// RunConfig: a run described in TOML, parsed into typed structs.
//
// load_run_config() reads a TOML file, applies `--set a.b=value` overrides and
// validates every key the core owns. Unknown keys, wrong types, out-of-range
// values and impossible meshes throw kolos::ConfigError whose message names
// the file, line, key, what was found and what would be valid ("did you
// mean" for typos). The keys of a role's section besides the core's (mesh
// sizes, the plugin choice) belong to that role's plugin, which reads them
// from `RunConfig::section()` in its configure() (kolos/core/roles.h); the
// core refuses them when no plugin of that role runs. Torch-free: this
// header is cheap to include.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kolos/core/mesh_layout.h"
#include "kolos/core/settings.h"

namespace kolos {

struct ModelConfig {
  std::string name = "gpt";  // a model from modules/
  int64_t layers = 2;
  int64_t hidden = 64;
  int64_t heads = 4;
  int64_t seq_len = 32;
  int64_t vocab = 256;
  int64_t mlp_ratio = 4;   // MLP hidden = mlp_ratio * hidden (gpt only)
  double init_std = 0.02;  // normal init of linear/embedding weights
  // name = "llama" only (refused for the others). Read as 0 = "the default",
  // then resolved, so after load_run_config they hold the values used.
  int64_t kv_heads = 0;       // key/value heads (grouped-query attention); 0: heads
  double rope_theta = 10000;  // rotary position embedding base
  int64_t ffn_hidden = 0;     // SwiGLU width; 0: default_ffn_hidden(hidden)
  // name = "llama" and "vit" (refused for gpt): RMSNorm's epsilon for llama,
  // LayerNorm's for vit.
  double norm_eps = 1e-5;
  // name = "vit" only (refused for the others). seq_len and vocab are
  // derived for it: seq_len = image_size^2 * channels (the pixels of one
  // sample), vocab = classes.
  int64_t image_size = 0;  // square images of image_size x image_size pixels
  int64_t patch_size = 0;  // square patches; must divide image_size
  int64_t channels = 0;
  int64_t classes = 0;
  // The MLP's GELU: "gelu_tanh" (tanh approximation) or "gelu" (exact, erf).
  std::string activation = "gelu_tanh";
  // name = "dit" only (refused for the others), besides image_size,
  // patch_size, channels and classes as for "vit" (docs/models.md). Derived
  // for it: seq_len = image_size^2 * channels + 2 (the pixels, the label and
  // a per-sample noise key), vocab = classes.
  int64_t diffusion_steps = 1000;        // DDPM timesteps T
  std::string beta_schedule = "linear";  // "linear" | "cosine"
  double class_dropout = 0.1;            // P(label -> the null class), for guidance
  std::string pos_embed = "sincos";      // "sincos" (fixed) | "learned"
  // name = "mixtral" only (refused for the others), besides llama's keys:
  // the MLP of every moe_every-th block (blocks moe_every-1, 2*moe_every-1,
  // ...) is a mixture of `experts` SwiGLU experts of width ffn_hidden, each
  // token sent to its top_k (docs/moe.md).
  int64_t experts = 8;
  int64_t top_k = 2;
  int64_t moe_every = 1;
  double aux_loss_coef = 0.01;   // Switch/GShard load-balancing loss
  double z_loss_coef = 0.0;      // router z-loss (ST-MoE)
  double capacity_factor = 0.0;  // 0: dropless; else capacity per expert, tokens beyond dropped
  // "softmax" (Mixtral) or "sigmoid" (DeepSeek-V3): how router logits become
  // scores; the chosen top_k scores are renormalised to sum to 1 either way.
  std::string router = "softmax";
  // SwiGLU experts every token goes through besides its routed ones
  // (DeepSeek's shared experts): one MLP of width shared_experts x ffn_hidden.
  int64_t shared_experts = 0;
  // Auxiliary-loss-free balancing (DeepSeek-V3): > 0 adds a per-expert bias
  // to the scores when choosing the top_k (not to the weights), and after
  // every step moves each block's bias by this rate towards balance:
  // + rate for an expert that took fewer than the mean assignments, - rate
  // for one that took more (counted over the whole step, every rank).
  double bias_update_rate = 0.0;
};

// Whether block `block` of `c` has a mixture-of-experts MLP.
bool is_moe_block(const ModelConfig& c, int64_t block);
// llama and mixtral share the LLaMA block (RMSNorm, RoPE, SwiGLU).
inline bool llama_family(const ModelConfig& c) { return c.name == "llama" || c.name == "mixtral"; }

// LLaMA's SwiGLU width for `hidden`: 2/3 * 4 * hidden rounded up to a
// multiple of 256, or of hidden itself when hidden < 256 (so a tiny model
// does not get an MLP many times wider than LLaMA's ratio; 4096 -> 11008,
// 64 -> 192). 0 when it would overflow.
int64_t default_ffn_hidden(int64_t hidden);

struct DataConfig {
  std::string kind = "synthetic";  // "synthetic" | "tokens"
  std::string path;                // tokens: file of little-endian token ids
  std::string dtype = "uint16";    // tokens: "uint16" | "uint32"
  // kind = "images" only (refused for the others): pixels / 255 are
  // normalised as (x - mean) / std; crop_pad > 0 pads each side with that
  // many zero pixels and crops a random image_size window back; flip
  // mirrors half the samples left-right (both drawn from (seed, index)).
  double mean = 0.0;
  double std = 1.0;
  int64_t crop_pad = 0;
  bool flip = false;
};

struct OptimConfig {
  std::string name = "adamw";
  double lr = 1e-3;
  double min_lr = 0.0;  // cosine decays to this
  int64_t warmup_steps = 0;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double grad_clip = 1.0;  // global L2 norm; 0 disables
  bool fused = true;       // AdamW by the fused CPU kernel (kolos/kernels) where it applies
};

struct TrainConfig {
  int64_t global_batch = 8;  // samples per optimizer step, all ranks together
  int64_t micro_batch = 4;   // samples per forward/backward on one rank
  int64_t steps = 20;
  int64_t seed = 1234;             // >= 0
  // "fp32" | "bf16" | "fp16": the dtype of parameters, activations and
  // gradients; bf16 and fp16 keep fp32 master weights and AdamW moments
  // (docs/precision.md).
  std::string precision = "fp32";
  // "param": gradients reduced in the precision's dtype; "fp32": in fp32
  // (each bucket widened for the collective, then rounded back once).
  std::string reduce_dtype = "param";
  // fp16 only: dynamic loss scaling's first scale and the number of
  // overflow-free steps after which the scale doubles (halved on overflow).
  double loss_scale_init = 65536.0;
  int64_t loss_scale_growth_interval = 2000;
  // Activation recomputation of the repeated (transformer) blocks: "none",
  // "full" (whole blocks) or "selective" (their attention core only).
  std::string recompute = "none";
  int64_t recompute_every = 1;  // every k-th repeated block, from the first
};

// The keys of [parallel.tensor], [parallel.pipeline], [parallel.sequence] and
// [parallel.zero] that the core reads: mesh sizes and what selects a plugin.
// Every other key of those tables is the chosen plugin's.
struct TensorParallelConfig {
  int64_t size = 1;
  std::string mode = "1d";  // "1d" | "2d" | "2.5d" | "3d": the layers plugin
};

struct PipelineConfig {
  int64_t size = 1;
};

struct SequenceConfig {
  int64_t size = 1;
  // "ulysses" | "ring" | "megatron" | "hybrid": the sequence plugin (those
  // this version builds are accepted; docs/sequence-parallel.md).
  std::string mode = "ulysses";
};

// parallel.expert: expert parallelism (model.name = "mixtral"). `size` ranks
// along the mesh's ep axis split the data ranks (parallel.data / size stay
// on dp) and each holds model.experts / size experts of every mixture layer.
struct ExpertConfig {
  int64_t size = 1;
};

struct ZeroConfig {
  int64_t stage = 0;  // 0..3: the gradients plugin (dp, zero1, zero2, zero3)
};

struct ParallelConfig {
  int64_t data = 0;  // 0: the world size divided by the other axes
  TensorParallelConfig tensor;
  PipelineConfig pipeline;
  SequenceConfig sequence;
  ExpertConfig expert;
  ZeroConfig zero;
  int64_t bucket_mb = 25;  // gradient bucket size for dp, in MiB (fractions via bucket_kb)
  int64_t bucket_kb = 0;   // if > 0, overrides bucket_mb
  // How dp and zero1 all-reduce their gradient buckets when the group spans
  // nodes: "auto" (measure both once at set-up, keep the faster), "flat",
  // "hierarchical" (kolos/core/comm/hierarchical.h).
  std::string allreduce = "auto";
  // parallel.auto: the planner role chooses the sizes and modes the config
  // leaves open (kolos/core/planner.h); the run uses the plan it resolves to.
  bool auto_plan = false;
};

struct LogConfig {
  std::string metrics;  // path of a JSON-lines metrics file; empty: none
  int64_t every = 1;    // progress update every N steps
  std::string progress =
      "auto";             // "auto" (bar on a TTY, lines otherwise) | "bar" | "lines" | "off"
  bool trace = false;     // write a Chrome/Perfetto trace per rank (pipeline timeline)
  std::string trace_dir;  // where; empty: next to the metrics file, else "."
};

struct CheckpointConfig {
  std::string dir;        // checkpoint root; empty: no checkpoints
  int64_t every = 0;      // save every N steps (0: only at the end and on a stop request)
  int64_t keep_last = 0;  // keep the newest N checkpoints (0: keep all)
  bool async = false;     // write in a background thread after a host copy
};

struct RuntimeConfig {
  // Deadline of every collective and point-to-point operation, in seconds;
  // 0: KOLOS_COMM_TIMEOUT_S, else 600. When one passes the watchdog ends the
  // whole job (docs/reliability.md).
  double comm_timeout_s = 0;
  // Bytes one rank may use; 0: the node's available memory divided by its
  // ranks. Runs whose estimate exceeds it are refused before the model is
  // built (kolos/core/memory_estimate.h).
  int64_t memory_limit = 0;
  // Where the model computes: "cpu", or "cuda" (the GPU of the rank's
  // node-local rank; kolos/core/device.h). "cuda" needs a kolos built with
  // its CUDA backend and a usable GPU, and is refused for the mixes not yet
  // tested on one (check_device_mix in the engine).
  std::string device = "cpu";
};

struct PluginsConfig {
  std::vector<std::string> path;               // searched first
  std::map<std::string, std::string> by_role;  // role -> plugin name override
};

struct RunConfig {
  std::string source;  // the file it was read from ("<string>" when parsed from text)
  // The document it was read from (null for a config built in code): the
  // plugins' sections are read from it.
  std::shared_ptr<const ConfigDocument> document;
  ModelConfig model;
  DataConfig data;
  OptimConfig optim;
  TrainConfig train;
  ParallelConfig parallel;
  LogConfig log;
  CheckpointConfig checkpoint;
  RuntimeConfig runtime;
  PluginsConfig plugins;

  // The table at dotted `path` of the document ("parallel.pipeline"); an
  // empty section when absent or when the config was built in code.
  ConfigSection section(const std::string& path) const { return ConfigSection(document, path); }
};

// [eval]: a held-out evaluation, forward only (Engine::evaluate). Not a
// member of RunConfig: read from its document by read_eval_config.
struct EvalConfig {
  bool enabled = false;  // the run has an [eval] section
  // The held-out file, of data.kind's format (data.kind = "synthetic": none;
  // held-out samples are drawn from another seed).
  std::string path;
  int64_t every = 0;    // evaluate every N steps (0: only at the end)
  int64_t samples = 0;  // how many samples (0: the whole file; synthetic: 256)
};

// The [eval] section of `config` (checked: ConfigError naming the key).
EvalConfig read_eval_config(const RunConfig& config);

// Reads `path`, applies overrides of the form "section.key=value" (value in
// TOML syntax; bare words are taken as strings), validates. Throws ConfigError.
RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides = {});

// As load_run_config, from TOML text; `name` stands for the file in messages.
RunConfig parse_run_config(const std::string& toml_text, const std::string& name,
                           const std::vector<std::string>& overrides = {});

// Mesh sizes implied by a config for `world_size` ranks, in mesh order
// pp, dp, sp, tp. Throws ConfigError naming the sizes when they do not divide
// the world (with the nearest valid world sizes / data sizes).
MeshShape resolve_mesh_shape(const RunConfig& config, int64_t world_size);

// Renders the effective configuration as TOML (for logs and checkpoints):
// the core's keys from their tables, the plugins' keys as they were given.
std::string to_toml(const RunConfig& config);

}  // namespace kolos
