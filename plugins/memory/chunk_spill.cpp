// BuildSpill (chunk_spill.h).
#include "chunk_spill.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kolos/core/error.h"

namespace kolos::chunks {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

}  // namespace

BuildSpill::BuildSpill(const std::string& dir) : dir_(dir) {
#ifdef O_TMPFILE
  fd_ = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
#endif
  if (fd_ < 0) {
    // File systems without O_TMPFILE: a named file, unlinked at once.
    std::vector<char> name(dir.begin(), dir.end());
    const std::string tail = "/kolos-build-XXXXXX";
    name.insert(name.end(), tail.begin(), tail.end());
    name.push_back('\0');
    fd_ = ::mkostemp(name.data(), O_CLOEXEC);
    if (fd_ >= 0) ::unlink(name.data());
  }
  if (fd_ < 0) {
    throw Error(
        "memory (chunks): cannot create the file that holds the model while it is "
        "built, in " +
        dir + ": " + errno_text(errno));
  }
}

BuildSpill::~BuildSpill() {
  if (fd_ >= 0) ::close(fd_);
}

void BuildSpill::put(const void* key, const void* data, int64_t bytes) {
  const auto* p = static_cast<const char*>(data);
  int64_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pwrite(fd_, p + done, static_cast<size_t>(bytes - done), end_ + done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw Error("memory (chunks): writing the model as it is built to a file in " + dir_ +
                  " failed after " + std::to_string(end_ + done) +
                  " bytes: " + errno_text(n < 0 ? errno : ENOSPC));
    }
    done += n;
  }
  where_[key] = {end_, bytes};
  end_ += bytes;
}

void BuildSpill::get(const void* key, void* out, int64_t bytes) const {
  const auto it = where_.find(key);
  KOLOS_CHECK(it != where_.end() && it->second.second == bytes,
              "memory (chunks): internal error: a parameter of ", bytes,
              " bytes was not kept as the model was built");
  auto* p = static_cast<char*>(out);
  int64_t done = 0;
  while (done < bytes) {
    const ssize_t n =
        ::pread(fd_, p + done, static_cast<size_t>(bytes - done), it->second.first + done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw Error("memory (chunks): reading the model back from its file in " + dir_ +
                  " failed: " + (n < 0 ? errno_text(errno) : std::string("end of file")));
    }
    done += n;
  }
}

}  // namespace kolos::chunks
