// What the tensor-parallel factories share: their settings and the checks of
// a model's shape against a mode, with errors that name the numbers and what
// would fit. All of it runs in configure(), before any communication.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "kolos/core/roles.h"
#include "kolos/core/run_config.h"

namespace kolos::tp {

// A tensor-parallel layout.
struct TpShape {
  std::string mode;   // "1d" | "2d" | "2.5d" | "3d"
  int64_t size = 1;   // ranks on the tp axis
  int64_t depth = 1;  // 2.5d: the grid's depth
  int64_t q = 1;      // the grid's side (1d: size)
};

// Reads the plugin's keys of [parallel.tensor] (2.5d owns `depth`; the other
// modes none besides the core's size and mode) and checks, before any
// communication, that the tp size fits the mode's grid and that the model's
// heads, MLP width and micro-batch divide over it. ConfigError otherwise,
// at the key, naming the nearest values and tensor sizes that would fit.
TpShape configure_tp(const PluginContext& context, const std::string& mode);

// The grid side q of `size` in `mode` (1d: size itself), or 0 when the
// size does not fit the mode.
int64_t grid_side(const std::string& mode, int64_t depth, int64_t size);

}  // namespace kolos::tp
