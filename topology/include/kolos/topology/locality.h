// Whether the mesh's communication-heavy groups stay inside a node.
//
// The mesh puts rank (p, d, s, t) at ((p*DP + d)*SP + s)*TP + t
// (kolos/core/mesh_layout.h): tensor-parallel peers are consecutive ranks,
// then sequence-parallel peers, and pipeline stages are farthest apart. With
// the block mapping of mpirun (--map-by slot/core/numa) and srun
// (--distribution=block, the default), consecutive ranks share a node, so a
// tp group stays inside one node when TP divides the ranks per node. The
// axes checked are those registered as within a node (tp, sp, and any a
// plugin registers so: AxisInfo::within_node). This
// check says, for a concrete rank-to-node layout, which tp and sp groups
// cross nodes (or NVLink domains, when those are known) and whether pp
// crosses nodes, as it should.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kolos/core/mesh_layout.h"

namespace kolos::topology {

struct LocalityFinding {
  std::string axis;                // an axis registered within a node: "tp", "sp", ...
  std::vector<int64_t> ranks;      // the group's world ranks
  std::vector<std::string> hosts;  // distinct hosts of the group, in rank order
  bool crosses_nodes = false;
  bool crosses_domains = false;  // same node, several NVLink domains
  std::string message;           // one line naming the group, its ranks and hosts
};

struct LocalityReport {
  std::vector<LocalityFinding> findings;  // only groups that cross something
  bool pp_crosses_nodes = false;  // pipeline stages on different nodes (expected on >1 node)
  int nodes = 0;                  // distinct hosts
  std::vector<std::string> warnings() const;
  // One line per finding, then the pp line; "tp and sp groups stay inside
  // one node" when there is nothing to report.
  std::string summary() const;
};

// Checks the mesh SHAPE against HOST_OF_RANK (one host name per world rank)
// and, when not empty, DOMAIN_OF_RANK (an NVLink domain label per rank,
// unique across hosts, e.g. "node3/0"; empty string: unknown). Under STRICT
// throws kolos::ConfigError naming the first group that crosses nodes, its
// ranks and hosts; a group that only crosses NVLink domains is a warning
// even then. Throws when the sizes do not match.
LocalityReport check_locality(const MeshShape& shape, const std::vector<std::string>& host_of_rank,
                              const std::vector<std::string>& domain_of_rank = {},
                              bool strict = false);

}  // namespace kolos::topology
