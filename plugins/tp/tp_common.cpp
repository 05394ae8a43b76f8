#include "tp_common.h"

#include <algorithm>
#include <cmath>

#include "kolos/core/error.h"
#include "kolos/core/settings.h"

namespace kolos::tp {
namespace {

// Tensor-parallel sizes of `mode` (1d: n; 2d: q^2; 2.5d: q^2 * depth; 3d:
// q^3) up to 512 whose split of `value` (given by `parts_of(size)`) divides
// it, as "1, 4, 16".
std::string valid_sizes(const std::string& mode, int64_t depth, int64_t value,
                        const std::function<int64_t(int64_t)>& parts_of) {
  std::string out;
  for (int64_t size = 1; size <= 512; ++size) {
    if (grid_side(mode, depth, size) == 0) continue;
    if (value % parts_of(size) != 0) continue;
    out += (out.empty() ? "" : ", ") + std::to_string(size);
  }
  return out;
}

// ConfigError unless `value` (the config key `key`) divides into `parts`,
// the split the mode makes of it; the message names both numbers, the
// nearest values that would divide, and the tensor sizes that would fit.
void require_divisible(const RunConfig& config, const TpShape& tp, const std::string& key,
                       int64_t value, int64_t parts, const std::string& what,
                       const std::function<int64_t(int64_t)>& parts_of) {
  if (value % parts == 0) return;
  const int64_t below = value / parts * parts;
  const int64_t above = below + parts;
  std::string nearest =
      below > 0 ? std::to_string(below) + " or " + std::to_string(above) : std::to_string(above);
  // `key` may be a product ("model.hidden * model.mlp_ratio"): point at its first key.
  const std::string first = key.substr(0, key.find(' '));
  config.section("").fail_at_any(
      {first}, key + " = " + std::to_string(value) + " does not divide into the " +
                   std::to_string(parts) + " " + what + " of tensor mode \"" + tp.mode +
                   "\" at size " + std::to_string(tp.size) + "; use " + key + " = " + nearest +
                   ", or a tensor size of " + valid_sizes(tp.mode, tp.depth, value, parts_of));
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

// "" when the size fits the mode's process grid, else a message naming the
// nearest valid sizes.
std::string grid_problem(const TpShape& tp) {
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

// The MLP width, and for LLaMA the key/value heads (each rank keeps whole
// groups of query heads with their key/value head), divide over the q
// blocks of the heads and features.
void require_mlp_and_kv(const RunConfig& config, const TpShape& tp, const std::string& what,
                        const std::function<int64_t(int64_t)>& side) {
  const auto& m = config.model;
  if (!llama_family(m)) {
    require_divisible(config, tp, "model.hidden * model.mlp_ratio", m.hidden * m.mlp_ratio, tp.q,
                      what, side);
    return;
  }
  require_divisible(config, tp, "model.ffn_hidden", m.ffn_hidden, tp.q, what, side);
  require_divisible(config, tp, "model.kv_heads", m.kv_heads > 0 ? m.kv_heads : m.heads, tp.q,
                    "key/value-head groups", side);
}

}  // namespace

int64_t grid_side(const std::string& mode, int64_t depth, int64_t size) {
  for (int64_t q = 1; q <= size; ++q) {
    const int64_t n = mode == "1d"     ? q
                      : mode == "2d"   ? q * q
                      : mode == "2.5d" ? q * q * depth
                                       : q * q * q;
    if (n == size) return q;
    if (n > size) break;
  }
  return 0;
}

TpShape configure_tp(const PluginContext& context, const std::string& mode) {
  const RunConfig& config = context.config;
  TpShape tp;
  tp.mode = mode;
  tp.size = context.shape.tp;
  const auto table = SettingsTable<TpShape>("parallel.tensor").integer("depth", &TpShape::depth, 1);
  if (mode == "2.5d") {
    table.read(context.section, tp, context.core_keys, context.owner);
  } else {
    context.section.check_keys(context.core_keys, context.owner);
  }
  const std::string shape = grid_problem(tp);
  if (!shape.empty()) context.section.fail_at_any({"size", "mode"}, shape);
  tp.q = grid_side(mode, tp.depth, tp.size);

  const auto& m = config.model;
  const int64_t depth = tp.depth;
  const auto side = [mode, depth](int64_t s) {
    return std::max<int64_t>(1, grid_side(mode, depth, s));
  };
  if (mode == "1d") {
    require_divisible(config, tp, "model.heads", m.heads, tp.q, "attention-head groups", side);
    require_mlp_and_kv(config, tp, "MLP column blocks", side);
    return tp;
  }
  const auto batch_of = [mode, side, depth](int64_t s) {
    const int64_t q = side(s);
    return mode == "2d" ? q : mode == "2.5d" ? q * depth : q * q;
  };
  require_divisible(config, tp, "model.heads", m.heads, tp.q, "attention-head groups", side);
  require_mlp_and_kv(config, tp, "MLP feature blocks", side);
  require_divisible(config, tp, "train.micro_batch", config.train.micro_batch, batch_of(tp.size),
                    "batch blocks", batch_of);
  return tp;
}

}  // namespace kolos::tp
