// The hierarchical all-reduce against the flat one, on one host with the
// nodes simulated by KOLOS_SIMULATED_HOSTS (one name per world rank, what
// the launcher's locality check reads too): set here before each group is
// made, so the layouts below need no environment from CTest.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "equivalence.h"
#include "kolos/core/comm/hierarchical.h"
#include "kolos/core/error.h"
#include "kolos/core/run_config.h"
#include "kolos/modules/data.h"
#include "kolos/modules/gpt.h"

namespace kolos {
namespace {

using testing::world_rank;
using testing::world_size;

// One simulated host name per world rank, by a rule on the rank.
class SimulatedHosts {
 public:
  template <typename Rule>
  explicit SimulatedHosts(Rule rule) {
    std::string names;
    for (int r = 0; r < world_size(); ++r) names += (r ? "," : "") + rule(r);
    setenv("KOLOS_SIMULATED_HOSTS", names.c_str(), 1);
  }
  ~SimulatedHosts() { unsetenv("KOLOS_SIMULATED_HOSTS"); }
};

std::string halves(int r) { return r < world_size() / 2 ? "n0" : "n1"; }
std::string alternate(int r) { return r % 2 ? "odd" : "even"; }
std::string one_host(int) { return "only"; }
std::string own_host(int r) { return "h" + std::to_string(r); }
// The last rank alone, the others together (3+1 on 4 ranks).
std::string last_alone(int r) { return r == world_size() - 1 ? "last" : "rest"; }

// Integer-valued data, different on every rank: sums are exact in fp32.
at::Tensor ranked(int64_t n, at::ScalarType dtype) {
  return (torch::arange(n, torch::kInt64) * 7 + world_rank() * 13).remainder(101).to(dtype);
}

TEST(Reduce, OntoTheRootLeavesTheOthers) {
  auto world = testing::world_group();
  for (int root = 0; root < world->size(); ++root) {
    at::Tensor t = ranked(1000, at::kFloat);
    const at::Tensor before = t.clone();
    world->reduce(t, root, comm::ReduceOp::kSum)->wait();
    at::Tensor want = ranked(1000, at::kFloat);
    world->all_reduce(want, comm::ReduceOp::kSum)->wait();
    if (world->rank() == root) {
      EXPECT_TRUE(t.equal(want)) << "root " << root;
    } else {
      EXPECT_TRUE(t.equal(before)) << "a non-root tensor changed, root " << root;
    }
  }
  EXPECT_EQ(world->stats().calls[static_cast<int>(comm::OpType::kReduce)],
            static_cast<uint64_t>(world->size()));
}

// Every layout, op and dtype: hierarchical equals flat exactly (integer data).
TEST(Hierarchical, EqualsFlatOnEveryLayout) {
  using Rule = std::string (*)(int);
  const std::vector<std::pair<const char*, Rule>> layouts = {
      {"halves", halves}, {"alternate", alternate}, {"one host", one_host},
      {"own host", own_host}, {"last alone", last_alone}};
  auto world = testing::world_group();
  for (const auto& [name, rule] : layouts) {
    SimulatedHosts hosts(rule);
    auto hier = comm::make_hierarchical_group(world, comm::group_hosts(*world));
    EXPECT_EQ(hier->size(), world->size());
    EXPECT_EQ(hier->rank(), world->rank());
    for (const auto dtype : {at::kFloat, at::kDouble, at::kLong}) {
      for (const auto op : {comm::ReduceOp::kSum, comm::ReduceOp::kAvg, comm::ReduceOp::kMax,
                            comm::ReduceOp::kMin}) {
        // Sizes: empty, one element, a bucket's worth (1 MiB of fp32).
        for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{1} << 18}) {
          at::Tensor a = ranked(n, dtype), b = ranked(n, dtype);
          world->all_reduce(a, op)->wait();
          hier->all_reduce(b, op)->wait();
          EXPECT_TRUE(a.equal(b)) << name << ", " << comm::to_string(op) << ", "
                                  << at::toString(dtype) << ", " << n << " elements";
        }
      }
    }
    // Several in flight at once complete in order, each with its own sum.
    std::vector<at::Tensor> ts;
    std::vector<comm::WorkPtr> works;
    for (int i = 0; i < 6; ++i) {
      ts.push_back(ranked(4096 * (i + 1), at::kFloat) + i);
      works.push_back(hier->all_reduce(ts.back(), comm::ReduceOp::kSum));
    }
    for (int i = 0; i < 6; ++i) {
      works[i]->wait();
      at::Tensor want = ranked(4096 * (i + 1), at::kFloat) + i;
      world->all_reduce(want, comm::ReduceOp::kSum)->wait();
      EXPECT_TRUE(ts[i].equal(want)) << name << ", in flight " << i;
    }
  }
}

