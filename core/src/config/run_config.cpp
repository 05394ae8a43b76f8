// TOML -> RunConfig: parse, apply `--set` overrides, check every key, report
// errors the way a compiler does (where, what was found, what would be valid).
//
// How a config is read:
//   1. toml11 parses the text into a document; a syntax error becomes a
//      ConfigError carrying toml11's own located message.
//   2. Each override "a.b.c=value" is parsed as a TOML value (falling back to
//      a plain string) and written into the document, so overrides go through
//      exactly the same checks as the file.
//   3. A Reader walks the document section by section: unknown sections and
//      keys first (in file order), then types, then ranges and cross-key
//      rules. The first problem throws.
// Every message starts with an origin: "file:line:col" for a value that came
// from the file, "file: --set a.b=c" for one that came from an override, or
// the file alone for a default that breaks a rule.
#include "kolos/core/run_config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>
#include <utility>

#include <toml.hpp>

#include "kolos/core/error.h"

namespace kolos {
namespace {

const std::vector<std::string> kSections = {"model",    "data", "optim",      "train",
                                            "parallel", "log",  "checkpoint", "plugins"};
const std::vector<std::string> kModelKeys = {"name",    "layers", "hidden",    "heads",
                                             "seq_len", "vocab",  "mlp_ratio", "init_std"};
const std::vector<std::string> kDataKeys = {"kind", "path", "dtype"};
const std::vector<std::string> kOptimKeys = {
    "name", "lr", "min_lr", "warmup_steps", "beta1", "beta2", "eps", "weight_decay", "grad_clip",
    "fused"};
const std::vector<std::string> kTrainKeys = {"global_batch", "micro_batch", "steps", "seed",
                                             "precision"};
const std::vector<std::string> kParallelKeys = {"data", "tensor",    "pipeline", "sequence",
                                                "zero", "bucket_mb", "bucket_kb"};
const std::vector<std::string> kTensorKeys = {"size", "mode", "depth"};
const std::vector<std::string> kPipelineKeys = {"size",   "schedule", "microbatches",
                                                "chunks", "balance",  "layers_per_stage"};
const std::vector<std::string> kSequenceKeys = {"size", "mode"};
const std::vector<std::string> kZeroKeys = {"stage", "reshard_after_forward"};
const std::vector<std::string> kLogKeys = {"metrics", "every", "progress", "trace", "trace_dir"};
const std::vector<std::string> kCheckpointKeys = {"dir", "every", "keep_last", "async"};
// The roles of kolos::kRoles (kolos/core/plugin.h); repeated here so that config stays
// independent of the plugin interface.
const std::vector<std::string> kPluginRoles = {"layers",    "sequence", "pipeline",
                                               "gradients", "memory",   "planner"};

const std::vector<std::string> kDataKinds = {"synthetic", "tokens"};
const std::vector<std::string> kTokenDtypes = {"uint16", "uint32"};
// Kept to what the engine implements, so a config that parses can run.
const std::vector<std::string> kOptimizers = {"adamw"};
const std::vector<std::string> kPrecisions = {"fp32", "bf16", "fp16"};
const std::vector<std::string> kTensorModes = {"1d", "2d", "2.5d", "3d"};
const std::vector<std::string> kPipelineSchedules = {"gpipe", "1f1b", "interleaved", "zb"};
const std::vector<std::string> kPipelineBalance = {"params", "time"};
const std::vector<std::string> kSequenceModes = {"ulysses", "ring", "megatron"};
const std::vector<std::string> kProgressModes = {"auto", "bar", "lines", "off"};

constexpr int64_t kMaxUint16Vocab = 65536;

std::string join(const std::vector<std::string>& items, const std::string& sep,
                 bool quote = false) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += sep;
    out += quote ? "\"" + items[i] + "\"" : items[i];
  }
  return out;
}

bool contains(const std::vector<std::string>& items, const std::string& item) {
  return std::find(items.begin(), items.end(), item) != items.end();
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(key);
  while (std::getline(in, part, '.')) parts.push_back(part);
  if (!key.empty() && key.back() == '.') parts.emplace_back();
  return parts;
}

std::string last_part(const std::string& key) {
  const auto dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

std::string parent_key(const std::string& key) {
  const auto dot = key.rfind('.');
  return dot == std::string::npos ? std::string() : key.substr(0, dot);
}

// TOML basic string with the escapes the spec requires.
std::string quote_toml(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c) & 0xffu);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// Shortest decimal form that reads back as the same double, always a TOML
// float (has '.', 'e', or is inf/nan).
std::string format_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  std::string out = buf;
  if (out.find_first_of(".e") == std::string::npos) out += ".0";
  return out;
}

const char* type_phrase(toml::value_t type) {
  switch (type) {
    case toml::value_t::boolean:
      return "a boolean";
    case toml::value_t::integer:
      return "an integer";
    case toml::value_t::floating:
      return "a float";
    case toml::value_t::string:
      return "a string";
    case toml::value_t::offset_datetime:
    case toml::value_t::local_datetime:
      return "a date-time";
    case toml::value_t::local_date:
      return "a date";
    case toml::value_t::local_time:
      return "a time";
    case toml::value_t::array:
      return "an array";
    case toml::value_t::table:
      return "a table";
    default:
      return "nothing";
  }
}

