// check_locality over multi-node layouts: node lists, NVLink domains and
// OpenMPI hostfiles under block mapping.
#include "kolos/topology/locality.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "error_of.h"
#include "kolos/core/error.h"
#include "kolos/topology/hostfile.h"

namespace kolos::topology {
namespace {

// NODES x PER_NODE ranks, block-mapped: rank r on "node<r / PER_NODE>".
std::vector<std::string> block(int nodes, int per_node) {
  std::vector<std::string> out;
  for (int n = 0; n < nodes; ++n) {
    for (int s = 0; s < per_node; ++s) out.push_back("node" + std::to_string(n));
  }
  return out;
}

MeshShape mesh(int64_t pp, int64_t dp, int64_t sp, int64_t tp) { return MeshShape{pp, dp, sp, tp}; }

TEST(Locality, Tp8OnTwoNodesOfEightStaysInside) {
  const auto r = check_locality(mesh(1, 2, 1, 8), block(2, 8), {}, /*strict=*/true);
  EXPECT_TRUE(r.findings.empty()) << r.summary();
  EXPECT_EQ(r.nodes, 2);
  EXPECT_FALSE(r.pp_crosses_nodes);
  EXPECT_NE(r.summary().find("tp and sp groups stay inside one node"), std::string::npos);
}

TEST(Locality, Tp16CrossesNodes) {
  const auto r = check_locality(mesh(1, 1, 1, 16), block(2, 8));
  ASSERT_EQ(r.findings.size(), 1u);
  const LocalityFinding& f = r.findings[0];
  EXPECT_EQ(f.axis, "tp");
  EXPECT_TRUE(f.crosses_nodes);
  EXPECT_EQ(f.hosts, (std::vector<std::string>{"node0", "node1"}));
  EXPECT_EQ(f.ranks.size(), 16u);
  EXPECT_NE(
      f.message.find("tp group of ranks 0-15 crosses nodes: node0 (ranks 0-7), node1 (ranks 8-15)"),
      std::string::npos)
      << f.message;
  EXPECT_EQ(r.warnings().size(), 1u);
  // Strict: refused, naming the group's ranks and hosts.
  const std::string e = testing::message_of<ConfigError>(
      [] { check_locality(mesh(1, 1, 1, 16), block(2, 8), {}, true); });
  EXPECT_NE(
      e.find("locality (strict): tp group of ranks 0-15 crosses nodes: node0 (ranks 0-7), node1"),
      std::string::npos)
      << e;
}

TEST(Locality, TpThatDoesNotDivideTheNodeCrossesOnlyWhereItStraddles) {
  // 3 nodes x 4 ranks, tp 6: groups {0-5} and {6-11} both straddle.
  const auto r = check_locality(mesh(1, 2, 1, 6), block(3, 4));
  ASSERT_EQ(r.findings.size(), 2u);
  EXPECT_EQ(r.findings[0].hosts, (std::vector<std::string>{"node0", "node1"}));
  EXPECT_EQ(r.findings[1].hosts, (std::vector<std::string>{"node1", "node2"}));
  // tp 2 on nodes of 4: every group inside.
  EXPECT_TRUE(check_locality(mesh(1, 6, 1, 2), block(3, 4)).findings.empty());
}

TEST(Locality, PipelineCrossesNodesAndTpSpStayInside) {
  // 4 nodes of 8: pp 4 x sp 2 x tp 4: each stage's sp x tp block of 8 ranks is one node.
  const auto r = check_locality(mesh(4, 1, 2, 4), block(4, 8), {}, true);
  EXPECT_TRUE(r.findings.empty()) << r.summary();
  EXPECT_TRUE(r.pp_crosses_nodes);
  EXPECT_NE(r.summary().find("pp crosses nodes, as it should on 4 nodes"), std::string::npos);
  // The same ranks with sp 4 x tp 4 (dp 1, pp 2): sp groups span 2 nodes.
  const auto sp = check_locality(mesh(2, 1, 4, 4), block(4, 8));
  ASSERT_FALSE(sp.findings.empty());
  EXPECT_EQ(sp.findings[0].axis, "sp");
  EXPECT_TRUE(sp.findings[0].crosses_nodes);
  // sp crossing nodes is refused under strict too.
  EXPECT_NE(testing::message_of<ConfigError>([] {
              check_locality(mesh(2, 1, 4, 4), block(4, 8), {}, true);
            }).find("sp group"),
            std::string::npos);
}

TEST(Locality, NvlinkDomainsInsideANode) {
  // 1 node, 8 GPUs in two NVLink domains of 4 (no NVSwitch): tp 8 stays in
  // the node but crosses domains (a warning, even under strict); tp 4 is fine.
  std::vector<std::string> domains;
  for (int r = 0; r < 8; ++r) domains.push_back(r < 4 ? "node0/nvl0" : "node0/nvl1");
  const auto r = check_locality(mesh(1, 1, 1, 8), block(1, 8), domains, /*strict=*/true);
  ASSERT_EQ(r.findings.size(), 1u);
  EXPECT_FALSE(r.findings[0].crosses_nodes);
  EXPECT_TRUE(r.findings[0].crosses_domains);
  EXPECT_NE(r.findings[0].message.find(
                "crosses NVLink domains: node0/nvl0 (ranks 0-3), node0/nvl1 (ranks 4-7)"),
            std::string::npos)
      << r.findings[0].message;
  EXPECT_TRUE(check_locality(mesh(1, 2, 1, 4), block(1, 8), domains, true).findings.empty());
  // Unknown domains (empty labels) say nothing.
  EXPECT_TRUE(check_locality(mesh(1, 1, 1, 8), block(1, 8), std::vector<std::string>(8), true)
                  .findings.empty());
}

TEST(Locality, SizesMustMatch) {
  EXPECT_NE(testing::message_of<ConfigError>([] {
              check_locality(mesh(1, 2, 1, 4), block(1, 4));
            }).find("has 8 ranks but the layout names hosts for 4"),
            std::string::npos);
  EXPECT_NE(testing::message_of<ConfigError>([] {
              check_locality(mesh(1, 1, 1, 4), block(1, 4), {"a"});
            }).find("NVLink domains are given for 1"),
            std::string::npos);
}

TEST(Hostfile, BlockMappingOfSlots) {
  const auto hosts = read_hostfile(
      "# two DGX nodes\n"
      "dgx01 slots=8\n"
      "\n"
      "dgx02 slots=4 max_slots=8   # half of it\n"
      "dgx02 slots=4\n");
  ASSERT_EQ(hosts.size(), 2u);
  EXPECT_EQ(hosts[0].host, "dgx01");
  EXPECT_EQ(hosts[1].slots, 8);
  const auto layout = hosts_by_block(hosts, 16);
  EXPECT_EQ(layout[7], "dgx01");
  EXPECT_EQ(layout[8], "dgx02");
  // The two cases through a hostfile: tp 8 fits, tp 16 crosses.
  EXPECT_TRUE(check_locality(mesh(1, 2, 1, 8), layout, {}, true).findings.empty());
  EXPECT_NE(testing::message_of<ConfigError>([&] {
              check_locality(mesh(1, 1, 1, 16), layout, {}, true);
            }).find("dgx01 (ranks 0-7), dgx02 (ranks 8-15)"),
            std::string::npos);
  // Fewer ranks than slots fill the first host first.
  EXPECT_EQ(hosts_by_block(hosts, 10),
            (std::vector<std::string>{"dgx01", "dgx01", "dgx01", "dgx01", "dgx01", "dgx01", "dgx01",
                                      "dgx01", "dgx02", "dgx02"}));
}

TEST(Hostfile, UnevenNodesFromAFile) {
  // 3 hosts of 6, 4 and 6 slots: tp 4 x dp 4 = 16 ranks; tp groups
  // {4-7} (host a: 4,5; b: 6,7) and {8-11} (b: 8,9; c: 10,11) straddle.
  char name[] = "/tmp/kolos-hostfile.XXXXXX";
  const int fd = mkstemp(name);
  ASSERT_GE(fd, 0);
  close(fd);
  std::ofstream(name) << "a slots=6\nb slots=4\nc slots=6\n";
  const auto layout = hosts_by_block(read_hostfile(name), 16);
  std::remove(name);
  const auto r = check_locality(mesh(1, 4, 1, 4), layout);
  ASSERT_EQ(r.findings.size(), 2u);
  EXPECT_EQ(r.findings[0].ranks, (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(r.findings[1].ranks, (std::vector<int64_t>{8, 9, 10, 11}));
}

TEST(Hostfile, Errors) {
  auto err = [](const std::string& text) {
    try {
      read_hostfile(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(err("a slots=2\nb\n").find("hostfile text:2: `b` has no slots=N"), std::string::npos);
  EXPECT_NE(err("a slots=two\n").find("hostfile text:1: `slots=two` is not a positive number"),
            std::string::npos);
  EXPECT_NE(err("a slots=0\n").find("not a positive number"), std::string::npos);
  EXPECT_NE(err("a cpus=4\n").find("hostfile text:1: unknown `cpus=4`"), std::string::npos);
  EXPECT_NE(err("# nothing\n\n").find("no hosts"), std::string::npos);
  EXPECT_NE(err("/nonexistent/hosts").find("hostfile /nonexistent/hosts: cannot open it"),
            std::string::npos);
  try {
    hosts_by_block({{"a", 2}, {"b", 2}}, 5);
    FAIL() << "5 ranks on 4 slots accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("5 ranks but only 4 slots"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kolos::topology