// auto: measured when the group spans nodes with more than one rank on some
// node; every rank takes the same path; no measurement otherwise.
TEST(Choice, AutoMeasuresOnlyWhereHierarchicalDiffers) {
  auto world = testing::world_group();
  at::Tensor sample = torch::empty({int64_t{1} << 16}, torch::kFloat);
  {
    SimulatedHosts hosts(one_host);
    const auto c = comm::choose_all_reduce(world, comm::AllReduceMode::kAuto, sample);
    EXPECT_EQ(c.path, "flat");
    EXPECT_FALSE(c.measured);
    EXPECT_EQ(c.nodes, 1);
    EXPECT_EQ(c.group, world);
  }
  {
    SimulatedHosts hosts(own_host);
    const auto c = comm::choose_all_reduce(world, comm::AllReduceMode::kAuto, sample);
    EXPECT_EQ(c.path, "flat");
    EXPECT_FALSE(c.measured);
    EXPECT_EQ(c.nodes, world->size());
  }
  if (world->size() >= 3) {
    SimulatedHosts hosts(halves);
    const auto c = comm::choose_all_reduce(world, comm::AllReduceMode::kAuto, sample);
    EXPECT_TRUE(c.measured);
    EXPECT_EQ(c.nodes, 2);
    EXPECT_GT(c.flat_s, 0);
    EXPECT_GT(c.hierarchical_s, 0);
    EXPECT_EQ(c.bucket_bytes, sample.numel() * 4);
    EXPECT_EQ(c.path, c.hierarchical_s < c.flat_s ? "hierarchical" : "flat");
    // The same pick everywhere.
    at::Tensor pick = at::full({1}, c.path == "hierarchical" ? 1 : 0, at::kInt);
    at::Tensor low = pick.clone();
    world->all_reduce(pick, comm::ReduceOp::kMax)->wait();
    world->all_reduce(low, comm::ReduceOp::kMin)->wait();
    EXPECT_EQ(pick.item<int>(), low.item<int>());
    EXPECT_NE(c.describe().find("flat "), std::string::npos) << c.describe();
    EXPECT_NE(c.json().find("\"hierarchical_s\":"), std::string::npos) << c.json();
  }
  {
    SimulatedHosts hosts(halves);
    const auto f = comm::choose_all_reduce(world, comm::AllReduceMode::kFlat, sample);
    EXPECT_EQ(f.path, "flat");
    EXPECT_EQ(f.group, world);
    const auto h = comm::choose_all_reduce(world, comm::AllReduceMode::kHierarchical, sample);
    EXPECT_EQ(h.path, "hierarchical");
    EXPECT_NE(h.group, world);
    EXPECT_FALSE(h.measured);
  }
}

// Training: hierarchical and flat over the same simulated nodes. The
// parameters before the first reduction are the same, so any difference is
// the reductions' summation order: with 2 ranks per node (or 1) it is
// a + b and a + b again. Bounds: relative 1e-6 per step on loss and
// gradient norm, 1e-6 absolute on parameters (measured: see the output).
TEST(Training, HierarchicalEqualsFlat) {
  modules::register_builtin_models();
  SimulatedHosts hosts(halves);
  auto world = testing::world_group();
  const auto flat =
      testing::run_and_record(testing::tiny_gpt_config({"parallel.allreduce=\"flat\""}), world);
  const auto hier = testing::run_and_record(
      testing::tiny_gpt_config({"parallel.allreduce=\"hierarchical\"", "parallel.bucket_kb=4"}),
      world);
  double worst_loss = 0, worst_param = 0;
  for (size_t i = 0; i < flat.losses.size(); ++i) {
    worst_loss = std::max(worst_loss, std::abs(flat.losses[i] - hier.losses[i]) /
                                          std::abs(flat.losses[i]));
  }
  for (size_t i = 0; i < flat.parameters.size(); ++i) {
    worst_param = std::max(
        worst_param,
        (flat.parameters[i].second - hier.parameters[i].second).abs().max().item<double>());
  }
  if (world_rank() == 0) {
    std::printf("hierarchical vs flat over %d ranks: largest relative loss difference %.3g, "
                "largest parameter difference %.3g\n",
                world_size(), worst_loss, worst_param);
  }
  testing::expect_records_match(flat, hier, testing::Tolerance{1e-6, 1e-6, 1e-6},
                                "hierarchical vs flat");
  // And against the serial run, as every strategy is checked.
  testing::expect_equivalent(
      testing::tiny_gpt_config({"parallel.data=1"}),
      testing::tiny_gpt_config({"parallel.allreduce=\"hierarchical\""}));
}

