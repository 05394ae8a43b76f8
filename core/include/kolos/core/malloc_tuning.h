// How a training process's heap is set up (docs/reliability.md, "The
// training heap").
//
// By default a training process keeps glibc's malloc as it comes. A step's
// large tensors then come from malloc's heap once the first large free has
// raised its mmap threshold, and the heap keeps what the step frees in
// pieces that later, slightly different requests cannot always reuse: the
// peak RSS depends on the order of allocations, moves from run to run, and
// can reach twice the live tensors. Steps reuse that memory without asking
// the kernel for pages.
//
// KOLOS_MALLOC=tuned trades step time for a lower, steadier peak: `kolos
// train` (and the ranks of the planner's calibration and finalists, which
// time training steps) run with glibc's tunables
//
//   glibc.malloc.mmap_threshold=131072  every block of 128 KiB or more from
//                                       mmap, given back when freed (a fixed
//                                       threshold: glibc no longer raises it)
//   glibc.malloc.hugetlb=1              transparent huge pages for malloc's
//                                       mappings, so that a fresh block costs
//                                       one page fault per 2 MiB, not 512
//
// which glibc reads only when a process starts: the process re-executes
// itself once with them added to GLIBC_TUNABLES. Every such block is then
// fresh pages from the kernel, zeroed on first touch: a step that allocates
// many medium-sized tensors against little arithmetic (a small model, short
// products, a mixture's routed rows) runs slower, up to 2x here. Not tuned,
// even when asked, where the kernel's transparent huge pages are `never`
// (the fixed threshold alone made steps up to 73% slower), or when
// GLIBC_TUNABLES already sets one of the two (the user's choice stands).
#pragma once

#include <string>

namespace kolos {

// kolos's tunables, as they go into GLIBC_TUNABLES.
inline constexpr const char* kMallocTunables =
    "glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=131072";

struct MallocSetup {
  bool tuned = false;  // whether a training process runs with kMallocTunables
  std::string reason;  // why not, for the log: "KOLOS_MALLOC=system", ...; "" by default
};

// What a training process started from this environment runs with. Throws
// UsageError on a KOLOS_MALLOC other than "" (glibc's defaults), "system"
// (the same) or "tuned".
MallocSetup training_malloc();
// The same for KOLOS_MALLOC=`choice` (what the tuned heap would be here).
MallocSetup training_malloc(const std::string& choice);

// Whether this process runs with kMallocTunables (its GLIBC_TUNABLES holds
// both; glibc read them when the process started).
bool malloc_tuned_here();

// For a training process: when training_malloc() asks for the tunables and
// this process lacks them, adds them to GLIBC_TUNABLES and replaces the
// process with itself (the binary /proc/self/exe names, the same arguments;
// the pid, the name, the environment and the CPU affinity stay, so mpirun's
// and srun's ranks carry on). Returns only when nothing is to be done, or when the exec failed
// (then with a warning on stderr, GLIBC_TUNABLES as it was and
// KOLOS_MALLOC=system, what the process then runs with).
void reexec_with_malloc_tuning(char** argv);

}  // namespace kolos
