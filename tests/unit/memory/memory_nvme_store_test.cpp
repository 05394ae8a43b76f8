// NvmeStore: bit-equal round trips under concurrent reads and writes, each
// refused input with its message, I/O errors through the future, and crash
// safety with a child process killed (SIGKILL) in the middle of its writes.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kolos/core/error.h"
#include "kolos/memory/nvme_store.h"
#include "memory_test_support.h"

namespace fs = std::filesystem;
using kolos::memory::AlignedBuffer;
using kolos::memory::allocate_aligned;
using kolos::memory::NvmeOptions;
using kolos::memory::NvmeStore;

namespace {

using kolos::memory::testing::error_of;
using kolos::memory::testing::nvme_options;
using kolos::memory::testing::TempDir;

void fill_random(std::byte* p, int64_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < bytes; i += 8) {
    const uint64_t v = rng();
    std::memcpy(p + i, &v, 8);
  }
}

std::vector<std::string> store_folders(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(NvmeStore::folder_prefix(), 0) == 0) out.push_back(entry.path().string());
  }
  return out;
}

std::string start_time_of_self() {
  std::ifstream in("/proc/self/stat");
  std::string stat;
  std::getline(in, stat);
  std::istringstream fields(stat.substr(stat.rfind(')') + 1));
  std::string field;
  for (int index = 3; index <= 22; ++index) fields >> field;
  return field;
}

std::string host() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

// Round trip of every slot; the data read equals the data written.
void expect_round_trip(NvmeStore& store, int64_t slots, uint64_t seed) {
  const int64_t bytes = store.slot_bytes();
  std::vector<AlignedBuffer> src, dst;
  std::vector<std::future<void>> pending;
  for (int64_t i = 0; i < slots; ++i) {
    src.push_back(allocate_aligned(bytes, store.alignment()));
    dst.push_back(allocate_aligned(bytes, store.alignment()));
    fill_random(src.back().get(), bytes, seed + static_cast<uint64_t>(i));
    pending.push_back(store.write(i, src.back().get()));
  }
  for (auto& f : pending) f.get();
  pending.clear();
  for (int64_t i = 0; i < slots; ++i) pending.push_back(store.read(i, dst[i].get()));
  for (auto& f : pending) f.get();
  for (int64_t i = 0; i < slots; ++i) {
    ASSERT_EQ(std::memcmp(src[i].get(), dst[i].get(), static_cast<std::size_t>(bytes)), 0)
        << "slot " << i;
  }
}

}  // namespace

TEST(AllocateAligned, AlignsAndRefusesBadAlignment) {
  for (int64_t alignment : {512, 4096, 1 << 16}) {
    AlignedBuffer buffer = allocate_aligned(100, alignment);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buffer.get()) % alignment, 0u);
  }
  EXPECT_NE(error_of([] { allocate_aligned(100, 3000); }).find("not a power of two"),
            std::string::npos);
}

