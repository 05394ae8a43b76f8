// A training process's heap (malloc_tuning.h).
#include "kolos/core/malloc_tuning.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "kolos/core/error.h"

namespace kolos {
namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

// The kernel's transparent huge page mode: the bracketed word of
// /sys/kernel/mm/transparent_hugepage/enabled ("always [madvise] never"),
// "" when the file is absent.
std::string huge_page_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(in, line)) return "";
  const auto open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return "";
  return line.substr(open + 1, close - open - 1);
}

bool has_tunable(const std::string& tunables, const std::string& setting) {
  size_t from = 0;
  while (from <= tunables.size()) {
    const size_t end = std::min(tunables.find(':', from), tunables.size());
    if (tunables.compare(from, end - from, setting) == 0) return true;
    from = end + 1;
  }
  return false;
}

}  // namespace

bool malloc_tuned_here() {
  const std::string tunables = env("GLIBC_TUNABLES");
  return has_tunable(tunables, "glibc.malloc.hugetlb=1") &&
         has_tunable(tunables, "glibc.malloc.mmap_threshold=131072");
}

MallocSetup training_malloc() { return training_malloc(env("KOLOS_MALLOC")); }

MallocSetup training_malloc(const std::string& choice) {
  if (choice != "" && choice != "tuned" && choice != "system") {
    throw UsageError("KOLOS_MALLOC=" + choice +
                     ": the training heap is `system` (glibc's defaults, the default) or `tuned` "
                     "(a lower, steadier peak; slower steps where a step allocates many "
                     "medium-sized tensors)");
  }
  if (choice == "system") return {false, "KOLOS_MALLOC=system"};
  // Running with them (restarted, or the user's own GLIBC_TUNABLES): tuned.
  if (malloc_tuned_here()) return {true, "GLIBC_TUNABLES " + std::string(kMallocTunables)};
  if (choice.empty()) return {false, ""};  // the default
  if (std::getenv("KOLOS_MALLOC_REEXEC") != nullptr) {
    return {false, "GLIBC_TUNABLES did not reach the restarted process"};
  }
  const std::string tunables = env("GLIBC_TUNABLES");
  if (tunables.find("glibc.malloc.hugetlb") != std::string::npos ||
      tunables.find("glibc.malloc.mmap_threshold") != std::string::npos) {
    return {false, "GLIBC_TUNABLES sets malloc itself"};
  }
  // Read once: a refused run's alternatives ask for every variant they try.
  static const std::string mode = huge_page_mode();
  if (mode != "always" && mode != "madvise") {
    return {false, "transparent huge pages " + (mode.empty() ? "unavailable" : "`" + mode + "`") +
                       " here"};
  }
  return {true, "GLIBC_TUNABLES " + std::string(kMallocTunables)};
}

void reexec_with_malloc_tuning(char** argv) {
  // KOLOS_MALLOC_REEXEC marks the restarted process: one restart at most,
  // even if GLIBC_TUNABLES did not come through.
  if (malloc_tuned_here() || std::getenv("KOLOS_MALLOC_REEXEC") != nullptr ||
      !training_malloc().tuned) {
    return;
  }
  const char* before = std::getenv("GLIBC_TUNABLES");
  const std::string saved = before != nullptr ? before : "";
  const std::string tunables =
      saved.empty() ? std::string(kMallocTunables) : saved + ":" + kMallocTunables;
  setenv("GLIBC_TUNABLES", tunables.c_str(), 1);
  setenv("KOLOS_MALLOC_REEXEC", "1", 1);
  // The binary by its own path, so that the process keeps its name (a
  // process exec'd through /proc/self/exe is called `exe`: ps -C, pgrep
  // and /proc/PID/comm would no longer find it).
  char self[4096];
  const ssize_t length = readlink("/proc/self/exe", self, sizeof self - 1);
  const bool named = length > 0 && static_cast<size_t>(length) < sizeof self - 1;
  if (named) self[length] = '\0';
  const std::string path = named ? self : "/proc/self/exe";
  execv(access(path.c_str(), X_OK) == 0 ? path.c_str() : "/proc/self/exe", argv);
  const int error = errno;
  unsetenv("KOLOS_MALLOC_REEXEC");
  if (before != nullptr) {
    setenv("GLIBC_TUNABLES", saved.c_str(), 1);
  } else {
    unsetenv("GLIBC_TUNABLES");
  }
  std::fprintf(stderr,
               "kolos: warning: could not restart with GLIBC_TUNABLES=%s (%s); training with "
               "glibc's malloc defaults\n",
               kMallocTunables, std::strerror(error));
  // What this process runs with, for its memory estimate and its log.
  setenv("KOLOS_MALLOC", "system", 1);
}

}  // namespace kolos
