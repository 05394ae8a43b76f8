// Checkpoint save/load throughput vs the same bytes through dd and through
// torch::save/torch::load, measured in the same run on the same disk.
//
//   checkpoint_bench [MiB=512] [DIR=$TMPDIR]
//
// One process (an MPI singleton), serial mesh: what one rank does. Save is
// timed to durable (fsync) for every contender: dd with conv=fsync, and
// torch::save followed by an fsync. Reads come from the page cache for all
// contenders alike (no root-free way to drop it); load includes verifying
// every checksum. Not a test: it prints numbers and ratios, asserts nothing.
#include <fcntl.h>
#include <mpi.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "kolos/checkpoint/checkpoint.h"
#include "kolos/core/comm/mpi.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double run_shell(const std::string& cmd) {
  const auto t = Clock::now();
  if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "failed: %s\n", cmd.c_str());
  return seconds_since(t);
}

void fsync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  const int64_t mib = argc > 1 ? std::atoll(argv[1]) : 512;
  const std::string base = argc > 2 ? argv[2] : fs::temp_directory_path().string();
  const std::string work = base + "/kolos-ckpt-bench-" + std::to_string(::getpid());
  fs::create_directories(work);
  {
    kolos::comm::ProcessGroupPtr self = kolos::comm::make_mpi_process_group(MPI_COMM_SELF, "self");
    // A GPT-like mix: a few large matrices and many small vectors.
    std::vector<kolos::checkpoint::Piece> pieces;
    std::vector<at::Tensor> tensors;
    int64_t bytes = 0;
    for (int i = 0; bytes < mib * (1 << 20); ++i) {
      at::Tensor t = i % 4 == 3 ? torch::randn({4096}) : torch::randn({1024, 1024});
      bytes += t.numel() * 4;
      tensors.push_back(t);
      pieces.push_back({"model/t" + std::to_string(i), t, kolos::Placement::replicated(t.sizes().vec())});
    }
    const double gb = static_cast<double>(bytes) / 1e9;
    kolos::MeshLayout layout(kolos::MeshShape{});

    auto t = Clock::now();
    kolos::checkpoint::save_pieces(*self, layout, work + "/ckpt", pieces, {});
    const double save_s = seconds_since(t);
    for (auto& p : pieces) p.tensor = torch::empty_like(p.tensor);
    t = Clock::now();
    kolos::checkpoint::load_pieces(*self, work + "/ckpt", pieces);
    const double load_s = seconds_since(t);

    const int64_t blocks = (bytes + (16 << 20) - 1) / (16 << 20);
    const double dd_write = run_shell("dd if=/dev/zero of=" + work + "/dd.bin bs=16M count=" +
                                      std::to_string(blocks) + " conv=fsync status=none");
    const double dd_read =
        run_shell("dd if=" + work + "/dd.bin of=/dev/null bs=16M status=none");

    t = Clock::now();
    torch::save(tensors, work + "/torch.pt");
    fsync_file(work + "/torch.pt");
    const double tsave = seconds_since(t);
    std::vector<at::Tensor> back;
    t = Clock::now();
    torch::load(back, work + "/torch.pt");
    const double tload = seconds_since(t);

    std::printf("checkpoint bench: %.3f GB in %zu tensors, one rank, %s\n", gb, tensors.size(),
                work.c_str());
    std::printf("  %-28s %8.2f GB/s   (dd write+fsync %6.2f GB/s: %.2fx; torch::save+fsync %6.2f GB/s: %.2fx)\n",
                "save (HDF5 shard + index)", gb / save_s, gb / dd_write, dd_write / save_s,
                gb / tsave, tsave / save_s);
    std::printf("  %-28s %8.2f GB/s   (dd read %6.2f GB/s: %.2fx; torch::load %6.2f GB/s: %.2fx)\n",
                "load (verify + read)", gb / load_s, gb / dd_read, dd_read / load_s, gb / tload,
                tload / load_s);
  }
  if (!std::getenv("KEEP")) fs::remove_all(work);
  MPI_Finalize();
  return 0;
}
