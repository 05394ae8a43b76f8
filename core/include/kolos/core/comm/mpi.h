// The MPI backend of ProcessGroup (CPU tensors).
#pragma once

#include <mpi.h>

#include <string>

#include "kolos/core/comm/process_group.h"

namespace kolos::comm {

// Duplicates `comm` (the group owns its duplicate and frees it on
// destruction, which must happen before MPI_Finalize; the Runtime sees to
// that) and starts the group's communication thread on first use.
// Requires MPI initialised with MPI_THREAD_MULTIPLE.
ProcessGroupPtr make_mpi_process_group(MPI_Comm comm, std::string name);

}  // namespace kolos::comm
