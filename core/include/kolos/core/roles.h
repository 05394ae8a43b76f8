// The roles a run fills, each with one plugin, and what a plugin owns.
//
// One table says, for every role: the section of the run's document whose
// keys its plugin owns, the keys of that section the core itself reads (mesh
// sizes and the plugin choice), the plugin used when none is chosen, and
// whether this version's engine runs the role at all. Nothing else in kolos
// lists the roles.
//
// Every role plugin derives from RolePlugin. configure() is called on every
// rank, after the plugin is loaded and before any communication; it reads
// and checks the plugin's keys through the section it is given, so a bad key
// fails on every rank at once with the key's file:line:col.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kolos/core/run_config.h"
#include "kolos/core/settings.h"

namespace kolos {

struct RoleSpec {
  std::string name;                    // "layers"
  std::string section;                 // "parallel.tensor": the table its plugin owns
  std::vector<std::string> core_keys;  // keys of that table the core reads
  std::string builtin;                 // used when no plugin is chosen ("" none)
  bool available = true;               // the engine runs this role in this version
};

// Every role, in the order a run sets them up.
const std::vector<RoleSpec>& role_specs();
const RoleSpec& role_spec(const std::string& role);  // throws ConfigError for an unknown role
std::vector<std::string> role_names();

// Which plugin serves each role for a config ("" when none): [plugins]
// overrides, else what the [parallel] settings select (tensor.mode and
// size > 1, pipeline.size > 1, sequence.size > 1, zero.stage), else the
// role's built-in. The one place that maps settings to plugin names.
struct RoleChoice {
  std::string layers, sequence, pipeline, gradients, memory, planner;
  const std::string& of(const std::string& role) const;
};
RoleChoice choose_plugins(const RunConfig& config);

// What that choice reads of a run, without [plugins] overrides: the
// [parallel] sizes and modes, and whether a [memory] or [planner] section is
// there. The planner describes its candidates this way.
struct RoleSettings {
  int64_t tensor_size = 1;
  std::string tensor_mode = "1d";
  int64_t sequence_size = 1;
  std::string sequence_mode;
  int64_t pipeline_size = 1;
  int64_t zero_stage = 0;
  bool memory = false, planner = false;
};
RoleChoice choose_plugins(const RoleSettings& settings);

// What configure() is given.
struct PluginContext {
  const RunConfig& config;
  ConfigSection section;               // the table the role owns (maybe absent)
  std::vector<std::string> core_keys;  // keys of that table the core reads
  std::string owner;                   // "layers plugin `tp2d`", for messages
  MeshShape shape;                     // the mesh this run will have
  int64_t accumulation = 1;            // micro-batches per step on each rank
};

class RolePlugin {
 public:
  virtual ~RolePlugin() = default;
  // Reads and checks this plugin's settings. Local (no communication);
  // throws ConfigError. The default accepts none besides the core's keys.
  virtual void configure(const PluginContext& context);
};

}  // namespace kolos
