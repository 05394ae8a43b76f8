// The equivalence harness: every parallel mix must match the serial run of
// the same model, seed and data.
//
// run_and_record() trains a config with the Engine on a process group and
// records every step's loss and the final global parameters.
// expect_equivalent() runs the serial reference on MPI_COMM_SELF (rank 0
// trains it and every rank gets its record: serial_record), then the
// parallel config on MPI_COMM_WORLD, and compares per-step losses (relative) and final
// parameters (absolute, after gathering every piece into its global tensor).
// A new strategy is checked by writing its config, nothing else.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <functional>
#include <ostream>

#include <string>
#include <utility>
#include <vector>

#include "kolos/core/comm/process_group.h"
#include "kolos/core/engine.h"
#include "kolos/core/run_config.h"

namespace kolos::testing {

struct RunRecord {
  std::vector<double> losses;
  std::vector<double> grad_norms;  // global gradient norm of each step, before clipping
  std::vector<std::pair<std::string, at::Tensor>> parameters;
};

struct Tolerance {
  double loss_rel = 1e-5;   // |a - b| <= loss_rel * |b| per step
  double param_abs = 5e-5;  // max |a - b| over every element of every parameter
  // Per step, relative. The norm sees a gradient's scale, which AdamW and
  // clipping would hide from losses and parameters (a sum for a mean).
  double grad_norm_rel = 1e-4;
};

// This rank and the ranks in MPI_COMM_WORLD.
int world_rank();
int world_size();

// A new process group over MPI_COMM_WORLD / MPI_COMM_SELF (collective over
// the communicator).
comm::ProcessGroupPtr world_group();
comm::ProcessGroupPtr self_group();
// The first `n` ranks of the world as a new group; nullptr on the others.
// Collective over the world.
comm::ProcessGroupPtr first_ranks(int n);

// A fresh directory <tmp>/kolos-<tag>-XXXXXX, the same on every rank of the
// world (rank 0 creates it). Collective over the world.
std::string shared_tmpdir(const std::string& tag);

// The ConfigError message that reading tiny_gpt_config(overrides) and
// planning it (plan_run: plugins and their settings) at the fewest ranks its
// mesh fits raise ("" when the overrides are accepted).
std::string config_error(const std::vector<std::string>& overrides);

// A tiny run of the model a [model] table describes: synthetic data, AdamW
// (lr 3e-3 warmed up over 3 steps, decaying to 3e-4, weight decay 0.01,
// clipping at 1), 16 samples a step in micro-batches of 4, 20 steps, seed 7,
// no progress line. `overrides` are --set's; `origin` names the text in errors.
RunConfig tiny_run_config(const std::string& model_section, const std::string& origin,
                          const std::vector<std::string>& overrides);

// A model family's tiny runs, for its tests: tiny(overrides) the run,
// tiny.serial(overrides) the same on one rank (parallel.data = 1), and
// tiny.config_error(overrides) what reading it raises as a ConfigError
// ("(no kolos::ConfigError)" when nothing).
class TinyModel {
 public:
  using Make = std::function<RunConfig(const std::vector<std::string>&)>;
  explicit TinyModel(Make make) : make_(std::move(make)) {}
  RunConfig operator()(const std::vector<std::string>& overrides = {}) const {
    return make_(overrides);
  }
  RunConfig serial(std::vector<std::string> overrides = {}) const;
  std::string config_error(const std::vector<std::string>& overrides) const;

 private:
  Make make_;
};

// The image models' tiny runs (model.name "vit" or "dit"): 2 layers of
// width 32 with 4 heads, 8x8 images in 2 channels cut into 4x4 patches, 5
// classes, 12 steps. `model_lines` adds keys to [model]; `defaults` go
// before each run's own overrides.
TinyModel tiny_image_model(const std::string& name, const std::string& model_lines,
                           const std::vector<std::string>& defaults);

// A small GPT on synthetic data: 20 steps, fp32, no dropout; overridable.
RunConfig tiny_gpt_config(const std::vector<std::string>& overrides = {});

// The tensor-parallel grids this world fills, as overrides: 2d at 4 ranks,
// 2.5d (depth 2) and 3d at 8; none at other sizes. Each needs micro-batches
// of a multiple of 4 rows and heads of a multiple of 2.
std::vector<std::vector<std::string>> grid_layouts();

RunRecord run_and_record(const RunConfig& config, const comm::ProcessGroupPtr& group);

// run_and_record(config, self_group()) as every rank of the world would get
// it, trained once: on rank 0 alone, the record then broadcast. The other
// ranks wait asleep: with more ranks than cores, training it on every rank
// or spinning in MPI while rank 0 trains takes the cores from rank 0.
// Collective over the world.
RunRecord serial_record(const RunConfig& config);

// GoogleTest expectations: losses and parameters agree within `tolerance`.
void expect_records_match(const RunRecord& reference, const RunRecord& candidate,
                          const Tolerance& tolerance, const std::string& what);

// GoogleTest expectations: every step's loss and gradient norm and every
// final parameter equal bit for bit.
void expect_records_bit_equal(const RunRecord& reference, const RunRecord& candidate,
                              const std::string& what);

// Serial `reference` (serial_record) vs `candidate` on MPI_COMM_WORLD.
void expect_equivalent(const RunConfig& reference, const RunConfig& candidate,
                       const Tolerance& tolerance = {});

// One parallel layout of a model family's checks: the overrides of the
// parallel run, and those both it and its serial reference take.
struct Mix {
  std::string name;  // a test-name suffix: letters, digits and _
  std::vector<std::string> parallel;
  std::vector<std::string> shape;
};

// The layouts every model family is checked in at 2 ranks: dp, zero1-3,
// tp1d and a 1f1b pipeline (in micro-batches of 2).
std::vector<Mix> two_rank_mixes();

// How GoogleTest prints a mix in a failure: its name.
inline void PrintTo(const Mix& mix, std::ostream* out) { *out << mix.name; }

// For INSTANTIATE_TEST_SUITE_P: the mix's name.
std::string mix_name(const ::testing::TestParamInfo<Mix>& info);

// expect_equivalent(tiny.serial(shape), tiny(shape + parallel)).
void expect_mix_matches_serial(const Mix& mix, const TinyModel& tiny);

}  // namespace kolos::testing

// Skips the test unless the world has one of the listed rank counts (a
// binary that runs at several counts holds tests for each).
#define REQUIRE_RANKS(...)                                                           \
  do {                                                                               \
    const std::vector<int> allowed{__VA_ARGS__};                                     \
    if (std::find(allowed.begin(), allowed.end(), ::kolos::testing::world_size()) == \
        allowed.end())                                                               \
      GTEST_SKIP() << "runs at " #__VA_ARGS__ " ranks";                              \
  } while (0)
