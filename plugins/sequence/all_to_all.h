// The Ulysses all-to-alls (docs/sequence-parallel.md, "Ulysses"): q, k, v
// and the attention output between sequence-split and head-split layouts,
// differentiable. Shared by the sequence plugins that use them (ulysses, and
// hybrid inside each of its Ulysses subgroups).
#pragma once

#include <ATen/core/Tensor.h>

namespace kolos {

namespace comm {
class ProcessGroup;
}

// x [N, H, t, d], sequence-split over the group's n ranks (rank s holds
// chunk s of the sequence, t = T/n) -> [N, H/n, T, d], head-split (rank r
// holds head block r), the sequence chunks in rank order. H must divide by
// n. Collective over `group`; its backward is heads_to_sequence, collective
// too. `group` outlives the backward.
at::Tensor all_to_all_sequence_to_heads(const at::Tensor& x, comm::ProcessGroup& group);

// The inverse: y [N, H/n, T, d] head-split -> [N, H, T/n, d] sequence-split.
// T must divide by n. Its backward is sequence_to_heads.
at::Tensor all_to_all_heads_to_sequence(const at::Tensor& y, comm::ProcessGroup& group);

}  // namespace kolos