// The value as the user wrote it, short, for "found ..." phrases.
std::string show_value(const toml::value& v) {
  switch (v.type()) {
    case toml::value_t::string:
      return quote_toml(v.as_string().str);
    case toml::value_t::integer:
      return std::to_string(v.as_integer());
    case toml::value_t::floating:
      return format_float(v.as_floating());
    case toml::value_t::boolean:
      return v.as_boolean() ? "true" : "false";
    default: {
      std::ostringstream out;
      out << v;
      std::string s = out.str();
      s.erase(std::remove(s.begin(), s.end(), '\n'), s.end());
      if (s.size() > 40) s = s.substr(0, 37) + "...";
      return s;
    }
  }
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates,
                         bool quote) {
  const std::string match = closest_match(word, candidates);
  if (match.empty()) return "";
  return quote ? " Did you mean \"" + match + "\"?" : " Did you mean `" + match + "`?";
}

struct Override {
  std::string text;  // as given, for messages: "parallel.tensor.size=2"
  std::string key;   // "parallel.tensor.size"
};

// Where a problem is: "file:line:col" plus the source line with a caret, or
// "file: --set key=value" for overrides, or just the file.
struct Origin {
  std::string where;
  std::string snippet;
};

[[noreturn]] void fail(const Origin& origin, const std::string& message) {
  throw ConfigError(origin.where + ": " + message + origin.snippet);
}

Origin file_origin(const toml::source_location& loc, const std::string& name,
                   const std::string& key_word) {
  size_t column = loc.column();
  size_t width = std::max<size_t>(1, loc.region());
  const std::string& line = loc.line_str();
  if (!key_word.empty()) {
    // toml11 records where values are, not keys: find the key on its line
    // (at the line start, or after '{' / ',' inside an inline table).
    size_t pos = 0;
    while ((pos = line.find(key_word, pos)) != std::string::npos) {
      size_t before = pos;
      while (before > 0 && (line[before - 1] == ' ' || line[before - 1] == '\t')) --before;
      size_t after = pos + key_word.size();
      while (after < line.size() && (line[after] == ' ' || line[after] == '\t')) ++after;
      const bool key_start = before == 0 || line[before - 1] == '{' || line[before - 1] == ',';
      if (key_start && after < line.size() && (line[after] == '=' || line[after] == '.')) {
        column = pos + 1;
        width = key_word.size();
        break;
      }
      pos += 1;
    }
  }
  Origin origin;
  origin.where = name + ":" + std::to_string(loc.line()) + ":" + std::to_string(column);
  const std::string number = std::to_string(loc.line());
  const std::string gutter(number.size() + 1, ' ');
  width = std::min(width, line.size() >= column ? line.size() - column + 1 : size_t{1});
  origin.snippet = "\n " + number + " | " + line + "\n" + gutter + " | " +
                   std::string(column > 0 ? column - 1 : 0, ' ') + "^" +
                   std::string(width > 1 ? width - 1 : 0, '~');
  return origin;
}

// floor(n^(1/k)), exact for the small integers a mesh has.
int64_t int_root(int64_t n, int k) {
  int64_t r = static_cast<int64_t>(std::llround(std::pow(static_cast<double>(n), 1.0 / k)));
  const auto power = [k](int64_t x) {
    int64_t p = 1;
    for (int i = 0; i < k; ++i) p *= x;
    return p;
  };
  while (r > 0 && power(r) > n) --r;
  while (power(r + 1) <= n) ++r;
  return r;
}

// "" when the tensor-parallel size fits the mode's process grid, else a
// message naming the nearest valid sizes. Used by parsing and by
// resolve_mesh_shape() (for configs built in code).
std::string tensor_shape_problem(const TensorParallelConfig& tp) {
  if (tp.size < 1) return "";
  const auto nearest = [&](int k, int64_t factor, const std::string& form) {
    const int64_t q = int_root(tp.size / factor, k);
    const auto grid = [&](int64_t x) {
      int64_t p = factor;
      for (int i = 0; i < k; ++i) p *= x;
      return p;
    };
    if (tp.size % factor == 0 && grid(q) == tp.size) return std::string();
    std::string msg = "parallel.tensor.size = " + std::to_string(tp.size) + " does not fit mode " +
                      quote_toml(tp.mode) + ", which needs size = " + form +
                      "; nearest valid sizes: ";
    const int64_t below = q >= 1 ? grid(q) : 0;
    const int64_t above = grid(q + 1);
    msg += below >= 1 && below != tp.size ? std::to_string(below) + " or " + std::to_string(above)
                                          : std::to_string(above);
    return msg;
  };
  if (tp.mode == "2d" || tp.mode == "3d") {
    const bool square = tp.mode == "2d";
    const std::string msg = square ? nearest(2, 1, "q*q (1, 4, 9, 16, ...)")
                                   : nearest(3, 1, "q*q*q (1, 8, 27, 64, ...)");
    return msg.empty() ? msg : msg + ".";
  }
  if (tp.mode == "2.5d") {
    const std::string form = "q*q*depth with depth = " + std::to_string(tp.depth);
    std::string msg = nearest(2, std::max<int64_t>(tp.depth, 1), form);
    if (msg.empty()) return msg;
    std::vector<std::string> depths;
    for (int64_t d = 1; d <= tp.size; ++d) {
      if (tp.size % d == 0) {
        const int64_t q = int_root(tp.size / d, 2);
        if (q * q == tp.size / d) depths.push_back(std::to_string(d));
      }
    }
    msg += " (or keep size " + std::to_string(tp.size) + " with depth = " + join(depths, " or ") +
           ").";
    return msg;
  }
  return "";
}

