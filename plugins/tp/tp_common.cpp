#include "tp_common.h"

#include <cmath>

#include "kolos/core/error.h"

namespace kolos::tp {
int64_t grid_side(const std::string& mode, int64_t depth, int64_t size) {
  for (int64_t q = 1; q <= size; ++q) {
    const int64_t n = mode == "1d" ? q : mode == "2d" ? q * q : mode == "2.5d" ? q * q * depth : q * q * q;
    if (n == size) return q;
    if (n > size) break;
  }
  return 0;
}

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

void require_divisible(const RunConfig& config, const std::string& key, int64_t value,
                       int64_t parts, const std::string& what,
                       const std::function<int64_t(int64_t)>& parts_of) {
  if (value % parts == 0) return;
  const auto& tp = config.parallel.tensor;
  const int64_t below = value / parts * parts;
  const int64_t above = below + parts;
  std::string nearest = below > 0 ? std::to_string(below) + " or " + std::to_string(above)
                                   : std::to_string(above);
  throw ConfigError(config.source + ": " + key + " = " + std::to_string(value) +
                    " does not divide into the " + std::to_string(parts) + " " + what +
                    " of tensor mode \"" + tp.mode + "\" at size " + std::to_string(tp.size) +
                    "; use " + key + " = " + nearest + ", or a tensor size of " +
                    valid_sizes(tp.mode, tp.depth, value, parts_of));
}

}  // namespace kolos::tp
