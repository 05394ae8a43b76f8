// Binding plans on the fixtures' real hwloc topologies and on this machine.
#include "kolos/topology/binding.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <set>

#include "error_of.h"
#include "kolos/core/error.h"

namespace kolos::topology {
namespace {

const std::string kFixtures = KOLOS_TOPOLOGY_FIXTURES;

const Topology& dgx() {
  static const Topology t = from_hwloc_xml(kFixtures + "/dgx-h100.xml");
  return t;
}
const Topology& cpu() {
  static const Topology t = from_hwloc_xml(kFixtures + "/cpu-2s.xml");
  return t;
}

// Every plan: one binding per rank, non-empty, contiguous within its NUMA
// node's core list, disjoint across ranks, all cores on the rank's node, and
// the PUs exactly those cores' threads.
void expect_valid(const std::vector<RankBinding>& plan, const Topology& t) {
  std::set<int> used;
  for (size_t r = 0; r < plan.size(); ++r) {
    const RankBinding& b = plan[r];
    EXPECT_EQ(b.local_rank, static_cast<int>(r));
    ASSERT_FALSE(b.cores.empty()) << "rank " << r;
    for (size_t i = 1; i < b.cores.size(); ++i)
      EXPECT_EQ(b.cores[i], b.cores[i - 1] + 1) << "rank " << r;
    std::vector<int> pus;
    for (int c : b.cores) {
      EXPECT_TRUE(used.insert(c).second) << "core " << c << " given twice";
      EXPECT_EQ(t.cores[c].numa, b.numa) << "rank " << r << " core " << c;
      pus.insert(pus.end(), t.cores[c].pus.begin(), t.cores[c].pus.end());
    }
    std::sort(pus.begin(), pus.end());
    EXPECT_EQ(b.pus, pus);
  }
}

TEST(Binding, CpuNodeBlocksOfRanksPerNumaNode) {
  // 4 ranks on 2 x 32 cores: ranks 0-1 on NUMA 0, 2-3 on NUMA 1, 16 cores each.
  const auto plan = bindings_for(4, cpu());
  expect_valid(plan, cpu());
  EXPECT_EQ(plan[0].numa, 0);
  EXPECT_EQ(plan[1].numa, 0);
  EXPECT_EQ(plan[2].numa, 1);
  EXPECT_EQ(plan[3].numa, 1);
  for (const auto& b : plan) EXPECT_EQ(b.cores.size(), 16u);
  EXPECT_EQ(plan[1].cores.front(), 16);
  EXPECT_EQ(plan[1].gpu, -1);
  // Core 16 of socket 0: hardware threads 16 and 80.
  EXPECT_EQ(describe(plan[1], cpu()), "rank 1: NUMA node 0, cores 16-31 (CPUs 16-31,80-95)");
}

TEST(Binding, UnevenCountsStayContiguousAndEven) {
  for (int ranks : {1, 2, 3, 5, 7, 31, 33, 63, 64}) {
    SCOPED_TRACE(ranks);
    const auto plan = bindings_for(ranks, cpu());
    expect_valid(plan, cpu());
    // Ranks per NUMA node differ by at most one, and rank order follows node order.
    int on0 = 0;
    for (const auto& b : plan) on0 += b.numa == 0;
    EXPECT_LE(std::abs(on0 - (ranks - on0)), 1);
    for (size_t r = 1; r < plan.size(); ++r) EXPECT_LE(plan[r - 1].numa, plan[r].numa);
    // Cores per rank on one node differ by at most one.
    size_t lo = 1000, hi = 0;
    for (const auto& b : plan) {
      lo = std::min(lo, b.cores.size());
      hi = std::max(hi, b.cores.size());
    }
    if (ranks % 2 == 0) EXPECT_LE(hi - lo, 1u);
  }
  // One rank: the first NUMA node, all of its cores (not the whole machine:
  // memory and threads stay on one node).
  const auto one = bindings_for(1, cpu());
  EXPECT_EQ(one[0].numa, 0);
  EXPECT_EQ(one[0].cores.size(), 32u);
}

TEST(Binding, DgxOneRankPerGpuOnItsNumaNode) {
  const auto plan = bindings_for(8, dgx(), {true});
  expect_valid(plan, dgx());
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(plan[r].gpu, r);
    EXPECT_EQ(plan[r].numa, dgx().gpus[r].numa);
    EXPECT_EQ(plan[r].cores.size(), 14u);  // 56 cores of a socket for its 4 GPUs
  }
  EXPECT_EQ(describe(plan[5], dgx()),
            "rank 5: NUMA node 1, cores 70-83 (CPUs 70-83,182-195), GPU 5 0000:ab:00.0");
  EXPECT_EQ(binding_for(5, 8, dgx(), {true}).cores, plan[5].cores);
  // 2 ranks with GPUs 0 and 1: both on NUMA node 0 (their GPUs' node), not spread.
  const auto two = bindings_for(2, dgx(), {true});
  EXPECT_EQ(two[0].numa, 0);
  EXPECT_EQ(two[1].numa, 0);
  EXPECT_EQ(two[1].cores.size(), 28u);
  // Without GPUs, 2 ranks spread over both sockets.
  const auto spread = bindings_for(2, dgx());
  EXPECT_EQ(spread[1].numa, 1);
}

TEST(Binding, Refusals) {
  std::string e = testing::message_of([] { bindings_for(65, cpu()); });
  EXPECT_NE(e.find("65 ranks on cpu01"), std::string::npos) << e;
  EXPECT_NE(e.find("64 cores"), std::string::npos) << e;
  EXPECT_NE(e.find("--bind none"), std::string::npos) << e;
  e = testing::message_of([] { bindings_for(9, dgx(), {true}); });
  EXPECT_NE(e.find("9 ranks on dgx01"), std::string::npos) << e;
  EXPECT_NE(e.find("8 GPU(s)"), std::string::npos) << e;
  e = testing::message_of([] { bindings_for(1, cpu(), {true}); });
  EXPECT_NE(e.find("0 GPU(s)"), std::string::npos) << e;
  e = testing::message_of([] { bindings_for(0, cpu()); });
  EXPECT_NE(e.find("at least 1, got 0"), std::string::npos) << e;
  e = testing::message_of([] { binding_for(4, 4, cpu()); });
  EXPECT_NE(e.find("local rank 4 is outside 0..3"), std::string::npos) << e;
}

TEST(Binding, GpusCrowdedOntoOneSmallNumaNodeAreRefused) {
  // A node whose 8 GPUs all hang off NUMA node 0, which has 4 cores.
  Topology t = cpu();
  t.hostname = "crowded";
  t.numa_nodes[0].cores.resize(4);
  for (auto& c : t.cores) {
    if (c.numa == 0 && c.index >= 4) c.numa = 1, t.numa_nodes[1].cores.push_back(c.index);
  }
  std::sort(t.numa_nodes[1].cores.begin(), t.numa_nodes[1].cores.end());
  for (int g = 0; g < 8; ++g) {
    Gpu gpu;
    gpu.index = g;
    gpu.numa = 0;
    gpu.pci_bus_id = "0000:0" + std::to_string(g) + ":00.0";
    t.gpus.push_back(gpu);
  }
  const std::string e = testing::message_of([&] { bindings_for(8, t, {true}); });
  EXPECT_NE(e.find("local ranks 0,1,2,3,4,5,6,7 (one per GPU) of crowded"), std::string::npos) << e;
  EXPECT_NE(e.find("NUMA node 0"), std::string::npos) << e;
  EXPECT_NE(e.find("4 cores for their 8 ranks"), std::string::npos) << e;
  EXPECT_NO_THROW(bindings_for(4, t, {true}));
}

TEST(Binding, ThisMachine) {
  const Topology t = discover();
  const int cores = static_cast<int>(t.cores.size());
  for (int ranks = 1; ranks <= cores; ++ranks) expect_valid(bindings_for(ranks, t), t);
  EXPECT_NE(testing::message_of([&] {
              bindings_for(cores + 1, t);
            }).find(std::to_string(cores) + " cores"),
            std::string::npos);
}

}  // namespace
}  // namespace kolos::topology