// Reads a validated RunConfig out of a parsed (and overridden) document.
class Reader {
 public:
  Reader(const toml::value& doc, std::string name, std::vector<Override> overrides)
      : doc_(doc), name_(std::move(name)), overrides_(std::move(overrides)) {}

  RunConfig read() {
    RunConfig config;
    config.source = name_;
    check_keys("", doc_, kSections, "section", "sections");
    read_model(config.model);
    read_data(config);
    read_optim(config.optim);
    read_train(config.train);
    read_parallel(config.parallel);
    read_log(config.log);
    read_checkpoint(config.checkpoint);
    read_plugins(config.plugins);
    check_zero(config);
    return config;
  }

 private:
  const toml::value* find(const std::string& key) const {
    const toml::value* v = &doc_;
    for (const auto& part : split_key(key)) {
      if (!v->is_table()) return nullptr;
      const auto& table = v->as_table();
      const auto it = table.find(part);
      if (it == table.end()) return nullptr;
      v = &it->second;
    }
    return v;
  }

  const Override* override_for(const std::string& key) const {
    for (auto it = overrides_.rbegin(); it != overrides_.rend(); ++it) {
      if (it->key == key || starts_with(key, it->key + ".") || starts_with(it->key, key + ".")) {
        return &*it;
      }
    }
    return nullptr;
  }

  bool from_file(const toml::value& v) const { return v.location().file_name() == name_; }

  // The origin of `key`: its value if present (the key itself when
  // `at_key`), else the closest enclosing section that is present.
  Origin origin_of(const std::string& key, bool at_key = false) const {
    for (std::string k = key; !k.empty(); k = parent_key(k), at_key = false) {
      const toml::value* v = find(k);
      if (v == nullptr) continue;
      if (from_file(*v)) return file_origin(v->location(), name_, at_key ? last_part(k) : "");
      if (const Override* o = override_for(k)) return Origin{name_ + ": --set " + o->text, ""};
    }
    return Origin{name_, ""};
  }

  // The origin of the first of `keys` that is present (for rules that
  // involve several keys, e.g. hidden % heads).
  Origin origin_of_any(const std::vector<std::string>& keys) const {
    for (const auto& key : keys) {
      if (find(key) != nullptr) return origin_of(key);
    }
    return origin_of(keys.front());
  }

  [[noreturn]] void fail_at(const std::string& key, const std::string& message) const {
    fail(origin_of(key), key + ": " + message);
  }

  // Unknown keys of `table` (at `prefix`), reported in file order.
  void check_keys(const std::string& prefix, const toml::value& table,
                  const std::vector<std::string>& valid, const char* noun,
                  const char* plural) const {
    std::vector<std::pair<std::string, const toml::value*>> unknown;
    for (const auto& kv : table.as_table()) {
      if (!contains(valid, kv.first)) unknown.emplace_back(kv.first, &kv.second);
    }
    if (unknown.empty()) return;
    const auto rank = [this](const toml::value* v) {
      return from_file(*v) ? v->location().line() : std::numeric_limits<uint32_t>::max();
    };
    const auto first = std::min_element(
        unknown.begin(), unknown.end(),
        [&](const auto& a, const auto& b) { return rank(a.second) < rank(b.second); });
    const std::string full = prefix.empty() ? first->first : prefix + "." + first->first;
    std::string message = "unknown " + std::string(noun) + " `" + full + "`; valid " + plural;
    message += prefix.empty() ? ": " : " in [" + prefix + "]: ";
    message += join(valid, ", ") + "." + did_you_mean(first->first, valid, false);
    fail(origin_of(full, /*at_key=*/true), message);
  }

  [[noreturn]] void fail_type(const std::string& key, const toml::value& v,
                              const std::string& expected) const {
    fail_at(key, "expected " + expected + ", found " + type_phrase(v.type()) + " (" +
                     show_value(v) + ")");
  }

  // The table at `key`, or nullptr when absent.
  const toml::value* table_at(const std::string& key) const {
    const toml::value* v = find(key);
    if (v != nullptr && !v->is_table()) {
      fail_type(key, *v, "a table (a [" + key + "] section)");
    }
    return v;
  }

  void read_int(const std::string& key, int64_t& out) const {
    const toml::value* v = find(key);
    if (v == nullptr) return;
    if (!v->is_integer()) fail_type(key, *v, "an integer");
    out = v->as_integer();
  }

