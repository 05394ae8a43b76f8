// Owned POSIX file descriptors and errno messages (internal to modules/data).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

namespace kolos::data::internal {

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

}  // namespace kolos::data::internal
