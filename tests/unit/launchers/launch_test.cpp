#include "launch.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "kolos/core/error.h"

namespace kolos::cli {
namespace {

bool has(const std::vector<std::string>& cmd, const std::vector<std::string>& seq) {
  return std::search(cmd.begin(), cmd.end(), seq.begin(), seq.end()) != cmd.end();
}

LaunchOptions options(int ranks, int cores) {
  LaunchOptions o;
  o.ranks = ranks;
  o.cores = cores;
  o.config = "run.toml";
  o.mpirun = "mpirun";
  o.kolos = "/opt/kolos/bin/kolos";
  return o;
}

TEST(Launch, RanksWithinCores) {
  auto cmd = mpirun_command(options(2, 8));
  EXPECT_EQ(cmd.front(), "mpirun");
  EXPECT_TRUE(has(cmd, {"-np", "2"}));
  EXPECT_FALSE(has(cmd, {"--oversubscribe"}));
  EXPECT_FALSE(has(cmd, {"--allow-run-as-root"}));
  EXPECT_TRUE(has(cmd, {"-x", "OMP_NUM_THREADS=4"}));
  EXPECT_TRUE(has(cmd, {"-x", "OPENBLAS_NUM_THREADS=1"}));
  EXPECT_TRUE(has(cmd, {"/opt/kolos/bin/kolos", "train", "run.toml"}));
  // 4 CPUs per rank: a spare core for each rank's communication thread.
  EXPECT_TRUE(has(cmd, {"--mca", "pml", "ucx", "--mca", "pml_ucx_tls", "any", "--mca",
                        "pml_ucx_devices", "any"}));
}

TEST(Launch, OversubscribedAsRoot) {
  LaunchOptions o = options(4, 2);
  o.root = true;
  o.overrides = {"train.steps=5", "parallel.data=4"};
  auto cmd = mpirun_command(o);
  EXPECT_TRUE(has(cmd, {"--allow-run-as-root"}));
  EXPECT_TRUE(has(cmd, {"--oversubscribe", "--bind-to", "none"}));
  EXPECT_TRUE(has(cmd, {"--mca", "mpi_yield_when_idle", "1"}));
  EXPECT_TRUE(has(cmd, {"-x", "OMP_NUM_THREADS=1"}));
  EXPECT_TRUE(has(cmd, {"--set", "train.steps=5", "--set", "parallel.data=4"}));
}

TEST(Launch, PassesResume) {
  LaunchOptions o = options(2, 2);
  o.resume = true;
  EXPECT_EQ(mpirun_command(o).back(), "--resume");
  o.resume_dir = "ckpt/step-40";
  auto cmd = mpirun_command(o);
  EXPECT_TRUE(has(cmd, {"train", "run.toml", "--resume", "ckpt/step-40"}));
}

TEST(Launch, UcxOnlyWithASpareCorePerRank) {
  EXPECT_FALSE(has(mpirun_command(options(2, 2)), {"--mca", "pml", "ucx"}));
  EXPECT_FALSE(has(mpirun_command(options(2, 3)), {"--mca", "pml", "ucx"}));
  EXPECT_TRUE(has(mpirun_command(options(2, 4)), {"--mca", "pml", "ucx"}));
  LaunchOptions forced = options(2, 2);
  forced.ucx = true;
  EXPECT_TRUE(has(mpirun_command(forced), {"--mca", "pml", "ucx"}));
}

TEST(Launch, NoUcxOnRequest) {
  LaunchOptions o = options(2, 8);
  o.no_ucx = true;
  EXPECT_FALSE(has(mpirun_command(o), {"--mca", "pml", "ucx"}));
}

// The binding flags of a machine with PHYSICAL cores in NUMA nodes of CPN.
LaunchOptions machine(int ranks, int physical, int numa, int cpn) {
  LaunchOptions o = options(ranks, physical);
  o.physical_cores = physical;
  o.numa_nodes = numa;
  o.cores_per_numa = cpn;
  return o;
}

TEST(LaunchBinding, DefaultBindsCoresInBlocksPerNumaNode) {
  // 8 ranks on 2 x 56 cores: 4 consecutive ranks per NUMA node, 14 cores each.
  auto cmd = mpirun_command(machine(8, 112, 2, 56));
  EXPECT_TRUE(has(cmd, {"--map-by", "ppr:4:numa:PE=14", "--bind-to", "core"}));
  EXPECT_FALSE(has(cmd, {"--oversubscribe"}));
  EXPECT_EQ(resolve_bind(machine(8, 112, 2, 56)), "cores");
  EXPECT_EQ(
      describe_binding(machine(8, 112, 2, 56)),
      "binding cores (default): 8 ranks, 112 cores in 2 NUMA node(s), up to 4 consecutive ranks "
      "per NUMA node, 14 core(s) each");
  // This kind of machine: 2 ranks on 2 cores, one NUMA node.
  EXPECT_TRUE(has(mpirun_command(machine(2, 2, 1, 2)),
                  {"--map-by", "ppr:2:numa:PE=1", "--bind-to", "core"}));
  // 3 ranks on 2 x 4 cores: 2 on the first node, 1 on the second, 2 cores each.
  EXPECT_TRUE(has(mpirun_command(machine(3, 8, 2, 4)), {"--map-by", "ppr:2:numa:PE=2"}));
  // Unequal NUMA nodes (1 and 7 cores) too small for a block: rank order over the cores.
  EXPECT_TRUE(
      has(mpirun_command(machine(4, 8, 2, 1)), {"--map-by", "slot:PE=2", "--bind-to", "core"}));
  // Without topology (0s): the CPUs as cores of one NUMA node.
  EXPECT_TRUE(
      has(mpirun_command(options(2, 8)), {"--map-by", "ppr:2:numa:PE=4", "--bind-to", "core"}));
}

TEST(LaunchBinding, DefaultIsNoBindingWhenOversubscribed) {
  auto o = machine(4, 2, 1, 2);
  EXPECT_EQ(resolve_bind(o), "none");
  auto cmd = mpirun_command(o);
  EXPECT_TRUE(has(cmd, {"--oversubscribe", "--bind-to", "none"}));
  EXPECT_FALSE(has(cmd, {"--map-by"}));
  EXPECT_NE(describe_binding(o).find("more ranks than cores: not bound"), std::string::npos);
  // Hardware threads are not cores: 4 ranks on 2 cores of 2 threads each
  // oversubscribe OpenMPI's slots.
  auto ht = machine(4, 2, 1, 2);
  ht.cores = 4;
  EXPECT_TRUE(has(mpirun_command(ht), {"--oversubscribe", "--bind-to", "none"}));
}

TEST(LaunchBinding, ExplicitPolicies) {
  auto o = machine(8, 112, 2, 56);
  o.bind = "none";
  EXPECT_TRUE(has(mpirun_command(o), {"--bind-to", "none"}));
  EXPECT_FALSE(has(mpirun_command(o), {"--map-by"}));
  EXPECT_EQ(describe_binding(o), "binding none: 8 ranks, 112 cores in 2 NUMA node(s), not bound");
  o.bind = "numa";
  EXPECT_TRUE(has(mpirun_command(o), {"--map-by", "ppr:4:numa", "--bind-to", "numa"}));
  // NUMA binding with more ranks than cores: allowed, overloading the node.
  auto over = machine(4, 2, 1, 2);
  over.bind = "numa";
  auto cmd = mpirun_command(over);
  EXPECT_TRUE(has(cmd, {"--oversubscribe"}));
  EXPECT_TRUE(has(cmd, {"--map-by", "ppr:4:numa", "--bind-to", "numa:overload-allowed"}));
}

TEST(LaunchBinding, Refusals) {
  auto o = machine(4, 2, 1, 2);
  o.bind = "cores";
  try {
    mpirun_command(o);
    FAIL() << "--bind cores with 4 ranks on 2 cores accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "4 ranks do not fit on 2 cores (use --bind numa or --bind none)"),
              std::string::npos)
        << e.what();
  }
  // kolos run checks its options before it looks at the machine: then only
  // the policy's name is checked.
  LaunchOptions unknown = options(4, 0);
  unknown.bind = "cores";
  EXPECT_NO_THROW(mpirun_command(unknown));
  unknown.bind = "socket";
  EXPECT_THROW(mpirun_command(unknown), UsageError);
  o.bind = "socket";
  try {
    mpirun_command(o);
    FAIL() << "--bind socket accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--bind must be none, cores or numa, got `socket`"),
              std::string::npos);
  }
}

TEST(Launch, RejectsFewerThanOneRank) {
  for (int n : {0, -3}) {
    try {
      mpirun_command(options(n, 2));
      FAIL() << "no error for -n " << n;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("-n must be at least 1, got " + std::to_string(n)),
                std::string::npos);
    }
  }
}

}  // namespace
}  // namespace kolos::cli
