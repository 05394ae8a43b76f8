// The groups of ranks gradients are averaged over, for the plugins that
// keep gradients themselves (zero1-3, chunks).
//
// A gradient is averaged over the data axes (batch_axes(): dp, and ep when
// experts are split; and sp) that its parameter is not held apart along:
// every parameter over all of them, an expert of an expert-parallel mixture
// (held apart along ep) over dp x sp only. The all-to-all's backward has
// already summed, on the expert's rank, the gradients of every ep peer's
// tokens, so the group's mean times `factor` (the group's size over the
// whole data group's: 1 / ep for an expert) is the mean over all data
// ranks, as serially (docs/moe.md).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "kolos/core/mesh.h"

namespace kolos {

struct DataDomain {
  AxisSet axes;
  comm::ProcessGroupPtr group;
  int64_t ranks = 1, index = 0;  // the group's size, this rank's place in it
  double factor = 1.0;           // after the group's mean: its size / the whole data group's
};

// The index in `domains` of the domain of a parameter held apart along
// `sharded` (its placement's sharded axes), added at the end on first use.
// Called first with no axes, it makes domains[0] the whole data group.
inline size_t data_domain(std::vector<DataDomain>& domains, const DeviceMesh& mesh,
                          AxisSet sharded) {
  const AxisSet data = batch_axes() | AxisSet{Axis::kSP};
  const AxisSet over = data.without(sharded);
  for (size_t d = 0; d < domains.size(); ++d) {
    if (domains[d].axes == over) return d;
  }
  DataDomain d;
  d.axes = over;
  d.group = mesh.group(over);
  d.ranks = d.group->size();
  d.index = d.group->rank();
  d.factor = static_cast<double>(mesh.layout().size(over)) /
             static_cast<double>(mesh.layout().size(data));
  domains.push_back(std::move(d));
  return domains.size() - 1;
}

}  // namespace kolos
