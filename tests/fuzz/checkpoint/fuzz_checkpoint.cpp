// libFuzzer target: the checkpoint readers. The input is a checkpoint of one
// writing rank, packed as
//
//   [4 bytes: n, little-endian] [n bytes: index.h5] [the rest: shard-0.h5]
//
// (pack.py packs a real checkpoint directory this way; the seeds are two).
// The files are written into a scratch directory and read by the code that
// `kolos ckpt verify` and a resume run: kolos::checkpoint::verify (the index
// with its attributes and /rng/cpu, the virtual datasets' mappings, each
// piece's shard dataset, attributes and checksum, coverage). When it finds
// no problem, every tensor is read whole through the index's virtual
// dataset, in bounded blocks of rows, as load does with its hyperslabs.
//
// Any bytes must give a list of problems (or none), never a crash, a hang,
// a sanitizer report or an exception. After each input no HDF5 object may
// be left open (a leaked hid_t would also keep the file cached by HDF5 for
// the next input).
#include <hdf5.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "h5.h"
#include "kolos/checkpoint/format.h"
#include "reader.h"

namespace kolos::checkpoint::detail {
// The torch side of the library defines it from LibTorch's generator; this
// torch-free build uses the size LibTorch 1.13's CPUGeneratorImplState has.
int64_t cpu_rng_state_bytes() { return 5056; }
}  // namespace kolos::checkpoint::detail

namespace {

std::string scratch;

void write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) {
    std::perror(path.c_str());
    std::abort();
  }
}

// Reads every tensor of a sound checkpoint through its virtual dataset.
void read_tensors(const std::string& dir) {
  using namespace kolos::checkpoint;
  const detail::IndexInfo index = detail::read_index(dir, /*with_rng=*/false);
  auto lock = h5::h5_lock();
  h5::H5Id file = h5::open_file_read(dir + "/index.h5");
  for (const auto& tensor : index.tensors) {
    const std::string where = dir + "/index.h5: dataset /" + tensor;
    h5::H5Id ds = h5::dataset(H5Dopen2(file, ("/" + tensor).c_str(), H5P_DEFAULT), where);
    h5::read_rows(ds, index.shapes.at(tensor), index.dtypes.at(tensor), 1 << 20, where,
                  [](const char*, size_t) {});
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : std::getenv("TMPDIR");
  std::string pattern = std::string(base ? base : "/tmp") + "/kolos-fuzz-ckpt-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    std::perror("mkdtemp");
    std::abort();
  }
  scratch = pattern;
  // libFuzzer ends a timed run with exit(): remove the scratch files then.
  std::atexit([] {
    for (const char* name : {"/index.h5", "/shard-0.h5"}) std::remove((scratch + name).c_str());
    rmdir(scratch.c_str());
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  size_t n = static_cast<size_t>(data[0]) | static_cast<size_t>(data[1]) << 8 |
             static_cast<size_t>(data[2]) << 16 | static_cast<size_t>(data[3]) << 24;
  if (n > size - 4) n = size - 4;
  write_file(scratch + "/index.h5", data + 4, n);
  const std::string shard = scratch + "/shard-0.h5";
  if (size - 4 - n > 0) {
    write_file(shard, data + 4 + n, size - 4 - n);
  } else {
    std::remove(shard.c_str());
  }
  try {
    if (kolos::checkpoint::verify(scratch).empty()) read_tensors(scratch);
  } catch (const kolos::CheckpointError&) {
    // A checkpoint that verifies may still fail to read: that is an error
    // message, not a crash.
  }
  const ssize_t open = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
  if (open != 0) {
    std::fprintf(stderr, "%zd HDF5 objects left open after reading the input\n", open);
    std::abort();
  }
  return 0;
}
