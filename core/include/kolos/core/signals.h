// Graceful stop: SIGTERM (Slurm preemption, `kill`), SIGUSR1 (Slurm's
// `--signal` warning before a time limit) and SIGINT ask the run to stop at
// the next step boundary. The engine agrees on the request over every rank
// (a rank that got the signal stops the others), ends the step, and the
// `kolos train` command exits with kExitStopped.
//
// During set-up (from install_stop_handlers() until the first step begins:
// plugins, mesh, model, data, a checkpoint load) there is nothing to save
// and set-up may block for long (a huge model, data on a hung file system,
// a peer that never arrives), so SIGTERM and SIGINT end the process at
// once: it prints "kolos: SIGTERM during set-up on rank R (host): ..." and
// exits with 128 + the signal; the launcher (mpirun, srun) then ends the
// other ranks. SIGUSR1 still waits for the first step boundary.
#pragma once

#include <string>

namespace kolos {

inline constexpr int kExitStopped = 3;  // stopped early on request; resumable

// Installs the handlers (idempotent). A second SIGINT ends the process.
void install_stop_handlers();
bool stop_requested();
// The signal that asked to stop (0 when none or requested in code).
int stop_signal();
void request_stop();
void clear_stop_request();

// Names this process in the set-up message (" on rank 1 (node07)"); the
// Runtime sets it once it knows. Not for use in a signal handler.
void set_stop_context(int rank, int size, const std::string& host);
// Set-up is over: from now on SIGTERM and SIGINT stop at a step boundary.
// Idempotent; the engine calls it when a step begins.
void end_setup_phase();
bool in_setup_phase();

}  // namespace kolos
