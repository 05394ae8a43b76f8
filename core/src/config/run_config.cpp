// TOML -> RunConfig: parse, apply `--set` overrides, read the core's
// sections through their key tables, report errors the way a compiler does
// (where, what was found, what would be valid).
//
// How a config is read:
//   1. toml11 parses the text into a document; a syntax error becomes a
//      ConfigError carrying toml11's own located message.
//   2. Each override "a.b.c=value" is parsed as a TOML value (falling back to
//      a plain string) and written into the document, so overrides go through
//      exactly the same checks as the file.
//   3. Each core section is read by its SettingsTable (unknown keys first, in
//      file order, then types, then ranges), then the rules that involve
//      several keys. The first problem throws.
//   4. The roles: which plugin each one gets (choose_plugins), and keys of a
//      role's section that no plugin will read are refused. Plugins read and
//      check their own keys later, in configure(), before any communication.
// Every message starts with an origin: "file:line:col" for a value that came
// from the file, "file: --set a.b=c" for one that came from an override, or
// the file alone for a default that breaks a rule.
#include "kolos/core/run_config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>
#include <utility>

#include "document.h"
#include "kolos/core/error.h"
#include "kolos/core/roles.h"

namespace kolos {
namespace {

const std::vector<std::string> kDataKinds = {"synthetic", "tokens", "images"};
const std::vector<std::string> kTokenDtypes = {"uint16", "uint32"};
// Kept to what the engine implements, so a config that parses can run.
const std::vector<std::string> kOptimizers = {"adamw"};
const std::vector<std::string> kPrecisions = {"fp32", "bf16", "fp16"};
const std::vector<std::string> kReduceDtypes = {"param", "fp32"};
const std::vector<std::string> kRecomputeModes = {"none", "full", "selective"};
const std::vector<std::string> kTensorModes = {"1d", "2d", "2.5d", "3d"};
// parallel.sequence.mode: each a sequence plugin of that name.
const std::vector<std::string> kSequenceModes = {"ulysses", "ring", "megatron", "hybrid"};
const std::vector<std::string> kProgressModes = {"auto", "bar", "lines", "off"};

constexpr int64_t kMaxUint16Vocab = 65536;

std::string positive(double x) { return x > 0 && std::isfinite(x) ? "" : "> 0"; }
std::string non_negative(double x) { return x >= 0 ? "" : ">= 0"; }

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
  static const auto table = SettingsTable<ModelConfig>("model")
                                .string("name", &ModelConfig::name)
                                .integer("layers", &ModelConfig::layers, 1)
                                .integer("hidden", &ModelConfig::hidden, 1)
                                .integer("heads", &ModelConfig::heads, 1)
                                .integer("seq_len", &ModelConfig::seq_len, 1)
                                .integer("vocab", &ModelConfig::vocab, 2)
                                .number("init_std", &ModelConfig::init_std, positive)
                                .integer("kv_heads", &ModelConfig::kv_heads, 0)
                                .number("rope_theta", &ModelConfig::rope_theta, positive)
                                .integer("ffn_hidden", &ModelConfig::ffn_hidden, 0)
                                .number("norm_eps", &ModelConfig::norm_eps, positive);
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
  static const auto table = SettingsTable<ModelConfig>("model")
                                .string("name", &ModelConfig::name)
                                .integer("layers", &ModelConfig::layers, 1)
                                .integer("hidden", &ModelConfig::hidden, 1)
                                .integer("heads", &ModelConfig::heads, 1)
                                .integer("mlp_ratio", &ModelConfig::mlp_ratio, 1)
                                .number("init_std", &ModelConfig::init_std, positive)
                                .integer("image_size", &ModelConfig::image_size, 1)
                                .integer("patch_size", &ModelConfig::patch_size, 1)
                                .integer("channels", &ModelConfig::channels, 1)
                                .integer("classes", &ModelConfig::classes, 2);
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

// The axis tables of [parallel], each the section of one role.
struct Axis {
  const char* key;       // "tensor"
  const char* role;      // "layers"
  const char* size_key;  // the key a shorthand integer stands for
};
const Axis kAxes[] = {{"tensor", "layers", "size"},
                      {"pipeline", "pipeline", "size"},
                      {"sequence", "sequence", "size"},
                      {"zero", "gradients", "stage"}};

// The top-level sections a run may have: the core's, and those of the
// roles this version runs whose section is a top-level table.
std::vector<std::string> core_sections() {
  std::vector<std::string> out = {"model",    "data", "optim",      "train",
                                  "parallel", "log",  "checkpoint", "runtime", "plugins"};
  for (const auto& spec : role_specs()) {
    if (spec.available && !spec.section.empty() && spec.section.find('.') == std::string::npos) {
      out.push_back(spec.section);
    }
  }
  // [inference] belongs to libkolos_inference (`kolos generate`), which
  // reads and checks its keys; the training engine does not read it.
  out.push_back("inference");
  out.push_back("eval");  // read_eval_config
  return out;
}

class Reader {
 public:
  explicit Reader(std::shared_ptr<const ConfigDocument> doc) : doc_(std::move(doc)) {}

  RunConfig read() {
    RunConfig config;
    config.source = doc_->name();
    config.document = doc_;
    for (const auto& spec : role_specs()) {  // a role this version cannot run
      const ConfigSection own = section(spec.section);
      if (!spec.available && own.present() && spec.section.find('.') == std::string::npos) {
        own.fail_here("[" + spec.section + "]: the " + spec.name +
                      " role is not available in this version: the engine cannot run a " +
                      spec.name + " plugin yet; remove the section.");
      }
    }
    ConfigSection(doc_, "").check_keys(core_sections());
    for (const auto& name : core_sections()) {
      const toml::value* v = doc_->find(name);
      if (v != nullptr && !v->is_table()) {
        section(name).fail_here(name + ": expected a table (a [" + name + "] section), found " +
                                type_phrase(v->type()) + " (" + show_value(*v) + ")");
      }
    }
    read_model(config.model);
    read_data(config);
    optim_table().read(section("optim"), config.optim);
    check_optim(config.optim);
    read_train(config.train);
    read_parallel(config.parallel);
    log_table().read(section("log"), config.log);
    read_checkpoint(config.checkpoint);
    runtime_table().read(section("runtime"), config.runtime);
    read_plugins(config.plugins);
    check_roles(config);
    read_eval_config(config);  // checks [eval]
    return config;
  }

 private:
  ConfigSection section(const std::string& path) const { return ConfigSection(doc_, path); }

