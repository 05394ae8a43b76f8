// `kolos check`: a config checked as a run of N ranks would check it on
// each rank (the mesh, the roles, the batch, the per-rank memory), then a
// one-line summary; --effective adds every key as TOML.
#include "check_command.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <iostream>

#include "command_options.h"
#include "kolos/core/config_located.h"
#include "kolos/core/format.h"
#include "kolos/core/memory_estimate.h"
#include "kolos/core/mesh_layout.h"
#include "kolos/modules/gpt.h"

namespace po = boost::program_options;

namespace kolos::cli {

RunPlan check_run(const RunConfig& config, int64_t ranks) {
  modules::register_builtin_models();
  check_model_name(config);
  return plan_run(config, ranks);
}

int check_command(const std::vector<std::string>& args) {
  po::options_description options("options");
  std::string config_path;
  std::vector<std::string> overrides;
  int64_t ranks = 0;
  int64_t per_node = 0;
  bool effective = false;
  options.add_options()("config", po::value(&config_path)->required(), "the run's TOML file")(
      "effective", po::bool_switch(&effective),
      "also print the effective configuration (every key, defaults included) as TOML")(
      "np,n", po::value(&ranks), "ranks to check for (default: the fewest the config's mesh fits)")(
      "per-node", po::value(&per_node),
      "ranks sharing this machine's memory (default 1: the config may be meant for other "
      "machines)")(
      "set", po::value(&overrides)->composing(), "override a key: --set train.steps=100");
  po::positional_options_description positional;
  positional.add("config", 1);
  Parsed parsed = parse("check", args, options, positional,
                        "CONFIG [-n N] [--per-node K] [--set key=value ...] [--effective]");
  if (parsed.help) return 0;
  const RunConfig config = load_run_config(config_path, overrides);
  if (ranks <= 0) {
    ranks = fewest_ranks(config);
  }
  const RunPlan plan = check_run(config, ranks);
  const MemoryEstimate memory = estimate_memory(config, ranks, resident_bytes());
  // A config may be meant for other machines: by default one rank on this
  // one must fit (--per-node says how many share it).
  const MemoryBudget budget = memory_budget(config, per_node > 0 ? std::min(per_node, ranks) : 1);
  check_memory_fits(config, memory, budget, ranks);
  std::cout << "kolos: " << config_path << ": ok for " << ranks << (ranks == 1 ? " rank" : " ranks")
            << ": mesh " << MeshLayout(plan.shape).describe() << " | layers " << plan.roles.layers
            << ", pipeline "
            << plan.roles.pipeline << ", gradients " << plan.roles.gradients
            << (plan.roles.sequence.empty() ? "" : ", sequence " + plan.roles.sequence)
            << (plan.roles.memory.empty() ? "" : ", memory " + plan.roles.memory)
            << " | batch " << config.train.global_batch << " = " << config.train.micro_batch
            << " x " << plan.accumulation << " accum x " << plan.shape.dp << " dp"
            << (plan.shape.of(expert_axis()) > 1
                    ? " x " + std::to_string(plan.shape.of(expert_axis())) + " ep"
                    : std::string())
            << " | memory about "
            << detail::format_bytes(memory.peak()) << " per rank of "
            << detail::format_bytes(budget.bytes) << "\n";
  if (config.parallel.auto_plan) {
    std::cout << "kolos: parallel.auto = true: that is the config's own layout; a run uses the "
                 "planner's choice (`kolos plan "
              << config_path << " -n " << ranks << "` shows it)\n";
  }
  if (effective) std::cout << "\n" << to_toml(config);
  return 0;
}

}  // namespace kolos::cli
