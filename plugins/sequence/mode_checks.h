// Checks the sequence plugins share, made in configure() where the message
// can name the key, before the mesh communicates.
#pragma once

#include <cstdint>
#include <string>

#include "kolos/core/roles.h"
#include "kolos/core/run_config.h"
#include "kolos/core/settings.h"

namespace kolos::sequence {

// What a sequence mode's configure() checks against: the run, its root
// section (for messages at any key), the mesh's sequence and tensor sizes,
// and "parallel.sequence.size = N" as the messages cite it.
struct ModeInputs {
  const RunConfig& config;
  ConfigSection root;
  int64_t sp;
  int64_t tp;
  std::string at_sp;
};

inline ModeInputs mode_inputs(const PluginContext& context) {
  return ModeInputs{context.config, context.config.section(""), context.shape.sp, context.shape.tp,
                    "parallel.sequence.size = " + std::to_string(context.shape.sp)};
}

// Sequence mode `mode` splits attention over this rank's tokens: the 2d,
// 2.5d and 3d layers hand it blocks of other shapes (kolos/core/
// layer_factory.h), 1d keeps them whole. Fails at parallel.tensor.mode when
// tp > 1 under another tensor mode.
inline void require_tensor_1d(const RunConfig& config, int64_t tp, int64_t sp,
                              const std::string& mode) {
  if (tp <= 1 || config.parallel.tensor.mode == "1d") return;
  config.section("").fail_at_any(
      {"parallel.tensor.mode", "parallel.tensor"},
      "sequence mode \"" + mode + "\" composes with tensor mode \"1d\" only; found " +
          "parallel.tensor.mode = " + quote_toml(config.parallel.tensor.mode) +
          " with parallel.sequence.size = " + std::to_string(sp) +
          ". Use tensor mode \"1d\", or sequence size 1.");
}

}  // namespace kolos::sequence
