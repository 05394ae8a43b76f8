// Collective times under the alpha-beta model, with the group's placement.
//
// Ranks are laid out as kolos's mesh lays them out (pp, dp, sp, tp outermost
// first) and a node holds devices_per_node consecutive ranks; an NVLink
// domain holds nvlink_domain consecutive ranks (it may span nodes, as on
// NVL72 racks). A group inside one domain runs at the intra figures, or at
// the calibration's measured alpha/beta for its (operation, size) when the
// calibration has them. A group that spans domains with k > 1 members in
// each runs hierarchically, as NCCL does: the intra part over k, the inter
// part over the D domains on 1/k of the data, every device using its own
// NIC (inter_bandwidth is per device).
#include <algorithm>
#include <map>

#include "kolos/planner/cost_model.h"

namespace kolos::planner {
namespace {

struct Spread {
  int64_t per_domain = 1;  // k: members in the first member's domain
  int64_t domains = 1;     // D
};

Spread spread(int64_t n, int64_t stride, int64_t first, int64_t domain) {
  Spread s;
  if (stride >= domain) {
    s.per_domain = 1;
    s.domains = n;
    return s;
  }
  // stride < domain: every domain between the first member's and the last's is touched.
  const int64_t last = first + (n - 1) * stride;
  s.domains = last / domain - first / domain + 1;
  const int64_t room = domain - first % domain;  // ranks left in the first member's domain
  s.per_domain = std::min(n, (room + stride - 1) / stride);
  return s;
}

// Ring algorithms: steps and the fraction of the buffer each rank moves.
double ring_time(Collective op, double bytes, int64_t n, double alpha, double beta) {
  if (n <= 1) return 0;
  const double dn = static_cast<double>(n);
  switch (op) {
    case Collective::kAllReduce:
      return 2 * (dn - 1) * alpha + 2 * (dn - 1) / dn * bytes / beta;
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kAllToAll:
      return (dn - 1) * alpha + (dn - 1) / dn * bytes / beta;
    case Collective::kSendRecv:
      return alpha + bytes / beta;
  }
  return 0;
}

}  // namespace

double alpha_beta_time(const Machine& m, Collective op, double bytes, int64_t n, int64_t stride,
                       int64_t first);

bool spans_nodes(const Cluster& c, int64_t n, int64_t stride, int64_t first) {
  if (n <= 1) return false;
  return spread(n, stride, first, c.devices_per_node).domains > 1;
}

AllReducePaths mpi_all_reduce_paths(const Cluster& c, double bytes, int64_t n) {
  AllReducePaths t;
  if (n <= 1 || bytes <= 0) return t;
  const int64_t k = std::min(n, std::max<int64_t>(1, c.devices_per_node));
  const int64_t D = (n + k - 1) / k;
  const double ai = c.intra_latency, bi = c.intra_bandwidth;
  if (D == 1) {  // one node: both are the ring inside it
    t.flat = t.hierarchical = ring_time(Collective::kAllReduce, bytes, n, ai, bi);
    return t;
  }
  const double link = static_cast<double>(k) * c.inter_bandwidth;
  const double dn = static_cast<double>(n), dk = static_cast<double>(k);
  t.flat = 2 * (dn - 1) * std::max(ai, c.inter_latency) +
           2 * (dn - 1) / dn * bytes / std::min(bi, link);
  const double inside = k > 1 ? 2 * (dk - 1) * ai + 2 * (dk - 1) / dk * bytes / bi : 0;
  t.hierarchical = inside + ring_time(Collective::kAllReduce, bytes, D, c.inter_latency, link) +
                   inside;
  return t;
}

double collective_time(const Machine& m, Collective op, double bytes, int64_t n, int64_t stride,
                       int64_t first, Sync sync) {
  if (n <= 1 || bytes <= 0) return 0;
  // Fewer cores than ranks: the group also waits for its ranks to be
  // scheduled (the calibration's sync cost per pattern and size). A grid
  // or ring larger than the calibration measured takes the largest
  // measured below it; one smaller than every measured size (or with no
  // figure) waits as its own group.
  const bool shared =
      m.rates.cores > 0 && m.rates.cores < static_cast<double>(m.cluster.devices_per_node);
  double wait = 0;
  if (shared) {
    const MachineRates& r = m.rates;
    wait = r.sync_seconds(op == Collective::kSendRecv ? 2 : n);
    const std::map<int64_t, double>* table = sync.pattern == SyncPattern::kGrid   ? &r.grid_sync
                                             : sync.pattern == SyncPattern::kRing ? &r.ring_sync
                                                                                  : nullptr;
    if (table != nullptr && !table->empty() && sync.span >= table->begin()->first) {
      wait = MachineRates::sync_seconds(*table, sync.span);
    }
  }
  return wait + alpha_beta_time(m, op, bytes, n, stride, first);
}

double alpha_beta_time(const Machine& m, Collective op, double bytes, int64_t n, int64_t stride,
                       int64_t first) {
  const Cluster& c = m.cluster;
  const Spread s = spread(n, stride, first, c.nvlink_domain);
  if (s.domains == 1) {
    const auto it = m.rates.measured.find({op, n});
    if (it != m.rates.measured.end()) return it->second.alpha + bytes / it->second.beta;
    return ring_time(op, bytes, n, c.intra_latency, c.intra_bandwidth);
  }
  const double ai = c.intra_latency, bi = c.intra_bandwidth;
  const double ao = c.inter_latency, bo = c.inter_bandwidth;
  const int64_t k = s.per_domain, D = s.domains;
  if (op == Collective::kSendRecv) return ring_time(op, bytes, 2, ao, bo);
  if (k == 1) return ring_time(op, bytes, n, ao, bo);
  const double dk = static_cast<double>(k);
  switch (op) {
    case Collective::kAllReduce:
      return ring_time(Collective::kReduceScatter, bytes, k, ai, bi) +
             ring_time(Collective::kAllReduce, bytes / dk, D, ao, bo) +
             ring_time(Collective::kAllGather, bytes, k, ai, bi);
    case Collective::kAllGather:
    case Collective::kReduceScatter:
      return ring_time(op, bytes / dk, D, ao, bo) + ring_time(op, bytes, k, ai, bi);
    case Collective::kAllToAll: {
      // Each rank sends (n-k)/n of its buffer across domains, (k-1)/n inside.
      const double dn = static_cast<double>(n);
      const double out = (static_cast<double>(D) - 1) * ao + bytes * (dn - dk) / dn / bo;
      const double in = (dk - 1) * ai + bytes * (dk - 1) / dn / bi;
      return std::max(out, in);
    }
    default:
      return 0;
  }
}

}  // namespace kolos::planner
