// What the memory tiers' tests share: a scratch directory, NVMe store
// options and the message of an expected kolos::Error.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <exception>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

#include "kolos/core/error.h"
#include "kolos/memory/nvme_store.h"

namespace kolos::memory::testing {

// A fresh directory under `base` (/tmp by default: a disk file system here,
// unlike /dev/shm), removed with everything in it at the end of the test.
class TempDir {
 public:
  explicit TempDir(const std::string& base = "/tmp") {
    std::string pattern = base + "/kolos-memory-test.XXXXXX";
    char* made = ::mkdtemp(pattern.data());
    if (made == nullptr) throw std::runtime_error("mkdtemp in " + base + " failed");
    path_ = made;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A store in `dir` with `threads` I/O threads, the other options default.
inline NvmeOptions nvme_options(const std::string& dir, int threads = 4) {
  NvmeOptions options;
  options.dir = dir;
  options.threads = threads;
  return options;
}

// The message of the kolos::Error `f` throws; fails the test if it throws
// nothing or something else.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const kolos::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a kolos::Error: " << e.what();
    return {};
  }
  ADD_FAILURE() << "no error thrown";
  return {};
}

}  // namespace kolos::memory::testing
