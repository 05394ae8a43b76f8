// Owned POSIX file descriptors, errno messages and the pieces of an atomic
// file write (a temporary file, fsynced, renamed over the output, then the
// directory fsynced), for the tools that write data files (modules/data,
// tokenizer/).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kolos/core/error.h"

namespace kolos::posix {

// strerror(err) as a std::string. strerror is not required to be thread-safe,
// strerror_r comes in two incompatible flavours; this picks whichever the C
// library provides.
inline std::string errno_text(int err) {
  char buffer[256] = {0};
  auto pick = [&](auto result) -> std::string {
    if constexpr (std::is_same_v<decltype(result), char*>) {
      return result != nullptr ? std::string(result) : std::string("unknown error");  // GNU
    } else {
      return result == 0 ? std::string(buffer) : "errno " + std::to_string(err);  // XSI
    }
  };
  return pick(strerror_r(err, buffer, sizeof(buffer)));
}

// A file descriptor closed by the destructor. Move-only.
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(ScopedFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

  // Closes now and reports close()'s errno (0 on success): for written files a
  // failed close can be the first sign of a lost write, so writers check it.
  int close_checked() {
    if (fd_ < 0) return 0;
    const int result = ::close(std::exchange(fd_, -1));
    return result == 0 ? 0 : errno;
  }

 private:
  void reset() noexcept {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  }

  int fd_ = -1;
};

// Removes a temporary file unless commit() was called. Never throws.
class TempFileGuard {
 public:
  explicit TempFileGuard(std::string path) : path_(std::move(path)) {}
  TempFileGuard(const TempFileGuard&) = delete;
  TempFileGuard& operator=(const TempFileGuard&) = delete;
  ~TempFileGuard() {
    if (!committed_) ::unlink(path_.c_str());
  }
  void commit() { committed_ = true; }

 private:
  std::string path_;
  bool committed_ = false;
};

// The directory holding `path` ("." for a bare file name).
inline std::string parent_directory(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Writes all of `size` bytes to `fd`, retrying short writes and EINTR.
// Throws DataError naming `path`.
inline void write_all(int fd, const void* data, size_t size, const std::string& path) {
  const char* at = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, at, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw DataError("cannot write " + path + ": " + errno_text(errno));
    }
    at += n;
    size -= static_cast<size_t>(n);
  }
}

// Makes a rename into `path`'s directory durable. Best effort: the data is
// already safe and some file systems refuse fsync on a directory.
inline void sync_parent_directory(const std::string& path) {
  ScopedFd dir(::open(parent_directory(path).c_str(), O_RDONLY | O_CLOEXEC));
  if (dir.valid()) ::fsync(dir.get());
}

// The whole content of a regular file. Throws DataError naming `path`
// (described as `what`, e.g. "image") when it cannot be opened or read.
inline std::vector<uint8_t> read_whole_file(const std::string& path, const std::string& what) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) throw DataError("cannot open " + what + " " + path + ": " + errno_text(errno));
  std::vector<uint8_t> bytes;
  struct stat st {};
  if (::fstat(fd.get(), &st) == 0 && st.st_size > 0) bytes.reserve(static_cast<size_t>(st.st_size));
  uint8_t buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buffer, sizeof buffer);
    if (n < 0) {
      if (errno == EINTR) continue;
      // A directory opens fine and fails here with EISDIR.
      throw DataError("cannot read " + what + " " + path + ": " + errno_text(errno));
    }
    if (n == 0) break;
    bytes.insert(bytes.end(), buffer, buffer + n);
  }
  return bytes;
}

}  // namespace kolos::posix
