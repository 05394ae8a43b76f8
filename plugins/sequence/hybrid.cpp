// hybrid: Ulysses inside a group times ring attention across groups, as
// USP and LoongTrain do (docs/sequence-parallel.md, "Hybrid").
//
// The sp group of size sp = a x r (a = parallel.sequence.ulysses, the
// Ulysses degree; r = sp / a, the ring degree) is cut in two ways: sp rank s
// has Ulysses coordinate u = s % a and ring coordinate j = s / a. The a
// adjacent ranks of one j form a Ulysses subgroup; the r ranks of one u, a
// ring subgroup. Placement: ring group j holds the zigzag positions of a
// ring of r (zigzag_positions(T, r, j), T/r positions: chunks j and 2r-1-j
// of 2r), and its Ulysses rank u holds the u-th contiguous slice of them
// (T/(r*a) positions). Every layer but attention acts token by token on them.
//
// Attention: an all-to-all inside the Ulysses subgroup turns q, k and v from
// sequence-split into head-split, [B, h/a, T/r, d] with the ring group's
// positions in order (the slices arrive in u order); ring attention over
// the ring subgroup, whose r ranks all hold the same head block u, runs on
// them; a second all-to-all turns the output back. Per layer and rank, with
// X = B*h*(T/sp)*d elements (the same count before and after the
// all-to-all) and e the element size, forward sends 4 X e (a-1)/a bytes in
// the all-to-alls plus (r-1) (2 X e + 8 T/r) in the ring; backward the same
// again plus r * 2 X * 4 (the ring's float32 dK/dV accumulators).
//
// Heads (per tensor-parallel rank, after grouped-query attention repeats the
// key/value heads) must divide by a; heads need not divide by r. The
// sequence length must divide into the 2r zigzag chunks and each group's T/r
// positions into a slices: T a multiple of r * lcm(2, a).
//
// train.recompute = "selective" recomputes nothing here, as under ring: the
// ring kernel keeps no T x T scores (ring.cpp).
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "all_to_all.h"
#include "kolos/core/comm/process_group.h"
#include "kolos/core/error.h"
#include "kolos/core/plugin_registry.h"
#include "kolos/core/sequence.h"
#include "mode_checks.h"
#include "ring_attention.h"

namespace kolos {
namespace {

// "1, 2, 4": the values >= 1 that divide `value` and `also`.
std::string common_divisors(int64_t value, int64_t also) {
  std::string out;
  for (int64_t a = 1; a <= value; ++a) {
    if (value % a == 0 && also % a == 0) out += (out.empty() ? "" : ", ") + std::to_string(a);
  }
  return out;
}

// The sequence lengths must be multiples of this (see the top of the file).
int64_t length_unit(int64_t ulysses, int64_t ring) {
  return ring * (ulysses % 2 == 0 ? ulysses : 2 * ulysses);
}

class Hybrid : public SequenceStrategy {
 public:
  std::string name() const override { return "hybrid"; }