  void read_float(const std::string& key, double& out) const {
    const toml::value* v = find(key);
    if (v == nullptr) return;
    if (v->is_integer()) {
      out = static_cast<double>(v->as_integer());
    } else if (v->is_floating()) {
      out = v->as_floating();
    } else {
      fail_type(key, *v, "a number");
    }
  }

  void read_string(const std::string& key, std::string& out) const {
    const toml::value* v = find(key);
    if (v == nullptr) return;
    if (!v->is_string()) fail_type(key, *v, "a string");
    out = v->as_string().str;
  }

  void read_choice(const std::string& key, std::string& out, const std::vector<std::string>& valid,
                   const char* what) const {
    read_string(key, out);
    if (contains(valid, out)) return;
    fail_at(key, quote_toml(out) + " is not a valid " + what +
                     "; valid: " + join(valid, ", ", true) + "." + did_you_mean(out, valid, true));
  }

  void require(bool ok, const std::string& key, const std::string& message) const {
    if (!ok) fail_at(key, message);
  }

  void require_at_least(const std::string& key, int64_t value, int64_t min) const {
    require(value >= min, key,
            std::to_string(value) + " is out of range; it must be >= " + std::to_string(min) + ".");
  }

  void read_model(ModelConfig& m) const {
    const toml::value* t = table_at("model");
    if (t == nullptr) return;
    check_keys("model", *t, kModelKeys, "key", "keys");
    read_string("model.name", m.name);
    read_int("model.layers", m.layers);
    read_int("model.hidden", m.hidden);
    read_int("model.heads", m.heads);
    read_int("model.seq_len", m.seq_len);
    read_int("model.vocab", m.vocab);
    read_int("model.mlp_ratio", m.mlp_ratio);
    read_float("model.init_std", m.init_std);
    require(!m.name.empty(), "model.name",
            "must not be empty; name a model from modules/ (e.g. \"gpt\").");
    require_at_least("model.layers", m.layers, 1);
    require_at_least("model.hidden", m.hidden, 1);
    require_at_least("model.heads", m.heads, 1);
    if (m.hidden % m.heads != 0) {
      const int64_t below = m.hidden / m.heads * m.heads;
      std::string hint = "e.g. hidden = " + std::to_string(below + m.heads);
      if (below > 0)
        hint = "e.g. hidden = " + std::to_string(below) + " or " + std::to_string(below + m.heads);
      fail(origin_of_any({"model.hidden", "model.heads"}),
           "model.hidden = " + std::to_string(m.hidden) + " is not divisible by model.heads = " +
               std::to_string(m.heads) + "; hidden must be a multiple of heads (" + hint + ").");
    }
    require_at_least("model.seq_len", m.seq_len, 1);
    require_at_least("model.vocab", m.vocab, 2);
    require_at_least("model.mlp_ratio", m.mlp_ratio, 1);
    require(m.init_std > 0 && std::isfinite(m.init_std), "model.init_std",
            format_float(m.init_std) + " is out of range; it must be > 0.");
  }

  void read_data(RunConfig& c) const {
    DataConfig& d = c.data;
    const toml::value* t = table_at("data");
    if (t == nullptr) return;
    check_keys("data", *t, kDataKeys, "key", "keys");
    read_choice("data.kind", d.kind, kDataKinds, "data kind");
    read_string("data.path", d.path);
    read_choice("data.dtype", d.dtype, kTokenDtypes, "token dtype");
    if (d.kind != "tokens") return;
    if (d.path.empty()) {
      fail(origin_of_any({"data.path", "data.kind"}),
           "data.path: required when data.kind = \"tokens\"; set it to a file of little-endian " +
               d.dtype + " token ids (or use kind = \"synthetic\").");
    }
    if (d.dtype == "uint16" && c.model.vocab > kMaxUint16Vocab) {
      fail(origin_of_any({"data.dtype", "model.vocab"}),
           "data.dtype = \"uint16\" holds token ids below 65536, but model.vocab = " +
               std::to_string(c.model.vocab) + "; use dtype = \"uint32\" or vocab <= 65536.");
    }
  }

  void read_optim(OptimConfig& o) const {
    const toml::value* t = table_at("optim");
    if (t == nullptr) return;
    check_keys("optim", *t, kOptimKeys, "key", "keys");
    read_choice("optim.name", o.name, kOptimizers, "optimizer");
    read_float("optim.lr", o.lr);
    read_float("optim.min_lr", o.min_lr);
    read_int("optim.warmup_steps", o.warmup_steps);
    read_float("optim.beta1", o.beta1);
    read_float("optim.beta2", o.beta2);
    read_float("optim.eps", o.eps);
    read_float("optim.weight_decay", o.weight_decay);
    read_float("optim.grad_clip", o.grad_clip);
    if (const toml::value* v = find("optim.fused")) {
      if (!v->is_boolean()) fail_type("optim.fused", *v, "true or false");
      o.fused = v->as_boolean();
    }
    require(o.lr > 0 && std::isfinite(o.lr), "optim.lr",
            format_float(o.lr) + " is out of range; it must be > 0.");
    require(o.min_lr >= 0 && o.min_lr <= o.lr, "optim.min_lr",
            format_float(o.min_lr) +
                " is out of range; it must be in [0, optim.lr = " + format_float(o.lr) + "].");
    require_at_least("optim.warmup_steps", o.warmup_steps, 0);
    for (const auto& [key, beta] : {std::pair<const char*, double>{"optim.beta1", o.beta1},
                                    std::pair<const char*, double>{"optim.beta2", o.beta2}}) {
      require(beta >= 0 && beta < 1, key,
              format_float(beta) + " is out of range; it must satisfy 0 <= beta < 1.");
    }
    require(o.eps > 0, "optim.eps", format_float(o.eps) + " is out of range; it must be > 0.");
    require(o.weight_decay >= 0, "optim.weight_decay",
            format_float(o.weight_decay) + " is out of range; it must be >= 0.");
    require(o.grad_clip >= 0, "optim.grad_clip",
            format_float(o.grad_clip) + " is out of range; it must be >= 0 (0 disables clipping).");
  }