  void read_model(ModelConfig& m) const {
    const ConfigSection s = section("model");
    // The keys that apply depend on the model: LLaMA's own keys only to
    // "llama", GPT's mlp_ratio not to it. Refused by name first (a clearer
    // message than "unknown key"); the other models' tables read as before.
    std::string name = m.name;
    s.read("name", name);
    if (name != "mixtral") {
      for (const std::string& key : kMoeKeys) {
        if (s.has(key)) {
          s.fail(key, "applies to model.name = \"mixtral\" only, not to model.name = " +
                          quote_toml(name) + "; remove it (or set name = \"mixtral\").");
        }
      }
    }
    if (name == "llama" || name == "mixtral") {
      if (s.has("mlp_ratio")) {
        s.fail("mlp_ratio",
               "applies to model.name = \"gpt\"; the SwiGLU width of model.name = " +
                   quote_toml(name) +
                   " is model.ffn_hidden (default: 2/3 * 4 * hidden rounded up to a multiple of "
                   "256, or of hidden when hidden < 256); remove mlp_ratio.");
      }
      std::vector<std::string> valid = {"name",    "layers", "hidden",  "heads",
                                        "seq_len", "vocab",  "init_std"};
      valid.insert(valid.end(), kLlamaKeys.begin(), kLlamaKeys.end());
      if (name == "mixtral") valid.insert(valid.end(), kMoeKeys.begin(), kMoeKeys.end());
      s.check_keys(valid);
      model_table().read_rows(s, m);
    } else if (name == "vit") {
      for (const std::string& key : {"seq_len", "vocab"}) {
        if (s.has(key)) {
          s.fail(key, "does not apply to model.name = \"vit\": its sequence is the image's "
                      "patches (model.image_size, model.patch_size) and its outputs are "
                      "model.classes; remove " + std::string(key) + ".");
        }
      }
      for (const std::string& key : kLlamaKeys) {
        if (key != "norm_eps" && s.has(key)) {
          s.fail(key, "applies to model.name = \"llama\" only, not to model.name = \"vit\"; "
                      "remove it.");
        }
      }
      std::vector<std::string> valid = {"name", "layers", "hidden", "heads", "mlp_ratio",
                                        "init_std"};
      valid.insert(valid.end(), kVitKeys.begin(), kVitKeys.end());
      valid.insert(valid.end(), kVitOptionalKeys.begin(), kVitOptionalKeys.end());
      s.check_keys(valid);
      model_table().read_rows(s, m);
    } else if (name == "dit") {
      for (const std::string& key : {"seq_len", "vocab"}) {
        if (s.has(key)) {
          s.fail(key, "does not apply to model.name = \"dit\": its sequence is the image's "
                      "patches (model.image_size, model.patch_size); remove " +
                          std::string(key) + ".");
        }
      }
      for (const std::string& key : kLlamaKeys) {
        if (s.has(key)) {
          s.fail(key, "applies to model.name = \"llama\" only, not to model.name = \"dit\"; "
                      "remove it.");
        }
      }
      std::vector<std::string> valid = {"name", "layers", "hidden", "heads", "mlp_ratio",
                                        "init_std"};
      valid.insert(valid.end(), kVitKeys.begin(), kVitKeys.end());
      valid.insert(valid.end(), kDitKeys.begin(), kDitKeys.end());
      s.check_keys(valid);
      model_table().read_rows(s, m);
    } else {
      for (const std::string& key : kDitKeys) {
        if (s.has(key)) {
          s.fail(key, "applies to model.name = \"dit\" only, not to model.name = " +
                          quote_toml(name) + "; remove it (or set name = \"dit\").");
        }
      }
      for (const std::string& key : kVitKeys) {
        if (s.has(key)) {
          s.fail(key, "applies to model.name = \"vit\" only, not to model.name = " +
                          quote_toml(name) + "; remove it (or set name = \"vit\").");
        }
      }
      if (s.has("activation")) {
        s.fail("activation", "applies to model.name = \"vit\" only, not to model.name = " +
                                 quote_toml(name) +
                                 " (whose MLP uses GELU's tanh form); remove it.");
      }
      if (s.has("norm_eps")) {
        s.fail("norm_eps", "applies to model.name = \"llama\" and \"vit\", not to "
                           "model.name = " +
                               quote_toml(name) + " (whose LayerNorm eps is 1e-5); remove it.");
      }
      for (const std::string& key : kLlamaKeys) {
        if (s.has(key)) {
          s.fail(key, "applies to model.name = \"llama\" only, not to model.name = " +
                          quote_toml(name) + "; remove it (or set name = \"llama\").");
        }
      }
      model_table().read(s, m);
    }
    if (m.name.empty())
      s.fail("name", "must not be empty; name a model from modules/ (e.g. \"gpt\").");
    if (m.hidden % m.heads != 0) {
      const int64_t below = m.hidden / m.heads * m.heads;
      std::string hint = "e.g. hidden = " + std::to_string(below);
      if (below <= std::numeric_limits<int64_t>::max() - m.heads) {
        const std::string above = std::to_string(below + m.heads);
        hint = below > 0 ? hint + " or " + above : "e.g. hidden = " + above;
      }
      s.fail_at_any({"hidden", "heads"},
                    "model.hidden = " + std::to_string(m.hidden) +
                        " is not divisible by model.heads = " + std::to_string(m.heads) +
                        "; hidden must be a multiple of heads (" + hint + ").");
    }
    if (m.name == "llama" || m.name == "mixtral") read_llama(s, m);
    if (m.name == "mixtral") read_moe(s, m);
    if (m.name == "vit") read_vit(s, m);
    if (m.name == "dit") read_dit(s, m);
  }

  // The image keys of the image models (vit, dit): all required, read and
  // checked together.
  void read_image_keys(const ConfigSection& s, ModelConfig& m) const {
    for (const std::string& key : kVitKeys) {
      if (!s.has(key)) {
        s.fail_here("model." + key + ": required when model.name = \"" + m.name +
                    "\" (set image_size, patch_size, channels and classes).");
      }
    }
    vit_table().read_rows(s, m);
    if (m.image_size % m.patch_size != 0) {
      s.fail_at_any({"patch_size", "image_size"},
                    "model.image_size = " + std::to_string(m.image_size) +
                        " is not divisible by model.patch_size = " +
                        std::to_string(m.patch_size) +
                        "; images are cut into whole square patches, so patch_size must divide "
                        "image_size.");
    }
    if (m.image_size > 4096 || m.channels > 64) {
      s.fail_at_any({"image_size", "channels"},
                    "model.image_size (<= 4096) or model.channels (<= 64) is out of range.");
    }
  }