// Many slots of random data, written concurrently; then half of them
// rewritten while the other half are read, all in flight at once; then all
// read back. Every read is bit-equal to the last write of its slot.
TEST(NvmeStore, ConcurrentRoundTripIsBitEqual) {
  TempDir dir;
  constexpr int64_t kSlots = 96;
  constexpr int64_t kBytes = 64 * 1024;
  std::string folder;
  {
    NvmeStore store(nvme_options(dir.path(), 4), kBytes, kSlots);
    folder = store.folder();
    EXPECT_TRUE(fs::is_directory(folder));
    EXPECT_EQ(fs::path(folder).parent_path(), fs::path(dir.path()));
    EXPECT_EQ(fs::path(store.file()).parent_path(), fs::path(folder));
    EXPECT_EQ(store.threads(), 4);
    EXPECT_EQ(store.alignment() % 4096, 0);

    std::vector<AlignedBuffer> data, out;
    for (int64_t i = 0; i < kSlots; ++i) {
      data.push_back(allocate_aligned(kBytes, store.alignment()));
      out.push_back(allocate_aligned(kBytes, store.alignment()));
      fill_random(data[i].get(), kBytes, 1000 + static_cast<uint64_t>(i));
    }
    std::vector<std::future<void>> pending;
    for (int64_t i = 0; i < kSlots; ++i) pending.push_back(store.write(i, data[i].get()));
    for (auto& f : pending) f.get();
    pending.clear();

    // Odd slots get new data while even slots are read.
    std::vector<AlignedBuffer> second;
    for (int64_t i = 0; i < kSlots; ++i) {
      if (i % 2 == 1) {
        second.push_back(allocate_aligned(kBytes, store.alignment()));
        fill_random(second.back().get(), kBytes, 5000 + static_cast<uint64_t>(i));
        pending.push_back(store.write(i, second.back().get()));
      } else {
        pending.push_back(store.read(i, out[i].get()));
      }
    }
    for (auto& f : pending) f.get();
    for (int64_t i = 0; i < kSlots; i += 2) {
      ASSERT_EQ(std::memcmp(out[i].get(), data[i].get(), kBytes), 0) << "slot " << i;
    }
    pending.clear();
    for (int64_t i = 0; i < kSlots; ++i) pending.push_back(store.read(i, out[i].get()));
    for (auto& f : pending) f.get();
    for (int64_t i = 0; i < kSlots; ++i) {
      const std::byte* expected = i % 2 == 1 ? second[i / 2].get() : data[i].get();
      ASSERT_EQ(std::memcmp(out[i].get(), expected, kBytes), 0) << "slot " << i;
    }
  }
  EXPECT_FALSE(fs::exists(folder)) << "the destructor removes the private folder";
}

TEST(NvmeStore, OneThreadAndOneSlot) {
  TempDir dir;
  NvmeStore store(nvme_options(dir.path(), 1), 4096, 1);
  expect_round_trip(store, 1, 7);
}

TEST(NvmeStore, ReadOfSlotNeverWrittenIsAnError) {
  TempDir dir;
  NvmeStore store(nvme_options(dir.path()), 4096, 4);
  AlignedBuffer buffer = allocate_aligned(4096);
  const std::string message = error_of([&] { store.read(2, buffer.get()); });
  EXPECT_NE(message.find("slot 2"), std::string::npos) << message;
  EXPECT_NE(message.find("holds nothing this store wrote"), std::string::npos) << message;
  // Once written, it reads.
  fill_random(buffer.get(), 4096, 3);
  store.write(2, buffer.get()).get();
  store.read(2, buffer.get()).get();
}

