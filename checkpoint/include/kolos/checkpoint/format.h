// The checkpoint format's torch-free half: what a checkpoint records besides
// tensors, how its directories are named and found, and the verifier
// (`kolos ckpt verify`). The format itself is described in checkpoint.h.
// Torch-free so that the readers can be built alone (the fuzz targets in
// tests/fuzz do).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kolos/checkpoint/error.h"
#include "kolos/core/mesh_layout.h"  // MeshShape

namespace kolos::checkpoint {

inline constexpr int kFormatVersion = 1;

// What a checkpoint records besides tensors.
struct Metadata {
  int64_t step = 0;             // optimizer steps taken
  int64_t data_position = 0;    // global samples consumed (step x global batch)
  int64_t optimizer_steps = 0;  // the optimizer's own step count (bias correction)
  std::string config_toml;      // the effective configuration
  // fp16's dynamic loss scale and its overflow-free steps since the last
  // change; 0 when the run does not scale its loss (attributes
  // "loss_scale", as text that reads back exactly, and
  // "loss_scale_good_steps", written only then).
  double loss_scale = 0.0;
  int64_t loss_scale_good_steps = 0;
  std::string kolos_version;
  MeshShape mesh;          // the writing mesh
  int64_t world_size = 1;  // pp x dp x sp x tp of `mesh`
  // Every rank's LibTorch CPU generator state, in rank order (may be empty;
  // else world_size states, each the size of this LibTorch's).
  std::vector<std::vector<uint8_t>> rng_cpu;
};

// ---- directories ------------------------------------------------------------

// "step-00000020"
std::string step_dir_name(int64_t step);
// The directory `latest` in `root` names, or "" when there is none or it
// does not name a directory inside `root` (resolve() says which).
std::string latest(const std::string& root);
// `path` itself when it holds an index.h5, else the checkpoint that
// <path>/latest names. Throws CheckpointError when neither exists, and when
// `latest` points outside `path` (`..`, a slash), naming the file and value.
std::string resolve(const std::string& path);

// Checks the index's attributes, every dataset's checksum and shape, every
// shard's presence, and that the pieces of each tensor cover it exactly.
// Returns the problems found, each naming the file and dataset (empty: the
// checkpoint is sound).
std::vector<std::string> verify(const std::string& path);

}  // namespace kolos::checkpoint
