// The chunks plugin's settings: the [memory] table (docs/memory.md),
// read and checked. Torch-free.
#pragma once

#include <cstdint>
#include <string>

#include "kolos/core/roles.h"

namespace kolos::chunks {

struct ChunkSettings {
  std::string placement = "auto";  // "auto" | "static"
  int64_t compute_budget = 0;      // bytes of chunks the compute tier holds at most
  std::string offload = "host";    // the lower tier: "host" | "nvme"
  std::string nvme_dir;
  std::string chunk_size = "auto";
  int64_t chunk_bytes = 0;  // chunk_size in bytes; 0 for "auto" (searched at set-up)
  double param_fraction = 0, grad_fraction = 0, optim_fraction = 0;  // static placement's
  int64_t prefetch = 1;                                               // auto placement's
  int64_t io_threads = 4;                                             // NVMe's
};

// Reads [memory] (context.section) and checks each key against the others:
// throws ConfigError naming the key and its place (a missing
// compute_budget, a chunk_size that is not a multiple of the direct-I/O
// alignment, an nvme_dir that is not a directory, a key of the other
// placement policy or tier).
ChunkSettings read_chunk_settings(const PluginContext& context);

}  // namespace kolos::chunks
