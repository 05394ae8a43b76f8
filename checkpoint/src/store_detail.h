// Private to libkolos_checkpoint: the steps of a save and a load, shared by
// the collective functions (store.cpp), the Checkpointer and the tools.
#pragma once

#include <ATen/core/Tensor.h>
#include <mpi.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kolos/checkpoint/checkpoint.h"

namespace kolos::checkpoint::detail {

// Bounds on what a reader accepts from a file before allocating anything.
inline constexpr int64_t kMaxTensors = 1 << 20;
inline constexpr int64_t kMaxMappings = 1 << 20;   // pieces of one tensor
inline constexpr int64_t kMaxText = 64 << 20;      // config, tensor list
inline constexpr int64_t kMaxName = 4096;          // a file or dataset name
inline constexpr int64_t kMaxRngBytes = 64 << 20;  // all ranks' generator states
inline constexpr int64_t kChunkBytes = 16 << 20;   // checksum / copy granularity

// One piece as the index records it.
struct Record {
  std::string path;   // "model/embed.wte.weight" (no leading slash)
  std::string dtype;  // "float32", ...
  int64_t rank = 0;   // the writing rank: its file is shard-<rank>.h5
  uint32_t crc = 0;
  std::vector<int64_t> global_shape, offset, length;
  int64_t numel() const;
};

struct HostPiece {
  Record record;
  at::Tensor data;  // contiguous, CPU, the unpadded piece
};

// A save, ready to write: the host copies of this rank's pieces and the
// metadata. Building it is local (no communication); writing it is
// collective (run_job), and may run in a background thread.
struct SaveJob {
  std::string dir;  // the final directory, <root>/step-N
  int rank = 0;
  std::vector<HostPiece> mine;
  Metadata meta;
};

std::string stored_dtype_name(at::ScalarType type);
// The extents a tensor of this placement has in files (0-d tensors: [1]).
std::vector<int64_t> file_shape(const std::vector<int64_t>& shape);

// `copy`: clone the pieces (asynchronous saves); otherwise contiguous views
// of the live tensors are kept where possible.
SaveJob snapshot(const MeshLayout& layout, int rank, const std::string& dir,
                 const std::vector<Piece>& pieces, Metadata meta, bool copy);
// Collective over `group`: write shards into the temporary directory, gather
// the records, rank 0 writes the index and commits (fsync, rename).
void run_job(comm::ProcessGroup& group, SaveJob& job);
// Rank 0 only: replace <root>/latest by rename; remove all but the newest
// `keep_last` step-N directories (0: none).
void update_latest(const std::string& root, const std::string& name);
void prune(const std::string& root, int64_t keep_last);

// ---- reading ----
struct Mapping {
  std::string tensor;  // "model/..."
  std::string file;    // "shard-3.h5"
  std::string dataset; // "/model/..."
  std::vector<int64_t> offset, length;
};
struct IndexInfo {
  std::string dir;
  Metadata meta;
  std::vector<int64_t> writers;
  std::vector<std::string> tensors;  // in save order
  std::map<std::string, std::vector<int64_t>> shapes;
  std::map<std::string, std::string> dtypes;
  std::vector<Mapping> mappings;  // every piece of every tensor, in tensor order
};
// Reads index.h5 of `dir` (bounded). `with_rng`: also /rng/cpu.
IndexInfo read_index(const std::string& dir, bool with_rng);
// Checks one mapping's source: file present, dataset shape, offset, dtype,
// checksum. Returns "" or the problem, naming the file and dataset.
std::string verify_mapping(const IndexInfo& index, const Mapping& m);
// Problems with the tensors' coverage by their pieces (gaps, overlaps).
std::vector<std::string> coverage_problems(const IndexInfo& index);

void fsync_path(const std::string& path, bool directory);

// Collective over `group`: every rank's bytes on rank 0, in rank order
// (empty on the other ranks).
std::vector<std::string> gather_bytes(comm::ProcessGroup& group, const std::string& mine);

}  // namespace kolos::checkpoint::detail