  void read_train(TrainConfig& tr) const {
    const toml::value* t = table_at("train");
    if (t == nullptr) return;
    check_keys("train", *t, kTrainKeys, "key", "keys");
    read_int("train.global_batch", tr.global_batch);
    read_int("train.micro_batch", tr.micro_batch);
    read_int("train.steps", tr.steps);
    int64_t seed = static_cast<int64_t>(tr.seed);
    read_int("train.seed", seed);
    require_at_least("train.seed", seed, 0);
    tr.seed = static_cast<uint64_t>(seed);
    read_choice("train.precision", tr.precision, kPrecisions, "precision");
    require_at_least("train.micro_batch", tr.micro_batch, 1);
    require_at_least("train.global_batch", tr.global_batch, 1);
    if (tr.global_batch % tr.micro_batch != 0) {
      const int64_t below = tr.global_batch / tr.micro_batch * tr.micro_batch;
      std::string hint = std::to_string(below + tr.micro_batch);
      if (below > 0) hint = std::to_string(below) + " or " + hint;
      fail(origin_of_any({"train.global_batch", "train.micro_batch"}),
           "train.global_batch = " + std::to_string(tr.global_batch) +
               " is not divisible by train.micro_batch = " + std::to_string(tr.micro_batch) +
               "; use a multiple of micro_batch (e.g. " + hint + ").");
    }
    require_at_least("train.steps", tr.steps, 1);
  }

  // `parallel.<axis>` is a table or, as shorthand, an integer that stands for
  // its `size_key` (`tensor = 4` is `tensor = { size = 4 }`). Reads the size
  // and returns the key that holds it, for messages about it.
  std::string read_axis(const std::string& key, const std::vector<std::string>& keys,
                        const std::string& size_key, int64_t& size,
                        const std::string& example) const {
    const toml::value* v = find(key);
    if (v != nullptr && v->is_integer()) {
      size = v->as_integer();
      return key;
    }
    if (v != nullptr) {
      if (!v->is_table()) fail_type(key, *v, "an integer or a table such as " + example);
      check_keys(key, *v, keys, "key", "keys");
    }
    read_int(key + "." + size_key, size);
    return key + "." + size_key;
  }

