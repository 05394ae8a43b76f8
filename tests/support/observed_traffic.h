// Traffic observed at the MPI boundary, for the traffic tests of tensor
// parallelism, ZeRO and the pipeline.
//
// The counts come from libkolos_pmpi_count (tests/support/pmpi_count), which
// intercepts the MPI calls the process makes, so they reflect what kolos
// actually asked MPI to do (which call, how many elements of which
// datatype, on which communicator), not counters that the ProcessGroup
// computes from the same sizes that the formulas use.
//
// "Bytes sent" (ObservedTraffic::sent) is defined per MPI call as the bytes
// this rank sends under the bandwidth-optimal algorithm for that call, with
// n the communicator's size and X the bytes handed to MPI (count x
// MPI_Type_size):
//   all_reduce (MPI_Allreduce)                 2 (n-1) X / n
//   reduce_scatter (MPI_Reduce_scatter[_block]) X - own share
//   all_gather (MPI_Allgather[v])              (n-1) x, x = own contribution
//   broadcast (MPI_Bcast)                      root (n-1) X, others 0
//   all_to_all (MPI_Alltoall[v])               bytes for ranks other than self
//   send (MPI_Send/Isend) X; recv 0
// (pmpi_count.h has the full table.) The analytic formulas of the tests
// (tp_volume.h, the ZeRO and pipeline tests) are written in the same terms.
// MPI's own algorithms may move other byte counts on the wire; a formula
// that matches these counts has counted the right calls with the right sizes
// on the right communicators.
//
// Communicators are found by name: a ProcessGroup names its communicator
// after itself (MPI_Comm_set_name), so a group's traffic is the traffic of
// the live communicators named like it.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "kolos/core/comm/mpi.h"
#include "pmpi_count.h"

namespace kolos::testing {

struct ObservedTraffic {
  std::array<kolos_pmpi_count, KOLOS_PMPI_KINDS> kinds{};
  int communicators = 0;  // how many live communicators matched the names

  uint64_t sent(kolos_pmpi_kind kind) const { return kinds[kind].sent_bytes; }
  uint64_t calls(kolos_pmpi_kind kind) const { return kinds[kind].calls; }
  uint64_t sent() const {
    uint64_t total = 0;
    for (const auto& k : kinds) total += k.sent_bytes;
    return total;
  }
};

// The MPI name a ProcessGroup gives its communicator.
inline std::string mpi_name_of(const std::string& group_name) {
  return group_name.substr(0, MPI_MAX_OBJECT_NAME - 1);
}

// Traffic of the communicators named like the given groups (each distinct
// name counted once) since the last reset.
inline ObservedTraffic observed_traffic(const std::vector<comm::ProcessGroupPtr>& groups) {
  std::set<std::string> names;
  for (const auto& g : groups) names.insert(mpi_name_of(g->name()));
  ObservedTraffic out;
  for (const std::string& name : names) {
    std::array<kolos_pmpi_count, KOLOS_PMPI_KINDS> counts{};
    out.communicators += kolos_pmpi_counts_by_name(name.c_str(), counts.data());
    for (int k = 0; k < KOLOS_PMPI_KINDS; ++k) {
      out.kinds[k].calls += counts[k].calls;
      out.kinds[k].payload_bytes += counts[k].payload_bytes;
      out.kinds[k].sent_bytes += counts[k].sent_bytes;
    }
  }
  return out;
}

inline void reset_observed_traffic() { kolos_pmpi_reset(); }

// Empty when the interposition works for MPI calls made inside kolos's own
// libraries (not only the test's): a ProcessGroup on MPI_COMM_SELF
// all-reduces 3 floats and the counter of its communicator must show them.
// Otherwise a description of what went wrong (e.g. libmpi came before
// libkolos_pmpi_count in the link order), so a test fails instead of
// comparing formulas with zeros.
inline std::string pmpi_interposition_problem() {
  const std::string name = "kolos-pmpi-probe";
  comm::ProcessGroupPtr probe = comm::make_mpi_process_group(MPI_COMM_SELF, name);
  probe->all_reduce(at::ones({3}, at::kFloat))->wait();
  const ObservedTraffic seen = observed_traffic({probe});
  if (seen.communicators != 1) {
    return "libkolos_pmpi_count sees " + std::to_string(seen.communicators) +
           " communicators named '" + name + "', expected 1";
  }
  if (seen.calls(KOLOS_PMPI_ALLREDUCE) != 1 ||
      seen.kinds[KOLOS_PMPI_ALLREDUCE].payload_bytes != 12) {
    return "libkolos_pmpi_count did not see the probe's MPI_Allreduce of 12 bytes (calls " +
           std::to_string(seen.calls(KOLOS_PMPI_ALLREDUCE)) + ", bytes " +
           std::to_string(seen.kinds[KOLOS_PMPI_ALLREDUCE].payload_bytes) +
           "): MPI calls of kolos's libraries bypass the interposition";
  }
  return "";
}

}  // namespace kolos::testing
