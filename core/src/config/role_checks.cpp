// The checks of a run's roles that span sections: which plugin each role
// gets (a [plugins] override against the settings that select a plugin),
// role keys that the choice leaves without a reader, and the layouts a
// model runs under (vit and dit attend bidirectionally; mixtral's tested
// layouts; the expert axis).
#include "role_checks.h"

#include "kolos/core/roles.h"
#include "kolos/core/sequence_modes.h"
#include "kolos/core/settings.h"

namespace kolos {
namespace {

// What model.name = "mixtral" runs under: the layouts its equivalence
// test covers (tests/mpi/moe); the others are refused by name.
void check_moe_roles(const RunConfig& c, const ConfigSection& root) {
  if (sequence_splits(c.parallel.sequence)) {
    root.fail_at_any({"parallel.sequence", "parallel.sequence.mode", "model.name"},
                     "model.name = \"mixtral\" does not run under sequence parallelism yet: "
                     "its routing and load-balancing loss see a rank's tokens, which a "
                     "sequence split would change; set parallel.sequence.size = 1.");
  }
  if (c.parallel.tensor.size > 1 && c.parallel.tensor.mode != "1d") {
    root.fail_at_any({"parallel.tensor.mode", "parallel.tensor", "model.name"},
                     "parallel.tensor.mode = " + quote_toml(c.parallel.tensor.mode) +
                         ": model.name = \"mixtral\" runs under tensor mode \"1d\" only "
                         "(each expert's MLP split as a dense one); set "
                         "parallel.tensor.mode = \"1d\".");
  }
  if (c.parallel.auto_plan) {
    root.fail_at_any({"parallel.auto", "model.name"},
                     "parallel.auto: the planner does not model mixture-of-experts layers "
                     "(model.name = \"mixtral\"); set the layout yourself.");
  }
}

// parallel.expert.size > 1: an MoE model whose experts divide, and the
// layouts the expert axis is checked under (docs/moe.md).
void check_expert_axis(const RunConfig& c, const ConfigSection& root) {
  const int64_t ep = c.parallel.expert.size;
  const std::string size = "parallel.expert.size = " + std::to_string(ep);
  if (c.model.name != "mixtral") {
    root.fail_at_any({"parallel.expert.size", "parallel.expert", "model.name"},
                     size + ": model.name = " + quote_toml(c.model.name) +
                         " has no experts to split; the expert axis needs a mixture-of-experts "
                         "model (model.name = \"mixtral\"), or remove parallel.expert.");
  }
  if (c.model.experts % ep != 0) {
    root.fail_at_any({"parallel.expert.size", "parallel.expert", "model.experts"},
                     size + " does not divide model.experts = " +
                         std::to_string(c.model.experts) +
                         ": each rank of the expert axis holds an equal share of the experts; "
                         "use a size that divides " + std::to_string(c.model.experts) + ".");
  }
}

}  // namespace

// Which plugin each role gets, and the keys of a role's section that the
// choice leaves without a reader.
void check_roles(const RunConfig& c) {
  const ConfigSection root = c.section("");
  const auto& by_role = c.plugins.by_role;
  const bool dit = c.model.name == "dit";
  if ((dit || c.model.name == "vit") && c.parallel.sequence.size > 1) {
    root.fail_at_any(
        {"parallel.sequence", "model.name"},
        "parallel.sequence.size = " + std::to_string(c.parallel.sequence.size) +
            ": model.name = \"" + c.model.name + "\" attends bidirectionally" +
            (dit ? " (and carries its conditioning as one token of the sequence)" : "") +
            " and the sequence strategies (ulysses, ring, megatron, hybrid) attend "
            "causally only; set parallel.sequence.size = 1.");
  }
  if (c.model.name == "mixtral") check_moe_roles(c, root);
  if (c.parallel.expert.size > 1) check_expert_axis(c, root);
  // A [plugins] override and the settings that select a plugin of the
  // same role must agree.
  const int64_t stage = c.parallel.zero.stage;
  if (stage > 0 && by_role.count("gradients") &&
      by_role.at("gradients") != "zero" + std::to_string(stage)) {
    root.fail_at_any({"plugins.gradients", "parallel.zero.stage", "parallel.zero"},
                     "parallel.zero.stage = " + std::to_string(stage) +
                         " selects the gradients plugin `zero" + std::to_string(stage) +
                         "`, but plugins.gradients names `" + by_role.at("gradients") +
                         "`; remove one of the two.");
  }
  const ConfigSection tensor = c.section("parallel.tensor");
  if (tensor.has("mode")) {
    const RoleChoice by_settings = choose_plugins([&] {
      RunConfig plain = c;
      plain.plugins.by_role.clear();
      return plain;
    }());
    // Under parallel.auto a mode without a size fixes the mode of the
    // plans the planner may choose (kolos/core/planner.h).
    if (c.parallel.tensor.size == 1 && !by_role.count("layers") && !c.parallel.auto_plan) {
      tensor.fail("mode", quote_toml(c.parallel.tensor.mode) +
                              " has no effect: parallel.tensor.size = 1 runs the serial layers; "
                              "remove it, or set a size > 1.");
    }
    if (by_role.count("layers") && by_role.at("layers") != by_settings.layers &&
        c.parallel.tensor.size > 1) {
      root.fail_at_any({"plugins.layers", "parallel.tensor.mode"},
                       "parallel.tensor.mode = " + quote_toml(c.parallel.tensor.mode) +
                           " selects the layers plugin `" + by_settings.layers +
                           "`, but plugins.layers names `" + by_role.at("layers") +
                           "`; remove one of the two.");
    }
  }
  const ConfigSection sequence = c.section("parallel.sequence");
  if (sequence.has("mode") && !sequence_splits(c.parallel.sequence) && !by_role.count("sequence") &&
      !c.parallel.auto_plan) {
    sequence.fail("mode", quote_toml(c.parallel.sequence.mode) +
                              " has no effect: parallel.sequence.size = 1 splits no sequence; "
                              "remove it, or set a size > 1.");
  }
  if (by_role.count("sequence") && sequence.has("mode") && c.parallel.sequence.size > 1 &&
      by_role.at("sequence") != c.parallel.sequence.mode) {
    root.fail_at_any({"plugins.sequence", "parallel.sequence.mode"},
                     "parallel.sequence.mode = " + quote_toml(c.parallel.sequence.mode) +
                         " selects the sequence plugin `" + c.parallel.sequence.mode +
                         "`, but plugins.sequence names `" + by_role.at("sequence") +
                         "`; remove one of the two.");
  }
  const RoleChoice choice = choose_plugins(c);
  for (const auto& spec : role_specs()) {
    const std::string& plugin = choice.of(spec.name);
    const ConfigSection own = c.section(spec.section);
    if (!spec.available) {
      if (by_role.count(spec.name)) {
        root.fail("plugins." + spec.name,
                  "the " + spec.name +
                      " role is not available in this version: the engine cannot run a " +
                      spec.name + " plugin yet; remove the key.");
      }
      if (!plugin.empty()) {
        root.fail_at_any({spec.section + ".size", spec.section},
                         spec.section + ".size = " + std::to_string(c.parallel.sequence.size) +
                             ": " + spec.name +
                             " parallelism is not available in this version (no " + spec.name +
                             " plugin runs yet); set size = 1.");
      }
    }
    if (plugin.empty()) {
      own.check_keys(spec.core_keys, "no " + spec.name + " plugin runs");
    }
  }
}

}  // namespace kolos