  void read_parallel(ParallelConfig& p) const {
    const toml::value* t = table_at("parallel");
    if (t == nullptr) return;
    check_keys("parallel", *t, kParallelKeys, "key", "keys");
    read_int("parallel.data", p.data);
    require_at_least("parallel.data", p.data, 0);

    // Sub-keys of a shorthand axis are absent, so these reads keep defaults.
    TensorParallelConfig& tp = p.tensor;
    const std::string tp_key =
        read_axis("parallel.tensor", kTensorKeys, "size", tp.size, "{ size = 4, mode = \"2d\" }");
    read_choice("parallel.tensor.mode", tp.mode, kTensorModes, "tensor-parallel mode");
    read_int("parallel.tensor.depth", tp.depth);
    require_at_least(tp_key, tp.size, 1);
    require_at_least("parallel.tensor.depth", tp.depth, 1);
    if (tp.depth != 1 && tp.mode != "2.5d") {
      fail_at("parallel.tensor.depth", "depth = " + std::to_string(tp.depth) +
                                           " only applies to mode = \"2.5d\" (mode is " +
                                           quote_toml(tp.mode) + "); remove it or set depth = 1.");
    }
    const std::string shape = tensor_shape_problem(tp);
    if (!shape.empty()) fail(origin_of(tp_key), shape);

    PipelineConfig& pp = p.pipeline;
    const std::string pp_key = read_axis("parallel.pipeline", kPipelineKeys, "size", pp.size,
                                         "{ size = 2, schedule = \"1f1b\" }");
    read_choice("parallel.pipeline.schedule", pp.schedule, kPipelineSchedules, "pipeline schedule");
    read_int("parallel.pipeline.microbatches", pp.microbatches);
    read_int("parallel.pipeline.chunks", pp.chunks);
    require_at_least(pp_key, pp.size, 1);
    require_at_least("parallel.pipeline.microbatches", pp.microbatches, 0);
    require_at_least("parallel.pipeline.chunks", pp.chunks, 1);
    read_choice("parallel.pipeline.balance", pp.balance, kPipelineBalance, "stage balance");
    if (pp.chunks > 1 && pp.schedule != "interleaved") {
      fail(origin_of_any({"parallel.pipeline.chunks", "parallel.pipeline.schedule"}),
           "parallel.pipeline.chunks = " + std::to_string(pp.chunks) +
               " only applies to schedule = \"interleaved\", but the schedule is " +
               quote_toml(pp.schedule) + "; set chunks = 1 or schedule = \"interleaved\".");
    }
    if (const toml::value* v = find("parallel.pipeline.layers_per_stage")) {
      const std::string key = "parallel.pipeline.layers_per_stage";
      if (!v->is_array()) fail_type(key, *v, "an array of block counts (e.g. [3, 2])");
      for (const auto& item : v->as_array()) {
        if (!item.is_integer() || item.as_integer() < 1) {
          fail_at(key, "expected an array of integers >= 1 (blocks per stage), found an element " +
                           show_value(item));
        }
        pp.layers_per_stage.push_back(item.as_integer());
      }
      if (find("parallel.pipeline.balance") != nullptr) {
        fail_at(key, "an explicit cut and parallel.pipeline.balance = " + quote_toml(pp.balance) +
                         " are both set; remove one of the two.");
      }
      const int64_t stages = pp.size * (pp.schedule == "interleaved" ? pp.chunks : 1);
      if (static_cast<int64_t>(pp.layers_per_stage.size()) != stages) {
        fail_at(key, "has " + std::to_string(pp.layers_per_stage.size()) +
                         " entries, but the pipeline has " + std::to_string(stages) +
                         (stages == pp.size ? " stages (size = " + std::to_string(pp.size) + ")"
                                            : " virtual stages (size " + std::to_string(pp.size) +
                                                  " x chunks " + std::to_string(pp.chunks) + ")") +
                         "; give one block count per stage.");
      }
    }

    SequenceConfig& sp = p.sequence;
    const std::string sp_key = read_axis("parallel.sequence", kSequenceKeys, "size", sp.size,
                                         "{ size = 2, mode = \"ulysses\" }");
    read_choice("parallel.sequence.mode", sp.mode, kSequenceModes, "sequence-parallel mode");
    require_at_least(sp_key, sp.size, 1);

    const std::string stage_key =
        read_axis("parallel.zero", kZeroKeys, "stage", p.zero.stage, "{ stage = 2 }");
    require(p.zero.stage >= 0 && p.zero.stage <= 3, stage_key,
            std::to_string(p.zero.stage) +
                " is not a ZeRO stage; valid: 0 (off), 1 (optimizer states), 2 (+ gradients), "
                "3 (+ parameters).");
    if (const toml::value* v = find("parallel.zero.reshard_after_forward")) {
      if (!v->is_boolean()) fail_type("parallel.zero.reshard_after_forward", *v, "true or false");
      p.zero.reshard_after_forward = v->as_boolean();
    }

    read_int("parallel.bucket_mb", p.bucket_mb);
    read_int("parallel.bucket_kb", p.bucket_kb);
    require_at_least("parallel.bucket_mb", p.bucket_mb, 1);
    require_at_least("parallel.bucket_kb", p.bucket_kb, 0);
  }

  void read_log(LogConfig& l) const {
    const toml::value* t = table_at("log");
    if (t == nullptr) return;
    check_keys("log", *t, kLogKeys, "key", "keys");
    read_string("log.metrics", l.metrics);
    read_int("log.every", l.every);
    require_at_least("log.every", l.every, 1);
    read_choice("log.progress", l.progress, kProgressModes, "progress mode");
    if (const toml::value* v = find("log.trace")) {
      if (!v->is_boolean()) fail_type("log.trace", *v, "true or false");
      l.trace = v->as_boolean();
    }
    read_string("log.trace_dir", l.trace_dir);
  }

  // ZeRO options that only make sense together: the stage and a
  // [plugins] gradients override must name the same plugin, and
  // reshard_after_forward is a ZeRO-3 option.
  void check_zero(const RunConfig& c) const {
    const auto& by_role = c.plugins.by_role;
    const int64_t stage = c.parallel.zero.stage;
    const std::string chosen = by_role.count("gradients") ? by_role.at("gradients")
                               : stage > 0               ? "zero" + std::to_string(stage)
                                                         : "dp";
    if (stage > 0 && chosen != "zero" + std::to_string(stage)) {
      fail(origin_of_any({"plugins.gradients", "parallel.zero.stage", "parallel.zero"}),
           "parallel.zero.stage = " + std::to_string(stage) + " selects the gradients plugin `zero" +
               std::to_string(stage) + "`, but plugins.gradients names `" + chosen +
               "`; remove one of the two.");
    }
    if (find("parallel.zero.reshard_after_forward") != nullptr && chosen != "zero3") {
      fail_at("parallel.zero.reshard_after_forward",
              "only applies to ZeRO stage 3 (parameters sharded at rest), but the gradients "
              "plugin is `" + chosen + "`; set parallel.zero.stage = 3 or remove the key.");
    }
  }