// A read of a slot whose rewrite is still queued is refused (it would see a
// half-written slot), and so is a write of a slot whose read is still
// queued. On one I/O thread, 64 MiB queued ahead keeps the request queued
// while the second call is made. Whether it still was is looked at only
// after the second call returned, without waiting on it: a request still in
// flight then was in flight during the call, and the call must have been
// refused; a call that was accepted must have found the request done. Each
// direction is tried until a refusal has been seen (at most 5 times), so a
// queue that happened to drain first does not leave the refusal unchecked.
TEST(NvmeStore, OverlappingReadAndWriteOfASlotAreRefused) {
  TempDir dir;
  constexpr int64_t kBytes = 4 << 20;
  constexpr int64_t kSlots = 17;
  constexpr int kAttempts = 5;
  NvmeStore store(nvme_options(dir.path(), 1), kBytes, kSlots);
  std::vector<AlignedBuffer> buffers;
  std::vector<std::future<void>> pending;
  for (int64_t i = 0; i < kSlots; ++i) {
    buffers.push_back(allocate_aligned(kBytes));
    fill_random(buffers.back().get(), kBytes, static_cast<uint64_t>(i));
    pending.push_back(store.write(i, buffers.back().get()));
  }
  for (auto& f : pending) f.get();
  pending.clear();

  bool refused = false;
  AlignedBuffer scratch = allocate_aligned(kBytes);
  for (int attempt = 0; attempt < kAttempts && !refused; ++attempt) {
    // Rewrite everything; the last slot's write is queued behind 64 MiB.
    for (int64_t i = 0; i < kSlots; ++i) pending.push_back(store.write(i, buffers[i].get()));
    std::future<void> second;
    try {
      second = store.read(kSlots - 1, scratch.get());
    } catch (const kolos::Error& e) {
      refused = true;
      EXPECT_NE(std::string(e.what()).find("its write not yet complete"), std::string::npos)
          << e.what();
    }
    const bool write_was_done =
        pending.back().wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    for (auto& f : pending) f.get();
    pending.clear();
    if (second.valid()) second.get();
    EXPECT_TRUE(refused || write_was_done)
        << "a read of a slot with a write in flight was accepted";
  }
  EXPECT_TRUE(refused) << "in " << kAttempts << " attempts the write never was in flight";
  // Once the write's future is ready the slot reads again.
  AlignedBuffer out = allocate_aligned(kBytes);
  store.read(kSlots - 1, out.get()).get();
  EXPECT_EQ(std::memcmp(out.get(), buffers[kSlots - 1].get(), kBytes), 0);

  std::vector<AlignedBuffer> outs;
  for (int64_t i = 0; i < kSlots; ++i) outs.push_back(allocate_aligned(kBytes));
  refused = false;
  for (int attempt = 0; attempt < kAttempts && !refused; ++attempt) {
    for (int64_t i = 0; i < kSlots; ++i) pending.push_back(store.read(i, outs[i].get()));
    std::future<void> second;
    try {
      second = store.write(kSlots - 1, buffers[kSlots - 1].get());
    } catch (const kolos::Error& e) {
      refused = true;
      EXPECT_NE(std::string(e.what()).find("read(s) of the slot are still queued or running"),
                std::string::npos)
          << e.what();
    }
    const bool read_was_done =
        pending.back().wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    for (auto& f : pending) f.get();
    pending.clear();
    if (second.valid()) second.get();
    EXPECT_TRUE(refused || read_was_done) << "a write of a slot with a read in flight was accepted";
  }
  EXPECT_TRUE(refused) << "in " << kAttempts << " attempts the read never was in flight";
  for (int64_t i = 0; i < kSlots; ++i) {
    ASSERT_EQ(std::memcmp(outs[i].get(), buffers[i].get(), kBytes), 0) << "slot " << i;
  }
}