  void configure(const PluginContext& context) override {
    struct Settings {
      int64_t ulysses = 0;  // absent: refused below
    } settings;
    SettingsTable<Settings>("parallel.sequence")
        .integer("ulysses", &Settings::ulysses, 1)
        .read(context.section, settings, context.core_keys, context.owner);
    const auto [config, root, sp, tp, at_sp] = sequence::mode_inputs(context);
    if (settings.ulysses == 0) {
      root.fail_at_any({"parallel.sequence.mode", "parallel.sequence"},
                       "sequence mode \"hybrid\" needs its Ulysses degree: set "
                       "parallel.sequence.ulysses to a divisor of " +
                           at_sp + " (" + common_divisors(sp, sp) +
                           "); the ring degree is the size over it.");
    }
    const int64_t a = settings.ulysses;
    const std::string at_a = "parallel.sequence.ulysses = " + std::to_string(a);
    if (sp % a != 0) {
      context.section.fail("ulysses", std::to_string(a) + " does not divide " + at_sp +
                                          ": sizes that do not factor into ulysses x ring; Ulysses "
                                          "degrees that divide it: " +
                                          common_divisors(sp, sp) + ".");
    }
    const int64_t r = sp / a;
    sequence::require_tensor_1d(config, tp, sp, "hybrid");
    const int64_t heads = config.model.heads;
    if (heads % tp == 0 && (heads / tp) % a != 0) {
      const int64_t local = heads / tp;
      context.section.fail(
          "ulysses", std::to_string(a) + " (with " + at_sp + "): the Ulysses subgroups give " +
                         "each rank whole heads, but the " + std::to_string(local) +
                         " attention heads" +
                         (tp > 1 ? " of each tensor rank (model.heads = " + std::to_string(heads) +
                                       " / tensor " + std::to_string(tp) + ")"
                                 : " (model.heads)") +
                         " do not divide by " + std::to_string(a) +
                         "; Ulysses degrees that divide both them and the sequence size: " +
                         common_divisors(sp, local) + ".");
    }
    const int64_t seq = config.model.seq_len;
    const int64_t unit = length_unit(a, r);
    if (seq % unit != 0) {
      const int64_t below = seq / unit * unit;
      root.fail_at_any({"model.seq_len"},
                       "model.seq_len = " + std::to_string(seq) + " does not divide into the " +
                           std::to_string(2 * r) + " zigzag chunks of a ring of " +
                           std::to_string(r) + " with each group's positions cut in " +
                           std::to_string(a) + " (sequence mode \"hybrid\", " + at_sp + ", " +
                           at_a + "): lengths must be multiples of " + std::to_string(unit) +
                           "; nearest valid lengths: " +
                           (below > 0 ? std::to_string(below) + " or " : std::string()) +
                           std::to_string(below + unit) + ".");
    }
    ulysses_ = a;
  }

  void setup(const DeviceMesh& mesh, const RunConfig& config) override {
    SequenceStrategy::setup(mesh, config);
    const int64_t sp = size();
    KOLOS_CHECK(ulysses_ >= 1 && sp % ulysses_ == 0, "hybrid: Ulysses degree ", ulysses_,
                " does not divide the ", sp, " sequence ranks (configure() checks this)");
    const int64_t u = rank() % ulysses_;
    const int64_t j = rank() / ulysses_;
    // Both collective over the sp group, in this order on every rank.
    ulysses_group_ = group_->split(j, u, group_->name() + "/ulysses");
    ring_group_ = group_->split(u, j, group_->name() + "/ring");
  }

  at::Tensor local_positions(int64_t seq) const override {
    const int64_t a = ulysses_, r = ring_size();
    KOLOS_CHECK(seq % length_unit(a, r) == 0, "hybrid: a sequence of ", seq,
                " tokens does not divide into a ring of ", r, " x Ulysses ", a);
    const int64_t slice = seq / (r * a);
    return zigzag_positions(seq, r, rank() / a).narrow(0, (rank() % a) * slice, slice);
  }

  at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const at::Tensor& positions) override {
    const int64_t a = ulysses_;
    KOLOS_CHECK(q.size(1) % a == 0, "hybrid: ", q.size(1), " heads do not divide into ", a,
                " Ulysses ranks");
    // q, k and v travel in one all-to-all: [3B, h/a, T/r, d], the ring
    // group's positions in order.
    at::Tensor qkv = all_to_all_sequence_to_heads(torch::cat({q, k, v}, 0), *ulysses_group_);
    std::vector<at::Tensor> parts = qkv.chunk(3, 0);
    const int64_t seq = positions.size(0) * size();
    const at::Tensor ring_positions = zigzag_positions(seq, ring_size(), rank() / a);
    at::Tensor y = ring_attention(parts[0], parts[1], parts[2], ring_positions, *ring_group_);
    return all_to_all_heads_to_sequence(y, *ulysses_group_);  // [B, h, T/sp, d]
  }

 private:
  int64_t ring_size() const { return size() / ulysses_; }

  int64_t ulysses_ = 1;                  // a; set by configure
  comm::ProcessGroupPtr ulysses_group_;  // the a ranks of this ring coordinate j
  comm::ProcessGroupPtr ring_group_;     // the r ranks of this Ulysses coordinate u
};

}  // namespace
}  // namespace kolos

KOLOS_DEFINE_PLUGIN("hybrid", "sequence", kolos::SequenceStrategy, kolos::Hybrid,
                    "sequence parallelism: Ulysses all-to-all inside groups x ring attention "
                    "across them")
