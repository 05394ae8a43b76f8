// A training run's checkpoints: a TrainingState as pieces and metadata, and
// the (optionally asynchronous) save protocol around store.cpp.
//
// Asynchronous save: save() copies this rank's pieces to host buffers and
// gathers the ranks' generator states on the calling thread, then hands the
// job to one background thread, which runs the collective write on the
// checkpointer's own duplicate of the caller's communicator (so it never
// interleaves with the caller's collectives; MPI_THREAD_MULTIPLE is
// required and the runtime asks for it). Only one save is in flight: the
// next save() or load() first waits for it. Errors are agreed inside the
// job, so wait() rethrows the same error on every rank.
#include <filesystem>
#include <thread>

#include "kolos/checkpoint/checkpoint.h"
#include "kolos/config.h"
#include "kolos/core/runtime.h"
#include "store_detail.h"

namespace kolos::checkpoint {

struct Checkpointer::Pending {
  std::thread thread;
  std::exception_ptr error;
};

Checkpointer::Checkpointer(MPI_Comm comm, Options options) : options_(std::move(options)) {
  MPI_Comm_dup(comm, &comm_);
}

Checkpointer::~Checkpointer() {
  if (pending_ && pending_->thread.joinable()) pending_->thread.join();
  pending_.reset();
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void Checkpointer::wait() {
  if (!pending_) return;
  if (pending_->thread.joinable()) pending_->thread.join();
  std::exception_ptr error = pending_->error;
  pending_.reset();
  if (error) std::rethrow_exception(error);
}

void Checkpointer::save(const TrainingState& state) {
  wait();
  KOLOS_CHECK_KIND(kCheckpoint, !options_.root.empty(), "no checkpoint directory configured");
  int rank = 0, size = 1;
  MPI_Comm_rank(comm_, &rank);
  MPI_Comm_size(comm_, &size);
  const MeshLayout layout(state.mesh);
  Metadata meta;
  meta.step = state.step;
  meta.data_position = state.data_position;
  meta.optimizer_steps = state.optimizer_steps;
  meta.config_toml = state.config_toml;
  meta.kolos_version = KOLOS_VERSION;
  meta.mesh = state.mesh;
  meta.world_size = layout.world_size();
  const std::string mine(state.rng_cpu.begin(), state.rng_cpu.end());
  for (const std::string& bytes : detail::gather_bytes(comm_, mine)) {
    meta.rng_cpu.emplace_back(bytes.begin(), bytes.end());
  }

  const std::string name = step_dir_name(meta.step);
  const std::string dir = (std::filesystem::path(options_.root) / name).string();
  std::string error;
  auto job = std::make_shared<detail::SaveJob>();
  try {
    KOLOS_CHECK_KIND(kCheckpoint, layout.world_size() == size, "the state's mesh (",
                     layout.describe(), ") has ", layout.world_size(),
                     " ranks, the checkpoint communicator ", size);
    *job = detail::snapshot(layout, rank, dir, state.pieces, std::move(meta),
                            /*copy=*/options_.async);
  } catch (const std::exception& e) {
    error = e.what();
  }
  kolos::detail::agree_on_error(comm_, error, static_cast<int>(ErrorKind::kCheckpoint));

  MPI_Comm comm = comm_;
  const Options options = options_;
  auto body = [job, comm, options, name, rank] {
    detail::run_job(comm, *job);
    std::string err;
    if (rank == 0) {
      try {
        detail::update_latest(options.root, name);
        detail::prune(options.root, options.keep_last);
      } catch (const std::exception& e) {
        err = e.what();
      }
    }
    kolos::detail::agree_on_error(comm, err, static_cast<int>(ErrorKind::kCheckpoint));
  };
  last_saved_step_ = state.step;
  if (!options_.async) {
    body();
    return;
  }
  pending_ = std::make_unique<Pending>();
  Pending* pending = pending_.get();
  pending_->thread = std::thread([body, pending] {
    try {
      body();
    } catch (...) {
      pending->error = std::current_exception();
    }
  });
}

std::string Checkpointer::load(const std::string& path, TrainingState& state) {
  wait();
  int rank = 0, size = 1;
  MPI_Comm_rank(comm_, &rank);
  MPI_Comm_size(comm_, &size);
  // Rank 0 resolves `latest`, so every rank loads the same directory.
  std::string dir, error;
  if (rank == 0) {
    try {
      dir = resolve(path);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  kolos::detail::agree_on_error(comm_, error, static_cast<int>(ErrorKind::kCheckpoint));
  int length = static_cast<int>(dir.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, comm_);
  dir.resize(static_cast<size_t>(length));
  MPI_Bcast(dir.data(), length, MPI_CHAR, 0, comm_);

  const Metadata meta = load_pieces(comm_, dir, state.pieces);
  state.step = meta.step;
  state.data_position = meta.data_position;
  state.optimizer_steps = meta.optimizer_steps;
  // Generator states are per rank: the same world reads its own rows;
  // another world reads rank 0's (every rank seeds identically today, so
  // the states agree anyway).
  state.rng_cpu.clear();
  if (!meta.rng_cpu.empty()) {
    const bool same = static_cast<int64_t>(meta.rng_cpu.size()) == size;
    state.rng_cpu = meta.rng_cpu[same ? rank : 0];
  }
  last_saved_step_ = meta.step;
  return dir;
}

}  // namespace kolos::checkpoint