TEST(NvmeStore, BadRequestsAreRefused) {
  TempDir dir;
  NvmeStore store(nvme_options(dir.path()), 8192, 4);
  AlignedBuffer buffer = allocate_aligned(8192 + 4096);
  EXPECT_NE(error_of([&] { store.write(4, buffer.get()); }).find("out of range [0, 4)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { store.read(-1, buffer.get()); }).find("out of range"),
            std::string::npos);
  EXPECT_NE(error_of([&] { store.write(0, nullptr); }).find("null buffer"), std::string::npos);
  if (store.direct_io()) {
    const std::string message = error_of([&] { store.write(0, buffer.get() + 512); });
    EXPECT_NE(message.find("not aligned to"), std::string::npos) << message;
    EXPECT_NE(message.find("allocate_aligned"), std::string::npos) << message;
  }
}

// A transfer of a slot's first bytes moves exactly those: the rest of the
// destination is untouched, and the neighbouring slot is not overwritten.
TEST(NvmeStore, PartialSlotRoundTrip) {
  TempDir dir;
  // The alignment the file system asks for (4096, or more where statx
  // reports more), learned from a first store on the same directory.
  const int64_t align = NvmeStore(nvme_options(dir.path()), 4096 * 16, 1).alignment();
  NvmeStore store(nvme_options(dir.path()), 3 * align, 2);
  ASSERT_EQ(store.alignment(), align);
  AlignedBuffer full = allocate_aligned(3 * align, align);
  fill_random(full.get(), 3 * align, 1);
  store.write(1, full.get()).get();
  AlignedBuffer part = allocate_aligned(align, align);
  fill_random(part.get(), align, 2);
  store.write(0, part.get(), align).get();

  AlignedBuffer got = allocate_aligned(3 * align, align);
  std::memset(got.get(), 0x5a, 3 * align);
  store.read(0, got.get(), align).get();
  EXPECT_EQ(std::memcmp(got.get(), part.get(), align), 0);
  for (int64_t i = align; i < 3 * align; ++i) ASSERT_EQ(got[i], std::byte{0x5a}) << i;
  store.read(1, got.get()).get();
  EXPECT_EQ(std::memcmp(got.get(), full.get(), 3 * align), 0);

  for (int64_t bad : {int64_t{0}, int64_t{512}, 4 * align}) {
    const std::string message = error_of([&] { store.read(1, got.get(), bad); });
    EXPECT_NE(message.find("give a multiple of the alignment " + std::to_string(align) +
                           " in (0, " + std::to_string(3 * align) + "]"),
              std::string::npos)
        << message;
  }
}

// An I/O error in a worker thread reaches the caller through the future,
// as a kolos::Error naming the file, the offset and the errno text. The
// file is cut short behind the store's back, so the read hits its end.
TEST(NvmeStore, IoErrorReachesTheFuture) {
  TempDir dir;
  NvmeStore store(nvme_options(dir.path()), 4096, 8);
  AlignedBuffer buffer = allocate_aligned(4096);
  fill_random(buffer.get(), 4096, 11);
  store.write(5, buffer.get()).get();
  ASSERT_EQ(::truncate(store.file().c_str(), 4096), 0);
  auto future = store.read(5, buffer.get());
  const std::string message = error_of([&] { future.get(); });
  EXPECT_NE(message.find(store.file()), std::string::npos) << message;
  EXPECT_NE(message.find("offset 20480"), std::string::npos) << message;
  EXPECT_NE(message.find("end of file"), std::string::npos) << message;
}

TEST(NvmeStoreInput, MissingDirectory) {
  TempDir dir;
  const std::string missing = dir.path() + "/no/such/dir";
  const std::string message = error_of([&] { NvmeStore(nvme_options(missing), 4096, 1); });
  EXPECT_NE(message.find("memory.nvme_dir '" + missing + "'"), std::string::npos) << message;
  EXPECT_NE(message.find("No such file or directory"), std::string::npos) << message;
  EXPECT_NE(message.find("create it"), std::string::npos) << message;
}

TEST(NvmeStoreInput, NotADirectory) {
  TempDir dir;
  const std::string file = dir.path() + "/a-file";
  std::ofstream(file) << "x";
  const std::string message = error_of([&] { NvmeStore(nvme_options(file), 4096, 1); });
  EXPECT_NE(message.find("'" + file + "' is not a directory"), std::string::npos) << message;
}

// Root bypasses mode bits, so a read-only mode is no test under root; /proc
// refuses folder creation to root as well. The mode-bit case runs when the
// test is not root.
TEST(NvmeStoreInput, NotWritable) {
  std::string message = error_of([] { NvmeStore(nvme_options("/proc"), 4096, 1); });
  EXPECT_NE(message.find("memory.nvme_dir '/proc' is not writable"), std::string::npos) << message;
  EXPECT_NE(message.find("give a directory this process can create folders in"), std::string::npos)
      << message;
  if (::geteuid() != 0) {
    TempDir dir;
    ASSERT_EQ(::chmod(dir.path().c_str(), 0500), 0);
    message = error_of([&] { NvmeStore(nvme_options(dir.path()), 4096, 1); });
    ::chmod(dir.path().c_str(), 0700);
    EXPECT_NE(message.find("is not writable"), std::string::npos) << message;
    EXPECT_NE(message.find("Permission denied"), std::string::npos) << message;
  } else {
    std::printf(
        "NotWritable: running as root, the mode-bit case (chmod 0500) is skipped: root "
        "bypasses mode bits; the /proc case above covers root\n");
  }
}

// More bytes than the file system has free: refused with both numbers, and
// no folder is left behind.
TEST(NvmeStoreInput, NotEnoughFreeSpace) {
  TempDir dir;
  struct statvfs vfs {};
  ASSERT_EQ(::statvfs(dir.path().c_str(), &vfs), 0);
  const int64_t free_bytes = static_cast<int64_t>(vfs.f_bavail) * vfs.f_frsize;
  constexpr int64_t kSlot = 1 << 20;
  const int64_t slots = free_bytes / kSlot + 1024;  // 1 GiB more than free
  const std::string message = error_of([&] { NvmeStore(nvme_options(dir.path()), kSlot, slots); });
  EXPECT_NE(message.find(std::to_string(slots) + " slots x " + std::to_string(kSlot) +
                         " bytes = " + std::to_string(slots * kSlot) + " bytes"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("free"), std::string::npos) << message;
  EXPECT_NE(message.find("use fewer or smaller slots"), std::string::npos) << message;
  EXPECT_TRUE(store_folders(dir.path()).empty()) << "a refused store leaves no folder";
}

TEST(NvmeStoreInput, SlotSizeNotAMultipleOfTheAlignment) {
  TempDir dir;
  const std::string message = error_of([&] { NvmeStore(nvme_options(dir.path()), 4096 + 512, 2); });
  EXPECT_NE(message.find("slot size 4608 bytes is not a multiple of the direct-I/O alignment"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("use 8192 (or 4096)"), std::string::npos) << message;
  EXPECT_TRUE(store_folders(dir.path()).empty());
  EXPECT_NE(error_of([&] { NvmeStore(nvme_options(dir.path()), 0, 2); }).find("must be > 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] { NvmeStore(nvme_options(dir.path(), 0), 4096, 2); }).find("I/O threads"),
            std::string::npos);
}

// tmpfs: older kernels refuse O_DIRECT there (the store then falls back to
// buffered I/O with a warning); since Linux 6.6 tmpfs accepts it. Either
// way the store must say which it uses, agree with what the file system
// does, warn exactly when it falls back, and round-trip the data.
TEST(NvmeStore, TmpfsUsesDirectIoOrFallsBackWithAWarning) {
  struct statfs sfs {};
  constexpr long kTmpfsMagic = 0x01021994;
  if (::statfs("/dev/shm", &sfs) != 0 || sfs.f_type != kTmpfsMagic) {
    GTEST_SKIP() << "/dev/shm is not a tmpfs here";
  }
  TempDir dir("/dev/shm");
  // What the file system does, probed independently of the store.
  bool direct_works = false;
  {
    const std::string probe = dir.path() + "/probe";
    const int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
    if (fd >= 0) {
      AlignedBuffer block = allocate_aligned(4096);
      std::memset(block.get(), 0, 4096);
      direct_works = ::pwrite(fd, block.get(), 4096, 0) == 4096;
      ::close(fd);
    }
    ::unlink(probe.c_str());
  }
  std::vector<std::string> warnings;
  NvmeOptions options = nvme_options(dir.path());
  options.warn = [&](const std::string& w) { warnings.push_back(w); };
  NvmeStore store(options, 8192, 16);
  EXPECT_EQ(store.direct_io(), direct_works);
  if (direct_works) {
    EXPECT_TRUE(warnings.empty());
  } else {
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_NE(warnings[0].find("buffered I/O"), std::string::npos) << warnings[0];
  }
  std::printf("tmpfs /dev/shm: %s\n", direct_works ? "direct I/O" : "buffered I/O (fell back)");
  expect_round_trip(store, 16, 99);
}

// A store of another process that was killed mid-write leaves its folder;
// the next store on the directory removes it and never reads it. Folders of
// live processes, of other hosts, and names that are not ours are kept; a
// folder whose pid now belongs to a process started at another time (a
// reused pid) is stale.
TEST(NvmeStoreCrash, KilledWriterLeavesNothingTheNextStoreReads) {
  TempDir dir;
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipe_fds[0]);
    try {
      NvmeStore store(nvme_options(dir.path(), 2), 1 << 20, 16);
      std::vector<AlignedBuffer> buffers;
      for (int i = 0; i < 16; ++i) {
        buffers.push_back(allocate_aligned(1 << 20));
        fill_random(buffers.back().get(), 1 << 20, static_cast<uint64_t>(i));
      }
      store.write(0, buffers[0].get()).get();
      const std::string folder = store.folder() + "\n";
      if (::write(pipe_fds[1], folder.data(), folder.size()) < 0) ::_exit(2);
      // Keep writes in flight until killed.
      for (int64_t round = 0;; ++round) {
        std::vector<std::future<void>> pending;
        for (int i = 0; i < 16; ++i) pending.push_back(store.write(i, buffers[i].get()));
        for (auto& f : pending) f.get();
      }
    } catch (...) {
      ::_exit(3);
    }
  }
  ::close(pipe_fds[1]);
  std::string folder;
  char c;
  while (::read(pipe_fds[0], &c, 1) == 1 && c != '\n') folder.push_back(c);
  ::close(pipe_fds[0]);
  ASSERT_FALSE(folder.empty()) << "the child wrote no folder name";
  ASSERT_TRUE(fs::is_directory(folder));
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "the child ended otherwise, status " << status;
  ASSERT_TRUE(fs::is_directory(folder)) << "SIGKILL ran no destructor: the folder is left";
  ASSERT_TRUE(fs::exists(folder + "/slots.bin"));

  const std::string prefix = NvmeStore::folder_prefix();
  const std::string pid = std::to_string(::getpid());
  // A live process's folder (this process, right start time), another
  // host's, a reused pid's (this pid, wrong start time), and a stranger.
  const std::string live =
      dir.path() + "/" + prefix + pid + "." + start_time_of_self() + ".aa." + host();
  const std::string other_host = dir.path() + "/" + prefix + "1.1.bb.some-other-host-" + host();
  const std::string reused = dir.path() + "/" + prefix + pid + ".1.cc." + host();
  const std::string stranger = dir.path() + "/" + prefix + "not-ours";
  for (const auto& d : {live, other_host, reused, stranger}) fs::create_directory(d);

  std::vector<std::string> warnings;
  NvmeOptions options = nvme_options(dir.path(), 2);
  options.warn = [&](const std::string& w) { warnings.push_back(w); };
  {
    NvmeStore store(options, 1 << 20, 16);
    EXPECT_FALSE(fs::exists(folder)) << "the killed writer's folder is stale and removed";
    EXPECT_FALSE(fs::exists(reused)) << "a reused pid's folder is stale";
    EXPECT_TRUE(fs::exists(live));
    EXPECT_TRUE(fs::exists(other_host));
    EXPECT_TRUE(fs::exists(stranger));
    EXPECT_NE(store.folder(), folder);
    EXPECT_TRUE(warnings.empty());
    // Nothing of the dead writer is readable: every slot reads as never
    // written.
    AlignedBuffer buffer = allocate_aligned(1 << 20);
    for (int64_t i = 0; i < 16; ++i) {
      EXPECT_NE(error_of([&] { store.read(i, buffer.get()); }).find("holds nothing"),
                std::string::npos);
    }
  }
  for (const auto& d : {live, other_host, stranger}) fs::remove_all(d);
}
