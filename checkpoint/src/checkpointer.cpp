// A training run's checkpoints: a TrainingState as pieces and metadata, and
// the (optionally asynchronous) save protocol around store.cpp.
//
// Asynchronous save: save() copies this rank's pieces to host buffers and
// gathers the ranks' generator states on the calling thread, then hands the
// job to one background thread, which runs the collective write on the
// checkpointer's own process group (split from the caller's, so it never
// interleaves with the caller's collectives). Only one save is in flight: the
// next save() or load() first waits for it. Errors are agreed inside the
// job, so wait() rethrows the same error on every rank.
#include <ATen/ATen.h>

#include <cstring>
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

Checkpointer::Checkpointer(const comm::ProcessGroupPtr& group, Options options)
    : options_(std::move(options)) {
  KOLOS_CHECK(group != nullptr, "a checkpointer needs a process group");
  group_ = group->split(0, group->rank(), "checkpoint");
}

Checkpointer::~Checkpointer() {
  if (pending_ && pending_->thread.joinable()) pending_->thread.join();
  pending_.reset();
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
  const int rank = group_->rank();
  const int size = group_->size();
  const MeshLayout layout(state.mesh);
  Metadata meta;
  meta.step = state.step;
  meta.data_position = state.data_position;
  meta.optimizer_steps = state.optimizer_steps;
  meta.config_toml = state.config_toml;
  meta.loss_scale = state.loss_scale;
  meta.loss_scale_good_steps = state.loss_scale_good_steps;
  meta.kolos_version = KOLOS_VERSION;
  meta.mesh = state.mesh;
  meta.world_size = layout.world_size();
  const std::string mine(state.rng_cpu.begin(), state.rng_cpu.end());
  for (const std::string& bytes : detail::gather_bytes(*group_, mine)) {
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
  kolos::detail::agree_on_error(*group_, error, static_cast<int>(ErrorKind::kCheckpoint));

  comm::ProcessGroupPtr group = group_;
  const Options options = options_;
  auto body = [job, group, options, name, rank] {
    detail::run_job(*group, *job);
    std::string err;
    if (rank == 0) {
      try {
        detail::update_latest(options.root, name);
        detail::prune(options.root, options.keep_last);
      } catch (const std::exception& e) {
        err = e.what();
      }
    }
    kolos::detail::agree_on_error(*group, err, static_cast<int>(ErrorKind::kCheckpoint));
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
  const int rank = group_->rank();
  const int size = group_->size();
  // Rank 0 resolves `latest`, so every rank loads the same directory.
  std::string dir, error;
  if (rank == 0) {
    try {
      dir = resolve(path);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  kolos::detail::agree_on_error(*group_, error, static_cast<int>(ErrorKind::kCheckpoint));
  at::Tensor length = at::full({1}, static_cast<int64_t>(dir.size()), at::kLong);
  group_->broadcast(length, 0)->wait();
  at::Tensor text = at::zeros({length.item<int64_t>()}, at::kByte);
  if (rank == 0 && !dir.empty()) std::memcpy(text.data_ptr(), dir.data(), dir.size());
  if (text.numel() > 0) group_->broadcast(text, 0)->wait();
  dir = text.numel() > 0 ? std::string(static_cast<const char*>(text.data_ptr()),
                                       static_cast<size_t>(text.numel()))
                         : std::string();

  const Metadata meta = load_pieces(*group_, dir, state.pieces);
  state.step = meta.step;
  state.data_position = meta.data_position;
  state.optimizer_steps = meta.optimizer_steps;
  state.loss_scale = meta.loss_scale;
  state.loss_scale_good_steps = meta.loss_scale_good_steps;
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
