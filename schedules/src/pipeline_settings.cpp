#include "kolos/schedules/pipeline_settings.h"

#include "kolos/core/settings.h"
#include "kolos/schedules/plan.h"

namespace kolos::pipeline {
namespace {

const SettingsTable<PipelineSettings>& table() {
  static const auto t =
      SettingsTable<PipelineSettings>("parallel.pipeline")
          .choice("schedule", &PipelineSettings::schedule, {"gpipe", "1f1b", "interleaved", "zb"},
                  "pipeline schedule")
          .integer("microbatches", &PipelineSettings::microbatches, 0)
          .integer("chunks", &PipelineSettings::chunks, 1)
          .choice("balance", &PipelineSettings::balance, {"params", "time"}, "stage balance")
          .integers("layers_per_stage", &PipelineSettings::layers_per_stage, 1, "blocks per stage");
  return t;
}

}  // namespace

PipelineSettings read_pipeline_settings(const PluginContext& context) {
  const ConfigSection& s = context.section;
  const RunConfig& config = context.config;
  PipelineSettings p;
  table().read(s, p, context.core_keys, context.owner);
  const int64_t P = context.shape.pp;
  const bool interleaved = p.schedule == "interleaved";
  if (p.chunks > 1 && !interleaved) {
    s.fail_at_any({"chunks", "schedule"},
                  "parallel.pipeline.chunks = " + std::to_string(p.chunks) +
                      " only applies to schedule = \"interleaved\", but the schedule is " +
                      quote_toml(p.schedule) + "; set chunks = 1 or schedule = \"interleaved\".");
  }
  if (!p.layers_per_stage.empty()) {
    if (s.has("balance")) {
      s.fail("layers_per_stage",
             "an explicit cut and parallel.pipeline.balance = " + quote_toml(p.balance) +
                 " are both set; remove one of the two.");
    }
    const int64_t stages = P * (interleaved ? p.chunks : 1);
    if (static_cast<int64_t>(p.layers_per_stage.size()) != stages) {
      s.fail("layers_per_stage",
             "has " + std::to_string(p.layers_per_stage.size()) +
                 " entries, but the pipeline has " + std::to_string(stages) +
                 (stages == P ? " stages (size = " + std::to_string(P) + ")"
                              : " virtual stages (size " + std::to_string(P) + " x chunks " +
                                    std::to_string(p.chunks) + ")") +
                 "; give one block count per stage.");
    }
  }
  const int64_t per_step = config.train.micro_batch * context.shape.dp;
  const int64_t M = context.accumulation;
  if (p.microbatches > 0 && p.microbatches != M) {
    // The batch settings decide; microbatches is a check (or 0: derived).
    s.fail(
        "microbatches",
        std::to_string(p.microbatches) +
            ", but train.global_batch = " + std::to_string(config.train.global_batch) +
            " / (train.micro_batch = " + std::to_string(config.train.micro_batch) +
            " x data-parallel size " + std::to_string(context.shape.dp) + ") gives " +
            std::to_string(M) + " micro-batches per step; set microbatches = " + std::to_string(M) +
            " (or 0 to derive it), or global_batch = " + std::to_string(p.microbatches * per_step));
  }
  const std::string problem = plan_problem(parse_schedule(p.schedule), static_cast<int>(P),
                                           static_cast<int>(M), static_cast<int>(p.chunks));
  if (!problem.empty()) {
    s.fail_at_any({"schedule", "size", "chunks"},
                  problem + " (M = train.global_batch " +
                      std::to_string(config.train.global_batch) + " / (micro_batch " +
                      std::to_string(config.train.micro_batch) + " x data " +
                      std::to_string(context.shape.dp) + "))");
  }
  return p;
}

}  // namespace kolos::pipeline
