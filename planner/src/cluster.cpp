// The cluster file and the calibration cache, read with toml11 directly:
// the core's ConfigSection serves a run's document (its ConfigDocument is
// private to core/src/config), and a cluster file is not one. Messages keep
// the core's shape: "file:line: table.key: what was found; what is valid".
#include "kolos/planner/cluster.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>

#include <toml.hpp>

#include "kolos/core/error.h"
#include "kolos/core/settings.h"
#include "kolos/planner/tune.h"

namespace kolos::planner {

const char* to_string(Collective op) {
  switch (op) {
    case Collective::kAllReduce:
      return "all_reduce";
    case Collective::kAllGather:
      return "all_gather";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kAllToAll:
      return "all_to_all";
    case Collective::kSendRecv:
      return "send_recv";
  }
  return "?";
}

MachineRates MachineRates::assumed(const Cluster& c) {
  MachineRates r;
  r.gemm_flops = 0.80 * c.peak_flops;
  r.attention_flops = 0.40 * c.peak_flops;
  r.elementwise_bytes = 0.80 * c.memory_bandwidth;
  r.source = "assumed (fractions of " + (c.source.empty() ? c.name : c.source) + "'s peaks)";
  return r;
}

double MachineRates::gemm_rate(double flops) const {
  if (gemm_curve.empty()) return gemm_flops;
  if (flops <= gemm_curve.front().first) return gemm_curve.front().second;
  if (flops >= gemm_curve.back().first) return gemm_curve.back().second;
  for (size_t i = 1; i < gemm_curve.size(); ++i) {
    const auto& [f1, r1] = gemm_curve[i];
    if (flops > f1) continue;
    const auto& [f0, r0] = gemm_curve[i - 1];
    const double t = std::log(flops / f0) / std::log(f1 / f0);
    return std::exp(std::log(r0) + t * (std::log(r1) - std::log(r0)));
  }
  return gemm_curve.back().second;
}

double MachineRates::sync_seconds(const std::map<int64_t, double>& table, int64_t group) {
  if (table.empty()) return 0;
  auto it = table.upper_bound(group);
  if (it == table.begin()) return it->second;
  return std::prev(it)->second;
}

std::string format_calibration(const std::string& host, const MachineRates& r) {
  std::ostringstream out;
  out.precision(9);
  out << "# Measured by `kolos calibrate` (docs/planner.md, \"Calibrating this machine\").\n"
      << "[calibration]\nhost = \"" << host << "\"\n"
      << "gemm_flops = " << r.gemm_flops << "\nattention_flops = " << r.attention_flops
      << "\nelementwise_bytes = " << r.elementwise_bytes << "\nop_seconds = " << r.op_seconds
      << "\nblock_factor = " << r.block_factor << "\nblock_fixed = " << r.block_fixed
      << "\nstep_factor = " << r.step_factor
      << "\ncores = " << r.cores << "\n";
  if (r.spread > 0) out << "spread = " << r.spread << "\n";
  for (const auto& [flops, rate] : r.gemm_curve) {
    out << "\n[[calibration.gemm]]\nflops = " << flops << "\nrate = " << rate << "\n";
  }
  for (const auto& [pattern, table] :
       {std::pair{"group", &r.sync}, {"grid", &r.grid_sync}, {"ring", &r.ring_sync}}) {
    for (const auto& [group, seconds] : *table) {
      out << "\n[[calibration.sync]]\npattern = \"" << pattern << "\"\ngroup = " << group
          << "\nseconds = " << seconds << "\n";
    }
  }
  for (const auto& [family, ratios] : r.feedback) {
    out << "\n[[calibration.feedback]]\nfamily = \"" << family << "\"\nratios = [";
    for (size_t i = 0; i < ratios.size(); ++i) out << (i ? ", " : "") << ratios[i];
    out << "]\n";
  }
  for (const auto& [key, ab] : r.measured) {
    out << "\n[[calibration.collective]]\nop = \"" << to_string(key.first)
        << "\"\ngroup = " << key.second << "\nalpha = " << ab.alpha << "\nbeta = " << ab.beta
        << "\n";
  }
  return out.str();
}

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

toml::value parse_toml(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  try {
    return toml::parse(in, name);
  } catch (const toml::exception& e) {
    throw ConfigError(name + ":" + std::to_string(e.location().line()) + ": malformed TOML\n" +
                      e.what());
  } catch (const std::exception& e) {
    throw ConfigError(name + ": malformed TOML\n" + e.what());
  }
}

// One table of a planner file, read key by key: each read records the key,
// so that unknown() can name the first key nobody read.
class Table {
 public:
  Table(const toml::value& table, std::string file, std::string path)
      : table_(table), file_(std::move(file)), path_(std::move(path)) {}