  // The keys of model.name = "dit": the image keys, its own with defaults;
  // seq_len (the pixels and the noise key, written twice: data/diffusion.cpp) and
  // vocab derived.
  void read_dit(const ConfigSection& s, ModelConfig& m) const {
    read_image_keys(s, m);
    dit_table().read_rows(s, m);
    m.seq_len = m.image_size * m.image_size * m.channels + 2;
    m.vocab = m.classes;
  }

  // The keys of model.name = "vit": the image keys, its optional ones;
  // seq_len and vocab derived.
  void read_vit(const ConfigSection& s, ModelConfig& m) const {
    read_image_keys(s, m);
    vit_optional_table().read_rows(s, m);
    m.seq_len = m.image_size * m.image_size * m.channels;
    m.vocab = m.classes;
  }

  // The keys of model.name = "mixtral" besides llama's.
  void read_moe(const ConfigSection& s, ModelConfig& m) const {
    moe_table().read_rows(s, m);
    if (m.experts < 2) {
      s.fail("experts", "model.experts = " + std::to_string(m.experts) +
                            ": a mixture needs at least 2 experts (for 1, use model.name = "
                            "\"llama\").");
    }
    if (m.top_k > m.experts) {
      s.fail_at_any({"top_k", "experts"},
                    "model.top_k = " + std::to_string(m.top_k) + " is more than model.experts = " +
                        std::to_string(m.experts) + "; each token goes to top_k distinct "
                        "experts, so use top_k <= " + std::to_string(m.experts) + ".");
    }
    if (m.moe_every > m.layers) {
      s.fail_at_any({"moe_every", "layers"},
                    "model.moe_every = " + std::to_string(m.moe_every) + " is more than "
                    "model.layers = " + std::to_string(m.layers) +
                        ": no block would have experts; use moe_every <= " +
                        std::to_string(m.layers) + ".");
    }
  }

  // The keys of model.name = "llama", checked and resolved (0 = default).
  void read_llama(const ConfigSection& s, ModelConfig& m) const {
    llama_table().read_rows(s, m);
    if (m.kv_heads == 0) m.kv_heads = m.heads;
    if (m.heads % m.kv_heads != 0) {
      std::vector<std::string> divisors;
      for (int64_t d = 1; d <= m.heads && divisors.size() < 16; ++d) {
        if (m.heads % d == 0) divisors.push_back(std::to_string(d));
      }
      s.fail_at_any({"kv_heads", "heads"},
                    "model.kv_heads = " + std::to_string(m.kv_heads) +
                        " does not divide model.heads = " + std::to_string(m.heads) +
                        "; each key/value head serves an equal group of query heads, so use "
                        "kv_heads = " +
                        join(divisors, ", ") + (divisors.size() < 16 ? "" : ", ...") +
                        " (or 0 for kv_heads = heads).");
    }
    // hidden % heads was checked above.
    const int64_t head_dim = m.hidden / m.heads;
    if (head_dim % 2 != 0) {
      s.fail_at_any({"hidden", "heads"},
                    "model.hidden / model.heads = " + std::to_string(m.hidden) + " / " +
                        std::to_string(m.heads) + " = " + std::to_string(head_dim) +
                        " is odd, but rotary position embedding (model.name = \"llama\") rotates "
                        "pairs of a head's features; use hidden = " +
                        std::to_string((head_dim + 1) * m.heads) + " (head dimension " +
                        std::to_string(head_dim + 1) +
                        ") or heads so that hidden / heads is even.");
    }
    if (m.ffn_hidden == 0) {
      m.ffn_hidden = default_ffn_hidden(m.hidden);
      if (m.ffn_hidden == 0) {
        s.fail_at_any({"hidden"}, "model.hidden = " + std::to_string(m.hidden) +
                                      " is too large for the default model.ffn_hidden; set "
                                      "ffn_hidden.");
      }
    }
  }

  void read_data(RunConfig& c) const {
    const ConfigSection s = section("data");
    DataConfig& d = c.data;
    std::vector<std::string> valid = data_table().keys();
    valid.insert(valid.end(), kImageDataKeys.begin(), kImageDataKeys.end());
    s.check_keys(valid, "");
    data_table().read_rows(s, d);
    if (d.kind != "images") {
      for (const std::string& key : kImageDataKeys) {
        if (s.has(key)) {
          s.fail(key, "applies to data.kind = \"images\" only, not to data.kind = " +
                          quote_toml(d.kind) + "; remove it.");
        }
      }
    }
    if (d.kind == "images") {
      if (s.has("dtype")) {
        s.fail("dtype", "applies to data.kind = \"tokens\"; an images file holds uint8 pixels; "
                        "remove it.");
      }
      image_data_table().read_rows(s, d);
      if (c.model.name != "vit" && c.model.name != "dit") {
        s.fail_at_any({"kind"}, "data.kind = \"images\" feeds an image classifier "
                                "(model.name = \"vit\"), not model.name = " +
                                    quote_toml(c.model.name) + ".");
      }
      if (d.path.empty()) {
        s.fail_at_any({"path", "kind"},
                      "data.path: required when data.kind = \"images\"; set it to an HDF5 file "
                      "with datasets `images` (N x H x W x C uint8) and `labels` (N) (see "
                      "scripts/digits-to-h5.py).");
      }
      return;
    }
    if (c.model.name == "dit" && d.kind == "tokens") {
      s.fail_at_any({"kind"}, "model.name = \"dit\" reads images: set data.kind = \"images\" "
                              "(or \"synthetic\" for generated labelled images), not \"tokens\".");
    }
    if (c.model.name == "vit" && d.kind == "tokens") {
      s.fail_at_any({"kind"}, "model.name = \"vit\" reads images: set data.kind = \"images\" "
                              "(or \"synthetic\" for generated labelled images), not \"tokens\".");
    }
    if (d.kind != "tokens") return;
    if (d.path.empty()) {
      s.fail_at_any({"path", "kind"},
                    "data.path: required when data.kind = \"tokens\"; set it to a file of "
                    "little-endian " +
                        d.dtype + " token ids (or use kind = \"synthetic\").");
    }
    if (d.dtype == "uint16" && c.model.vocab > kMaxUint16Vocab) {
      ConfigSection(doc_, "").fail_at_any(
          {"data.dtype", "model.vocab"},
          "data.dtype = \"uint16\" holds token ids below 65536, but model.vocab = " +
              std::to_string(c.model.vocab) + "; use dtype = \"uint32\" or vocab <= 65536.");
    }
  }

  void check_optim(const OptimConfig& o) const {
    if (o.min_lr > o.lr) {
      section("optim").fail("min_lr", format_float(o.min_lr) +
                                          " is out of range; it must be in [0, optim.lr = " +
                                          format_float(o.lr) + "].");
    }
  }