  void read_checkpoint(CheckpointConfig& c) const {
    const toml::value* t = table_at("checkpoint");
    if (t == nullptr) return;
    check_keys("checkpoint", *t, kCheckpointKeys, "key", "keys");
    read_string("checkpoint.dir", c.dir);
    read_int("checkpoint.every", c.every);
    read_int("checkpoint.keep_last", c.keep_last);
    if (const toml::value* v = find("checkpoint.async")) {
      if (!v->is_boolean()) fail_type("checkpoint.async", *v, "true or false");
      c.async = v->as_boolean();
    }
    require_at_least("checkpoint.every", c.every, 0);
    require_at_least("checkpoint.keep_last", c.keep_last, 0);
    if (c.dir.empty() && (c.every > 0 || c.keep_last > 0 || c.async)) {
      fail(origin_of_any({"checkpoint.every", "checkpoint.keep_last", "checkpoint.async"}),
           "[checkpoint] needs dir (where checkpoints go), e.g. dir = \"ckpt\".");
    }
  }

  void read_plugins(PluginsConfig& pl) const {
    const toml::value* t = table_at("plugins");
    if (t == nullptr) return;
    std::vector<std::string> valid = {"path"};
    valid.insert(valid.end(), kPluginRoles.begin(), kPluginRoles.end());
    check_keys("plugins", *t, valid, "role", "keys (path and the roles)");
    if (const toml::value* path = find("plugins.path")) {
      if (!path->is_array()) fail_type("plugins.path", *path, "an array of strings");
      for (const auto& item : path->as_array()) {
        if (!item.is_string()) {
          fail_at("plugins.path", "expected an array of strings, found an element that is " +
                                      std::string(type_phrase(item.type())) + " (" +
                                      show_value(item) + ")");
        }
        pl.path.push_back(item.as_string().str);
      }
    }
    for (const auto& role : kPluginRoles) {
      std::string plugin;
      const std::string key = "plugins." + role;
      if (find(key) == nullptr) continue;
      read_string(key, plugin);
      require(!plugin.empty(), key, "must name a plugin (e.g. \"tp2d\"), found an empty string.");
      pl.by_role[role] = plugin;
    }
  }

 private:
  const toml::value& doc_;
  std::string name_;
  std::vector<Override> overrides_;
};

// Parses the value half of an override as TOML, or takes it as a string.
toml::value parse_override_value(const std::string& text, const std::string& origin) {
  try {
    std::istringstream in("v = " + text);
    toml::value doc = toml::parse(in, origin);
    if (doc.is_table() && doc.as_table().size() == 1 && doc.contains("v")) return doc.at("v");
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
  (*v)[parts.back()] = parse_override_value(value_text, "--set " + o.text);
}

toml::value parse_document(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  try {
    return toml::parse(in, name);
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
}

}  // namespace

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  // Optimal-string-alignment distance (Levenshtein plus adjacent swaps),
  // case-insensitive. Allowed distance grows with the word: 1 up to 5
  // letters, 2 up to 8, then a third of the length. A tie between different
  // candidates is ambiguous and suggests nothing.
  const auto lower = [](std::string s) {
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  const std::string a = lower(word);
  const size_t max_distance = std::max<size_t>(1, a.size() / 3);
  size_t best = std::numeric_limits<size_t>::max();
  std::string match;
  bool tie = false;
  for (const auto& candidate : candidates) {
    const std::string b = lower(candidate);
    std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
    for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
    for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      for (size_t j = 1; j <= b.size(); ++j) {
        const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
        d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
        if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
          d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
      }
    }
    const size_t distance = d[a.size()][b.size()];
    // A one-letter word "matches" every one-letter candidate; require that
    // something of the word survives.
    if (distance > max_distance || distance >= std::max(a.size(), b.size())) continue;
    if (distance < best) {
      best = distance;
      match = candidate;
      tie = false;
    } else if (distance == best && lower(match) != b) {
      tie = true;
    }
  }
  return tie ? std::string() : match;
}

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
  return Reader(doc, name, std::move(parsed)).read();
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
  const std::string shape = tensor_shape_problem(p.tensor);
  if (!shape.empty()) throw ConfigError(where + ": " + shape);

  MeshShape mesh;
  mesh.pp = p.pipeline.size;
  mesh.sp = p.sequence.size;
  mesh.tp = p.tensor.size;
  const int64_t others = mesh.pp * mesh.sp * mesh.tp;
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
    return mesh;
  }
  mesh.dp = p.data;
  if (mesh.size() != world_size) {
    std::string fix;
    if (world_size % others == 0) {
      fix = "set parallel.data = " + std::to_string(world_size / others) +
            " (or 0 to derive it), or launch " + std::to_string(mesh.size()) + " ranks";
    } else {
      fix = "launch " + std::to_string(mesh.size()) +
            " ranks, or change the sizes so that "
            "their product divides " +
            std::to_string(world_size);
    }
    throw ConfigError(where + ": the mesh does not fit " + world + ": pipeline " +
                      std::to_string(mesh.pp) + " x data " + std::to_string(mesh.dp) +
                      " x sequence " + std::to_string(mesh.sp) + " x tensor " +
                      std::to_string(mesh.tp) + " = " + std::to_string(mesh.size()) +
                      ", but the world size is " + std::to_string(world_size) + "; " + fix + ".");
  }
  return mesh;
}

