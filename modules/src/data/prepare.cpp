// `kolos data prepare`: byte-level tokenisation into a uint16 token file.
//
// Atomicity: tokens go to `<output>.tmp.<pid>`, which is fsynced, closed and
// renamed over `output`, and then the directory is fsynced. A reader sees the
// old file or the whole new one, never a prefix; on any error the temporary
// file is removed and `output` is left as it was.
#include <sys/stat.h>

#include <cstring>
#include <vector>

#include "kolos/core/error.h"
#include "kolos/modules/data.h"
#include "kolos/core/posix_file.h"

namespace kolos::data {
namespace {

constexpr size_t kChunkBytes = size_t{1} << 20;


// Appends the bytes of `input` to `out_fd` as little-endian uint16 ids.
int64_t append_byte_tokens(const std::string& input, int out_fd, const std::string& out_path) {
  posix::ScopedFd in(::open(input.c_str(), O_RDONLY | O_CLOEXEC));
  if (!in.valid()) {
    throw DataError("cannot read input " + input + ": " + posix::errno_text(errno));
  }
  std::vector<unsigned char> bytes(kChunkBytes);
  std::vector<unsigned char> tokens(2 * kChunkBytes);
  int64_t count = 0;
  for (;;) {
    const ssize_t n = ::read(in.get(), bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      // A directory opens fine and fails here with EISDIR.
      throw DataError("cannot read input " + input + ": " + posix::errno_text(errno));
    }
    if (n == 0) break;
    for (ssize_t i = 0; i < n; ++i) {
      tokens[2 * i] = bytes[i];
      tokens[2 * i + 1] = 0;
    }
    posix::write_all(out_fd, tokens.data(), 2 * static_cast<size_t>(n), out_path);
    count += n;
  }
  return count;
}

}  // namespace

int64_t prepare_byte_tokens(const std::vector<std::string>& inputs, const std::string& output) {
  if (inputs.empty()) {
    throw DataError("kolos data prepare: no input files; give at least one FILE to tokenise");
  }
  if (output.empty()) {
    throw DataError("kolos data prepare: no output file; give one with -o out.bin");
  }
  const std::string temp = output + ".tmp." + std::to_string(::getpid());
  posix::ScopedFd out(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!out.valid()) {
    throw DataError("cannot create " + temp + " (temporary file for " + output +
                    "): " + posix::errno_text(errno));
  }
  posix::TempFileGuard guard(temp);

  int64_t count = 0;
  for (const std::string& input : inputs) count += append_byte_tokens(input, out.get(), temp);
  if (count == 0) {
    throw DataError("kolos data prepare: the inputs hold no bytes; nothing to write to " + output);
  }
  if (::fsync(out.get()) != 0) {
    throw DataError("cannot fsync " + temp + ": " + posix::errno_text(errno));
  }
  if (const int err = out.close_checked(); err != 0) {
    throw DataError("cannot close " + temp + ": " + posix::errno_text(err));
  }
  if (::rename(temp.c_str(), output.c_str()) != 0) {
    throw DataError("cannot rename " + temp + " to " + output + ": " + posix::errno_text(errno));
  }
  guard.commit();
  posix::sync_parent_directory(output);
  return count;
}

}  // namespace kolos::data
