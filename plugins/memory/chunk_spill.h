// BuildSpill: the parameters of a model built into place (the chunks
// plugin's placement_at_build), kept in an unnamed file until set-up has
// copied them into their chunks. Torch-free.
//
// As each block is built its trainable parameters' bytes go to the file and
// their memory is freed, so that the process never holds the whole model;
// set-up reads each back into the chunks it lays out. The file has no name
// (O_TMPFILE, else created and unlinked at once): nothing is left behind
// whatever ends the process. Ordinary buffered I/O: what the kernel caches
// is not the process's resident memory and is dropped under pressure.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>

namespace kolos::chunks {

class BuildSpill {
 public:
  // An unnamed file in `dir`; Error naming the directory otherwise.
  explicit BuildSpill(const std::string& dir);
  ~BuildSpill();
  BuildSpill(const BuildSpill&) = delete;
  BuildSpill& operator=(const BuildSpill&) = delete;

  // Appends `bytes` bytes at `data` under `key` (a parameter's TensorImpl);
  // Error naming the directory when the write fails (a full disk).
  void put(const void* key, const void* data, int64_t bytes);
  bool has(const void* key) const { return where_.count(key) > 0; }
  // The `bytes` bytes put under `key`, into `out`.
  void get(const void* key, void* out, int64_t bytes) const;
  int64_t size() const { return end_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  int fd_ = -1;
  int64_t end_ = 0;
  std::unordered_map<const void*, std::pair<int64_t, int64_t>> where_;  // offset, bytes
};

}  // namespace kolos::chunks
