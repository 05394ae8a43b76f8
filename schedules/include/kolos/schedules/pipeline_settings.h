// The pipeline plugin's settings: the keys of [parallel.pipeline] besides
// the core's `size`, and every rule about them that needs no model.
// Torch-free (linked by the plugin and by its unit tests).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kolos/core/roles.h"

namespace kolos::pipeline {

struct PipelineSettings {
  std::string schedule = "1f1b";          // "gpipe" | "1f1b" | "interleaved" | "zb"
  int64_t microbatches = 0;               // a check of the batch split; 0: derived
  int64_t chunks = 1;                     // model chunks per stage (interleaved)
  std::string balance = "params";         // "params" | "time": how stages are cut
  std::vector<int64_t> layers_per_stage;  // explicit cut: blocks per (virtual) stage
};

// Reads and checks the plugin's keys for a pipeline of context.shape.pp
// stages running context.accumulation micro-batches per step: types and
// ranges, chunks only with "interleaved", an explicit cut with one count per
// (virtual) stage and not together with balance, microbatches equal to the
// batch split, and the schedule's own rules on stages, micro-batches and
// chunks (plan_problem). ConfigError at the key otherwise.
PipelineSettings read_pipeline_settings(const PluginContext& context);

}  // namespace kolos::pipeline
