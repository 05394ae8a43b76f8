#include "kolos/memory/nvme_store.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <random>
#include <sstream>
#include <system_error>
#include <thread>
#include <vector>

#include "kolos/core/error.h"

namespace kolos::memory {
namespace {

namespace fs = std::filesystem;

std::string errno_text(int err) {
  // std::system_category().message is thread-safe, unlike strerror.
  return std::system_category().message(err) + " (errno " + std::to_string(err) + ")";
}

std::string mib(int64_t bytes) {
  std::ostringstream out;
  out << bytes << " bytes (" << static_cast<double>(bytes) / (1024.0 * 1024.0) << " MiB)";
  return out.str();
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  std::string host(name);
  // The host ends the folder name; a '/' would make it a path.
  for (char& c : host) {
    if (c == '/') c = '_';
  }
  return host;
}

// Field 22 of /proc/<pid>/stat: the process's start time in clock ticks
// since boot. With the pid it names one process for the life of the host,
// where the pid alone is reused. Empty when the process does not exist.
std::string start_time(long pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!in || !std::getline(in, stat)) return {};
  // The command name (field 2) may hold spaces and ')': fields after it
  // start after the last ')'.
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return {};
  std::istringstream fields(stat.substr(close + 1));
  std::string field;
  for (int index = 3; index <= 22; ++index) {
    if (!(fields >> field)) return {};
  }
  return field;
}

std::string random_tag() {
  std::random_device device;
  std::ostringstream out;
  out << std::hex << device() << device();
  return out.str();
}

// A folder name of ours: kolos-nvme.<pid>.<start>.<tag>.<host>.
struct FolderName {
  long pid = 0;
  std::string start;
  std::string host;
};

bool parse_folder_name(const std::string& name, FolderName* out) {
  const std::string prefix = NvmeStore::folder_prefix();
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  std::vector<std::string> parts;
  std::size_t begin = prefix.size();
  for (int i = 0; i < 3; ++i) {
    const auto dot = name.find('.', begin);
    if (dot == std::string::npos) return false;
    parts.push_back(name.substr(begin, dot - begin));
    begin = dot + 1;
  }
  if (begin >= name.size() || parts[0].empty() || parts[1].empty()) return false;
  for (char c : parts[0] + parts[1]) {
    if (c < '0' || c > '9') return false;
  }
  out->pid = std::strtol(parts[0].c_str(), nullptr, 10);
  out->start = parts[1];
  out->host = name.substr(begin);
  return out->pid > 0;
}

// True when the process that made a folder on this host no longer runs:
// its pid is gone, or now belongs to a process started at another time.
bool process_gone(const FolderName& folder) {
  if (::kill(static_cast<pid_t>(folder.pid), 0) != 0 && errno == ESRCH) return true;
  const std::string now = start_time(folder.pid);
  // An unreadable /proc entry (another user's process under hidepid) is
  // taken as alive: a folder left is only disk space, a folder removed under
  // a live run would break it.
  return !now.empty() && folder.start != "0" && now != folder.start;
}

// The direct-I/O alignment the kernel reports for `path` (statx
// STATX_DIOALIGN, Linux 6.1 and later), or 0 when it reports none. glibc
// 2.36's struct statx predates the field, so the kernel's layout is spelled
// out here (include/uapi/linux/stat.h).
int64_t reported_dio_alignment(const std::string& path) {
#ifdef SYS_statx
  struct KernelStatx {
    uint32_t mask, blksize;
    uint64_t attributes;
    uint32_t nlink, uid, gid;
    uint16_t mode, pad1;
    uint64_t ino, size, blocks, attributes_mask;
    uint8_t times[4 * 16];
    uint32_t rdev_major, rdev_minor, dev_major, dev_minor;
    uint64_t mnt_id;
    uint32_t dio_mem_align, dio_offset_align;
    uint64_t spare[12];
  } stx{};
  static_assert(offsetof(KernelStatx, dio_mem_align) == 0x98, "struct statx layout");
  constexpr unsigned kStatxDioAlign = 0x00002000U;
  if (::syscall(SYS_statx, AT_FDCWD, path.c_str(), 0, kStatxDioAlign, &stx) != 0) return 0;
  if ((stx.mask & kStatxDioAlign) == 0) return 0;
  return std::max<int64_t>(stx.dio_mem_align, stx.dio_offset_align);
#else
  (void)path;
  return 0;
#endif
}

bool power_of_two(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

}  // namespace

void AlignedFree::operator()(std::byte* p) const noexcept { std::free(p); }

AlignedBuffer allocate_aligned(int64_t bytes, int64_t alignment) {
  if (!power_of_two(alignment) || alignment < static_cast<int64_t>(sizeof(void*))) {
    throw Error(detail::concat("allocate_aligned: alignment ", alignment,
                               " is not a power of two of at least ", sizeof(void*)));
  }
  if (bytes <= 0) throw Error(detail::concat("allocate_aligned: ", bytes, " bytes; give > 0"));
  const int64_t rounded = (bytes + alignment - 1) / alignment * alignment;
  void* p = nullptr;
  const int rc =
      ::posix_memalign(&p, static_cast<std::size_t>(alignment), static_cast<std::size_t>(rounded));
  if (rc != 0) {
    throw Error(detail::concat("allocate_aligned: ", mib(rounded), " aligned to ", alignment,
                               " failed: ", errno_text(rc)));
  }
  return AlignedBuffer(static_cast<std::byte*>(p));
}

struct NvmeStore::Impl {
  struct Op {
    bool is_write = false;
    int64_t slot = 0;
    int64_t bytes = 0;  // from the slot's start; a multiple of the alignment
    std::byte* buffer = nullptr;
    std::promise<void> done;
  };

