// Sharded HDF5 checkpoints: each rank writes its pieces in place, any mesh
// reads them back (resharding on load, no conversion step).
//
// A checkpoint is a directory:
//   shard-R.h5   one plain serial HDF5 file per writing rank R: each piece
//                this rank holds, as a dataset of the piece's (unpadded)
//                shape, with attributes kolos.offset (into the global
//                tensor), kolos.global_shape, kolos.dtype and kolos.crc32c.
//                Replicas are written once, by the canonical replica
//                (Placement::is_canonical_replica: the rank whose coordinate
//                is 0 on every mesh axis the piece is NOT sharded along).
//   index.h5     one HDF5 virtual dataset (VDS) per global tensor, under its
//                name (/model/<param>, /optim/exp_avg/<param>,
//                /optim/exp_avg_sq/<param>, /state/<name>: run state that
//                is neither a parameter nor an optimizer moment, e.g. a
//                mixture block's balancing bias), mapping each piece's
//                hyperslab to its shard file; the run's attributes (step, data
//                position, optimizer steps, config, mesh, kolos version) and
//                /rng/cpu (every rank's LibTorch CPU generator state).
// Any HDF5 reader (h5dump, h5py) sees whole global tensors by name.
//
// Saving is atomic: every rank writes into <root>/.tmp-step-N, files are
// fsynced, rank 0 writes the index, fsyncs, renames the directory to
// <root>/step-N, fsyncs <root>, then replaces <root>/latest (a one-line file
// naming the directory) by rename. A save that dies half-way leaves the
// previous checkpoint and `latest` untouched; the next save removes the
// leftover temporary directory.
//
// Loading: each rank reads, for each of its pieces, the hyperslab its own
// Placement names from the index's virtual dataset. Before any tensor is
// written, every source dataset is checked (present, shape, checksum) by
// exactly one rank, and the verdict is agreed: a damaged checkpoint fails on
// every rank with a message naming the file and dataset, and loads nothing.
//
// Threads: HDF5 (the Debian build) is not thread-safe; this library
// serialises every HDF5 call behind one mutex, so a background save and a
// tool call in the same process are safe.
//
// The library stores pieces and scalars; it does not know what produced
// them. A trainer hands it a TrainingState (kolos/core/training_state.h;
// Engine::state()) and applies what it loads (Engine::load_state()).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kolos/checkpoint/error.h"
#include "kolos/checkpoint/format.h"
#include "kolos/core/comm/process_group.h"
#include "kolos/core/mesh.h"
#include "kolos/core/placement.h"
#include "kolos/core/training_state.h"

