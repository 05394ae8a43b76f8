// The token file source: a read-only memory map of nanoGPT-style .bin files.
//
// Layout: a flat array of little-endian uint16 or uint32 token ids, no header.
// Sample windows: W = (n_tokens - 1) / seq_len windows at stride seq_len;
// window w is tokens[w*seq_len .. w*seq_len + seq_len] (seq_len + 1 ids, the
// last id of one window is the first of the next). The tail that does not fill
// a window is never read.
// Numbering: sample i is epoch e = i / W, position p = i % W, and reads window
// perm_e(p), where perm_e is a FeistelPermutation of [0, W) keyed by
// (seed, e). So every window is read exactly once per epoch, each epoch in a
// different order, and sample i is the same whoever reads it and whenever.
// Contract: the file must not be truncated while a source maps it (reads past
// the new end raise SIGBUS); `kolos data prepare` replaces files by rename,
// which leaves an existing mapping intact.
#include <sys/mman.h>
#include <sys/stat.h>

#include <sstream>
#include <utility>

#include "hash.h"
#include "kolos/core/error.h"
#include "kolos/modules/data.h"
#include "kolos/core/posix_file.h"

namespace kolos::data {
namespace {

// Separates the permutation keys of this source from other uses of the seed.
constexpr uint64_t kShuffleDomain = 0x746f6b656e66696cULL;  // "tokenfil"

// 1234567 -> "1,234,567" (logs of large files stay readable).
std::string with_thousands(int64_t value) {
  std::string digits = std::to_string(value < 0 ? -value : value);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i != 0 && (digits.size() - i) % 3 == 0) out += ',';  // before each group of three
    out += digits[i];
  }
  return value < 0 ? "-" + out : out;
}

// A read-only mapping of a whole file, unmapped by the destructor. Move-only.
class MappedFile {
 public:
  // Maps `size` bytes of the open file `fd` (size > 0); the mapping stays valid
  // after fd is closed.
  MappedFile(int fd, size_t size, const std::string& path) : size_(size) {
    void* data = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (data == MAP_FAILED) {
      throw DataError("cannot memory-map token file " + path + " (" + std::to_string(size_) +
                      " bytes): " + posix::errno_text(errno));
    }
    data_ = static_cast<const unsigned char*>(data);
  }
  MappedFile(MappedFile&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(other.size_) {}
  MappedFile& operator=(MappedFile&&) = delete;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), size_);
  }

  const unsigned char* data() const { return data_; }

 private:
  const unsigned char* data_ = nullptr;
  size_t size_;
};

class TokenFileSource final : public TokenSource {
 public:
  TokenFileSource(std::string path, std::string dtype, int width, int64_t n_tokens, int64_t seq_len,
                  int64_t vocab, uint64_t seed, MappedFile file)
      : path_(std::move(path)),
        dtype_(std::move(dtype)),
        width_(width),
        n_tokens_(n_tokens),
        seq_len_(seq_len),
        vocab_(vocab),
        windows_((n_tokens - 1) / seq_len),
        shuffle_key_(internal::hash_words(seed, kShuffleDomain)),
        file_(std::move(file)) {}

  int64_t seq_len() const override { return seq_len_; }

  // Thread-safe: the mapping is read-only and the permutation is stateless.
  void sample(int64_t index, int64_t* out) const override {
    if (index < 0) {
      throw DataError(detail::concat("token file ", path_, ": sample index ", index,
                                     " is negative; indices start at 0"));
    }
    const uint64_t epoch = static_cast<uint64_t>(index / windows_);
    const uint64_t position = static_cast<uint64_t>(index % windows_);
    const internal::FeistelPermutation perm(static_cast<uint64_t>(windows_),
                                            internal::hash_words(shuffle_key_, epoch));
    const int64_t first = static_cast<int64_t>(perm(position)) * seq_len_;
    const unsigned char* bytes = file_.data() + first * width_;
    for (int64_t i = 0; i <= seq_len_; ++i) {
      const unsigned char* b = bytes + i * width_;
      // Byte by byte: little-endian on every host; compilers fuse it into a load.
      int64_t token = int64_t{b[0]} | (int64_t{b[1]} << 8);
      if (width_ == 4) token |= (int64_t{b[2]} << 16) | (int64_t{b[3]} << 24);
      if (token >= vocab_) {
        throw DataError(detail::concat(
            "token file ", path_, ": token ", token, " at offset ", first + i, " (byte ",
            (first + i) * width_, ") is not below vocab ", vocab_, "; set model.vocab to at least ",
            token + 1, " or check data.dtype (", dtype_, ")"));
      }
      out[i] = token;
    }
  }

  std::string describe() const override {
    std::ostringstream out;
    out << "tokens: " << path_ << " (" << dtype_ << ", " << with_thousands(n_tokens_) << " tokens, "
        << with_thousands(windows_) << " samples/epoch)";
    return out.str();
  }

 private:
  std::string path_;
  std::string dtype_;
  int width_;
  int64_t n_tokens_;
  int64_t seq_len_;
  int64_t vocab_;
  int64_t windows_;
  uint64_t shuffle_key_;
  MappedFile file_;
};

}  // namespace

std::unique_ptr<TokenSource> make_token_file_source(const std::string& path,
                                                    const std::string& dtype, int64_t seq_len,
                                                    int64_t vocab, uint64_t seed) {
  int width = 0;
  if (dtype == "uint16") {
    width = 2;
  } else if (dtype == "uint32") {
    width = 4;
  } else {
    throw DataError("token file " + path + ": unknown dtype '" + dtype +
                    "'; valid: uint16, uint32");
  }
  if (seq_len < 1) {
    throw DataError(
        detail::concat("token file ", path, ": seq_len is ", seq_len, ", needs at least 1"));
  }
  if (vocab < 1) {
    throw DataError(
        detail::concat("token file ", path, ": vocab is ", vocab, ", needs at least 1"));
  }

  // Open first and fstat the descriptor, so the checks and the mapping see the
  // same file even if the path is replaced meanwhile.
  posix::ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    throw DataError("cannot open token file " + path + ": " + posix::errno_text(errno));
  }
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) {
    throw DataError("cannot stat token file " + path + ": " + posix::errno_text(errno));
  }
  if (S_ISDIR(info.st_mode)) {
    throw DataError("token file " + path + " is a directory; expected a file of " + dtype +
                    " token ids (make one with `kolos data prepare`)");
  }
  if (!S_ISREG(info.st_mode)) {
    throw DataError("token file " + path + " is not a regular file; expected a file of " + dtype +
                    " token ids");
  }
  const auto bytes = static_cast<int64_t>(info.st_size);
  if (bytes % width != 0) {
    throw DataError(detail::concat("file ", path, " has ", bytes, " bytes, not a whole number of ",
                                   dtype, " tokens (", width, " bytes each)"));
  }
  const int64_t n_tokens = bytes / width;
  if (n_tokens < seq_len + 1) {
    throw DataError(detail::concat("file ", path, " needs at least ", seq_len + 1,
                                   " tokens for one sample of seq_len ", seq_len, ", has ",
                                   n_tokens));
  }
  MappedFile file(fd.get(), static_cast<size_t>(bytes), path);
  return std::make_unique<TokenFileSource>(path, dtype, width, n_tokens, seq_len, vocab, seed,
                                           std::move(file));
}

}  // namespace kolos::data
