// The pipeline's memory terms (kolos/core/plugin_terms.h): the micro-batches
// whose activations a stage holds at once, in units of the whole stage,
// counted by the schedules themselves (libkolos_schedules), the count the
// plugin runs. Torch-free, in libkolos_plugin_terms.
#include <algorithm>
#include <string>

#include "kolos/core/plugin_terms.h"
#include "kolos/schedules/plan.h"

namespace kolos {
namespace {

double in_flight(const MemoryQuery& q, int64_t stage, std::string* schedule_text) {
  const std::string schedule = q.setting("parallel.pipeline.schedule", "1f1b");
  int64_t chunks = 1;
  try {
    chunks = std::max<int64_t>(1, std::stoll(q.setting("parallel.pipeline.chunks", "1")));
  } catch (const std::exception&) {
  }  // the plugin refuses it, with the key's place
  if (schedule_text != nullptr) {
    *schedule_text = chunks > 1 ? schedule + ", " + std::to_string(chunks) + " chunks" : schedule;
  }
  return pipeline::stage_activations_in_flight(
      pipeline::parse_schedule(schedule), static_cast<int>(q.pp), static_cast<int>(q.accumulation),
      static_cast<int>(chunks), static_cast<int>(stage));
}

}  // namespace

KOLOS_PLUGIN_TERMS(PluginTerms{"pipeline", "pipeline", nullptr, nullptr, in_flight});

}  // namespace kolos
