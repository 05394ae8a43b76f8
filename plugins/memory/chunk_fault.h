// The chunks plugin's fault switch, compiled into each copy of the plugin
// on its own (chunk_fault.cpp). Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kolos::chunks {

// Called by the optimizer step before chunk `chunk` of `chunks` of step
// `step`; does nothing but in the plugin's test copy.
void maybe_die_mid_step(int64_t step, size_t chunk, size_t chunks);

}  // namespace kolos::chunks
