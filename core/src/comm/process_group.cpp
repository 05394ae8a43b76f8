// ProcessGroup's backend-independent parts: names, the default timeout, and
// the base-class defaults that fail by name (as c10d's Backend.hpp does).
#include "kolos/core/comm/process_group.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <numeric>

#include "kolos/core/comm/watchdog.h"
#include "kolos/core/error.h"

namespace kolos::comm {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "unknown reduce op";
}

const char* to_string(OpType op) {
  switch (op) {
    case OpType::kAllReduce:
      return "all_reduce";
    case OpType::kReduceScatter:
      return "reduce_scatter";
    case OpType::kAllGather:
      return "all_gather";
    case OpType::kBroadcast:
      return "broadcast";
    case OpType::kAllToAll:
      return "all_to_all";
    case OpType::kSend:
      return "send";
    case OpType::kRecv:
      return "recv";
    case OpType::kBarrier:
      return "barrier";
    case OpType::kReduce:
      return "reduce";
    case OpType::kCount:
      break;
  }
  return "unknown op";
}

namespace {
constexpr double kDefaultTimeoutS = 600.0;
// Longest accepted timeout: a week. Longer values are almost certainly a typo
// (milliseconds given as seconds) and would overflow the chrono arithmetic.
constexpr double kMaxTimeoutS = 7.0 * 24 * 3600;
}  // namespace

// Read on every call (cheap) so that a test or a launcher can change the
// variable at run time; a bad value fails loudly instead of falling back.
// While the watchdog runs it owns the deadline: waits last 10 s longer, so
// that the watchdog, which ends the whole job, acts first (watchdog.h).
std::chrono::milliseconds default_timeout() {
  if (watchdog_running()) return watchdog_timeout() + std::chrono::seconds(10);
  const char* text = std::getenv("KOLOS_COMM_TIMEOUT_S");
  if (text == nullptr || *text == '\0') {
    return std::chrono::milliseconds(static_cast<int64_t>(kDefaultTimeoutS * 1000));
  }
  errno = 0;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  const bool parsed = end != text && *end == '\0' && errno == 0 && std::isfinite(seconds);
  KOLOS_CHECK_KIND(kComm, parsed && seconds > 0 && seconds <= kMaxTimeoutS,
                   "environment variable KOLOS_COMM_TIMEOUT_S is '", text,
                   "'; expected a number of seconds greater than 0 and at most ", kMaxTimeoutS,
                   " (e.g. KOLOS_COMM_TIMEOUT_S=600, or 0.5)");
  return std::chrono::milliseconds(std::max<int64_t>(1, std::llround(seconds * 1000)));
}

uint64_t CommStats::total_bytes() const {
  return std::accumulate(bytes.begin(), bytes.end(), uint64_t{0});
}

void ProcessGroup::unsupported(const char* op) const {
  throw CommError(::kolos::detail::concat("backend '", backend(), "' of process group '", name(),
                                          "' does not support ", op,
                                          "; use a backend that implements it (e.g. 'mpi')"));
}

WorkPtr ProcessGroup::all_reduce(const at::Tensor&, ReduceOp) { unsupported("all_reduce"); }

WorkPtr ProcessGroup::reduce(const at::Tensor&, int, ReduceOp) { unsupported("reduce"); }

WorkPtr ProcessGroup::reduce_scatter(const at::Tensor&, const std::vector<at::Tensor>&, ReduceOp) {
  unsupported("reduce_scatter");
}

WorkPtr ProcessGroup::reduce_scatter_flat(const at::Tensor&, const at::Tensor&, ReduceOp) {
  unsupported("reduce_scatter_flat");
}

WorkPtr ProcessGroup::all_gather(const std::vector<at::Tensor>&, const at::Tensor&) {
  unsupported("all_gather");
}

WorkPtr ProcessGroup::all_gather_flat(const at::Tensor&, const at::Tensor&) {
  unsupported("all_gather_flat");
}

WorkPtr ProcessGroup::broadcast(const at::Tensor&, int) { unsupported("broadcast"); }

WorkPtr ProcessGroup::all_to_all(const at::Tensor&, const at::Tensor&, const std::vector<int64_t>&,
                                 const std::vector<int64_t>&) {
  unsupported("all_to_all");
}

WorkPtr ProcessGroup::send(const at::Tensor&, int, int) { unsupported("send"); }

WorkPtr ProcessGroup::recv(const at::Tensor&, int, int) { unsupported("recv"); }

ProcessGroupPtr ProcessGroup::split(int64_t, int64_t, const std::string&) { unsupported("split"); }

WorkPtr ProcessGroup::barrier() { unsupported("barrier"); }

}  // namespace kolos::comm
