#include "kolos/topology/binding.h"

#include <algorithm>
#include <map>

#include "kolos/core/error.h"

namespace kolos::topology {
namespace {

// Cores of one NUMA node (or of the whole machine when it has no NUMA
// information), as indices into Topology::cores.
struct Domain {
  int numa = -1;
  std::vector<int> cores;
};

std::vector<Domain> domains_of(const Topology& t) {
  std::vector<Domain> domains;
  for (size_t i = 0; i < t.numa_nodes.size(); ++i) {
    if (!t.numa_nodes[i].cores.empty())
      domains.push_back({static_cast<int>(i), t.numa_nodes[i].cores});
  }
  std::vector<int> loose;  // cores outside every NUMA node's cpuset
  for (const Core& c : t.cores) {
    if (c.numa < 0) loose.push_back(c.index);
  }
  if (!loose.empty()) domains.push_back({-1, loose});
  return domains;
}

std::string where(const Topology& t) {
  return t.hostname.empty() ? t.source : t.hostname + " (" + t.source + ")";
}

}  // namespace

std::vector<RankBinding> bindings_for(int local_size, const Topology& t, BindingPolicy policy) {
  if (local_size < 1) {
    throw Error("binding: the node-local rank count must be at least 1, got " +
                std::to_string(local_size));
  }
  const int cores = static_cast<int>(t.cores.size());
  if (local_size > cores) {
    throw Error("binding: " + std::to_string(local_size) + " ranks on " + where(t) +
                ", which has " + std::to_string(cores) +
                " cores: a rank needs a core of its own (run without binding, "
                "`kolos run --bind none`, to oversubscribe)");
  }
  if (policy.use_gpus && local_size > static_cast<int>(t.gpus.size())) {
    throw Error("binding: " + std::to_string(local_size) + " ranks on " + where(t) +
                ", which has " + std::to_string(t.gpus.size()) + " GPU(s): one rank per GPU");
  }
  const std::vector<Domain> domains = domains_of(t);

  // The domain of each rank.
  std::vector<int> domain_of(local_size, -1);
  if (policy.use_gpus) {
    std::map<int, int> by_numa;
    for (size_t d = 0; d < domains.size(); ++d) by_numa[domains[d].numa] = static_cast<int>(d);
    for (int r = 0; r < local_size; ++r) {
      auto it = by_numa.find(t.gpus[r].numa);
      if (it != by_numa.end()) domain_of[r] = it->second;
    }
  }
  // Ranks without a GPU's NUMA node: spread in proportion to cores, in
  // blocks. Rank r takes the domain holding core position r*C/R of the
  // concatenated core list; positions are distinct, so no domain gets more
  // ranks than it has cores.
  std::vector<int> unplaced;
  for (int r = 0; r < local_size; ++r) {
    if (domain_of[r] < 0) unplaced.push_back(r);
  }
  const int n = static_cast<int>(unplaced.size());
  for (int i = 0; i < n; ++i) {
    long position = static_cast<long>(i) * cores / n;
    for (size_t d = 0; d < domains.size(); ++d) {
      if (position < static_cast<long>(domains[d].cores.size())) {
        domain_of[unplaced[i]] = static_cast<int>(d);
        break;
      }
      position -= static_cast<long>(domains[d].cores.size());
    }
  }

  std::vector<RankBinding> out(local_size);
  for (size_t d = 0; d < domains.size(); ++d) {
    std::vector<int> ranks;
    for (int r = 0; r < local_size; ++r) {
      if (domain_of[r] == static_cast<int>(d)) ranks.push_back(r);
    }
    const int m = static_cast<int>(ranks.size());
    const int c = static_cast<int>(domains[d].cores.size());
    if (m > c) {
      std::string list;
      for (int r : ranks) list += (list.empty() ? "" : ",") + std::to_string(r);
      throw Error("binding: local ranks " + list + " (one per GPU) of " + where(t) +
                  " belong on NUMA node " +
                  std::to_string(t.numa_nodes.at(domains[d].numa).os_index) +
                  ", the GPUs' node, which has " + std::to_string(c) + " cores for their " +
                  std::to_string(m) + " ranks");
    }
    // Rank k of m takes cores [k*c/m, (k+1)*c/m): contiguous, disjoint,
    // never empty since m <= c.
    for (int k = 0; k < m; ++k) {
      RankBinding& b = out[ranks[k]];
      b.local_rank = ranks[k];
      b.numa = domains[d].numa;
      b.gpu = policy.use_gpus ? ranks[k] : -1;
      for (long i = static_cast<long>(k) * c / m; i < static_cast<long>(k + 1) * c / m; ++i) {
        const int core = domains[d].cores[i];
        b.cores.push_back(core);
        b.pus.insert(b.pus.end(), t.cores[core].pus.begin(), t.cores[core].pus.end());
      }
      std::sort(b.pus.begin(), b.pus.end());
    }
  }
  return out;
}

RankBinding binding_for(int local_rank, int local_size, const Topology& t, BindingPolicy policy) {
  if (local_rank < 0 || local_rank >= local_size) {
    throw Error("binding: local rank " + std::to_string(local_rank) + " is outside 0.." +
                std::to_string(local_size - 1));
  }
  return bindings_for(local_size, t, policy)[local_rank];
}

std::string describe(const RankBinding& b, const Topology& t) {
  std::string out = "rank " + std::to_string(b.local_rank) + ": ";
  out +=
      b.numa >= 0 ? "NUMA node " + std::to_string(t.numa_nodes[b.numa].os_index) : "no NUMA node";
  out += ", cores " + format_ranges(b.cores) + " (CPUs " + format_ranges(b.pus) + ")";
  if (b.gpu >= 0) out += ", GPU " + std::to_string(b.gpu) + " " + t.gpus[b.gpu].pci_bus_id;
  return out;
}

}  // namespace kolos::topology