  void read_train(TrainConfig& tr) const {
    const ConfigSection s = section("train");
    std::vector<std::string> valid = train_table().keys();
    for (const auto& key : loss_scale_table().keys()) valid.push_back(key);
    s.check_keys(valid, "");
    train_table().read_rows(s, tr);
    for (const auto& key : loss_scale_table().keys()) {
      if (tr.precision != "fp16" && s.has(key)) {
        s.fail(key, "loss scaling applies to precision = \"fp16\" only (bf16 has fp32's "
                    "exponent range and needs none), but train.precision = " +
                        quote_toml(tr.precision) +
                        "; remove the key or set precision = \"fp16\".");
      }
    }
    loss_scale_table().read_rows(s, tr);
    if (tr.global_batch % tr.micro_batch != 0) {
      const int64_t below = tr.global_batch / tr.micro_batch * tr.micro_batch;
      std::string hint = std::to_string(below);
      if (below <= std::numeric_limits<int64_t>::max() - tr.micro_batch) {
        const std::string above = std::to_string(below + tr.micro_batch);
        hint = below > 0 ? hint + " or " + above : above;
      }
      s.fail_at_any(
          {"global_batch", "micro_batch"},
          "train.global_batch = " + std::to_string(tr.global_batch) +
              " is not divisible by train.micro_batch = " + std::to_string(tr.micro_batch) +
              "; use a multiple of micro_batch (e.g. " + hint + ").");
    }
  }

  // `parallel.<axis>` is a table or, as shorthand, an integer that stands for
  // its size key (`tensor = 4` is `tensor = { size = 4 }`). Reads the core's
  // keys of it; the others are the role's plugin's. Returns the key that
  // holds the size, for messages about it.
  std::string read_axis(const Axis& axis, int64_t& size, int64_t min,
                        const std::string& example) const {
    const std::string key = std::string("parallel.") + axis.key;
    const toml::value* v = doc_->find(key);
    if (v != nullptr && v->is_integer()) {
      size = v->as_integer();
    } else if (v != nullptr) {
      if (!v->is_table()) {
        section("parallel")
            .fail(axis.key, std::string("expected an integer or a table such as ") + example +
                                ", found " + type_phrase(v->type()) + " (" + show_value(*v) + ")");
      }
      section(key).read(axis.size_key, size);
    }
    const std::string size_key = v != nullptr && v->is_integer() ? key : key + "." + axis.size_key;
    if (size < min) {
      ConfigSection(doc_, "").fail(
          size_key,
          std::to_string(size) + " is out of range; it must be >= " + std::to_string(min) + ".");
    }
    return size_key;
  }

  // parallel.expert = { size = E } (or the integer E): the ep axis. Not a
  // role's section: the core reads all of it (kolos/core/experts.h).
  void read_expert(ParallelConfig& p) const {
    const toml::value* v = doc_->find("parallel.expert");
    if (v == nullptr) return;
    std::string key = "parallel.expert";
    if (v->is_integer()) {
      p.expert.size = v->as_integer();
    } else if (v->is_table()) {
      const ConfigSection expert = section("parallel.expert");
      expert.check_keys({"size"});
      expert.read("size", p.expert.size);
      key += ".size";
    } else {
      section("parallel").fail("expert", std::string("expected an integer or a table such as "
                                                     "{ size = 2 }, found ") + type_phrase(v->type()) + " (" +
                                         show_value(*v) + ")");
    }
    if (p.expert.size < 1) {
      ConfigSection(doc_, "").fail(key, std::to_string(p.expert.size) +
                                            " is out of range; it must be >= 1.");
    }
  }

  void read_parallel(ParallelConfig& p) const {
    const ConfigSection s = section("parallel");
    std::vector<std::string> axes;
    for (const auto& axis : kAxes) axes.emplace_back(axis.key);
    axes.emplace_back("expert");
    parallel_table().read(s, p, axes);
    read_axis(kAxes[0], p.tensor.size, 1, "{ size = 4, mode = \"2d\" }");
    const ConfigSection tensor = section("parallel.tensor");
    if (tensor.present()) {
      SettingsTable<TensorParallelConfig>("parallel.tensor")
          .choice("mode", &TensorParallelConfig::mode, kTensorModes, "tensor-parallel mode")
          .read_rows(tensor, p.tensor);  // the other keys are the layers plugin's
    }
    read_axis(kAxes[1], p.pipeline.size, 1, "{ size = 2, schedule = \"1f1b\" }");
    read_axis(kAxes[2], p.sequence.size, 1, "{ size = 2, mode = \"ulysses\" }");
    const ConfigSection sequence = section("parallel.sequence");
    if (sequence.present()) {
      SettingsTable<SequenceConfig>("parallel.sequence")
          .choice("mode", &SequenceConfig::mode, kSequenceModes, "sequence-parallel mode")
          .read_rows(sequence, p.sequence);  // the other keys are the sequence plugin's
    }
    const std::string stage_key =
        read_axis(kAxes[3], p.zero.stage, std::numeric_limits<int64_t>::min(), "{ stage = 2 }");
    read_expert(p);
    // MPI numbers ranks with an int: a mesh larger than that cannot launch,
    // and products past it would overflow where the mesh is resolved.
    const int64_t max_ranks = std::numeric_limits<int>::max();
    const std::pair<const char*, int64_t> axes_sizes[] = {{"parallel.pipeline", p.pipeline.size},
                                                          {"parallel.data", std::max<int64_t>(p.data, 1)},
                                                          {"parallel.sequence", p.sequence.size},
                                                          {"parallel.tensor", p.tensor.size}};
    int64_t product = 1;
    for (const auto& [key, size] : axes_sizes) {
      if (__builtin_mul_overflow(product, size, &product) || product > max_ranks) {
        ConfigSection(doc_, "").fail_at_any(
            {std::string(key) + ".size", key},
            "the mesh pipeline " + std::to_string(p.pipeline.size) + " x data " +
                std::to_string(p.data) + " x sequence " + std::to_string(p.sequence.size) +
                " x tensor " + std::to_string(p.tensor.size) + " needs more than " +
                std::to_string(max_ranks) + " ranks, the most MPI can number; use smaller sizes.");
      }
    }
    if (p.zero.stage < 0 || p.zero.stage > 3) {
      ConfigSection(doc_, "").fail(stage_key,
                                   std::to_string(p.zero.stage) +
                                       " is not a ZeRO stage; valid: 0 (off), 1 (optimizer "
                                       "states), 2 (+ gradients), 3 (+ parameters).");
    }
    if (p.allreduce == "hierarchical" && p.zero.stage >= 2) {
      s.fail("allreduce", "\"hierarchical\" is how dp and zero1 all-reduce whole gradients; "
                          "ZeRO stage " + std::to_string(p.zero.stage) +
                          " reduce-scatters them instead; remove allreduce or use stage 0 or 1.");
    }
  }