  [[noreturn]] void fail_at(const toml::value& v, const std::string& key,
                            const std::string& what) const {
    throw ConfigError(file_ + ":" + std::to_string(v.location().line()) + ": " + path_ + "." + key +
                      ": " + what);
  }

  // The key's value, or nullptr when absent (an optional key).
  const toml::value* find(const std::string& key) {
    known_.push_back(key);
    const auto& t = table_.as_table();
    const auto it = t.find(key);
    return it == t.end() ? nullptr : &it->second;
  }

  const toml::value& get(const std::string& key) {
    known_.push_back(key);
    const auto& t = table_.as_table();
    const auto it = t.find(key);
    if (it == t.end()) {
      throw ConfigError(file_ + ":" + std::to_string(table_.location().line()) + ": [" + path_ +
                        "] has no `" + key + "`; the planner needs it (docs/planner.md, " +
                        "\"The cluster file\")");
    }
    return it->second;
  }

  double number(const std::string& key, bool positive = true) {
    const toml::value& v = get(key);
    double x = 0;
    if (v.is_floating()) {
      x = v.as_floating();
    } else if (v.is_integer()) {
      x = static_cast<double>(v.as_integer());
    } else {
      fail_at(v, key, "expected a number, found " + toml::format(v));
    }
    if (!std::isfinite(x) || (positive ? x <= 0 : x < 0)) {
      fail_at(v, key,
              toml::format(v) + " is out of range; it must be " + (positive ? "> 0" : ">= 0"));
    }
    return x;
  }

  int64_t integer(const std::string& key) {
    const toml::value& v = get(key);
    if (!v.is_integer()) fail_at(v, key, "expected an integer, found " + toml::format(v));
    if (v.as_integer() < 1) fail_at(v, key, toml::format(v) + " is out of range; it must be >= 1");
    return v.as_integer();
  }

  std::string string(const std::string& key) {
    const toml::value& v = get(key);
    if (!v.is_string()) fail_at(v, key, "expected a string, found " + toml::format(v));
    return v.as_string().str;
  }

  // "80GiB" (kolos's byte sizes) or a number of bytes.
  double bytes(const std::string& key) {
    const toml::value& v = get(key);
    if (v.is_string()) {
      try {
        const int64_t b = parse_byte_size(v.as_string().str);
        if (b <= 0) fail_at(v, key, "0 is out of range; it must be > 0");
        return static_cast<double>(b);
      } catch (const std::invalid_argument& e) {
        fail_at(v, key, toml::format(v) + ": " + e.what());
      }
    }
    known_.pop_back();
    return number(key);
  }

  void unknown() const {
    for (const auto& [key, v] : table_.as_table()) {
      bool ok = false;
      for (const auto& k : known_) ok = ok || k == key;
      if (!ok) {
        const std::string match = closest_match(key, known_);
        fail_at(v, key,
                "unknown key; valid: " + join(known_, ", ") +
                    (match.empty() ? "" : ". Did you mean `" + match + "`?"));
      }
    }
  }

