// The role table and the settings -> plugin choice (kolos/core/roles.h).
#include "kolos/core/roles.h"

#include "kolos/core/error.h"
#include "kolos/core/sequence_modes.h"

namespace kolos {

const std::vector<RoleSpec>& role_specs() {
  static const std::vector<RoleSpec> specs = {
      {"layers", "parallel.tensor", {"size", "mode"}, "serial", true},
      {"sequence", "parallel.sequence", {"size", "mode"}, "", true},
      {"pipeline", "parallel.pipeline", {"size"}, "single-stage", true},
      {"gradients", "parallel.zero", {"stage"}, "dp", true},
      {"memory", "memory", {}, "", true},
      {"planner", "planner", {}, "", true},
  };
  return specs;
}

const RoleSpec& role_spec(const std::string& role) {
  for (const auto& spec : role_specs()) {
    if (spec.name == role) return spec;
  }
  std::vector<std::string> names = role_names();
  const std::string match = closest_match(role, names);
  throw ConfigError("unknown role `" + role + "`; roles: " + join(names, ", ") + "." +
                    (match.empty() ? "" : " Did you mean `" + match + "`?"));
}

std::vector<std::string> role_names() {
  std::vector<std::string> out;
  for (const auto& spec : role_specs()) out.push_back(spec.name);
  return out;
}

const std::string& RoleChoice::of(const std::string& role) const {
  if (role == "layers") return layers;
  if (role == "sequence") return sequence;
  if (role == "pipeline") return pipeline;
  if (role == "gradients") return gradients;
  if (role == "memory") return memory;
  if (role == "planner") return planner;
  return role_spec(role).name;  // throws for an unknown role
}

RoleChoice choose_plugins(const RoleSettings& p) {
  RoleChoice choice;
  if (p.tensor_size > 1) {
    choice.layers = p.tensor_mode == "2.5d" ? "tp2p5d" : "tp" + p.tensor_mode;
  } else {
    choice.layers = role_spec("layers").builtin;
  }
  choice.pipeline = p.pipeline_size > 1 ? "pipeline" : role_spec("pipeline").builtin;
  choice.gradients =
      p.zero_stage > 0 ? "zero" + std::to_string(p.zero_stage) : role_spec("gradients").builtin;
  // A mode over the tensor group (megatron) has no sp axis of its own: it
  // is chosen by its mode whatever the size (its plugin checks the size).
  SequenceConfig sequence;
  sequence.size = p.sequence_size, sequence.mode = p.sequence_mode;
  choice.sequence = sequence_splits(sequence) ? p.sequence_mode : "";
  // A [memory] section asks for the memory role; `chunks` is its plugin.
  choice.memory = p.memory ? "chunks" : "";
  // parallel.auto = true (or a [planner] section) asks for the planner
  // role; `autoplan` is its plugin.
  choice.planner = p.planner ? "autoplan" : "";
  return choice;
}

RoleChoice choose_plugins(const RunConfig& config) {
  const auto& p = config.parallel;
  RoleSettings settings;
  settings.tensor_size = p.tensor.size;
  settings.tensor_mode = p.tensor.mode;
  settings.sequence_size = p.sequence.size;
  settings.sequence_mode = p.sequence.mode;
  settings.pipeline_size = p.pipeline.size;
  settings.zero_stage = p.zero.stage;
  settings.memory = config.section("memory").present();
  settings.planner = config.parallel.auto_plan || config.section("planner").present();
  RoleChoice choice = choose_plugins(settings);
  const auto& by_role = config.plugins.by_role;
  const auto override_with = [&](const char* role, std::string& slot) {
    const auto it = by_role.find(role);
    if (it != by_role.end()) slot = it->second;
  };
  override_with("layers", choice.layers);
  override_with("sequence", choice.sequence);
  override_with("pipeline", choice.pipeline);
  override_with("gradients", choice.gradients);
  override_with("memory", choice.memory);
  override_with("planner", choice.planner);
  return choice;
}

void RolePlugin::configure(const PluginContext& context) {
  context.section.check_keys(context.core_keys, context.owner);
}

}  // namespace kolos
