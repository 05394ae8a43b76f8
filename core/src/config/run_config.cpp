// TOML -> RunConfig: parse, apply `--set` overrides, read the core's
// sections through their key tables, report errors the way a compiler does
// (where, what was found, what would be valid). The parts: toml_input.cpp
// (text to document, overrides), core_tables.cpp (the sections' key tables
// and to_toml), this file (the reader and the rules across keys),
// role_checks.cpp (the roles), mesh/mesh_shape.cpp (the mesh on N ranks).
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

#include "core_tables.h"
#include "document.h"
#include "kolos/core/error.h"
#include "kolos/core/roles.h"
#include "kolos/core/sequence_modes.h"
#include "role_checks.h"
#include "toml_input.h"

namespace kolos {
namespace {

const std::vector<std::string> kTensorModes = {"1d", "2d", "2.5d", "3d"};
// parallel.sequence.mode: each a sequence plugin of that name; megatron
// splits over the tensor group, with no sp axis of its own.
const std::vector<std::string> kSequenceModes = {"ulysses", "ring", "megatron", "hybrid"};
const std::vector<std::string> kSequenceModesOverTensor = {"megatron"};
constexpr int64_t kMaxUint16Vocab = 65536;

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


  std::shared_ptr<const ConfigDocument> doc_;
};

}  // namespace

RunConfig parse_run_config(const std::string& toml_text, const std::string& name,
                           const std::vector<std::string>& overrides) {
  toml::value doc = parse_document(toml_text, name);
  std::vector<Override> parsed = apply_overrides(doc, overrides, name);
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

bool sequence_over_tensor(const std::string& mode) {
  return std::find(kSequenceModesOverTensor.begin(), kSequenceModesOverTensor.end(), mode) !=
         kSequenceModesOverTensor.end();
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

}  // namespace kolos
