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