  void read_checkpoint(CheckpointConfig& c) const {
    const ConfigSection s = section("checkpoint");
    checkpoint_table().read(s, c);
    if (c.dir.empty() && (c.every > 0 || c.keep_last > 0 || c.async)) {
      s.fail_at_any({"every", "keep_last", "async"},
                    "[checkpoint] needs dir (where checkpoints go), e.g. dir = \"ckpt\".");
    }
  }

  void read_plugins(PluginsConfig& pl) const {
    const ConfigSection s = section("plugins");
    std::vector<std::string> valid = {"path"};
    for (const auto& role : role_names()) valid.push_back(role);
    s.check_keys(valid, "path and the roles");
    s.read("path", pl.path);
    for (const auto& role : role_names()) {
      std::string plugin;
      if (!s.read(role, plugin)) continue;
      if (plugin.empty())
        s.fail(role, "must name a plugin (e.g. \"tp2d\"), found an empty string.");
      pl.by_role[role] = plugin;
    }
  }

  // What model.name = "mixtral" runs under: the layouts its equivalence
  // test covers (tests/mpi/moe); the others are refused by name.
  void check_moe_roles(const RunConfig& c, const ConfigSection& root) const {
    if (c.parallel.sequence.size > 1 || c.parallel.sequence.mode == "megatron") {
      root.fail_at_any({"parallel.sequence", "parallel.sequence.mode", "model.name"},
                       "model.name = \"mixtral\" does not run under sequence parallelism yet: "
                       "its routing and load-balancing loss see a rank's tokens, which a "
                       "sequence split would change; set parallel.sequence.size = 1.");
    }
    if (c.parallel.tensor.size > 1 && c.parallel.tensor.mode != "1d") {
      root.fail_at_any({"parallel.tensor.mode", "parallel.tensor", "model.name"},
                       "parallel.tensor.mode = " + quote_toml(c.parallel.tensor.mode) +
                           ": model.name = \"mixtral\" runs under tensor mode \"1d\" only "
                           "(each expert's MLP split as a dense one); set "
                           "parallel.tensor.mode = \"1d\".");
    }
    if (c.parallel.auto_plan) {
      root.fail_at_any({"parallel.auto", "model.name"},
                       "parallel.auto: the planner does not model mixture-of-experts layers "
                       "(model.name = \"mixtral\"); set the layout yourself.");
    }
  }

  // parallel.expert.size > 1: an MoE model whose experts divide, and the
  // layouts the expert axis is checked under (docs/moe.md).
  void check_expert_axis(const RunConfig& c, const ConfigSection& root) const {
    const int64_t ep = c.parallel.expert.size;
    const std::string size = "parallel.expert.size = " + std::to_string(ep);
    if (c.model.name != "mixtral") {
      root.fail_at_any({"parallel.expert.size", "parallel.expert", "model.name"},
                       size + ": model.name = " + quote_toml(c.model.name) +
                           " has no experts to split; the expert axis needs a mixture-of-experts "
                           "model (model.name = \"mixtral\"), or remove parallel.expert.");
    }
    if (c.model.experts % ep != 0) {
      root.fail_at_any({"parallel.expert.size", "parallel.expert", "model.experts"},
                       size + " does not divide model.experts = " +
                           std::to_string(c.model.experts) +
                           ": each rank of the expert axis holds an equal share of the experts; "
                           "use a size that divides " + std::to_string(c.model.experts) + ".");
    }
  }

  // Which plugin each role gets, and the keys of a role's section that the
  // choice leaves without a reader.
  void check_roles(const RunConfig& c) const {
    const ConfigSection root(doc_, "");
    const auto& by_role = c.plugins.by_role;
    if (c.model.name == "vit" && c.parallel.sequence.size > 1) {
      root.fail_at_any({"parallel.sequence", "model.name"},
                       "parallel.sequence.size = " + std::to_string(c.parallel.sequence.size) +
                           ": model.name = \"vit\" attends bidirectionally and the sequence "
                           "strategies (ulysses, ring, megatron, hybrid) attend causally only; "
                           "set parallel.sequence.size = 1.");
    }
    if (c.model.name == "dit" && c.parallel.sequence.size > 1) {
      root.fail_at_any({"parallel.sequence", "model.name"},
                       "parallel.sequence.size = " + std::to_string(c.parallel.sequence.size) +
                           ": model.name = \"dit\" attends bidirectionally (and carries its "
                           "conditioning as one token of the sequence) while the sequence "
                           "strategies attend causally only; set parallel.sequence.size = 1.");
    }
    if (c.model.name == "mixtral") check_moe_roles(c, root);
    if (c.parallel.expert.size > 1) check_expert_axis(c, root);
    // A [plugins] override and the settings that select a plugin of the
    // same role must agree.
    const int64_t stage = c.parallel.zero.stage;
    if (stage > 0 && by_role.count("gradients") &&
        by_role.at("gradients") != "zero" + std::to_string(stage)) {
      root.fail_at_any({"plugins.gradients", "parallel.zero.stage", "parallel.zero"},
                       "parallel.zero.stage = " + std::to_string(stage) +
                           " selects the gradients plugin `zero" + std::to_string(stage) +
                           "`, but plugins.gradients names `" + by_role.at("gradients") +
                           "`; remove one of the two.");
    }
    const ConfigSection tensor = section("parallel.tensor");
    if (tensor.has("mode")) {
      const RoleChoice by_settings = choose_plugins([&] {
        RunConfig plain = c;
        plain.plugins.by_role.clear();
        return plain;
      }());
      // Under parallel.auto a mode without a size fixes the mode of the
      // plans the planner may choose (kolos/core/planner.h).
      if (c.parallel.tensor.size == 1 && !by_role.count("layers") && !c.parallel.auto_plan) {
        tensor.fail("mode", quote_toml(c.parallel.tensor.mode) +
                                " has no effect: parallel.tensor.size = 1 runs the serial layers; "
                                "remove it, or set a size > 1.");
      }
      if (by_role.count("layers") && by_role.at("layers") != by_settings.layers &&
          c.parallel.tensor.size > 1) {
        root.fail_at_any({"plugins.layers", "parallel.tensor.mode"},
                         "parallel.tensor.mode = " + quote_toml(c.parallel.tensor.mode) +
                             " selects the layers plugin `" + by_settings.layers +
                             "`, but plugins.layers names `" + by_role.at("layers") +
                             "`; remove one of the two.");
      }
    }
    const ConfigSection sequence = section("parallel.sequence");
    if (sequence.has("mode") && c.parallel.sequence.size == 1 && !by_role.count("sequence") &&
        c.parallel.sequence.mode != "megatron" && !c.parallel.auto_plan) {
      sequence.fail("mode", quote_toml(c.parallel.sequence.mode) +
                                " has no effect: parallel.sequence.size = 1 splits no sequence; "
                                "remove it, or set a size > 1.");
    }
    if (by_role.count("sequence") && sequence.has("mode") && c.parallel.sequence.size > 1 &&
        by_role.at("sequence") != c.parallel.sequence.mode) {
      root.fail_at_any({"plugins.sequence", "parallel.sequence.mode"},
                       "parallel.sequence.mode = " + quote_toml(c.parallel.sequence.mode) +
                           " selects the sequence plugin `" + c.parallel.sequence.mode +
                           "`, but plugins.sequence names `" + by_role.at("sequence") +
                           "`; remove one of the two.");
    }
    const RoleChoice choice = choose_plugins(c);
    for (const auto& spec : role_specs()) {
      const std::string& plugin = choice.of(spec.name);
      const ConfigSection own = section(spec.section);
      if (!spec.available) {
        if (by_role.count(spec.name)) {
          root.fail("plugins." + spec.name,
                    "the " + spec.name +
                        " role is not available in this version: the engine cannot run a " +
                        spec.name + " plugin yet; remove the key.");
        }
        if (!plugin.empty()) {
          root.fail_at_any({spec.section + ".size", spec.section},
                           spec.section + ".size = " + std::to_string(c.parallel.sequence.size) +
                               ": " + spec.name +
                               " parallelism is not available in this version (no " + spec.name +
                               " plugin runs yet); set size = 1.");
        }
      }
      if (plugin.empty()) {
        own.check_keys(spec.core_keys, "no " + spec.name + " plugin runs");
      }
    }
  }

