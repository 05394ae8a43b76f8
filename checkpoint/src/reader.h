// Private to libkolos_checkpoint: the readers of a checkpoint's index and
// shards, shared by load (store.cpp), the tools (`kolos ckpt`) and the fuzz
// target (tests/fuzz/checkpoint). Torch-free and MPI-free.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kolos/checkpoint/format.h"

namespace kolos::checkpoint::detail {

// Bounds on what a reader accepts from a file before allocating anything.
inline constexpr int64_t kMaxTensors = 1 << 20;
inline constexpr int64_t kMaxMappings = 1 << 20;   // pieces of one tensor
inline constexpr int64_t kMaxText = 64 << 20;      // config, tensor list
inline constexpr int64_t kMaxName = 4096;          // a file or dataset name
inline constexpr int64_t kMaxRngBytes = 64 << 20;  // all ranks' generator states
inline constexpr int64_t kChunkBytes = 16 << 20;   // checksum / copy granularity

// ---- reading ----
struct Mapping {
  std::string tensor;   // "model/..."
  std::string file;     // "shard-3.h5"
  std::string dataset;  // "/model/..."
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

// The size in bytes of one LibTorch CPU generator state, as this LibTorch
// writes it (each row of /rng/cpu). Defined on the torch side of the library
// (store.cpp); a torch-free build of the readers defines its own.
int64_t cpu_rng_state_bytes();

// "[32, 32]"
std::string dims_string(const std::vector<int64_t>& dims);

}  // namespace kolos::checkpoint::detail
