#include "launch.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "kolos/config.h"
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
  EXPECT_EQ(has(cmd, {"--mca", "pml", "ucx"}), static_cast<bool>(KOLOS_WITH_UCX));
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
  EXPECT_EQ(has(mpirun_command(options(2, 4)), {"--mca", "pml", "ucx"}),
            static_cast<bool>(KOLOS_WITH_UCX));
  LaunchOptions forced = options(2, 2);
  forced.ucx = true;
  EXPECT_EQ(has(mpirun_command(forced), {"--mca", "pml", "ucx"}), static_cast<bool>(KOLOS_WITH_UCX));
}

TEST(Launch, NoUcxOnRequest) {
  LaunchOptions o = options(2, 8);
  o.no_ucx = true;
  EXPECT_FALSE(has(mpirun_command(o), {"--mca", "pml", "ucx"}));
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
