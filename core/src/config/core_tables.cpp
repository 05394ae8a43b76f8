// The core sections' settings tables (kolos/core/settings.h): one per
// section, each the one place that section's keys, types, defaults and
// ranges are written down. The reader (run_config.cpp) reads and checks
// with them; to_toml writes the effective configuration back with the same
// tables, so what is written reads back to the same RunConfig.
#include "core_tables.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "document.h"
#include "kolos/core/roles.h"
#include "kolos/core/sequence_modes.h"

namespace kolos {
namespace {

const std::vector<std::string> kDataKinds = {"synthetic", "tokens", "images"};
const std::vector<std::string> kTokenDtypes = {"uint16", "uint32"};
// Kept to what the engine implements, so a config that parses can run.
const std::vector<std::string> kOptimizers = {"adamw"};
const std::vector<std::string> kPrecisions = {"fp32", "bf16", "fp16"};
const std::vector<std::string> kReduceDtypes = {"param", "fp32"};
const std::vector<std::string> kRecomputeModes = {"none", "full", "selective"};
const std::vector<std::string> kProgressModes = {"auto", "bar", "lines", "off"};


std::string positive(double x) { return x > 0 && std::isfinite(x) ? "" : "> 0"; }
std::string non_negative(double x) { return x >= 0 ? "" : ">= 0"; }

}  // namespace

// ---- one table per core section: reading, checking and writing back ------

const SettingsTable<ModelConfig>& model_table() {
  static const auto table = SettingsTable<ModelConfig>("model")
                                .string("name", &ModelConfig::name)
                                .integer("layers", &ModelConfig::layers, 1)
                                .integer("hidden", &ModelConfig::hidden, 1)
                                .integer("heads", &ModelConfig::heads, 1)
                                .integer("seq_len", &ModelConfig::seq_len, 1)
                                .integer("vocab", &ModelConfig::vocab, 2)
                                .integer("mlp_ratio", &ModelConfig::mlp_ratio, 1)
                                .number("init_std", &ModelConfig::init_std, positive);
  return table;
}

// The keys only model.name = "llama" has (GPT's mlp_ratio is its SwiGLU
// width ffn_hidden there). norm_eps is vit's too (kVitOptionalKeys); gpt's
// LayerNorm eps is fixed at 1e-5, so gpt refuses it.
const std::vector<std::string> kLlamaKeys = {"kv_heads", "rope_theta", "ffn_hidden", "norm_eps"};

const SettingsTable<ModelConfig>& llama_table() {
  static const auto table = SettingsTable<ModelConfig>("model")
                                .integer("kv_heads", &ModelConfig::kv_heads, 0)
                                .number("rope_theta", &ModelConfig::rope_theta, positive)
                                .integer("ffn_hidden", &ModelConfig::ffn_hidden, 0)
                                .number("norm_eps", &ModelConfig::norm_eps, positive);
  return table;
}

// The keys only model.name = "mixtral" has (besides llama's).
const std::vector<std::string> kMoeKeys = {"experts",         "top_k",  "moe_every",
                                           "aux_loss_coef",   "z_loss_coef",
                                           "capacity_factor", "router", "shared_experts",
                                           "bias_update_rate"};

const SettingsTable<ModelConfig>& moe_table() {
  static const auto table = SettingsTable<ModelConfig>("model")
                                .integer("experts", &ModelConfig::experts, 1)
                                .integer("top_k", &ModelConfig::top_k, 1)
                                .integer("moe_every", &ModelConfig::moe_every, 1)
                                .number("aux_loss_coef", &ModelConfig::aux_loss_coef, non_negative)
                                .number("z_loss_coef", &ModelConfig::z_loss_coef, non_negative)
                                .number("capacity_factor", &ModelConfig::capacity_factor, non_negative)
                                .choice("router", &ModelConfig::router, {"softmax", "sigmoid"},
                                        "router score")
                                .integer("shared_experts", &ModelConfig::shared_experts, 0)
                                .number("bias_update_rate", &ModelConfig::bias_update_rate,
                                        non_negative);
  return table;
}

// What to_toml writes for "llama": model_table() less mlp_ratio, then its keys.
const SettingsTable<ModelConfig>& llama_written_table() {
  static const auto table = model_table().without({"mlp_ratio"}).then(llama_table());
  return table;
}

// The keys only model.name = "vit" has; seq_len and vocab are derived for it.
const std::vector<std::string> kVitKeys = {"image_size", "patch_size", "channels", "classes"};

const SettingsTable<ModelConfig>& vit_table() {
  static const auto table = SettingsTable<ModelConfig>("model")
                                .integer("image_size", &ModelConfig::image_size, 1)
                                .integer("patch_size", &ModelConfig::patch_size, 1)
                                .integer("channels", &ModelConfig::channels, 1)
                                .integer("classes", &ModelConfig::classes, 2);
  return table;
}

// The optional keys of model.name = "vit": its MLP's activation (vit only;
// gpt's is GELU's tanh form) and its LayerNorms' eps (shared with llama).
const std::vector<std::string> kVitOptionalKeys = {"activation", "norm_eps"};

const SettingsTable<ModelConfig>& vit_optional_table() {
  static const auto table =
      SettingsTable<ModelConfig>("model")
          .choice("activation", &ModelConfig::activation, {"gelu_tanh", "gelu"},
                  "MLP activation")
          .number("norm_eps", &ModelConfig::norm_eps, positive);
  return table;
}

// What to_toml writes for "vit": model_table() less seq_len and vocab, then
// its keys (then vit_optional_table()).
const SettingsTable<ModelConfig>& vit_written_table() {
  static const auto table = model_table().without({"seq_len", "vocab"}).then(vit_table());
  return table;
}

// model.name = "dit": the image keys of "vit" (kVitKeys), then its own.
const std::vector<std::string> kDitKeys = {"diffusion_steps", "beta_schedule", "class_dropout",
                                           "pos_embed"};

const SettingsTable<ModelConfig>& dit_table() {
  static const auto table =
      SettingsTable<ModelConfig>("model")
          .integer("diffusion_steps", &ModelConfig::diffusion_steps, 2, 100000)
          .choice("beta_schedule", &ModelConfig::beta_schedule, {"linear", "cosine"},
                  "noise schedule")
          .number("class_dropout", &ModelConfig::class_dropout,
                  [](double x) { return x >= 0 && x < 1 ? "" : ">= 0 and < 1"; })
          .choice("pos_embed", &ModelConfig::pos_embed, {"sincos", "learned"},
                  "position embedding");
  return table;
}

// The keys only data.kind = "images" has.
const std::vector<std::string> kImageDataKeys = {"mean", "std", "crop_pad", "flip"};

const SettingsTable<DataConfig>& image_data_table() {
  static const auto table = SettingsTable<DataConfig>("data")
                                .number("mean", &DataConfig::mean,
                                        [](double x) { return std::isfinite(x) ? "" : "finite"; })
                                .number("std", &DataConfig::std, positive)
                                .integer("crop_pad", &DataConfig::crop_pad, 0)
                                .boolean("flip", &DataConfig::flip);
  return table;
}

const SettingsTable<DataConfig>& data_table() {
  static const auto table = SettingsTable<DataConfig>("data")
                                .choice("kind", &DataConfig::kind, kDataKinds, "data kind")
                                .string("path", &DataConfig::path)
                                .choice("dtype", &DataConfig::dtype, kTokenDtypes, "token dtype");
  return table;
}

const SettingsTable<OptimConfig>& optim_table() {
  const auto beta = [](double b) { return b >= 0 && b < 1 ? "" : "in [0, 1)"; };
  static const auto table =
      SettingsTable<OptimConfig>("optim")
          .choice("name", &OptimConfig::name, kOptimizers, "optimizer")
          .number("lr", &OptimConfig::lr, positive)
          .number("min_lr", &OptimConfig::min_lr, non_negative)
          .integer("warmup_steps", &OptimConfig::warmup_steps, 0)
          .number("beta1", &OptimConfig::beta1, beta)
          .number("beta2", &OptimConfig::beta2, beta)
          .number("eps", &OptimConfig::eps, positive)
          .number("weight_decay", &OptimConfig::weight_decay, non_negative)
          .number("grad_clip", &OptimConfig::grad_clip,
                  [](double x) { return x >= 0 ? "" : ">= 0 (0 disables clipping)"; })
          .boolean("fused", &OptimConfig::fused);
  return table;
}

const SettingsTable<TrainConfig>& train_table() {
  static const auto table =
      SettingsTable<TrainConfig>("train")
          .integer("global_batch", &TrainConfig::global_batch, 1)
          .integer("micro_batch", &TrainConfig::micro_batch, 1)
          .integer("steps", &TrainConfig::steps, 1)
          .integer("seed", &TrainConfig::seed, 0)
          .choice("precision", &TrainConfig::precision, kPrecisions, "precision")
          .choice("reduce_dtype", &TrainConfig::reduce_dtype, kReduceDtypes,
                  "gradient reduction dtype")
          .choice("recompute", &TrainConfig::recompute, kRecomputeModes, "recompute mode")
          .integer("recompute_every", &TrainConfig::recompute_every, 1);
  return table;
}

// fp16's dynamic loss scaling: read, and written back, only when
// precision = "fp16" (elsewhere they would do nothing, so they are refused).
const SettingsTable<TrainConfig>& loss_scale_table() {
  static const auto table =
      SettingsTable<TrainConfig>("train")
          .number("loss_scale_init", &TrainConfig::loss_scale_init,
                  [](double x) {
                    return x >= 1 && std::isfinite(x) ? ""
                                                      : ">= 1 and finite (65536 is the usual start)";
                  })
          .integer("loss_scale_growth_interval", &TrainConfig::loss_scale_growth_interval, 1);
  return table;
}

const SettingsTable<LogConfig>& log_table() {
  static const auto table =
      SettingsTable<LogConfig>("log")
          .string("metrics", &LogConfig::metrics)
          .integer("every", &LogConfig::every, 1)
          .choice("progress", &LogConfig::progress, kProgressModes, "progress mode")
          .boolean("trace", &LogConfig::trace)
          .string("trace_dir", &LogConfig::trace_dir);
  return table;
}

const SettingsTable<CheckpointConfig>& checkpoint_table() {
  static const auto table = SettingsTable<CheckpointConfig>("checkpoint")
                                .string("dir", &CheckpointConfig::dir)
                                .integer("every", &CheckpointConfig::every, 0)
                                .integer("keep_last", &CheckpointConfig::keep_last, 0)
                                .boolean("async", &CheckpointConfig::async);
  return table;
}

const SettingsTable<RuntimeConfig>& runtime_table() {
  static const auto table = SettingsTable<RuntimeConfig>("runtime").number(
      "comm_timeout_s", &RuntimeConfig::comm_timeout_s, [](double s) {
        return s == 0 || (s > 0 && s <= 604800) ? "" : "0 (the default) or in (0, 604800] (a week)";
      })
      .bytes("memory_limit", &RuntimeConfig::memory_limit)
      .choice("device", &RuntimeConfig::device, {"cpu", "cuda"}, "device");
  return table;
}

// [parallel]'s own keys; its axis tables (tensor, pipeline, sequence, zero)
// are read by read_axis.
const SettingsTable<ParallelConfig>& parallel_table() {
  static const auto table = SettingsTable<ParallelConfig>("parallel")
                                .integer("data", &ParallelConfig::data, 0)
                                .integer("bucket_mb", &ParallelConfig::bucket_mb, 1)
                                .integer("bucket_kb", &ParallelConfig::bucket_kb, 0)
                                .choice("allreduce", &ParallelConfig::allreduce,
                                        {"auto", "flat", "hierarchical"}, "all-reduce path")
                                .boolean("auto", &ParallelConfig::auto_plan);
  return table;
}

namespace {

// The keys of a role's axis table that are not the core's, as "k = v" text.
std::string plugin_keys_inline(const RunConfig& c, const std::string& path,
                               const std::vector<std::string>& core) {
  std::string out;
  const ConfigSection s = c.section(path);
  for (const auto& key : s.keys()) {
    if (std::find(core.begin(), core.end(), key) != core.end()) continue;
    out += ", " + toml_key_text(key) + " = " + s.value_text(key);
  }
  return out;
}

}  // namespace

std::string to_toml(const RunConfig& c) {
  std::ostringstream out;
  out << "# effective configuration";
  if (!c.source.empty()) {
    std::string source = c.source;  // a comment ends at a newline
    std::replace(source.begin(), source.end(), '\n', ' ');
    out << " (read from " << source << ")";
  }
  out << "\n\n[model]\n";
  (llama_family(c.model) ? llama_written_table()
   : c.model.name == "vit" ? vit_written_table()
   : c.model.name == "dit" ? vit_written_table()
                            : model_table())
      .write(c.model, out);
  if (c.model.name == "dit") dit_table().write(c.model, out);
  if (c.model.name == "vit") vit_optional_table().write(c.model, out);
  if (c.model.name == "mixtral") moe_table().write(c.model, out);
  out << "\n[data]\n";
  if (c.data.kind == "images") {  // data.dtype does not apply to it
    out << "kind = " << quote_toml(c.data.kind) << "\npath = " << quote_toml(c.data.path) << "\n";
    image_data_table().write(c.data, out);
  } else {
    data_table().write(c.data, out);
  }
  out << "\n[optim]\n";
  optim_table().write(c.optim, out);
  out << "\n[train]\n";
  train_table().write(c.train, out);
  if (c.train.precision == "fp16") loss_scale_table().write(c.train, out);
  out << "\n[parallel]\n";
  parallel_table().write(c.parallel, out);
  const auto& p = c.parallel;
  out << "tensor = { size = " << p.tensor.size;
  // The mode acts only at size > 1 or under a layers override (see check_roles).
  if (p.tensor.size > 1 || c.plugins.by_role.count("layers")) {
    out << ", mode = " << quote_toml(p.tensor.mode);
  }
  out << plugin_keys_inline(c, "parallel.tensor", {"size", "mode"}) << " }\n";
  out << "pipeline = { size = " << p.pipeline.size
      << plugin_keys_inline(c, "parallel.pipeline", {"size"}) << " }\n";
  out << "sequence = { size = " << p.sequence.size;
  // Written where it selects the plugin (an override that names another
  // plugin would conflict with it when read back).
  const auto sequence_plugin = c.plugins.by_role.find("sequence");
  if (sequence_splits(p.sequence) &&
      (sequence_plugin == c.plugins.by_role.end() || sequence_plugin->second == p.sequence.mode)) {
    out << ", mode = " << quote_toml(p.sequence.mode);
  }
  out << plugin_keys_inline(c, "parallel.sequence", {"size", "mode"}) << " }\n";
  out << "zero = { stage = " << p.zero.stage << plugin_keys_inline(c, "parallel.zero", {"stage"})
      << " }\n";
  if (p.expert.size > 1) out << "expert = { size = " << p.expert.size << " }\n";
  out << "\n[log]\n";
  log_table().write(c.log, out);
  out << "\n[checkpoint]\n";
  checkpoint_table().write(c.checkpoint, out);
  const EvalConfig eval = read_eval_config(c);
  if (eval.enabled) {
    out << "\n[eval]\n";
    if (!eval.path.empty()) out << "path = " << quote_toml(eval.path) << "\n";
    out << "every = " << eval.every << "\nsamples = " << eval.samples << "\n";
  }
  out << "\n[runtime]\n";
  runtime_table().write(c.runtime, out);
  out << "\n[plugins]\npath = [";
  for (size_t i = 0; i < c.plugins.path.size(); ++i) {
    out << (i ? ", " : "") << quote_toml(c.plugins.path[i]);
  }
  out << "]\n";
  for (const auto& [role, plugin] : c.plugins.by_role)
    out << role << " = " << quote_toml(plugin) << "\n";
  return out.str();
}

}  // namespace kolos