namespace {
// `balance = ...` or, when the cut is explicit, `layers_per_stage = [...]`
// (the two exclude each other).
std::string pipeline_cut(const PipelineConfig& pp) {
  if (pp.layers_per_stage.empty()) return ", balance = " + quote_toml(pp.balance);
  std::string out = ", layers_per_stage = [";
  for (size_t i = 0; i < pp.layers_per_stage.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(pp.layers_per_stage[i]);
  }
  return out + "]";
}
}  // namespace

std::string to_toml(const RunConfig& c) {
  std::ostringstream out;
  const auto str = [](const std::string& s) { return quote_toml(s); };
  out << "# effective configuration";
  if (!c.source.empty()) {
    std::string source = c.source;  // a comment ends at a newline
    std::replace(source.begin(), source.end(), '\n', ' ');
    out << " (read from " << source << ")";
  }
  out << "\n\n[model]\n"
      << "name = " << str(c.model.name) << "\n"
      << "layers = " << c.model.layers << "\n"
      << "hidden = " << c.model.hidden << "\n"
      << "heads = " << c.model.heads << "\n"
      << "seq_len = " << c.model.seq_len << "\n"
      << "vocab = " << c.model.vocab << "\n"
      << "mlp_ratio = " << c.model.mlp_ratio << "\n"
      << "init_std = " << format_float(c.model.init_std) << "\n"
      << "\n[data]\n"
      << "kind = " << str(c.data.kind) << "\n"
      << "path = " << str(c.data.path) << "\n"
      << "dtype = " << str(c.data.dtype) << "\n"
      << "\n[optim]\n"
      << "name = " << str(c.optim.name) << "\n"
      << "lr = " << format_float(c.optim.lr) << "\n"
      << "min_lr = " << format_float(c.optim.min_lr) << "\n"
      << "warmup_steps = " << c.optim.warmup_steps << "\n"
      << "beta1 = " << format_float(c.optim.beta1) << "\n"
      << "beta2 = " << format_float(c.optim.beta2) << "\n"
      << "eps = " << format_float(c.optim.eps) << "\n"
      << "weight_decay = " << format_float(c.optim.weight_decay) << "\n"
      << "grad_clip = " << format_float(c.optim.grad_clip) << "\n"
      << "fused = " << (c.optim.fused ? "true" : "false") << "\n"
      << "\n[train]\n"
      << "global_batch = " << c.train.global_batch << "\n"
      << "micro_batch = " << c.train.micro_batch << "\n"
      << "steps = " << c.train.steps << "\n"
      << "seed = " << c.train.seed << "\n"
      << "precision = " << str(c.train.precision) << "\n"
      << "\n[parallel]\n"
      << "data = " << c.parallel.data << "\n"
      << "tensor = { size = " << c.parallel.tensor.size
      << ", mode = " << str(c.parallel.tensor.mode) << ", depth = " << c.parallel.tensor.depth
      << " }\n"
      << "pipeline = { size = " << c.parallel.pipeline.size
      << ", schedule = " << str(c.parallel.pipeline.schedule)
      << ", microbatches = " << c.parallel.pipeline.microbatches
      << ", chunks = " << c.parallel.pipeline.chunks << pipeline_cut(c.parallel.pipeline) << " }\n"
      << "sequence = { size = " << c.parallel.sequence.size
      << ", mode = " << str(c.parallel.sequence.mode) << " }\n"
      << "zero = { stage = " << c.parallel.zero.stage
      << (c.parallel.zero.reshard_after_forward ? "" : ", reshard_after_forward = false")
      << " }\n"
      << "bucket_mb = " << c.parallel.bucket_mb << "\n"
      << "bucket_kb = " << c.parallel.bucket_kb << "\n"
      << "\n[log]\n"
      << "metrics = " << str(c.log.metrics) << "\n"
      << "every = " << c.log.every << "\n"
      << "progress = " << str(c.log.progress) << "\n"
      << "trace = " << (c.log.trace ? "true" : "false") << "\n"
      << "trace_dir = " << str(c.log.trace_dir) << "\n"
      << "\n[checkpoint]\n"
      << "dir = " << str(c.checkpoint.dir) << "\n"
      << "every = " << c.checkpoint.every << "\n"
      << "keep_last = " << c.checkpoint.keep_last << "\n"
      << "async = " << (c.checkpoint.async ? "true" : "false") << "\n"
      << "\n[plugins]\n"
      << "path = [";
  for (size_t i = 0; i < c.plugins.path.size(); ++i) {
    out << (i ? ", " : "") << str(c.plugins.path[i]);
  }
  out << "]\n";
  for (const auto& [role, plugin] : c.plugins.by_role) out << role << " = " << str(plugin) << "\n";
  return out.str();
}

}  // namespace kolos