  std::function<void(const std::string&)> warn;
  int64_t slot_bytes = 0;
  int64_t slots = 0;
  int64_t alignment = 0;
  bool direct = false;
  int fd = -1;
  std::string folder;
  std::string file;
  // What each slot holds, guarded by `mutex`. A read needs `written` and no
  // write queued or running; a write needs no read queued or running, so a
  // read never sees a half-written slot and a write never changes a buffer
  // being read into.
  struct SlotState {
    int32_t writes = 0;    // queued or running
    int32_t reads = 0;     // queued or running
    bool written = false;  // the last write completed and nothing failed since
    bool failed = false;   // a write failed since the slot was last idle
  };
  std::vector<SlotState> state;

  std::mutex mutex;
  std::condition_variable ready;
  std::deque<Op> queue;
  bool stopping = false;
  std::vector<std::thread> workers;

  void run_worker();
  void transfer(Op& op);
  void remove_folder() noexcept;
};

void NvmeStore::Impl::remove_folder() noexcept {
  if (folder.empty()) return;
  std::error_code ec;
  fs::remove_all(folder, ec);
  if (ec) {
    try {
      warn("could not remove the NVMe store's folder '" + folder + "': " + ec.message() +
           "; it is removed by the next store that opens this directory on this host");
    } catch (...) {
    }
  }
}

void NvmeStore::Impl::transfer(Op& op) {
  const int64_t offset = op.slot * slot_bytes;
  int64_t done = 0;
  while (done < op.bytes) {
    const auto length = static_cast<std::size_t>(op.bytes - done);
    const ssize_t n = op.is_write ? ::pwrite(fd, op.buffer + done, length, offset + done)
                                  : ::pread(fd, op.buffer + done, length, offset + done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      std::ostringstream what;
      what << "NVMe store: " << (op.is_write ? "pwrite of slot " : "pread of slot ") << op.slot
           << (op.is_write ? " to '" : " from '") << file << "' at offset " << offset + done << " ("
           << op.bytes - done << " of " << op.bytes << " bytes left) failed: "
           << (n == 0 ? std::string("unexpected end of file") : errno_text(err));
      if (n < 0 && err == ENOSPC) what << "; free space on the drive of memory.nvme_dir";
      throw Error(what.str());
    }
    done += n;
  }
}

void NvmeStore::Impl::run_worker() {
  for (;;) {
    Op op;
    {
      std::unique_lock<std::mutex> lock(mutex);
      ready.wait(lock, [&] { return stopping || !queue.empty(); });
      if (queue.empty()) return;  // stopping, and everything queued is done
      op = std::move(queue.front());
      queue.pop_front();
    }
    std::exception_ptr error;
    try {
      transfer(op);
    } catch (...) {
      error = std::current_exception();
    }
    {
      // Before the future is ready: whoever waited on it may read or
      // write the slot next.
      std::lock_guard<std::mutex> lock(mutex);
      SlotState& slot = state[static_cast<std::size_t>(op.slot)];
      if (op.is_write) {
        slot.failed = slot.failed || error != nullptr;
        if (--slot.writes == 0) {
          slot.written = !slot.failed;
          slot.failed = false;
        }
      } else {
        --slot.reads;
      }
    }
    if (error) {
      op.done.set_exception(error);
    } else {
      op.done.set_value();
    }
  }
}

const char* NvmeStore::folder_prefix() noexcept { return "kolos-nvme."; }

NvmeStore::NvmeStore(const NvmeOptions& options, int64_t slot_bytes, int64_t slots)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.warn = options.warn ? options.warn : [](const std::string& message) {
    std::cerr << "kolos: warning: " << message << "\n";
  };
  const std::string& dir = options.dir;
  const std::string where = "memory.nvme_dir '" + dir + "'";
  if (dir.empty()) {
    throw Error("memory.nvme_dir is empty; give an existing, writable directory on a local drive");
  }
  if (slot_bytes <= 0 || slots <= 0) {
    throw Error(detail::concat("NVMe store in ", where, ": ", slots, " slots of ", slot_bytes,
                               " bytes; both must be > 0"));
  }
  if (options.threads < 1) {
    throw Error(detail::concat("NVMe store in ", where, ": ", options.threads,
                               " I/O threads; give at least 1"));
  }
  if (!power_of_two(options.alignment) || options.alignment < 512) {
    throw Error(detail::concat("NVMe store in ", where, ": alignment ", options.alignment,
                               " is not a power of two of at least 512"));
  }

  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    const int err = errno;
    throw Error(where + " cannot be used: " + errno_text(err) +
                "; create it (mkdir -p) or give an existing directory on a local drive");
  }
  if (!S_ISDIR(st.st_mode)) {
    throw Error(where + " is not a directory; give a directory (the store creates its own " +
                "folder inside it)");
  }

  // Stale folders first: their space counts as free below.
  const std::string host = host_name();
  {
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      FolderName name;
      if (!parse_folder_name(it->path().filename().string(), &name)) continue;
      if (name.host != host || !process_gone(name)) continue;
      std::error_code removed;
      fs::remove_all(it->path(), removed);
      if (removed) {
        s.warn("could not remove the stale NVMe store folder '" + it->path().string() +
               "' of process " + std::to_string(name.pid) +
               ", which no longer runs: " + removed.message());
      }
    }
  }

  // Writable: mode bits do not say (root bypasses them; a read-only mount
  // or /proc refuses root too), so create the folder and see.
  const long pid = static_cast<long>(::getpid());
  // Without /proc the start time is unknown: "0" keeps the name parseable,
  // and such a folder is stale only once its pid is gone.
  std::string started = start_time(pid);
  if (started.empty()) started = "0";
  const std::string folder = (fs::path(dir) / (std::string(folder_prefix()) + std::to_string(pid) +
                                               "." + started + "." + random_tag() + "." + host))
                                 .string();
  if (::mkdir(folder.c_str(), 0700) != 0) {
    const int err = errno;
    throw Error(where + " is not writable: creating '" + folder + "' failed: " + errno_text(err) +
                "; give a directory this process can create folders in");
  }
  s.folder = folder;
  // From here a failure removes the folder again.
  struct Cleanup {
    Impl* s;
    ~Cleanup() {
      if (s == nullptr) return;
      if (s->fd >= 0) ::close(s->fd);
      s->remove_folder();
    }
  } cleanup{&s};

  s.alignment = std::max(options.alignment, reported_dio_alignment(folder));
  if (slot_bytes % s.alignment != 0) {
    const int64_t up = (slot_bytes + s.alignment - 1) / s.alignment * s.alignment;
    throw Error(detail::concat("NVMe store in ", where, ": slot size ", slot_bytes,
                               " bytes is not a multiple of the direct-I/O alignment ", s.alignment,
                               "; use ", up, " (or ", up - s.alignment, ")"));
  }
  if (slots > INT64_MAX / slot_bytes) {
    throw Error(detail::concat("NVMe store in ", where, ": ", slots, " slots of ", slot_bytes,
                               " bytes overflow 64 bits"));
  }
  const int64_t total = slots * slot_bytes;
  struct statvfs vfs {};
  if (::statvfs(folder.c_str(), &vfs) != 0) {
    const int err = errno;
    throw Error(where + ": statvfs failed: " + errno_text(err));
  }
  const int64_t free_bytes =
      static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize);
  if (free_bytes < total) {
    throw Error(detail::concat("NVMe store in ", where, " needs ", slots, " slots x ", slot_bytes,
                               " bytes = ", mib(total), " but its file system has ",
                               mib(free_bytes),
                               " free; free space there, give a directory on a larger drive, or "
                               "use fewer or smaller slots"));
  }

  s.file = (fs::path(folder) / "slots.bin").string();
  s.fd = ::open(s.file.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, 0600);
  s.direct = s.fd >= 0;
  int direct_err = s.fd >= 0 ? 0 : errno;
  if (s.direct) {
    // Some file systems accept the flag at open and refuse the I/O: probe
    // one aligned block.
    AlignedBuffer probe = allocate_aligned(s.alignment, s.alignment);
    std::memset(probe.get(), 0, static_cast<std::size_t>(s.alignment));
    if (::pwrite(s.fd, probe.get(), static_cast<std::size_t>(s.alignment), 0) < 0) {
      direct_err = errno;
      s.direct = false;
      ::close(s.fd);
      s.fd = -1;
      ::unlink(s.file.c_str());
    }
  }
  if (!s.direct) {
    if (direct_err != EINVAL && direct_err != EOPNOTSUPP) {
      throw Error(where + ": creating '" + s.file + "' failed: " + errno_text(direct_err));
    }
    s.warn(where + ": the file system refuses direct I/O (O_DIRECT: " + errno_text(direct_err) +
           "); the NVMe store uses buffered I/O there, which goes through the page cache and "
           "takes host memory. Give a directory on a local ext4/xfs drive for direct I/O");
    // A refused O_DIRECT open may still have created the file.
    ::unlink(s.file.c_str());
    s.fd = ::open(s.file.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (s.fd < 0) {
      const int err = errno;
      throw Error(where + ": creating '" + s.file + "' failed: " + errno_text(err));
    }
  }

  // Allocate every slot now: a full drive fails here, with the numbers,
  // not in the middle of training; and writes into allocated blocks do not
  // extend the file, so concurrent direct writes need no exclusive lock.
  int rc = ::posix_fallocate(s.fd, 0, total);
  if (rc == EOPNOTSUPP || rc == EINVAL) rc = ::ftruncate(s.fd, total) == 0 ? 0 : errno;
  if (rc != 0) {
    throw Error(detail::concat(
        "NVMe store in ", where, ": allocating ", mib(total), " for '", s.file, "' failed: ",
        errno_text(rc), rc == ENOSPC ? "; free space there or use fewer or smaller slots" : ""));
  }

  s.slot_bytes = slot_bytes;
  s.slots = slots;
  s.state.resize(static_cast<std::size_t>(slots));
  s.workers.reserve(static_cast<std::size_t>(options.threads));
  try {
    for (int i = 0; i < options.threads; ++i) s.workers.emplace_back([&s] { s.run_worker(); });
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      s.stopping = true;
    }
    s.ready.notify_all();
    for (auto& worker : s.workers) worker.join();
    throw;
  }
  cleanup.s = nullptr;
}

