// The cluster file and the calibration cache: values, and every error naming
// file, line and field.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "kolos/core/error.h"
#include "kolos/planner/cluster.h"
#include "kolos/planner/cost_model.h"

using namespace kolos::planner;

namespace {

// Line 1 is the comment, line 2 the [cluster] header, keys from line 3.
const std::vector<std::string> kKeys = {
    "name = \"test\"",          "nodes = 2",
    "devices_per_node = 4",     "device_memory = \"16GiB\"",
    "peak_flops = 100e12",      "memory_bandwidth = 1e12",
    "intra_bandwidth = 100e9",  "intra_latency = 2e-6",
    "inter_bandwidth = 10e9",   "inter_latency = 8e-6",
    "nvlink_domain = 4",        "host_bandwidth = 16e9",
    "host_memory = \"256GiB\"",
};

std::string cluster_text(int skip = -1) {
  std::string text = "# test cluster\n[cluster]\n";
  for (int i = 0; i < static_cast<int>(kKeys.size()); ++i) {
    if (i != skip) text += kKeys[i] + "\n";
  }
  return text;
}

std::string error_of(const std::string& text) {
  try {
    parse_cluster(text, "c.toml");
  } catch (const kolos::ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(PlannerCluster, ReadsEveryField) {
  const ClusterFile f = parse_cluster(cluster_text(), "c.toml");
  const Cluster& c = f.cluster;
  EXPECT_EQ(c.name, "test");
  EXPECT_EQ(c.nodes, 2);
  EXPECT_EQ(c.devices_per_node, 4);
  EXPECT_EQ(c.devices(), 8);
  EXPECT_DOUBLE_EQ(c.device_memory, 16.0 * 1024 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(c.peak_flops, 100e12);
  EXPECT_DOUBLE_EQ(c.memory_bandwidth, 1e12);
  EXPECT_DOUBLE_EQ(c.intra_bandwidth, 100e9);
  EXPECT_DOUBLE_EQ(c.intra_latency, 2e-6);
  EXPECT_DOUBLE_EQ(c.inter_bandwidth, 10e9);
  EXPECT_DOUBLE_EQ(c.inter_latency, 8e-6);
  EXPECT_EQ(c.nvlink_domain, 4);
  EXPECT_DOUBLE_EQ(c.host_bandwidth, 16e9);
  EXPECT_DOUBLE_EQ(c.host_memory, 256.0 * 1024 * 1024 * 1024);
  // No [rates]: the assumed fractions of the peaks.
  EXPECT_DOUBLE_EQ(f.rates.gemm_flops, 0.8 * 100e12);
  EXPECT_DOUBLE_EQ(f.rates.attention_flops, 0.4 * 100e12);
  EXPECT_DOUBLE_EQ(f.rates.elementwise_bytes, 0.8 * 1e12);
  EXPECT_NE(f.rates.source.find("assumed"), std::string::npos);
}

TEST(PlannerCluster, EachMissingFieldNamesFileLineAndField) {
  for (int i = 0; i < static_cast<int>(kKeys.size()); ++i) {
    const std::string key = kKeys[i].substr(0, kKeys[i].find(' '));
    const std::string message = error_of(cluster_text(i));
    SCOPED_TRACE(key);
    // The line of the [cluster] header, where the key belongs.
    EXPECT_EQ(message.rfind("c.toml:2: [cluster] has no `" + key + "`", 0), 0u) << message;
  }
}

TEST(PlannerCluster, RatesTableNeedsEachOfItsFields) {
  const std::string rates = "\n[rates]\ngemm_flops = 50e12\nattention_flops = 20e12\n";
  const std::string message = error_of(cluster_text() + rates);
  // [rates] is on line 17 (15 lines of [cluster], then an empty line).
  EXPECT_EQ(message.rfind("c.toml:17: [rates] has no `elementwise_bytes`", 0), 0u) << message;
  const ClusterFile f =
      parse_cluster(cluster_text() + rates + "elementwise_bytes = 5e11\n", "c.toml");
  EXPECT_DOUBLE_EQ(f.rates.gemm_flops, 50e12);
  EXPECT_DOUBLE_EQ(f.rates.elementwise_bytes, 5e11);
}

TEST(PlannerCluster, WrongTypesRangesAndUnknownKeys) {
  std::string text = cluster_text();
  text.replace(text.find("nodes = 2"), 9, "nodes = \"two\"");
  EXPECT_EQ(error_of(text).rfind("c.toml:4: cluster.nodes: expected an integer", 0), 0u)
      << error_of(text);
  text = cluster_text();
  text.replace(text.find("peak_flops = 100e12"), 19, "peak_flops = -1.0");
  EXPECT_EQ(error_of(text).rfind("c.toml:7: cluster.peak_flops: -1.0 is out of range", 0), 0u)
      << error_of(text);
  text = cluster_text();
  text.replace(text.find("device_memory = \"16GiB\""), 23, "device_memory = \"16 parsecs\"");
  EXPECT_EQ(error_of(text).rfind("c.toml:6: cluster.device_memory:", 0), 0u) << error_of(text);
  const std::string unknown = error_of(cluster_text() + "nvlink_domian = 4\n");
  EXPECT_EQ(unknown.rfind("c.toml:16: cluster.nvlink_domian: unknown key", 0), 0u) << unknown;
  EXPECT_NE(unknown.find("Did you mean `nvlink_domain`?"), std::string::npos) << unknown;
  EXPECT_EQ(error_of("[nodes]\nx = 1\n").rfind("c.toml:1: `nodes`: unknown table", 0), 0u);
  EXPECT_EQ(error_of("# empty\n").rfind("c.toml:1: no [cluster] table", 0), 0u);
  EXPECT_EQ(error_of("[cluster\n").rfind("c.toml:1: malformed TOML", 0), 0u)
      << error_of("[cluster\n");
}

TEST(PlannerCluster, MissingFileIsNamed) {
  try {
    load_cluster("/nonexistent/cluster.toml");
    FAIL() << "no error";
  } catch (const kolos::ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("/nonexistent/cluster.toml: cannot open", 0), 0u);
  }
}

TEST(PlannerCluster, TheExampleClusterReads) {
  const ClusterFile f = load_cluster(KOLOS_SOURCE_DIR "/examples/clusters/a100-80gb-ib.toml");
  EXPECT_EQ(f.cluster.devices_per_node, 8);
  EXPECT_EQ(f.cluster.nvlink_domain, 8);
  EXPECT_DOUBLE_EQ(f.cluster.device_memory, 80.0 * 1024 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(f.cluster.inter_bandwidth, 25e9);  // 200 Gb/s per GPU
}

TEST(PlannerCluster, CalibrationReplacesRatesAndAddsMeasuredCollectives) {
  const ClusterFile f = parse_cluster(cluster_text(), "c.toml");
  const std::string cal =
      "[calibration]\nhost = \"node-1\"\ngemm_flops = 70e12\nattention_flops = 30e12\n"
      "elementwise_bytes = 7e11\n"
      "[[calibration.collective]]\nop = \"all_reduce\"\ngroup = 4\nalpha = 1e-5\nbeta = 5e10\n";
  const MachineRates r = parse_calibration(cal, "cal.toml", f.rates);
  EXPECT_DOUBLE_EQ(r.gemm_flops, 70e12);
  EXPECT_EQ(r.source, "cal.toml");
  ASSERT_EQ(r.measured.size(), 1u);
  const Machine m{f.cluster, r};
  // The measured pair replaces the ring model inside the domain...
  EXPECT_DOUBLE_EQ(collective_time(m, Collective::kAllReduce, 1e9, 4, 1), 1e-5 + 1e9 / 5e10);
  // ...and only for its (op, size).
  EXPECT_DOUBLE_EQ(collective_time(m, Collective::kAllReduce, 1e9, 2, 1), 2 * 2e-6 + 1e9 / 100e9);
  std::string bad = cal;
  bad.replace(bad.find("all_reduce"), 10, "allreduce!");
  try {
    parse_calibration(bad, "cal.toml", f.rates);
    FAIL() << "no error";
  } catch (const kolos::ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("cal.toml:7: calibration.collective.op:", 0), 0u)
        << e.what();
  }
}

TEST(PlannerCluster, CalibrationWrittenReadsBackWithItsCurveAndCollectives) {
  MachineRates r;
  r.gemm_flops = 4e10;
  r.attention_flops = 1.5e10;
  r.elementwise_bytes = 3e9;
  r.op_seconds = 4e-6;
  r.block_factor = 1.25;
  r.block_fixed = 3.5e-3;
  r.gemm_curve = {{6.5e4, 2e9}, {2.1e9, 4e10}};
  r.measured[{Collective::kAllGather, 2}] = {2.5e-5, 3e9};
  r.measured[{Collective::kSendRecv, 2}] = {1e-5, 6e9};
  const MachineRates back = parse_calibration(format_calibration("node-7", r), "c.toml", {});
  EXPECT_DOUBLE_EQ(back.gemm_flops, 4e10);
  EXPECT_DOUBLE_EQ(back.op_seconds, 4e-6);
  EXPECT_DOUBLE_EQ(back.block_factor, 1.25);
  EXPECT_DOUBLE_EQ(back.block_fixed, 3.5e-3);
  ASSERT_EQ(back.gemm_curve.size(), 2u);
  EXPECT_DOUBLE_EQ(back.gemm_curve[1].first, 2.1e9);
  ASSERT_EQ(back.measured.size(), 2u);
  EXPECT_DOUBLE_EQ((back.measured.at({Collective::kSendRecv, 2}).beta), 6e9);
  // The curve: its ends outside, log-log between them.
  EXPECT_DOUBLE_EQ(back.gemm_rate(1e3), 2e9);
  EXPECT_DOUBLE_EQ(back.gemm_rate(1e12), 4e10);
  const double mid = std::sqrt(6.5e4 * 2.1e9);
  EXPECT_NEAR(back.gemm_rate(mid), std::sqrt(2e9 * 4e10), 1e-3 * 4e10);
  // No curve: the single rate.
  MachineRates flat;
  flat.gemm_flops = 7;
  EXPECT_DOUBLE_EQ(flat.gemm_rate(1e9), 7);
}

TEST(PlannerCluster, ACalibrationCurveOutOfOrderIsRefusedWithItsLine) {
  const std::string cal =
      "[calibration]\nhost = \"h\"\ngemm_flops = 1e10\nattention_flops = 1e10\n"
      "elementwise_bytes = 1e9\ncollective = []\n"
      "[[calibration.gemm]]\nflops = 1e9\nrate = 1e10\n"
      "[[calibration.gemm]]\nflops = 1e6\nrate = 1e9\n";
  try {
    parse_calibration(cal, "cal.toml", {});
    FAIL() << "no error";
  } catch (const kolos::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cal.toml:11: calibration.gemm.flops: rows must be in "
                                         "ascending order"),
              std::string::npos)
        << e.what();
  }
}

// With fewer cores than ranks, a collective waits for its peers by the
// pattern its layer issues it in: its own group's size, a tensor grid's
// size (rows and columns alternate), a ring's size (hops). The tables read
// back as written; a row without `pattern` is a group row (older files).
TEST(PlannerCluster, SyncTablesByPatternReadBackAndPriceTheirCollectives) {
  const ClusterFile f = parse_cluster(cluster_text(), "c.toml");
  MachineRates r = f.rates;
  r.cores = 2;  // 4 devices per node
  r.sync = {{2, 1e-5}, {4, 2e-5}};
  r.grid_sync = {{4, 4e-4}};
  r.ring_sync = {{4, 1.5e-3}};
  const MachineRates back = parse_calibration(format_calibration("h", r), "c.toml", f.rates);
  EXPECT_EQ(back.sync, r.sync);
  EXPECT_EQ(back.grid_sync, r.grid_sync);
  EXPECT_EQ(back.ring_sync, r.ring_sync);
  const Machine m{f.cluster, back};
  Machine alone = m;  // no waits: the alpha-beta time
  alone.rates.cores = 0;
  const auto base = [&](Collective op, int64_t n) { return collective_time(alone, op, 1e6, n, 1); };
  EXPECT_DOUBLE_EQ(collective_time(m, Collective::kAllGather, 1e6, 2, 1),
                   1e-5 + base(Collective::kAllGather, 2));
  EXPECT_DOUBLE_EQ(
      collective_time(m, Collective::kAllGather, 1e6, 2, 1, 0, {SyncPattern::kGrid, 4}),
      4e-4 + base(Collective::kAllGather, 2));
  EXPECT_DOUBLE_EQ(collective_time(m, Collective::kSendRecv, 1e6, 4, 1, 0, {SyncPattern::kRing, 4}),
                   1.5e-3 + base(Collective::kSendRecv, 4));
  // A larger grid than measured: the largest measured size below it.
  EXPECT_DOUBLE_EQ(
      collective_time(m, Collective::kAllReduce, 1e6, 2, 1, 0, {SyncPattern::kGrid, 8}),
      4e-4 + base(Collective::kAllReduce, 2));
  // A ring smaller than every measured ring: its group's own wait.
  EXPECT_DOUBLE_EQ(collective_time(m, Collective::kSendRecv, 1e6, 2, 1, 0, {SyncPattern::kRing, 2}),
                   1e-5 + base(Collective::kSendRecv, 2));
  // No grid table (a calibration before them): the group's own wait.
  Machine old = m;
  old.rates.grid_sync.clear();
  EXPECT_DOUBLE_EQ(
      collective_time(old, Collective::kAllGather, 1e6, 2, 1, 0, {SyncPattern::kGrid, 4}),
      1e-5 + base(Collective::kAllGather, 2));
  const std::string head =
      "[calibration]\nhost = \"h\"\ngemm_flops = 1e10\nattention_flops = 1e10\n"
      "elementwise_bytes = 1e9\n";
  const MachineRates plain =
      parse_calibration(head + "[[calibration.sync]]\ngroup = 4\nseconds = 3e-5\n", "c.toml", {});
  EXPECT_EQ(plain.sync, (std::map<int64_t, double>{{4, 3e-5}}));
  try {
    parse_calibration(head + "[[calibration.sync]]\npattern = \"mesh\"\ngroup = 4\nseconds = 0\n",
                      "cal.toml", {});
    FAIL() << "no error";
  } catch (const kolos::ConfigError& e) {
    EXPECT_NE(
        std::string(e.what()).find("cal.toml:7: calibration.sync.pattern: \"mesh\" is not one "
                                   "of"),
        std::string::npos)
        << e.what();
  }
}