 private:
  const toml::value& table_;
  std::string file_, path_;
  std::vector<std::string> known_;
};

const toml::value* find_table(const toml::value& root, const std::string& name,
                              const std::string& file) {
  const auto& t = root.as_table();
  const auto it = t.find(name);
  if (it == t.end()) return nullptr;
  if (!it->second.is_table()) {
    throw ConfigError(file + ":" + std::to_string(it->second.location().line()) + ": `" + name +
                      "` must be a table ([" + name + "])");
  }
  return &it->second;
}

void check_top_level(const toml::value& root, const std::string& file,
                     const std::vector<std::string>& valid) {
  for (const auto& [key, v] : root.as_table()) {
    bool ok = false;
    for (const auto& k : valid) ok = ok || k == key;
    if (!ok) {
      throw ConfigError(file + ":" + std::to_string(v.location().line()) + ": `" + key +
                        "`: unknown table; valid: " + join(valid, ", "));
    }
  }
}

void read_rates(Table& t, MachineRates& r) {
  r.gemm_flops = t.number("gemm_flops");
  r.attention_flops = t.number("attention_flops");
  r.elementwise_bytes = t.number("elementwise_bytes");
}

}  // namespace

ClusterFile parse_cluster(const std::string& text, const std::string& name) {
  const toml::value root = parse_toml(text, name);
  check_top_level(root, name, {"cluster", "rates"});
  const toml::value* ct = find_table(root, "cluster", name);
  if (ct == nullptr) {
    throw ConfigError(name + ":1: no [cluster] table; a cluster file needs one (docs/planner.md)");
  }
  ClusterFile out;
  Cluster& c = out.cluster;
  c.source = name;
  Table t(*ct, name, "cluster");
  c.name = t.string("name");
  c.nodes = t.integer("nodes");
  c.devices_per_node = t.integer("devices_per_node");
  c.device_memory = t.bytes("device_memory");
  c.peak_flops = t.number("peak_flops");
  c.memory_bandwidth = t.number("memory_bandwidth");
  c.intra_bandwidth = t.number("intra_bandwidth");
  c.intra_latency = t.number("intra_latency", false);
  c.inter_bandwidth = t.number("inter_bandwidth");
  c.inter_latency = t.number("inter_latency", false);
  c.nvlink_domain = t.integer("nvlink_domain");
  c.host_bandwidth = t.number("host_bandwidth");
  c.host_memory = t.bytes("host_memory");
  t.unknown();
  out.rates = MachineRates::assumed(c);
  if (const toml::value* rt = find_table(root, "rates", name)) {
    Table r(*rt, name, "rates");
    read_rates(r, out.rates);
    r.unknown();
    out.rates.source = name + " [rates]";
  }
  return out;
}

ClusterFile load_cluster(const std::string& path) { return parse_cluster(read_file(path), path); }

