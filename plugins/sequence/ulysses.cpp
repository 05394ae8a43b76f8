// ulysses: DeepSpeed-Ulysses sequence parallelism over the mesh's sp axis.
//
// Rank s of the sp group holds the contiguous positions [s*T/sp, (s+1)*T/sp)
// of every sample. Every layer but attention acts token by token on them.
// Around attention one all-to-all (all_to_all.h) turns q, k and v from
// sequence-split [B, h, T/sp, d] into head-split [B, h/sp, T, d]: each rank
// then holds whole sequences for h/sp heads and runs the serial causal
// attention on them, and a second all-to-all turns the output back.
// Backward runs the inverse all-to-alls. Per layer and rank, forward sends
// (sp-1)/sp of q, k, v and the output, 4 * B*h*(T/sp)*d elements *
// (sp-1)/sp; backward the same.
//
// Heads (per tensor-parallel rank, after grouped-query attention repeats the
// key/value heads) must divide by sp, and the sequence length too.
#include <torch/torch.h>

#include <string>
#include <vector>

#include "all_to_all.h"
#include "kolos/core/error.h"
#include "kolos/core/plugin_registry.h"
#include "kolos/core/recompute.h"
#include "kolos/core/sequence.h"
#include "mode_checks.h"

namespace kolos {
namespace {

// "2, 4" : the sp sizes > 1 that divide `value`.
std::string divisors_above_one(int64_t value) {
  std::string out;
  for (int64_t s = 2; s <= value; ++s) {
    if (value % s == 0) out += (out.empty() ? "" : ", ") + std::to_string(s);
  }
  return out.empty() ? "none (only sp = 1)" : out;
}

class Ulysses : public SequenceStrategy {
 public:
  std::string name() const override { return "ulysses"; }

  void configure(const PluginContext& context) override {
    SequenceStrategy::configure(context);  // no keys of its own
    const auto [config, root, sp, tp, at_sp] = sequence::mode_inputs(context);
    sequence::require_tensor_1d(config, tp, sp, "ulysses");
    const int64_t heads = config.model.heads;
    if (heads % tp == 0 && (heads / tp) % sp != 0) {
      const int64_t local = heads / tp;
      root.fail_at_any(
          {"parallel.sequence.size", "parallel.sequence", "model.heads"},
          at_sp + ": sequence mode \"ulysses\" gives each sequence rank whole heads, but the " +
              std::to_string(local) + " attention heads" +
              (tp > 1 ? " of each tensor rank (model.heads = " + std::to_string(heads) +
                            " / tensor " + std::to_string(tp) + ")"
                      : " (model.heads)") +
              " do not divide by " + std::to_string(sp) +
              "; sequence sizes that divide them: " + divisors_above_one(local) + ".");
    }
    const int64_t seq = config.model.seq_len;
    if (sp > seq) {
      root.fail_at_any({"parallel.sequence.size", "parallel.sequence", "model.seq_len"},
                       at_sp + " is larger than the sequence (model.seq_len = " +
                           std::to_string(seq) + "): every sequence rank needs tokens; use " +
                           "sequence size <= " + std::to_string(seq) + " and dividing it, or " +
                           "model.seq_len = " + std::to_string(sp) + ".");
    }
    if (seq % sp != 0) {
      const int64_t below = seq / sp * sp;
      root.fail_at_any({"model.seq_len"}, "model.seq_len = " + std::to_string(seq) +
                                              " does not divide into the " + std::to_string(sp) +
                                              " sequence ranks (" + at_sp +
                                              "); nearest valid lengths: " + std::to_string(below) +
                                              " or " + std::to_string(below + sp) + ".");
    }
  }

  at::Tensor local_positions(int64_t seq) const override {
    const int64_t n = size();
    KOLOS_CHECK(seq % n == 0, "ulysses: a sequence of ", seq, " tokens does not divide into ", n,
                " sequence ranks");
    return torch::arange(rank() * (seq / n), (rank() + 1) * (seq / n), torch::kInt64);
  }

  at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const at::Tensor& positions) override {
    (void)positions;  // contiguous slices: rank order is sequence order
    const int64_t n = size();
    const int64_t heads = q.size(1);
    KOLOS_CHECK(heads % n == 0, "ulysses: ", heads, " heads do not divide into ", n,
                " sequence ranks");
    // q, k and v travel in one all-to-all: [3B, h, T/sp, d].
    at::Tensor qkv = all_to_all_sequence_to_heads(torch::cat({q, k, v}, 0), *group_);
    std::vector<at::Tensor> parts = qkv.chunk(3, 0);
    at::Tensor y = recompute_if_selected(&causal_attention, {parts[0], parts[1], parts[2]});
    return all_to_all_heads_to_sequence(y, *group_);  // [B, h, T/sp, d]
  }
};

}  // namespace
}  // namespace kolos

KOLOS_DEFINE_PLUGIN(
    "ulysses", "sequence", kolos::SequenceStrategy, kolos::Ulysses,
    "sequence parallelism: all-to-all from sequence- to head-split around attention")