namespace kolos::checkpoint {

// One tensor piece: `name` is the dataset path of its global tensor
// ("model/h.0.mlp.fc.weight", no leading slash), `tensor` this rank's local
// (possibly padded) tensor, `placement` where it sits.
using Piece = StatePiece;

// ---- collective layer (Placement level) -----------------------------------

// Collective over `group` (whose ranks are the mesh `layout`'s, in order):
// writes `pieces` and `meta` as the checkpoint directory `dir` atomically
// (temporary directory, fsync, rename). Does not touch `latest`.
void save_pieces(comm::ProcessGroup& group, const MeshLayout& layout, const std::string& dir,
                 const std::vector<Piece>& pieces, const Metadata& meta);

// Collective over `group`: verifies the checkpoint `dir` (each source dataset
// by one rank), then reads into each piece's tensor the hyperslab its
// placement names. Throws CheckpointError (the same on every rank) naming the
// file and dataset on a missing tensor (besides kStatePrefix's), a shape
// mismatch or damage; nothing is written into any tensor then. Returns the
// checkpoint's metadata.
// `only_under` (e.g. "model/"): only the checkpoint's tensors whose names
// start with it must match `pieces` and are verified; the others (the
// optimizer's moments, for inference) are left unread.
Metadata load_pieces(comm::ProcessGroup& group, const std::string& dir,
                     const std::vector<Piece>& pieces, const std::string& only_under = "");

// ---- a training run's checkpoints ---------------------------------------------

struct Options {
  std::string root;       // checkpoints go to <root>/step-N
  int64_t keep_last = 0;  // after a save, keep only the newest N (0: keep all)
  bool async = false;     // write in a background thread after a host copy
};

// Saves and loads TrainingStates as <root>/step-N, with `latest` and
// pruning. Construction is collective over `group`: the checkpointer splits
// a group of its own from it, so a background save never queues behind or
// interleaves with the caller's operations. The group's ranks are the ranks
// of the states' mesh, in layout order.
class Checkpointer {
 public:
  Checkpointer(const comm::ProcessGroupPtr& group, Options options);
  ~Checkpointer();  // waits for a pending save; never throws
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Collective. Saves `state` (every rank its own pieces; the ranks'
  // generator states gathered into one table) as <root>/step-<state.step>,
  // updates `latest` and prunes. Waits for the previous save first
  // (rethrowing its error). With async, returns once the pieces are copied
  // to host buffers; the files are written by a background thread.
  void save(const TrainingState& state);
  // Collective: waits for a pending asynchronous save; rethrows its error
  // (the same CheckpointError on every rank).
  void wait();
  // Collective: loads the checkpoint at `path` (a checkpoint directory, or a
  // root whose `latest` names one): reads into the tensors of
  // `state.pieces` the hyperslabs their placements name, and sets the step,
  // data position, optimizer steps and `rng_cpu` (this rank's generator
  // state when the world size matches the writer's, rank 0's otherwise;
  // empty when none was saved). The state's config and mesh stay this
  // run's (inspect() shows the writer's). Returns the directory.
  std::string load(const std::string& path, TrainingState& state);

  int64_t last_saved_step() const { return last_saved_step_; }
  const Options& options() const { return options_; }

 private:
  struct Pending;
  Options options_;
  comm::ProcessGroupPtr group_;
  std::unique_ptr<Pending> pending_;
  int64_t last_saved_step_ = -1;
};

// ---- tools (no MPI; `kolos ckpt`) -------------------------------------------

struct TensorInfo {
  std::string path;
  std::vector<int64_t> shape;
  std::string dtype;
  int64_t pieces = 0;
};
struct Inspection {
  std::string dir;
  Metadata meta;
  std::vector<int64_t> writers;
  std::vector<TensorInfo> tensors;
};
Inspection inspect(const std::string& path);
std::string format_inspection(const Inspection& inspection);

// Writes the global model weights (/model/*) as one safetensors file.
// Returns the number of tensors written.
int64_t export_safetensors(const std::string& path, const std::string& out_file);

// The global model weights (/model/*) of a checkpoint, whole, in memory, in
// the order they were saved, named without "model/"; and its metadata. The
// checkpoint is verified first (CheckpointError naming the first problem).
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;
struct ModelWeights {
  Metadata meta;
  NamedTensors tensors;
};
ModelWeights read_model_weights(const std::string& path);

// Writes `tensors` (CPU, any layout) as one safetensors file, in that order,
// with `metadata` as the header's __metadata__; atomically (temporary file,
// fsync, rename).
void write_safetensors(const std::string& file, const NamedTensors& tensors,
                       const std::vector<std::pair<std::string, std::string>>& metadata);

// Reads one safetensors file whole: every tensor, in the header's offset
// order, as a CPU tensor of its dtype. Every size is checked against the
// file before anything is allocated; CheckpointError naming the file and
// tensor on a malformed header, an unknown dtype, overlapping or
// out-of-bounds data, or a short file.
NamedTensors read_safetensors(const std::string& file);
// The weights of a Hugging Face model directory: `model.safetensors`, or
// the shards `model.safetensors.index.json`'s weight_map names (every shard
// read; a tensor missing from the shard the map names, a tensor in two
// shards, or one the map does not name is an error naming both).
NamedTensors read_safetensors_dir(const std::string& dir);

// Writes `weights` (global fp32 tensors, named as the model's parameters) as
// a one-rank checkpoint at step 0 under `root` (<root>/step-00000000 and
// `latest`), with zeroed AdamW moments: what a run that resumes from `root`
// on any mesh starts from, as if the weights were its initialisation.
// `config_toml` is recorded as the checkpoint's configuration. Returns the
// checkpoint directory.
std::string write_initial_checkpoint(const std::string& root, const NamedTensors& weights,
                                     const std::string& config_toml);

// Test hook (fault injection), only in the test build of the library
// (compiled with KOLOS_FAULT_INJECTION into lib/faults of the build tree,
// never installed): when the environment variables
// KOLOS_CKPT_TEST_DIE_RANK=R and KOLOS_CKPT_TEST_DIE_STEP=S are set, rank R
// _exit()s with code 9 right after writing its shard of the save of step S,
// before the save commits, as a rank killed mid-save would.

}  // namespace kolos::checkpoint
