#include "equivalence.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include "kolos/core/comm/mpi.h"
#include "kolos/core/error.h"
#include "kolos/core/memory_estimate.h"
#include "kolos/modules/data.h"
#include "kolos/modules/gpt.h"

namespace kolos::testing {

std::vector<std::vector<std::string>> grid_layouts() {
  if (world_size() == 4) return {{"parallel.tensor.size=4", "parallel.tensor.mode=\"2d\""}};
  if (world_size() == 8) {
    return {{"parallel.tensor.size=8", "parallel.tensor.mode=\"2.5d\"", "parallel.tensor.depth=2"},
            {"parallel.tensor.size=8", "parallel.tensor.mode=\"3d\""}};
  }
  return {};
}

RunConfig tiny_gpt_config(const std::vector<std::string>& overrides) {
  static const char* kText = R"(
[model]
name = "gpt"
layers = 2
hidden = 32
heads = 4
seq_len = 16
vocab = 64

[data]
kind = "synthetic"

[optim]
lr = 3e-3
warmup_steps = 3
min_lr = 3e-4
weight_decay = 0.01
grad_clip = 1.0

[train]
global_batch = 16
micro_batch = 4
steps = 20
seed = 7

[log]
progress = "off"
)";
  return parse_run_config(kText, "<tiny-gpt>", overrides);
}

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

comm::ProcessGroupPtr world_group() {
  return comm::make_mpi_process_group(MPI_COMM_WORLD, "world");
}

comm::ProcessGroupPtr self_group() { return comm::make_mpi_process_group(MPI_COMM_SELF, "self"); }

comm::ProcessGroupPtr first_ranks(int n) {
  return world_group()->split(world_rank() < n ? 0 : -1, world_rank(),
                              "first " + std::to_string(n) + " ranks");
}

std::string shared_tmpdir(const std::string& tag) {
  std::string dir;
  if (world_rank() == 0) {
    std::string pattern =
        (std::filesystem::temp_directory_path() / ("kolos-" + tag + "-XXXXXX")).string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp " + pattern);
    dir = pattern;
  }
  int n = static_cast<int>(dir.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
  dir.resize(n);
  MPI_Bcast(dir.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
  return dir;
}

std::string config_error(const std::vector<std::string>& overrides) {
  try {
    // At the fewest ranks the config's mesh fits, as `kolos check` does.
    const RunConfig config = tiny_gpt_config(overrides);
    plan_run(config, fewest_ranks(config));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

RunRecord run_and_record(const RunConfig& config, const comm::ProcessGroupPtr& group) {
  modules::register_builtin_models();
  Engine engine(config, group, [](const RunConfig& c) { return data::make_source(c); });
  RunRecord record;
  record.losses =
      engine.train([&](const StepMetrics& m) { record.grad_norms.push_back(m.grad_norm); }).losses;
  record.parameters = engine.gathered_parameters();
  return record;
}

void expect_records_bit_equal(const RunRecord& reference, const RunRecord& candidate,
                              const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(reference.losses.size(), candidate.losses.size());
  for (size_t s = 0; s < reference.losses.size(); ++s) {
    EXPECT_EQ(reference.losses[s], candidate.losses[s]) << "loss of step " << s + 1;
    EXPECT_EQ(reference.grad_norms.at(s), candidate.grad_norms.at(s))
        << "gradient norm of step " << s + 1;
  }
  ASSERT_EQ(reference.parameters.size(), candidate.parameters.size());
  for (size_t i = 0; i < reference.parameters.size(); ++i) {
    const auto& [name, p] = reference.parameters[i];
    EXPECT_EQ(name, candidate.parameters[i].first);
    EXPECT_TRUE(torch::equal(p, candidate.parameters[i].second))
        << name << ": max |diff| "
        << (p - candidate.parameters[i].second).abs().max().item<double>();
  }
}

void expect_records_match(const RunRecord& reference, const RunRecord& candidate,
                          const Tolerance& tolerance, const std::string& what) {
  ASSERT_EQ(reference.losses.size(), candidate.losses.size()) << what;
  for (size_t i = 0; i < reference.losses.size(); ++i) {
    const double a = reference.losses[i], b = candidate.losses[i];
    EXPECT_LE(std::abs(a - b), tolerance.loss_rel * std::abs(a))
        << what << ": loss of step " << i + 1 << " differs: reference " << a << ", got " << b;
  }
  ASSERT_EQ(reference.grad_norms.size(), candidate.grad_norms.size()) << what;
  for (size_t i = 0; i < reference.grad_norms.size(); ++i) {
    const double a = reference.grad_norms[i], b = candidate.grad_norms[i];
    EXPECT_LE(std::abs(a - b), tolerance.grad_norm_rel * std::abs(a))
        << what << ": gradient norm of step " << i + 1 << " differs: reference " << a << ", got "
        << b;
  }
  ASSERT_EQ(reference.parameters.size(), candidate.parameters.size()) << what;
  for (size_t i = 0; i < reference.parameters.size(); ++i) {
    const auto& [name, ref] = reference.parameters[i];
    const auto& [cand_name, cand] = candidate.parameters[i];
    EXPECT_EQ(name, cand_name) << what;
    ASSERT_EQ(ref.sizes(), cand.sizes()) << what << ": parameter " << name;
    const double diff = (ref - cand).abs().max().item<double>();
    EXPECT_LE(diff, tolerance.param_abs)
        << what << ": parameter " << name << " differs by up to " << diff;
  }
  // The run must have learned something, or equality proves little.
  EXPECT_LT(reference.losses.back(), reference.losses.front()) << what << ": loss did not fall";
}

void expect_equivalent(const RunConfig& reference, const RunConfig& candidate,
                       const Tolerance& tolerance) {
  RunRecord serial = run_and_record(reference, self_group());
  RunRecord parallel = run_and_record(candidate, world_group());
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::ostringstream what;
  what << candidate.source << " on " << size << " ranks";
  expect_records_match(serial, parallel, tolerance, what.str());
}

}  // namespace kolos::testing