  std::shared_ptr<const ConfigDocument> doc_;
};

// TOML text is UTF-8. toml11 checks that itself, but its error path for an
// invalid byte in a literal string mixes iterators of two buffers and reads
// out of bounds (found by fuzzing), so invalid bytes are refused first.
void check_utf8(const std::string& text, const std::string& name) {
  size_t line = 1, line_start = 0;
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      if (c == '\n') {
        ++line;
        line_start = i + 1;
      }
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t code = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      code = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      code = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      code = c & 0x07;
    }
    bool valid = len > 0 && i + len <= n;
    for (size_t k = 1; valid && k < len; ++k) {
      const unsigned char next = static_cast<unsigned char>(text[i + k]);
      valid = (next & 0xC0) == 0x80;
      code = (code << 6) | (next & 0x3F);
    }
    const uint32_t smallest[] = {0, 0, 0x80, 0x800, 0x10000};  // no overlong forms
    valid = valid && code >= smallest[len] && code <= 0x10FFFF && (code < 0xD800 || code > 0xDFFF);
    if (!valid) {
      char byte[8];
      std::snprintf(byte, sizeof byte, "0x%02x", c);
      throw ConfigError(name + ":" + std::to_string(line) + ":" +
                        std::to_string(i - line_start + 1) + ": a byte (" + byte +
                        ") that is not UTF-8; TOML files must be UTF-8 text");
    }
    i += len;
  }
}

// toml11 parses arrays and inline tables by recursion, so a value nested
// deeply enough (200,000 levels of `[`) overflows the stack. Nesting is
// counted before parsing, outside strings and comments; past kMaxNesting the
// text is refused with where the limit was crossed. Binary integers longer
// than toml11 can compute are refused the same way.
constexpr int kMaxNesting = 64;
constexpr size_t kMaxBinaryDigits = 62;

void check_nesting(const std::string& text, const std::string& name) {
  int depth = 0, line = 1;
  size_t line_start = 0;
  const size_t n = text.size();
  // Skips a string that starts at i (after its opening quote(s)); returns the
  // index after its closing quote(s), counting the lines it spans.
  const auto skip_string = [&](size_t i, const std::string& close, bool escapes, bool multiline) {
    while (i < n) {
      if (escapes && text[i] == '\\') {
        if (i + 1 < n && text[i + 1] == '\n') {  // a line-ending backslash
          ++line;
          line_start = i + 2;
        }
        i += 2;
        continue;
      }
      if (text.compare(i, close.size(), close) == 0) return i + close.size();
      if (text[i] == '\n') {
        if (!multiline) return i;  // unterminated: the parser reports it
        ++line;
        line_start = i + 1;
      }
      ++i;
    }
    return n;
  };
  for (size_t i = 0; i < n;) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      line_start = ++i;
    } else if (c == '#') {
      while (i < n && text[i] != '\n') ++i;
    } else if (text.compare(i, 3, "\"\"\"") == 0) {
      i = skip_string(i + 3, "\"\"\"", true, true);
    } else if (text.compare(i, 3, "'''") == 0) {
      i = skip_string(i + 3, "'''", false, true);
    } else if (c == '"') {
      i = skip_string(i + 1, "\"", true, false);
    } else if (c == '\'') {
      i = skip_string(i + 1, "'", false, false);
    } else if (c == '0' && i + 1 < n && text[i + 1] == 'b' &&
               (i == 0 || !(std::isalnum(static_cast<unsigned char>(text[i - 1])) ||
                            text[i - 1] == '_'))) {
      // toml11 computes a binary integer's place values in int64 and
      // overflows (undefined behaviour) from its 63rd digit on.
      size_t j = i + 2, digits = 0;
      for (; j < n && (text[j] == '0' || text[j] == '1' || text[j] == '_'); ++j) {
        if (text[j] != '_') ++digits;
      }
      if (digits > kMaxBinaryDigits) {
        throw ConfigError(name + ":" + std::to_string(line) + ":" +
                          std::to_string(i - line_start + 1) + ": a binary integer of " +
                          std::to_string(digits) + " digits; kolos reads at most " +
                          std::to_string(kMaxBinaryDigits) +
                          " (write larger values in decimal or hexadecimal)");
      }
      i = j;
    } else {
      if (c == '[' || c == '{') {
        if (++depth > kMaxNesting) {
          throw ConfigError(name + ":" + std::to_string(line) + ":" +
                            std::to_string(i - line_start + 1) +
                            ": arrays or inline tables nested more than " +
                            std::to_string(kMaxNesting) + " deep; kolos reads at most " +
                            std::to_string(kMaxNesting) + " levels");
        }
      } else if ((c == ']' || c == '}') && depth > 0) {
        --depth;
      }
      ++i;
    }
  }
}

