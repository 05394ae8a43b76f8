// The hybrid sequence plugin's attention on its own, for every factoring
// sp = a x r of the ranks (a the Ulysses degree, r the ring degree): the
// plugin is loaded, configured and set up on a mesh of sp ranks as a run
// does, every rank builds the same full q, k, v [2, 4, 16, 8] and output
// gradient, takes the rows at its local_positions, and its output and dq,
// dk, dv rows equal the serial attention core's and its autograd gradients
// within 1e-5. Each rank's placement is checked against zigzag_positions,
// and the bytes it hands to MPI on the Ulysses and ring subgroups, observed
// by libkolos_pmpi_count, against the formula of hybrid.cpp (X = B*h*T/sp*d
// elements, e = 4 bytes):
//   forward   all-to-alls 4 X e (a-1)/a; ring (r-1) (2 X e + 8 T/r)
//   backward  the same, plus the ring's float32 dK/dV accumulators r 2 X 4
//             (none when r = 1: a ring of one rank sends nothing).
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "equivalence.h"
#include "kolos/core/comm/process_group.h"
#include "kolos/core/mesh.h"
#include "kolos/core/plugin_registry.h"
#include "kolos/core/roles.h"
#include "kolos/core/sequence.h"
#include "observed_traffic.h"
#include "ring_attention.h"

namespace kolos {
namespace {

// Bytes this rank sent on the live communicators named `name` since the
// last reset, by kind.
testing::ObservedTraffic traffic_named(const std::string& name) {
  testing::ObservedTraffic out;
  out.communicators =
      kolos_pmpi_counts_by_name(testing::mpi_name_of(name).c_str(), out.kinds.data());
  return out;
}

struct Sent {
  uint64_t all_to_all = 0, ring = 0;
};

// A subgroup of one rank need not be an MPI communicator of its own; the
// others must be found, or the zeros below would prove nothing.
Sent sent_since_reset(const std::string& sp_name, int64_t a, int64_t r) {
  const testing::ObservedTraffic ulysses = traffic_named(sp_name + "/ulysses");
  const testing::ObservedTraffic ring = traffic_named(sp_name + "/ring");
  if (a > 1) EXPECT_EQ(ulysses.communicators, 1);
  if (r > 1) EXPECT_EQ(ring.communicators, 1);
  // The all-to-alls use nothing but all-to-all; the ring nothing but sends.
  EXPECT_EQ(ulysses.sent(), ulysses.sent(KOLOS_PMPI_ALLTOALL));
  EXPECT_EQ(ring.sent(), ring.sent(KOLOS_PMPI_SEND));
  return {ulysses.sent(KOLOS_PMPI_ALLTOALL), ring.sent(KOLOS_PMPI_SEND)};
}

TEST(HybridAttention, EveryFactoringMatchesSerialAndSendsTheFormula) {
  ASSERT_EQ(testing::pmpi_interposition_problem(), "");
  const auto world = testing::world_group();
  const int64_t sp = world->size();
  const int64_t batch = 2, heads = 4, seq = 16, dim = 8;
  MeshShape shape;
  shape.sp = sp;
  DeviceMesh mesh(world, shape);
  const std::string sp_name = mesh.group(Axis::kSP)->name();
  PluginRegistry registry;

  torch::manual_seed(11);
  const at::Tensor q_full = torch::randn({batch, heads, seq, dim}).requires_grad_();
  const at::Tensor k_full = torch::randn({batch, heads, seq, dim}).requires_grad_();
  const at::Tensor v_full = torch::randn({batch, heads, seq, dim}).requires_grad_();
  const at::Tensor grad_full = torch::randn({batch, heads, seq, dim});
  const at::Tensor serial = causal_attention({q_full, k_full, v_full});
  serial.backward(grad_full);

  for (int64_t a = 1; a <= sp; ++a) {
    if (sp % a != 0) continue;
    const int64_t r = sp / a;
    SCOPED_TRACE("hybrid " + std::to_string(a) + " x " + std::to_string(r));
    const RunConfig config = testing::tiny_gpt_config(
        {"parallel.sequence.size=" + std::to_string(sp), "parallel.sequence.mode=\"hybrid\"",
         "parallel.sequence.ulysses=" + std::to_string(a)});
    auto plugin = registry.create<SequenceStrategy>("sequence", "hybrid");
    const RoleSpec& spec = role_spec("sequence");
    plugin->configure(PluginContext{config, config.section(spec.section), spec.core_keys,
                                    "sequence plugin `hybrid`", shape, 1});
    plugin->setup(mesh, config);
    ASSERT_EQ(plugin->size(), sp);

    // Ring group j = s / a holds zigzag_positions(seq, r, j); Ulysses rank
    // u = s % a its u-th slice.
    const int64_t s = plugin->rank(), local = seq / sp;
    const at::Tensor pos = plugin->local_positions(seq);
    EXPECT_TRUE(pos.equal(zigzag_positions(seq, r, s / a).narrow(0, (s % a) * local, local)))
        << pos;

    const auto rows = [&](const at::Tensor& t) { return t.index_select(2, pos); };
    const at::Tensor q = rows(q_full.detach()).requires_grad_();
    const at::Tensor k = rows(k_full.detach()).requires_grad_();
    const at::Tensor v = rows(v_full.detach()).requires_grad_();
    const int64_t x = batch * heads * local * dim, e = 4;

    world->barrier()->wait();
    testing::reset_observed_traffic();
    const at::Tensor out = plugin->attention(q, k, v, pos);
    const Sent forward = sent_since_reset(sp_name, a, r);
    EXPECT_EQ(forward.all_to_all, uint64_t(4 * x * e * (a - 1) / a));
    EXPECT_EQ(forward.ring, uint64_t((r - 1) * (2 * x * e + 8 * (seq / r))));
    EXPECT_TRUE(torch::allclose(out, rows(serial.detach()), 1e-5, 1e-5))
        << (out - rows(serial.detach())).abs().max();

    world->barrier()->wait();
    testing::reset_observed_traffic();
    out.backward(rows(grad_full));
    const Sent backward = sent_since_reset(sp_name, a, r);
    EXPECT_EQ(backward.all_to_all, uint64_t(4 * x * e * (a - 1) / a));
    EXPECT_EQ(backward.ring,
              uint64_t((r - 1) * (2 * x * e + 8 * (seq / r)) + (r > 1 ? r * 2 * x * 4 : 0)));
    EXPECT_TRUE(torch::allclose(q.grad(), rows(q_full.grad()), 1e-5, 1e-5));
    EXPECT_TRUE(torch::allclose(k.grad(), rows(k_full.grad()), 1e-5, 1e-5));
    EXPECT_TRUE(torch::allclose(v.grad(), rows(v_full.grad()), 1e-5, 1e-5));
    world->barrier()->wait();
  }
}

}  // namespace
}  // namespace kolos