// zero1 all-reduces whole gradients through the same buckets.
TEST(Training, Zero1HierarchicalEqualsFlat) {
  modules::register_builtin_models();
  SimulatedHosts hosts(halves);
  auto world = testing::world_group();
  const auto flat = testing::run_and_record(
      testing::tiny_gpt_config({"parallel.zero.stage=1", "parallel.allreduce=\"flat\""}), world);
  const auto hier = testing::run_and_record(
      testing::tiny_gpt_config({"parallel.zero.stage=1", "parallel.allreduce=\"hierarchical\""}),
      world);
  testing::expect_records_match(flat, hier, testing::Tolerance{1e-6, 1e-6, 1e-6},
                                "zero1: hierarchical vs flat");
}

// bf16 gradients, reduced in bf16 (the MPI backend's 2-byte type and its
// user-defined sum) and widened to fp32 (train.reduce_dtype): the hierarchy
// takes the same dtypes through reduce, all_reduce and broadcast.
TEST(Training, HierarchicalEqualsFlatInBf16) {
  modules::register_builtin_models();
  SimulatedHosts hosts(halves);
  auto world = testing::world_group();
  for (const char* reduce : {"param", "fp32"}) {
    const std::vector<std::string> common = {"train.precision=\"bf16\"", "train.steps=8",
                                             std::string("train.reduce_dtype=\"") + reduce + "\""};
    auto with = [&](const char* path) {
      std::vector<std::string> o = common;
      o.push_back(std::string("parallel.allreduce=\"") + path + "\"");
      return testing::tiny_gpt_config(o);
    };
    const auto flat = testing::run_and_record(with("flat"), world);
    const auto hier = testing::run_and_record(with("hierarchical"), world);
    double worst = 0;
    for (size_t i = 0; i < flat.losses.size(); ++i) {
      worst = std::max(worst, std::abs(flat.losses[i] - hier.losses[i]) / std::abs(flat.losses[i]));
    }
    if (world_rank() == 0) {
      std::printf("bf16, reduce_dtype %s: hierarchical vs flat, largest relative loss difference "
                  "%.3g\n",
                  reduce, worst);
    }
    // bf16 rounds each partial sum: a different order may round differently.
    testing::expect_records_match(flat, hier, testing::Tolerance{1e-3, 1e-2, 1e-2},
                                  std::string("bf16, reduce_dtype ") + reduce);
  }
}

TEST(Config, RefusesAnUnknownPath) {
  const std::string text = "[model]\nname = \"gpt\"\n\n[parallel]\nallreduce = \"ring\"\n";
  try {
    parse_run_config(text, "bad.toml", {});
    FAIL() << "allreduce = \"ring\" was accepted";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("bad.toml:5"), std::string::npos) << m;
    EXPECT_NE(m.find("allreduce"), std::string::npos) << m;
    EXPECT_NE(m.find("ring"), std::string::npos) << m;
    EXPECT_NE(m.find("hierarchical"), std::string::npos) << m;
  }
  // zero2/zero3 reduce-scatter: a hierarchical all-reduce would do nothing.
  const std::string zero2 =
      testing::config_error({"parallel.allreduce=\"hierarchical\"", "parallel.zero.stage=2"});
  EXPECT_NE(zero2.find("allreduce"), std::string::npos) << zero2;
  EXPECT_NE(zero2.find("reduce-scatters"), std::string::npos) << zero2;
  EXPECT_EQ(testing::config_error({"parallel.allreduce=\"hierarchical\"", "parallel.zero.stage=1"}),
            "");
  for (const char* ok : {"auto", "flat", "hierarchical"}) {
    EXPECT_EQ(testing::tiny_gpt_config({std::string("parallel.allreduce=\"") + ok + "\""})
                  .parallel.allreduce,
              ok);
  }
}

}  // namespace
}  // namespace kolos