// toml11 reads a decimal, octal or hexadecimal integer too large for 64 bits
// as the largest int64 and wraps a binary one, without a word: each integer
// literal is read again from its source text and refused unless it fits.
bool fits_int64(const std::string& token) {
  size_t i = 0;
  bool negative = false;
  if (i < token.size() && (token[i] == '+' || token[i] == '-')) negative = token[i++] == '-';
  uint64_t base = 10;
  if (token.size() > i + 1 && token[i] == '0' && std::isalpha(static_cast<unsigned char>(token[i + 1]))) {
    base = token[i + 1] == 'x' ? 16 : token[i + 1] == 'o' ? 8 : 2;
    i += 2;
  }
  const uint64_t limit = negative ? uint64_t{1} << 63 : (uint64_t{1} << 63) - 1;
  uint64_t value = 0;
  for (; i < token.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c == '_') continue;
    const uint64_t digit = std::isdigit(c) ? c - '0' : std::tolower(c) - 'a' + 10;
    if (value > (limit - digit) / base) return false;
    value = value * base + digit;
  }
  return true;
}

// Throws for the first integer of `v` (a parsed document or value) whose
// literal does not fit 64 bits. `where` names an override's origin; empty
// for the file `name`.
void check_integers(const toml::value& v, const std::string& name, const std::string& where) {
  if (v.is_table()) {
    for (const auto& kv : v.as_table()) check_integers(kv.second, name, where);
  } else if (v.is_array()) {
    for (const auto& item : v.as_array()) check_integers(item, name, where);
  } else if (v.is_integer()) {
    const toml::source_location loc = v.location();
    const std::string& line = loc.line_str();
    if (loc.column() == 0 || loc.column() > line.size()) return;
    const std::string token = line.substr(loc.column() - 1, loc.region());
    if (fits_int64(token)) return;
    const std::string message = "the integer " + (token.size() > 40 ? token.substr(0, 37) + "..." : token) +
                                " does not fit 64 bits; integers must be in [-9223372036854775808, "
                                "9223372036854775807].";
    if (!where.empty()) throw ConfigError(where + ": " + message);
    fail(file_origin(loc, name), message);
  }
}

// Parses the value half of an override as TOML, or takes it as a string.
toml::value parse_override_value(const std::string& text, const std::string& origin,
                                 const std::string& where) {
  const std::string short_origin = origin.size() > 80 ? origin.substr(0, 77) + "..." : origin;
  check_utf8(text, short_origin);
  check_nesting(text, short_origin);
  try {
    std::istringstream in("v = " + text);
    toml::value doc = toml::parse(in, origin);
    if (doc.is_table() && doc.as_table().size() == 1 && doc.contains("v")) {
      check_integers(doc.at("v"), origin, where);
      return doc.at("v");
    }
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception&) {
    // Not TOML (e.g. `model.name=gpt`): a bare word stands for a string.
  }
  return toml::value(text);
}

// Writes `o` into `doc`, creating tables on the way. A shorthand integer on
// the path (`tensor = 4`) becomes its table form so `parallel.tensor.mode=2d`
// can refine it.
void apply_override(toml::value& doc, const Override& o, const std::string& value_text,
                    const std::string& file) {
  std::vector<std::string> parts = split_key(o.key);
  if (parts.empty()) parts.emplace_back();  // "=value": reported below as an empty key
  const std::string where = file + ": --set " + o.text;
  for (const auto& part : parts) {
    if (part.empty()) {
      throw ConfigError(where + ": `" + o.key +
                        "` is not a valid key; write section.key=value (e.g. "
                        "parallel.tensor.size=2).");
    }
  }
  toml::value* v = &doc;
  std::string path;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    path += (i ? "." : "") + parts[i];
    toml::value& child = (*v)[parts[i]];
    if (child.is_uninitialized()) {
      child = toml::table{};
    } else if (child.is_integer() && i == 1 && parts[0] == "parallel") {
      toml::value expanded = toml::table{};
      expanded[parts[1] == "zero" ? "stage" : "size"] = child;
      child = expanded;
    } else if (!child.is_table()) {
      throw ConfigError(where + ": `" + path + "` is " + type_phrase(child.type()) + " (" +
                        show_value(child) + "), not a table, so `" + o.key + "` cannot be set.");
    }
    v = &child;
  }
  (*v)[parts.back()] = parse_override_value(value_text, "--set " + o.text, where);
}

toml::value parse_document(const std::string& text, const std::string& name) {
  check_utf8(text, name);
  check_nesting(text, name);
  std::istringstream in(text);
  toml::value doc;
  try {
    doc = toml::parse(in, name);
  } catch (const toml::exception& e) {
    const auto& loc = e.location();
    std::string where = name;
    // Only the line: toml11's column here is that of its region, not of the
    // caret its own message draws below.
    if (loc.file_name() == name) where += ":" + std::to_string(loc.line());
    throw ConfigError(where + ": malformed TOML\n" + e.what());
  } catch (const std::exception& e) {
    throw ConfigError(name + ": malformed TOML\n" + e.what());
  }
  check_integers(doc, name, "");
  return doc;
}

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

RunConfig parse_run_config(const std::string& toml_text, const std::string& name,
                           const std::vector<std::string>& overrides) {
  toml::value doc = parse_document(toml_text, name);
  std::vector<Override> parsed;
  for (const auto& text : overrides) {
    const auto eq = text.find('=');
    if (eq == std::string::npos) {
      throw ConfigError(name + ": --set " + text +
                        ": expected section.key=value (e.g. parallel.tensor.size=2 or "
                        "model.name=gpt), found no '='.");
    }
    Override o{text, text.substr(0, eq)};
    // Tolerate "key = value" as typed in a TOML file.
    while (!o.key.empty() && o.key.back() == ' ') o.key.pop_back();
    while (!o.key.empty() && o.key.front() == ' ') o.key.erase(0, 1);
    std::string value = text.substr(eq + 1);
    while (!value.empty() && value.front() == ' ') value.erase(0, 1);
    apply_override(doc, o, value, name);
    parsed.push_back(std::move(o));
  }
  return Reader(std::make_shared<const ConfigDocument>(std::move(doc), name, std::move(parsed)))
      .read();
}

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    throw ConfigError(path + ": cannot open the config file: " + std::strerror(errno));
  }
  std::string text;
  char buf[65536];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, file)) > 0) text.append(buf, n);
  const bool failed = std::ferror(file) != 0;
  const int error = errno;
  std::fclose(file);
  if (failed) {
    throw ConfigError(path + ": cannot read the config file: " + std::strerror(error));
  }
  return parse_run_config(text, path, overrides);
}

