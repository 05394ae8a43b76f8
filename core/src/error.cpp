#include "kolos/core/error.h"

#include <atomic>

namespace kolos {

// The key functions: the classes' vtables and type information are emitted
// here, once, in libkolos_base.
Error::~Error() = default;
ConfigError::~ConfigError() = default;
PluginError::~PluginError() = default;
CommError::~CommError() = default;
DataError::~DataError() = default;
UsageError::~UsageError() = default;

const char* to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kGeneric: return "error";
    case ErrorKind::kConfig: return "config error";
    case ErrorKind::kPlugin: return "plugin error";
    case ErrorKind::kComm: return "communication error";
    case ErrorKind::kData: return "data error";
    case ErrorKind::kCheckpoint: return "checkpoint error";
    case ErrorKind::kUsage: return "usage error";
  }
  return "error";
}

namespace detail {
namespace {
std::atomic<int> g_rank{-1};
}

int current_rank() noexcept { return g_rank.load(std::memory_order_relaxed); }
void set_current_rank(int rank) noexcept { g_rank.store(rank, std::memory_order_relaxed); }

void throw_check_failure(ErrorKind kind, const char* file, int line, const char* condition,
                         const std::string& message) {
  std::ostringstream out;
  out << message;
  if (!message.empty() && message.back() != ' ') out << ' ';
  out << "[check `" << condition << "` failed at " << file << ':' << line;
  if (current_rank() >= 0) out << ", rank " << current_rank();
  out << ']';
  switch (kind) {
    case ErrorKind::kConfig: throw ConfigError(out.str());
    case ErrorKind::kPlugin: throw PluginError(out.str());
    case ErrorKind::kComm: throw CommError(out.str());
    case ErrorKind::kData: throw DataError(out.str());
    case ErrorKind::kUsage: throw UsageError(out.str());
    default: throw Error(out.str(), kind);
  }
}

}  // namespace detail
}  // namespace kolos
