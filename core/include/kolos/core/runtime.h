// Runtime: the MPI bootstrap of one rank.
//
// One Runtime per process, created first in main() and destroyed last: it
// initialises MPI with MPI_THREAD_MULTIPLE (communication threads need it),
// learns the rank, size, node-local rank/size and host, sizes LibTorch and
// BLAS threads to the cores each node-local rank may use, and calls
// MPI_Finalize in its destructor. Everything that owns an MPI communicator
// (meshes, process groups, engines) must be destroyed before it: keep them in
// an inner scope.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "kolos/core/error.h"

namespace kolos {

namespace comm {
class ProcessGroup;
}  // namespace comm

struct RankInfo {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // among the ranks of this node
  int local_size = 1;
  std::string host;
};

class Runtime {
 public:
  Runtime(int* argc, char*** argv);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const RankInfo& info() const { return info_; }
  int rank() const { return info_.rank; }
  int size() const { return info_.size; }
  // The group of all ranks of the job (engines and checkpointers split
  // theirs from it). Released before MPI_Finalize.
  const std::shared_ptr<comm::ProcessGroup>& world() const { return world_; }
  // Threads this rank gives LibTorch/BLAS (cores of the node / local ranks,
  // or KOLOS_THREADS).
  int threads() const { return threads_; }
  // The GPU this rank uses (node-local rank modulo the GPUs of the node),
  // or -1 without one.
  int device() const { return device_; }

 private:
  RankInfo info_;
  int threads_ = 1;
  int device_ = -1;
  bool finalize_ = false;
  std::shared_ptr<comm::ProcessGroup> world_;
};

// An error that every rank of a communicator agreed on (see
// agree_on_error): the same message on every rank, raised by `origin`.
class AgreedError : public Error {
 public:
  AgreedError(std::string message, ErrorKind kind, int origin)
      : Error(std::move(message), kind), origin_(origin) {}
  int origin() const { return origin_; }

 private:
  int origin_;
};

// This process's node-local rank and host, as the Runtime learned them (0
// and the host name before a Runtime exists): what picks a rank's GPU.
int node_local_rank();
std::string node_host();

// Runs `body` with every exception turned into a clear end of the whole job:
// - An AgreedError (raised identically on every rank during set-up: a bad
//   config, a missing plugin, bad data) is printed once, by rank 0, and every
//   rank returns exit code 2 after an orderly MPI_Finalize.
// - Any other exception, on any rank, ends the whole job at once with
//   MPI_Abort after printing "kolos: <kind> on rank R (host): message", so no
//   rank is left waiting in a collective.
// Returns body's exit code.
int run_guarded(const Runtime& runtime, const std::function<int()>& body);

namespace detail {
// Agreement step, collective over `group`: each rank passes its own error
// message ("" when it succeeded). If any rank failed, every rank throws an
// AgreedError carrying the message and kind of the lowest failing rank.
void agree_on_error(comm::ProcessGroup& group, const std::string& error_or_empty, int error_kind);

// Prints "kolos: <kind> on rank R (host) <when>: message" once, from this
// rank, and ends the whole job (MPI_Abort): for an error the other ranks
// cannot learn of because they may be waiting in a collective.
[[noreturn]] void abort_job(const std::exception& error, const char* when);
}  // namespace detail

// Prints "kolos: <kind>[ on rank R (host)]: message" to stderr.
void report_error(const std::exception& error, const RankInfo* where);
// An exception's message, without LibTorch's backtrace.
const char* error_text(const std::exception& error);

// The catch-and-agree step, collective over `group`: runs `body` on this
// rank, then every rank learns whether any rank's body threw (a kolos::Error
// keeps its kind; any other std::exception is generic). If one did, every
// rank throws the AgreedError of the lowest failing rank, so a rank-local
// failure (a config one rank cannot read, a set-up one rank cannot do) ends
// every rank the same way instead of leaving the others in a collective.
template <typename Body>
void agreed(comm::ProcessGroup& group, Body&& body) {
  std::string error;
  int kind = static_cast<int>(ErrorKind::kGeneric);
  try {
    body();
  } catch (const Error& e) {
    error = e.what();
    kind = static_cast<int>(e.kind());
  } catch (const std::exception& e) {
    error = error_text(e);
  }
  detail::agree_on_error(group, error, kind);
}

}  // namespace kolos
