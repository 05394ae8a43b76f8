#include "kolos/topology/locality.h"

#include <algorithm>
#include <set>

#include "kolos/core/error.h"
#include "kolos/topology/topology.h"

namespace kolos::topology {
namespace {

std::string rank_list(const std::vector<int64_t>& ranks) {
  std::vector<int> r(ranks.begin(), ranks.end());
  return format_ranges(r);
}

// "a (ranks 8-11), b (ranks 12-15)"
std::string hosts_with_ranks(const std::vector<int64_t>& ranks,
                             const std::vector<std::string>& label_of_rank) {
  std::vector<std::string> order;
  std::vector<std::vector<int>> members;
  for (int64_t r : ranks) {
    const std::string& h = label_of_rank[r];
    auto it = std::find(order.begin(), order.end(), h);
    if (it == order.end()) {
      order.push_back(h);
      members.emplace_back();
      it = order.end() - 1;
    }
    members[it - order.begin()].push_back(static_cast<int>(r));
  }
  std::string out;
  for (size_t i = 0; i < order.size(); ++i) {
    out += (i ? ", " : "") + order[i] + " (ranks " + format_ranges(members[i]) + ")";
  }
  return out;
}

}  // namespace

std::vector<std::string> LocalityReport::warnings() const {
  std::vector<std::string> out;
  for (const auto& f : findings) out.push_back(f.message);
  return out;
}

std::string LocalityReport::summary() const {
  std::string out;
  for (const auto& f : findings) out += f.message + "\n";
  if (findings.empty())
    out += "tp and sp groups stay inside one node (and NVLink domain, where known)\n";
  out += pp_crosses_nodes
             ? "pp crosses nodes, as it should on " + std::to_string(nodes) + " nodes\n"
         : nodes > 1 ? "pp stays inside each node\n"
                     : "one node\n";
  return out;
}

LocalityReport check_locality(const MeshShape& shape, const std::vector<std::string>& host_of_rank,
                              const std::vector<std::string>& domain_of_rank, bool strict) {
  const MeshLayout layout(shape);
  const int64_t world = layout.world_size();
  if (static_cast<int64_t>(host_of_rank.size()) != world) {
    throw ConfigError("locality: the mesh " + layout.describe() + " has " + std::to_string(world) +
                      " ranks but the layout names hosts for " +
                      std::to_string(host_of_rank.size()));
  }
  if (!domain_of_rank.empty() && static_cast<int64_t>(domain_of_rank.size()) != world) {
    throw ConfigError("locality: the mesh " + layout.describe() + " has " + std::to_string(world) +
                      " ranks but NVLink domains are given for " +
                      std::to_string(domain_of_rank.size()));
  }
  LocalityReport report;
  report.nodes =
      static_cast<int>(std::set<std::string>(host_of_rank.begin(), host_of_rank.end()).size());

  // Every axis registered as within a node (tp and sp, and any other),
  // innermost first.
  std::vector<Axis> inner_first = axes_in_order();
  std::reverse(inner_first.begin(), inner_first.end());
  for (Axis axis : inner_first) {
    if (layout.size(axis) == 1 || !axis_info(axis).within_node) continue;
    const std::string name = to_string(axis);
    std::set<int64_t> seen;
    for (int64_t rank = 0; rank < world; ++rank) {
      if (seen.count(rank)) continue;
      std::vector<int64_t> group = layout.group_ranks(rank, AxisSet{axis});
      seen.insert(group.begin(), group.end());
      LocalityFinding f;
      f.axis = name;
      f.ranks = group;
      for (int64_t r : group) {
        if (std::find(f.hosts.begin(), f.hosts.end(), host_of_rank[r]) == f.hosts.end()) {
          f.hosts.push_back(host_of_rank[r]);
        }
      }
      f.crosses_nodes = f.hosts.size() > 1;
      if (!f.crosses_nodes && !domain_of_rank.empty()) {
        std::set<std::string> domains;
        bool unknown = false;
        for (int64_t r : group) {
          unknown |= domain_of_rank[r].empty();
          domains.insert(domain_of_rank[r]);
        }
        f.crosses_domains = !unknown && domains.size() > 1;
      }
      if (!f.crosses_nodes && !f.crosses_domains) continue;
      const std::string what = f.crosses_nodes ? "nodes" : "NVLink domains";
      f.message = name + " group of ranks " + rank_list(group) + " crosses " + what + ": " +
                  hosts_with_ranks(group, f.crosses_nodes ? host_of_rank : domain_of_rank) +
                  " (mesh " + layout.describe() + "; " + name + " traffic would leave the " +
                  (f.crosses_nodes ? "node" : "NVLink domain") + ")";
      if (strict && f.crosses_nodes) {
        throw ConfigError("locality (strict): " + f.message + "; make " + name +
                          " divide the ranks per node, or run with fewer ranks per " + name +
                          " group");
      }
      report.findings.push_back(std::move(f));
    }
  }
  if (layout.size(Axis::kPP) > 1) {
    std::set<int64_t> seen;
    for (int64_t rank = 0; rank < world && !report.pp_crosses_nodes; ++rank) {
      for (int64_t r : layout.group_ranks(rank, AxisSet{Axis::kPP})) {
        if (host_of_rank[r] != host_of_rank[rank]) report.pp_crosses_nodes = true;
      }
    }
  }
  return report;
}

}  // namespace kolos::topology
