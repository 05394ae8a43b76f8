// TrainingState: what a run resumes from, as named placed pieces and scalars.
//
// The engine emits it (Engine::state()) and takes it back
// (Engine::load_state()); storage (libkolos_checkpoint) writes and reads it
// without knowing where it came from, as Megatron's sharded_state_dict and
// PyTorch DCP's get_state_dict/set_state_dict divide the work. A piece is a
// live tensor with its Placement; nothing in the state says which strategy
// placed it, so a state saved under one mesh loads under any other: every
// rank reads the part of each global tensor that its own placement names.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kolos/core/gradient_strategy.h"
#include "kolos/core/mesh_layout.h"  // MeshShape

namespace kolos {

// Run state that is neither a parameter nor an optimizer moment (a mixture
// block's balancing bias), as StatePiece names under this prefix. Loading
// does not require it: a checkpoint without it loads into a run that keeps
// it (the run's value stays as it was), and a run without it ignores the
// checkpoint's. Every other tensor must be in both.
inline constexpr const char* kStatePrefix = "state/";

struct TrainingState {
  // This rank's pieces, by global tensor name: "model/<param>" (the
  // parameters as the gradients role keeps them at rest; ZeRO-3: shards),
  // "optim/exp_avg/<param>", "optim/exp_avg_sq/<param>", run state under
  // kStatePrefix ("state/h.0.mlp.router_bias"). The tensors are
  // the live ones: reading a checkpoint into them restores them.
  std::vector<StatePiece> pieces;
  int64_t step = 0;              // optimizer steps the engine has taken
  int64_t data_position = 0;     // global samples consumed (step x global batch)
  int64_t optimizer_steps = 0;   // the optimizer's own count (bias correction)
  // fp16's dynamic loss scale and its count of overflow-free steps since
  // the last change (0: the run does not scale its loss).
  double loss_scale = 0.0;
  int64_t loss_scale_good_steps = 0;
  std::vector<uint8_t> rng_cpu;  // this rank's LibTorch CPU generator state (empty: none)
  std::string config_toml;       // the effective configuration
  MeshShape mesh;                // the mesh the pieces are placed on, ranks in layout order
};

}  // namespace kolos
