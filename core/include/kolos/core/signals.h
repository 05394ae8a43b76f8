// Graceful stop: SIGTERM (Slurm preemption, `kill`), SIGUSR1 (Slurm's
// `--signal` warning before a time limit) and SIGINT ask the run to stop at
// the next step boundary. The engine agrees on the request over every rank
// (a rank that got the signal stops the others), ends the step, and the
// `kolos train` command exits with kExitStopped.
#pragma once

namespace kolos {

inline constexpr int kExitStopped = 3;  // stopped early on request; resumable

// Installs the handlers (idempotent). A second SIGINT ends the process.
void install_stop_handlers();
bool stop_requested();
// The signal that asked to stop (0 when none or requested in code).
int stop_signal();
void request_stop();
void clear_stop_request();

}  // namespace kolos