namespace {

// parallel.expert.size ranks of the data ranks form the ep axis; dp keeps
// the rest.
MeshShape split_data_over_experts(MeshShape mesh, const ParallelConfig& p,
                                  const std::string& where) {
  const int64_t ep = p.expert.size;
  if (ep <= 1) return mesh;
  if (mesh.dp % ep != 0) {
    throw ConfigError(where + ": parallel.expert.size = " + std::to_string(ep) +
                      " does not divide the " + std::to_string(mesh.dp) +
                      " data ranks (parallel.data" + (p.data == 0 ? ", derived from the world size" : "") +
                      "): the expert axis splits them; use a size that divides " +
                      std::to_string(mesh.dp) + ", or more data ranks.");
  }
  mesh.dp /= ep;
  mesh.set(expert_axis(), ep);
  return mesh;
}

}  // namespace

MeshShape resolve_mesh_shape(const RunConfig& config, int64_t world_size) {
  const ParallelConfig& p = config.parallel;
  const std::string where = config.source.empty() ? "<config>" : config.source;
  if (world_size < 1) {
    throw ConfigError(where + ": the world size must be >= 1, found " + std::to_string(world_size));
  }
  const std::pair<const char*, int64_t> sizes[] = {{"parallel.pipeline.size", p.pipeline.size},
                                                   {"parallel.sequence.size", p.sequence.size},
                                                   {"parallel.tensor.size", p.tensor.size}};
  for (const auto& [key, size] : sizes) {
    if (size < 1) {
      throw ConfigError(where + ": " + key + " = " + std::to_string(size) + " must be >= 1.");
    }
  }
  if (p.data < 0) {
    throw ConfigError(where + ": parallel.data = " + std::to_string(p.data) +
                      " must be >= 0 (0 derives it from the world size).");
  }
  MeshShape mesh;
  mesh.pp = p.pipeline.size;
  // "megatron" splits the sequence over the tensor group: no sp axis.
  mesh.sp = p.sequence.mode == "megatron" ? 1 : p.sequence.size;
  mesh.tp = p.tensor.size;
  int64_t others = 0;
  if (__builtin_mul_overflow(mesh.pp, mesh.sp, &others) ||
      __builtin_mul_overflow(others, mesh.tp, &others)) {
    throw ConfigError(where + ": the mesh does not fit " + std::to_string(world_size) +
                      (world_size == 1 ? " rank" : " ranks") + ": pipeline " +
                      std::to_string(mesh.pp) + " x sequence " + std::to_string(mesh.sp) +
                      " x tensor " + std::to_string(mesh.tp) +
                      " is more than 2^63 ranks; use smaller sizes.");
  }
  const std::string axes = "pipeline " + std::to_string(mesh.pp) + " x sequence " +
                           std::to_string(mesh.sp) + " x tensor " + std::to_string(mesh.tp);
  const std::string world = std::to_string(world_size) + (world_size == 1 ? " rank" : " ranks");
  if (p.data == 0) {
    if (world_size % others != 0) {
      const int64_t below = world_size / others * others;
      std::string launch = below > 0 ? std::to_string(below) + " or " : "";
      launch += std::to_string(below + others);
      throw ConfigError(
          where + ": the mesh does not fit " + world + ": " + axes + " = " +
          std::to_string(others) + " does not divide the world size " + std::to_string(world_size) +
          " (parallel.data = 0 derives data from it); "
          "launch a multiple of " +
          std::to_string(others) + " ranks (e.g. " + launch +
          "), or choose sizes whose product divides " + std::to_string(world_size) + ".");
    }
    mesh.dp = world_size / others;
    return split_data_over_experts(mesh, p, where);
  }
  mesh.dp = p.data;
  int64_t total = 0;
  const bool overflow = __builtin_mul_overflow(others, mesh.dp, &total);
  const std::string total_text = overflow ? "more than 2^63" : std::to_string(total);
  if (overflow || total != world_size) {
    std::string fix;
    if (world_size % others == 0) {
      fix = "set parallel.data = " + std::to_string(world_size / others) +
            " (or 0 to derive it), or launch " + total_text + " ranks";
    } else {
      fix = "launch " + total_text +
            " ranks, or change the sizes so that "
            "their product divides " +
            std::to_string(world_size);
    }
    throw ConfigError(where + ": the mesh does not fit " + world + ": pipeline " +
                      std::to_string(mesh.pp) + " x data " + std::to_string(mesh.dp) +
                      " x sequence " + std::to_string(mesh.sp) + " x tensor " +
                      std::to_string(mesh.tp) + " = " + total_text +
                      ", but the world size is " + std::to_string(world_size) + "; " + fix + ".");
  }
  return split_data_over_experts(mesh, p, where);
}

bool is_moe_block(const ModelConfig& c, int64_t block) {
  return c.name == "mixtral" && (block + 1) % c.moe_every == 0;
}

int64_t default_ffn_hidden(int64_t hidden) {
  if (hidden <= 0 || hidden > std::numeric_limits<int64_t>::max() / 8) return 0;
  const int64_t multiple = hidden < 256 ? hidden : 256;
  const int64_t width = (8 * hidden + 2) / 3;  // ceil(2/3 * 4 * hidden)
  return (width + multiple - 1) / multiple * multiple;
}

EvalConfig read_eval_config(const RunConfig& c) {
  static const auto table =
      SettingsTable<EvalConfig>("eval")
          .string("path", &EvalConfig::path)
          .integer("every", &EvalConfig::every, 0)
          .integer("samples", &EvalConfig::samples, 0);
  EvalConfig e;
  const ConfigSection s = c.section("eval");
  if (!s.present()) return e;
  e.enabled = true;
  table.read(s, e);
  if (c.data.kind == "synthetic" && s.has("path")) {
    s.fail("path", "data.kind = \"synthetic\" evaluates on held-out samples drawn from another "
                   "seed; remove eval.path (or evaluate a file with data.kind = \"tokens\" or "
                   "\"images\").");
  }
  if (c.data.kind != "synthetic" && e.path.empty()) {
    s.fail_here("eval.path: required with data.kind = " + quote_toml(c.data.kind) +
                "; set it to a held-out file of the same format as data.path.");
  }
  return e;
}

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
  if ((p.sequence.size > 1 || p.sequence.mode == "megatron") &&
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
