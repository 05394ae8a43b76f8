#include "kolos/core/runtime.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <dlfcn.h>
#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kolos/core/comm/mpi.h"
#include "kolos/core/comm/watchdog.h"
#include "kolos/core/devices.h"
#include "kolos/core/error.h"
#include "kolos/core/signals.h"

namespace kolos {
namespace {

int g_local_rank = 0;
std::string g_host;

int mpi_check(int code, const char* what) {
  if (code != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    throw CommError(std::string(what) + " failed: " + std::string(text, length));
  }
  return code;
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

// OpenBLAS keeps its own pthread pool next to LibTorch's OpenMP pool, and
// both spin while idle: on the same cores they slow each other down (a GPT
// step here took 470-590 ms with 2 + 2 threads, 215 ms with LibTorch on 2
// threads and OpenBLAS on 1). Unless OPENBLAS_NUM_THREADS says otherwise,
// BLAS calls run on the calling thread and LibTorch's pool does the rest.
void set_blas_threads(int threads) {
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    fn(threads);
  }
}

}  // namespace

Runtime::Runtime(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    mpi_check(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    finalize_ = true;
    if (provided < MPI_THREAD_MULTIPLE) {
      std::fprintf(stderr,
                   "kolos: error: this MPI does not provide MPI_THREAD_MULTIPLE (level %d), which "
                   "the communication threads need\n",
                   provided);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &info_.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &info_.size);
  MPI_Comm local;
  mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, info_.rank, MPI_INFO_NULL,
                                &local),
            "MPI_Comm_split_type");
  MPI_Comm_rank(local, &info_.local_rank);
  MPI_Comm_size(local, &info_.local_size);
  MPI_Comm_free(&local);
  char host[MPI_MAX_PROCESSOR_NAME];
  int length = 0;
  MPI_Get_processor_name(host, &length);
  info_.host.assign(host, length);
  detail::set_current_rank(info_.size > 1 ? info_.rank : -1);
  g_local_rank = info_.local_rank;
  g_host = info_.host;
  set_stop_context(info_.rank, info_.size, info_.host);

  threads_ = std::max(1, usable_cores() / std::max(1, info_.local_size));
  if (const char* env = std::getenv("KOLOS_THREADS")) {
    char* end = nullptr;
    long value = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && value >= 1) threads_ = static_cast<int>(value);
  }
  at::set_num_threads(threads_);
  device_ = cuda::select_device(info_.local_rank);
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr) set_blas_threads(1);
  world_ = comm::make_mpi_process_group(MPI_COMM_WORLD, "world");
  comm::start_watchdog(comm::default_timeout(), info_.rank, info_.size, info_.host);
}

Runtime::~Runtime() {
  comm::stop_watchdog();
  world_.reset();
  if (!finalize_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

int node_local_rank() { return g_local_rank; }

std::string node_host() {
  if (!g_host.empty()) return g_host;
  char name[256] = {};
  return gethostname(name, sizeof name - 1) == 0 ? std::string(name) : std::string("localhost");
}

const char* error_text(const std::exception& error) {
  // LibTorch's errors carry a C++ backtrace that helps nobody here.
  if (auto* e = dynamic_cast<const c10::Error*>(&error)) return e->what_without_backtrace();
  return error.what();
}

void report_error(const std::exception& error, const RankInfo* where) {
  const char* kind = "error";
  if (auto* e = dynamic_cast<const Error*>(&error)) kind = to_string(e->kind());
  if (where != nullptr && where->size > 1) {
    std::fprintf(stderr, "kolos: %s on rank %d (%s): %s\n", kind, where->rank, where->host.c_str(),
                 error_text(error));
  } else {
    std::fprintf(stderr, "kolos: %s: %s\n", kind, error_text(error));
  }
  std::fflush(stderr);
}

namespace detail {

void agree_on_error(comm::ProcessGroup& group, const std::string& error_or_empty, int error_kind) {
  const int rank = group.rank();
  const int size = group.size();
  at::Tensor first = at::full({1}, error_or_empty.empty() ? size : rank, at::kLong);
  group.all_reduce(first, comm::ReduceOp::kMin)->wait();
  const int origin = static_cast<int>(first.item<int64_t>());
  if (origin == size) return;
  // The first failing rank tells the others its kind and message.
  at::Tensor header = at::tensor(
      {static_cast<int64_t>(error_kind), static_cast<int64_t>(error_or_empty.size())}, at::kLong);
  group.broadcast(header, origin)->wait();
  const int kind = static_cast<int>(header[0].item<int64_t>());
  at::Tensor text = at::empty({header[1].item<int64_t>()}, at::kByte);
  if (rank == origin && text.numel() > 0) {
    std::memcpy(text.data_ptr(), error_or_empty.data(), error_or_empty.size());
  }
  if (text.numel() > 0) group.broadcast(text, origin)->wait();
  std::string message;
  if (text.numel() > 0) message.assign(static_cast<const char*>(text.data_ptr()), text.numel());
  throw AgreedError(std::move(message), static_cast<ErrorKind>(kind), origin);
}

void abort_job(const std::exception& error, const char* when) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  char host[MPI_MAX_PROCESSOR_NAME] = "?";
  int length = 0;
  MPI_Get_processor_name(host, &length);
  const char* kind = "error";
  if (auto* e = dynamic_cast<const Error*>(&error)) kind = to_string(e->kind());
  std::fprintf(stderr, "kolos: %s on rank %d (%s) %s: %s; ending the job\n", kind, rank, host, when,
               error_text(error));
  std::fflush(stderr);
  ::alarm(10);  // should MPI_Abort hang, SIGALRM ends this process
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

}  // namespace detail

int run_guarded(const Runtime& runtime, const std::function<int()>& body) {
  try {
    return body();
  } catch (const AgreedError& error) {
    if (runtime.rank() == 0) {
      if (runtime.size() > 1 && error.origin() != 0) {
        std::fprintf(stderr, "kolos: %s (rank %d): %s\n", to_string(error.kind()), error.origin(),
                     error.what());
      } else {
        std::fprintf(stderr, "kolos: %s: %s\n", to_string(error.kind()), error.what());
      }
      std::fflush(stderr);
    }
    return 2;
  } catch (const std::exception& error) {
    report_error(error, &runtime.info());
  } catch (...) {
    std::fprintf(stderr, "kolos: unknown exception on rank %d\n", runtime.rank());
  }
  if (runtime.size() > 1) MPI_Abort(MPI_COMM_WORLD, 1);
  return 1;
}

}  // namespace kolos
