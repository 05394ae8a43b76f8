// Expert parallelism: which experts of a mixture-of-experts layer a rank
// holds, and the exchange that brings each expert the rows routed to it.
//
// With parallel.expert.size = P > 1 the mesh has an ep axis of size P
// (expert_axis(), mesh_layout.h). The ranks of one ep group read different
// samples, as dp peers do, and each holds experts / P of every mixture
// layer's experts: rank i the experts [i·L, (i+1)·L), L = experts / P. A
// layer routes its own tokens, then run_experts() sends every row to the
// rank holding its expert and brings the expert's output back:
//   1. an all-to-all of the row counts (P x L per rank, even split), so each
//      rank knows how many rows it receives from each peer for each expert;
//   2. an all-to-all of the rows themselves (uneven: as many as routed);
//   3. each local expert runs once on the rows it received from every peer
//      (no rows when none came: every expert runs every step, so each has a
//      gradient and no collective inside it waits for a rank that skipped);
//   4. the inverse all-to-all returns the outputs in the order sent.
// Both exchanges are differentiable: backward runs them with the splits
// swapped, so an expert's gradient on its rank sums the contributions of
// the tokens of every ep peer (the dp plugin averages it over dp x sp and
// divides by P).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kolos {

class DeviceMesh;
namespace comm {
class ProcessGroup;
}

class Model;

struct ExpertShard {
  int64_t first = 0;  // this rank's first expert
  int64_t count = 0;  // how many it holds
  int64_t total = 0;  // the layer's experts
  // The ep group (size > 1), or null: every expert on this rank.
  comm::ProcessGroup* group = nullptr;
};

// This rank's experts of a layer of `experts` (null mesh, or an ep axis of
// size 1: all of them). Throws when the ep size does not divide `experts`.
ExpertShard local_experts(const DeviceMesh* mesh, int64_t experts);

// The outputs of the experts on `rows` [M, H], the rows sorted by expert,
// `counts[e]` of them for expert e (shard.total entries summing to M), in
// the same order: `expert(j, x)` runs the shard's j-th local expert on x.
// Collective over shard.group: each rank of it calls it once per forward of
// the layer, with whatever rows it routed (none included).
at::Tensor run_experts(const at::Tensor& rows, const std::vector<int64_t>& counts,
                       const ExpertShard& shard,
                       const std::function<at::Tensor(int64_t, const at::Tensor&)>& expert);

// Routing figures of this rank's mixture blocks since the last
// take_routing(): recorded by each block's forward in grad mode only, so
// once per training micro-batch (not by a recomputation's first, no-grad
// pass, nor by evaluation or inference).
struct RoutingRecord {
  std::map<int64_t, std::vector<int64_t>> kept;  // block -> assignments each expert took
  int64_t dropped = 0;                           // assignments a capacity dropped
  double aux_loss = 0.0;  // the blocks' auxiliary losses (coefficients applied), summed
};
void record_routing(int64_t block, const std::vector<int64_t>& kept, int64_t dropped,
                    double aux_loss);
RoutingRecord take_routing();

// The name of a mixture block's balancing bias buffer ([experts] float32,
// model.bias_update_rate > 0): the top_k are chosen on scores + bias.
inline constexpr const char* kRouterBiasBuffer = "router_bias";

// Every balancing bias of `model`, in block order, each under its full
// name ("h.0.mlp.router_bias"); the live tensors. Every rank holds every
// block's (a pipeline stage included), so they are replicated.
std::vector<std::pair<std::string, at::Tensor>> router_biases(const Model& model);

// DeepSeek-V3's update, in place: each bias of `biases` (one per row of
// `load` [blocks, experts], the assignments each expert took in the step
// over every rank) gains rate for an expert below the row's mean load,
// loses rate for one above it.
void update_router_biases(const std::vector<std::pair<std::string, at::Tensor>>& biases,
                          const at::Tensor& load, double rate);

}  // namespace kolos
