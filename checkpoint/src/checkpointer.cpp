// The engine's checkpoints: what an Engine's state is, as pieces, and the
// (optionally asynchronous) save protocol around store.cpp.
//
// Asynchronous save: save() copies this rank's pieces to host buffers and
// gathers the ranks' RNG states on the calling thread, then hands the job to
// one background thread, which runs the collective write on the
// checkpointer's own duplicate of the engine's communicator (so it never
// interleaves with the engine's collectives; MPI_THREAD_MULTIPLE is
// required and the runtime asks for it). Only one save is in flight: the
// next save() or load() first waits for it. Errors are agreed inside the
// job, so wait() rethrows the same error on every rank.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <thread>

#include "kolos/checkpoint/checkpoint.h"
#include "kolos/config.h"
#include "kolos/core/engine.h"
#include "kolos/core/runtime.h"
#include "store_detail.h"

namespace kolos::checkpoint {

struct Checkpointer::Pending {
  std::thread thread;
  std::exception_ptr error;
};

namespace {

std::vector<uint8_t> cpu_rng_state() {
  at::Tensor state = at::detail::getDefaultCPUGenerator().get_state();
  const auto* p = state.data_ptr<uint8_t>();
  return std::vector<uint8_t>(p, p + state.numel());
}

void set_cpu_rng_state(const std::vector<uint8_t>& bytes) {
  at::Tensor state = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  std::memcpy(state.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// Every rank's state on rank 0, in rank order (empty elsewhere).
std::vector<std::vector<uint8_t>> gather_rng(MPI_Comm comm) {
  int size = 1, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  const std::vector<uint8_t> mine = cpu_rng_state();
  int n = static_cast<int>(mine.size());
  std::vector<int> sizes(size);
  MPI_Gather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, comm);
  std::vector<int> displs(size, 0);
  int total = 0;
  for (int r = 0; r < size; ++r) {
    displs[r] = total;
    total += sizes[r];
  }
  std::vector<uint8_t> all(rank == 0 ? total : 0);
  MPI_Gatherv(mine.data(), n, MPI_BYTE, all.data(), sizes.data(), displs.data(), MPI_BYTE, 0,
              comm);
  std::vector<std::vector<uint8_t>> out;
  if (rank == 0) {
    for (int r = 0; r < size; ++r) {
      out.emplace_back(all.begin() + displs[r], all.begin() + displs[r] + sizes[r]);
    }
  }
  return out;
}

}  // namespace

std::vector<Piece> engine_pieces(Engine& engine) {
  std::vector<Piece> pieces;
  for (auto& p : engine.gradients().parameters_at_rest()) {
    pieces.push_back(Piece{"model/" + p.name, p.tensor.detach(), p.placement});
  }
  for (auto& s : engine.gradients().optimizer_state()) {
    pieces.push_back(Piece{"optim/" + s.name, s.tensor, s.placement});
  }
  return pieces;
}

Checkpointer::Checkpointer(Engine& engine, Options options)
    : engine_(engine), options_(std::move(options)) {
  MPI_Comm_dup(engine_.comm(), &comm_);
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

void Checkpointer::save() {
  wait();
  KOLOS_CHECK_KIND(kCheckpoint, !options_.root.empty(), "no checkpoint directory configured");
  int rank = 0;
  MPI_Comm_rank(comm_, &rank);
  const RunConfig& config = engine_.config();
  Metadata meta;
  meta.step = engine_.steps_done();
  meta.data_position = meta.step * config.train.global_batch;
  meta.optimizer_steps = engine_.gradients().optimizer_steps();
  meta.config_toml = to_toml(config);
  meta.kolos_version = KOLOS_VERSION;
  meta.mesh = engine_.mesh().layout().shape();
  meta.world_size = engine_.mesh().layout().world_size();
  meta.rng_cpu = gather_rng(comm_);

  const std::string name = step_dir_name(meta.step);
  const std::string dir = (std::filesystem::path(options_.root) / name).string();
  std::string error;
  auto job = std::make_shared<detail::SaveJob>();
  try {
    *job = detail::snapshot(engine_.mesh().layout(), rank, dir, engine_pieces(engine_),
                            std::move(meta), /*copy=*/options_.async);
  } catch (const std::exception& e) {
    error = e.what();
  }
  kolos::detail::agree_on_error(comm_, error, static_cast<int>(ErrorKind::kCheckpoint));

  const int64_t step = engine_.steps_done();
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
  last_saved_step_ = step;
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

std::string Checkpointer::load(const std::string& path) {
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

  const Metadata meta = load_pieces(comm_, dir, engine_pieces(engine_));
  engine_.set_steps_done(meta.step);
  engine_.gradients().set_optimizer_steps(meta.optimizer_steps);
  // Same world: each rank its own generator state; another world: rank 0's
  // (every rank seeds identically today, so the states agree anyway).
  if (!meta.rng_cpu.empty()) {
    const bool same = static_cast<int64_t>(meta.rng_cpu.size()) == size;
    set_cpu_rng_state(meta.rng_cpu[same ? rank : 0]);
  }
  const int64_t batch = engine_.config().train.global_batch;
  if (rank == 0 && meta.data_position != meta.step * batch) {
    std::fprintf(stderr,
                 "kolos: warning: checkpoint %s consumed %lld samples in %lld steps; with this "
                 "run's global batch of %lld, data continues at sample %lld\n",
                 dir.c_str(), static_cast<long long>(meta.data_position),
                 static_cast<long long>(meta.step), static_cast<long long>(batch),
                 static_cast<long long>(meta.step * batch));
  }
  last_saved_step_ = meta.step;
  return dir;
}

}  // namespace kolos::checkpoint