NvmeStore::~NvmeStore() {
  Impl& s = *impl_;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.stopping = true;
  }
  s.ready.notify_all();
  for (auto& worker : s.workers) worker.join();
  if (s.fd >= 0) ::close(s.fd);
  s.remove_folder();
}

namespace {

void check_request(const NvmeStore& store, const char* what, int64_t slot, const void* buffer,
                   int64_t bytes) {
  if (slot < 0 || slot >= store.slots()) {
    throw Error(detail::concat("NVMe store ", what, ": slot ", slot, " is out of range [0, ",
                               store.slots(), ")"));
  }
  if (buffer == nullptr) throw Error(detail::concat("NVMe store ", what, ": null buffer"));
  if (store.direct_io() && reinterpret_cast<std::uintptr_t>(buffer) % store.alignment() != 0) {
    throw Error(detail::concat("NVMe store ", what, " of slot ", slot, ": buffer ", buffer,
                               " is not aligned to ", store.alignment(),
                               " bytes, which direct I/O needs; allocate it with "
                               "kolos::memory::allocate_aligned"));
  }
  if (bytes <= 0 || bytes > store.slot_bytes() || bytes % store.alignment() != 0) {
    throw Error(detail::concat("NVMe store ", what, " of slot ", slot, ": ", bytes,
                               " bytes; give a multiple of the alignment ", store.alignment(),
                               " in (0, ", store.slot_bytes(), "] (the slot size)"));
  }
}

}  // namespace