MachineRates parse_calibration(const std::string& text, const std::string& name,
                               MachineRates rates) {
  const toml::value root = parse_toml(text, name);
  check_top_level(root, name, {"calibration"});
  const toml::value* ct = find_table(root, "calibration", name);
  if (ct == nullptr) throw ConfigError(name + ":1: no [calibration] table");
  Table t(*ct, name, "calibration");
  t.string("host");
  read_rates(t, rates);
  if (t.find("op_seconds") != nullptr) rates.op_seconds = t.number("op_seconds", false);
  if (t.find("block_factor") != nullptr) rates.block_factor = t.number("block_factor");
  if (t.find("block_fixed") != nullptr) rates.block_fixed = t.number("block_fixed", false);
  if (t.find("step_factor") != nullptr) rates.step_factor = t.number("step_factor");
  if (t.find("cores") != nullptr) rates.cores = t.number("cores", false);
  if (t.find("spread") != nullptr) rates.spread = t.number("spread", false);
  // Each row of an optional array of tables `key`, as a Table of its own.
  const auto rows = [&](const std::string& key, const auto& read) {
    const toml::value* list = t.find(key);
    if (list == nullptr) return;
    if (!list->is_array()) t.fail_at(*list, key, "expected an array of tables");
    for (const toml::value& row : list->as_array()) {
      if (!row.is_table()) t.fail_at(row, key, "expected a table");
      Table r(row, name, "calibration." + key);
      read(r);
      r.unknown();
    }
  };
  // [[calibration.gemm]]: flops (of one product), rate (FLOP/s).
  rates.gemm_curve.clear();
  rows("gemm", [&](Table& r) {
    const double flops = r.number("flops");
    const double rate = r.number("rate");
    if (!rates.gemm_curve.empty() && flops <= rates.gemm_curve.back().first) {
      r.fail_at(r.get("flops"), "flops", "rows must be in ascending order of flops");
    }
    rates.gemm_curve.emplace_back(flops, rate);
  });
  // [[calibration.sync]]: pattern ("group" when absent, "grid", "ring"),
  // group, seconds.
  rates.sync.clear();
  rates.grid_sync.clear();
  rates.ring_sync.clear();
  rows("sync", [&](Table& r) {
    const std::string pattern = r.find("pattern") != nullptr ? r.string("pattern") : "group";
    std::map<int64_t, double>* table = pattern == "group"  ? &rates.sync
                                       : pattern == "grid" ? &rates.grid_sync
                                       : pattern == "ring" ? &rates.ring_sync
                                                           : nullptr;
    if (table == nullptr) {
      r.fail_at(r.get("pattern"), "pattern",
                "\"" + pattern + "\" is not one of \"group\", \"grid\", \"ring\"");
    }
    const int64_t group = r.integer("group");
    (*table)[group] = r.number("seconds", false);
  });
  // [[calibration.feedback]]: family (tune.h family_of), ratios (measured
  // over the model's prediction, positive, oldest first).
  rates.feedback.clear();
  rows("feedback", [&](Table& r) {
    const std::string family = r.string("family");
    std::string why;
    if (!valid_family(family, &why)) r.fail_at(r.get("family"), "family", why);
    if (rates.feedback.count(family) != 0) {
      r.fail_at(r.get("family"), "family", "\"" + family + "\" has a row already");
    }
    const toml::value& list = r.get("ratios");
    if (!list.is_array() || list.as_array().empty()) {
      r.fail_at(list, "ratios",
                "expected a non-empty array of numbers, found " + toml::format(list));
    }
    std::vector<double>& ratios = rates.feedback[family];
    for (const toml::value& x : list.as_array()) {
      const double v = x.is_floating()  ? x.as_floating()
                       : x.is_integer() ? static_cast<double>(x.as_integer())
                                        : -1.0;
      if (!std::isfinite(v) || v <= 0) {
        r.fail_at(x, "ratios", toml::format(x) + " is not a ratio; each must be a number > 0");
      }
      ratios.push_back(v);
    }
  });
  // [[calibration.collective]]: op, group, alpha (s), beta (bytes/s); a
  // calibration of one rank has none.
  rows("collective", [&](Table& r) {
    const std::string op = r.string("op");
    Collective kind = Collective::kAllReduce;
    bool found = false;
    for (Collective k : {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter,
                         Collective::kAllToAll, Collective::kSendRecv}) {
      if (op == to_string(k)) kind = k, found = true;
    }
    if (!found) {
      r.fail_at(r.get("op"), "op",
                "\"" + op +
                    "\" is not a collective; valid: all_reduce, all_gather, "
                    "reduce_scatter, all_to_all, send_recv");
    }
    const int64_t group = r.integer("group");
    AlphaBeta ab;
    ab.alpha = r.number("alpha", false);
    ab.beta = r.number("beta");
    rates.measured[{kind, group}] = ab;
  });
  t.unknown();
  rates.source = name;
  return rates;
}

MachineRates load_calibration(const std::string& path, MachineRates rates) {
  return parse_calibration(read_file(path), path, std::move(rates));
}

}  // namespace kolos::planner
