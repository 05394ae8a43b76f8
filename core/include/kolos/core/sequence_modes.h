// What the core knows of a sequence mode beyond its plugin's name: whether
// it splits over the tensor group with no sp axis of its own (megatron).
// One table (config/run_config.cpp) says which modes do.
#pragma once

#include <cstdint>
#include <string>

#include "kolos/core/run_config.h"

namespace kolos {

// The mode splits the sequence over the tensor group ("megatron").
bool sequence_over_tensor(const std::string& mode);
// A sequence split is asked for: an sp axis over 1, or a mode over the
// tensor group whatever the size.
inline bool sequence_splits(const SequenceConfig& s) {
  return s.size > 1 || sequence_over_tensor(s.mode);
}
// The ranks of the mesh's sp axis: 1 for a mode over the tensor group.
inline int64_t sequence_axis_size(const SequenceConfig& s) {
  return sequence_over_tensor(s.mode) ? 1 : s.size;
}

}  // namespace kolos
