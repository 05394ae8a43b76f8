// What the tensor-parallel factories share: the checks of a model's shape
// against a mode, with errors that name the numbers and what would fit.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "kolos/core/run_config.h"

namespace kolos::tp {

// The grid side q of `size` in `mode` (1d: size itself), or 0 when the
// size does not fit the mode.
int64_t grid_side(const std::string& mode, int64_t depth, int64_t size);

// Tensor-parallel sizes of `mode` (1d: n; 2d: q^2; 2.5d: q^2 * depth; 3d:
// q^3) up to 512 whose split of `value` (given by `parts_of(size)`) divides
// it, as "1, 4, 16".
std::string valid_sizes(const std::string& mode, int64_t depth, int64_t value,
                        const std::function<int64_t(int64_t size)>& parts_of);

// ConfigError unless `value` (the config key `key`) divides into `parts`,
// the split the mode makes of it; the message names both numbers, the
// nearest values that would divide, and the tensor sizes that would fit.
void require_divisible(const RunConfig& config, const std::string& key, int64_t value,
                       int64_t parts, const std::string& what,
                       const std::function<int64_t(int64_t size)>& parts_of);

}  // namespace kolos::tp
