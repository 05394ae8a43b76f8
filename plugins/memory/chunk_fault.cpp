// The chunks plugin's fault switch (chunk_fault.h): compiled with
// KOLOS_FAULT_INJECTION into the test copy of the plugin, without it into
// the installed one. Torch-free.
#include "chunk_fault.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>

namespace kolos::chunks {

// Fault injection, compiled only into the test copy of this plugin
// (lib/kolos/fault-plugins of the build tree, never installed): with
// KOLOS_CHUNKS_TEST_DIE_STEP=S the process kills itself with SIGKILL
// halfway through optimizer step S's chunks, some of them updated (and
// written back to host or NVMe) and some not: a power loss at the worst
// point, reached without a timer.
#ifdef KOLOS_FAULT_INJECTION
void maybe_die_mid_step(int64_t step, size_t chunk, size_t chunks) {
  const char* at = std::getenv("KOLOS_CHUNKS_TEST_DIE_STEP");
  if (at == nullptr || std::atoll(at) != step || chunk != chunks / 2) return;
  std::fprintf(stderr, "kolos: test hook: killed in optimizer step %lld at chunk %zu of %zu\n",
               static_cast<long long>(step), chunk, chunks);
  std::fflush(stderr);
  std::raise(SIGKILL);
}
#else
void maybe_die_mid_step(int64_t, size_t, size_t) {}
#endif

}  // namespace kolos::chunks