std::future<void> NvmeStore::write(int64_t slot, const void* src) {
  return write(slot, src, impl_->slot_bytes);
}

std::future<void> NvmeStore::write(int64_t slot, const void* src, int64_t bytes) {
  check_request(*this, "write", slot, src, bytes);
  Impl& s = *impl_;
  Impl::Op op;
  op.is_write = true;
  op.slot = slot;
  op.bytes = bytes;
  // pwrite only reads the buffer; the queue holds one pointer type.
  op.buffer = const_cast<std::byte*>(static_cast<const std::byte*>(src));
  auto future = op.done.get_future();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    Impl::SlotState& state = s.state[static_cast<std::size_t>(slot)];
    if (state.reads > 0) {
      throw Error(detail::concat("NVMe store write of slot ", slot, " in '", s.file,
                                 "': ", state.reads,
                                 " read(s) of the slot are still queued or running; wait for "
                                 "their futures before writing the slot"));
    }
    ++state.writes;
    state.written = false;
    s.queue.push_back(std::move(op));
  }
  s.ready.notify_one();
  return future;
}

std::future<void> NvmeStore::read(int64_t slot, void* dst) {
  return read(slot, dst, impl_->slot_bytes);
}

std::future<void> NvmeStore::read(int64_t slot, void* dst, int64_t bytes) {
  check_request(*this, "read", slot, dst, bytes);
  Impl& s = *impl_;
  Impl::Op op;
  op.slot = slot;
  op.bytes = bytes;
  op.buffer = static_cast<std::byte*>(dst);
  auto future = op.done.get_future();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    Impl::SlotState& state = s.state[static_cast<std::size_t>(slot)];
    if (!state.written || state.writes > 0) {
      throw Error(detail::concat(
          "NVMe store read of slot ", slot, " in '", s.file,
          "': the slot holds nothing this store wrote (never written, its write not yet "
          "complete, or its write failed); wait for a write's future before reading the slot"));
    }
    ++state.reads;
    s.queue.push_back(std::move(op));
  }
  s.ready.notify_one();
  return future;
}

int64_t NvmeStore::slot_bytes() const noexcept { return impl_->slot_bytes; }
int64_t NvmeStore::slots() const noexcept { return impl_->slots; }
int64_t NvmeStore::alignment() const noexcept { return impl_->alignment; }
bool NvmeStore::direct_io() const noexcept { return impl_->direct; }
int NvmeStore::threads() const noexcept { return static_cast<int>(impl_->workers.size()); }
const std::string& NvmeStore::folder() const noexcept { return impl_->folder; }
const std::string& NvmeStore::file() const noexcept { return impl_->file; }

}  // namespace kolos::memory
