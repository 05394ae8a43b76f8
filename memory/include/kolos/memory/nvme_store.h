// The NVMe tier of the memory role: fixed-size slots in one file that this
// process alone owns, read and written with direct I/O on a small pool of
// I/O threads.
//
// Direct I/O (O_DIRECT) bypasses the page cache: the point of this tier is
// to hold states that do not fit in host memory, and a page cache that keeps
// a copy of every slot written would take that memory back. O_DIRECT wants
// the buffer address, the file offset and the length aligned to the file
// system's direct-I/O alignment; slots are therefore multiples of
// alignment() and buffers come from allocate_aligned().
//
// Crash safety: the store writes only into a private folder it creates under
// the directory it is given (kolos-nvme.<pid>.<start>.<tag>.<host>), removes
// that folder when destroyed, and at construction removes the folders of
// processes on this host that no longer run (killed before their destructor
// ran). It never reads a file it did not create, and reading a slot that was
// not written by this store is an error, so nothing a dead run left behind
// can reach a new one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>

namespace kolos::memory {

// Direct-I/O alignment assumed when the kernel does not report one: the
// logical block size of every NVMe drive and of 4K-native disks.
inline constexpr int64_t kDefaultDirectIoAlignment = 4096;

struct AlignedFree {
  void operator()(std::byte* p) const noexcept;
};
using AlignedBuffer = std::unique_ptr<std::byte[], AlignedFree>;

// `bytes` bytes (rounded up to a multiple of `alignment`) at an address that
// is a multiple of `alignment` (a power of two). Throws kolos::Error when
// the allocation fails. The contents are uninitialised.
AlignedBuffer allocate_aligned(int64_t bytes, int64_t alignment = kDefaultDirectIoAlignment);

struct NvmeOptions {
  // memory.nvme_dir: an existing, writable directory on the drive to use.
  std::string dir;
  // I/O threads; each has at most one pread/pwrite in flight, so this is the
  // queue depth the drive sees.
  int threads = 4;
  // The least alignment used; raised to the file system's direct-I/O
  // alignment when the kernel reports a larger one (statx STATX_DIOALIGN).
  int64_t alignment = kDefaultDirectIoAlignment;
  // Where warnings go (a file system without O_DIRECT, a stale folder that
  // could not be removed). Empty: standard error, prefixed "kolos: warning: ".
  std::function<void(const std::string&)> warn;
};

class NvmeStore {
 public:
  // Checks `options.dir` (exists, is a directory, writable, has room for
  // slots x slot_bytes) and that slot_bytes is a multiple of the alignment,
  // removes stale folders, creates this store's folder and its file with all
  // slots allocated, and starts the I/O threads. Each failure is a
  // kolos::Error naming the path and what would work.
  //
  // A file system that refuses O_DIRECT (an old tmpfs, some network file
  // systems) is used with buffered I/O and a warning; direct_io() says which.
  NvmeStore(const NvmeOptions& options, int64_t slot_bytes, int64_t slots);
  // Waits for queued I/O, stops the threads and removes the private folder.
  ~NvmeStore();
  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;

  // Queues a write of slot_bytes() bytes from `src` into `slot`. `src` must
  // stay valid and unchanged until the future is ready, and be aligned to
  // alignment() when direct_io(). The future throws kolos::Error (naming the
  // file, offset and errno text) when the write failed; the slot then reads
  // as never written. While a read of the slot is queued or running,
  // write() throws kolos::Error at once.
  std::future<void> write(int64_t slot, const void* src);
  // Queues a read of `slot` into `dst` (slot_bytes() bytes, aligned as for
  // write). The slot must have been written, with no write of it queued or
  // running, when read() is called: otherwise read() throws kolos::Error at
  // once.
  std::future<void> read(int64_t slot, void* dst);

  // The same for the first `bytes` bytes of the slot only (a multiple of
  // alignment(), at most slot_bytes()), so that a chunk smaller than the
  // slot moves without a slot-sized buffer. A read of a slot returns the
  // bytes of its last write; reading past what that write covered gives
  // unspecified bytes.
  std::future<void> write(int64_t slot, const void* src, int64_t bytes);
  std::future<void> read(int64_t slot, void* dst, int64_t bytes);

  int64_t slot_bytes() const noexcept;
  int64_t slots() const noexcept;
  int64_t alignment() const noexcept;
  bool direct_io() const noexcept;
  int threads() const noexcept;
  // This store's private folder and the one file in it.
  const std::string& folder() const noexcept;
  const std::string& file() const noexcept;

  // Every private folder's name starts with this.
  static const char* folder_prefix() noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kolos::memory
