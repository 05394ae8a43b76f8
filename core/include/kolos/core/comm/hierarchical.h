// Hierarchical all-reduce for groups whose ranks span several nodes:
// reduce inside each node onto its leader (the node's lowest rank of the
// group), all-reduce among the leaders, broadcast inside each node. Only the
// leaders' traffic crosses nodes: one bucket per node instead of the flat
// algorithm's share from every rank. docs/communication.md, "Hierarchical
// all-reduce", says when it pays and how `[parallel] allreduce` chooses.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "kolos/core/comm/process_group.h"

namespace kolos::comm {

enum class AllReduceMode { kAuto, kFlat, kHierarchical };
// "auto" | "flat" | "hierarchical" (the config reader has checked the text).
AllReduceMode parse_all_reduce_mode(const std::string& text);
const char* to_string(AllReduceMode mode);

// The host of each of the group's ranks, by group rank: gethostname(), or,
// when KOLOS_SIMULATED_HOSTS is set (one name per world rank,
// comma-separated; the launcher's locality check reads the same variable),
// this rank's name from it, so one machine can stand in for several nodes.
// Collective over `group`. Throws kolos::UsageError when the variable names
// another number of hosts than the world has ranks.
std::vector<std::string> group_hosts(ProcessGroup& group);

// A group over the same ranks as `flat` whose all_reduce is hierarchical
// (per `hosts`, as group_hosts returns them); every other operation, stats
// and split go to `flat`. Collective over `flat` (it splits it twice: one
// group per node, one of the leaders).
//
// Its all_reduce returns at once; the three stages run in order on the
// group's own thread, each on its sub-group's communication thread. sum,
// max and min combine stage by stage; avg is a sum divided by the group's
// size at the end (floor division for integers), as the flat all-reduce
// does, so the result equals flat's up to the order of the additions
// (exact for integer-valued data). Its all_reduces run in issue order among
// themselves; they are not ordered with the operations that go to `flat`
// (each communicator still sees one order on every rank). stats() sums the
// flat group's and the sub-groups' counts: the node stages appear as reduce
// and broadcast, the leaders' stage as all_reduce.
ProcessGroupPtr make_hierarchical_group(ProcessGroupPtr flat, const std::vector<std::string>& hosts);

// What the gradient buckets all-reduce on, and why.
struct AllReduceChoice {
  ProcessGroupPtr group;         // the flat group or a hierarchical one over it
  std::string path = "flat";     // "flat" | "hierarchical"
  AllReduceMode mode = AllReduceMode::kFlat;
  int nodes = 1;                 // nodes the group spans
  std::string layout;            // ranks per node, e.g. "2+2"
  bool measured = false;         // auto on several nodes with a node of >1 rank
  int64_t bucket_bytes = 0;      // the size measured
  double flat_s = 0, hierarchical_s = 0;  // median of the rounds' slowest rank
  int rounds = 0;
  std::string reason;            // one phrase: why this path
  // The run log's line (without "kolos: "), e.g. "allreduce: hierarchical
  // (auto) over 2 nodes (2+2 ranks of group 'dp') ...".
  std::string describe() const;
  // {"mode":"auto","path":"hierarchical","nodes":2,...} for the metrics.
  std::string json() const;
};

// Decides how `group` all-reduces buckets of `sample`'s size and dtype.
// Collective over `group`. kFlat: the group itself. kHierarchical: a
// hierarchical group whatever the nodes (on one node: reduce and broadcast
// inside it). kAuto: flat on one node or when every node holds one rank of
// the group (hierarchical would be flat plus two no-ops), without
// measuring; otherwise both paths are timed on `sample` (one warm-up each,
// then `rounds` rounds alternating which goes first; a round's time is the
// slowest rank's), rank 0 picks the faster median and broadcasts its pick.
// `sample`'s contents are overwritten.
AllReduceChoice choose_all_reduce(ProcessGroupPtr group, AllReduceMode mode,
                                  const at::Tensor& sample, int rounds = 3);

}  // namespace kolos::comm
