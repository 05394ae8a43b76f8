// The communication watchdog: every collective and point-to-point operation
// has a deadline, and a job whose operation misses it ends, whole, with a
// message that says what was stuck and which rank stopped answering.
//
// The MPI backend registers each operation from the moment it enters MPI
// (a blocking collective, inline or on the group's thread; a posted send or
// recv) until it completes. One thread per process checks the registrations
// every 200 ms. When the oldest is older than the timeout, the rank prints
// one line
//
//   kolos: communication timeout on rank 0 (node01): all_reduce of 4096 float32
//   elements on group 'dp' (world ranks 0,1) has not completed after 20 s;
//   step 12, micro-batch 3; rank 1 (node02) stopped answering: no heartbeat for 19.4 s
//
// and calls MPI_Abort, which ends every rank (a stopped one too: the launcher
// kills it); an alarm ends the process 10 s later should MPI_Abort itself
// hang. Nothing joins a thread that is stuck inside MPI.
//
// Heartbeats run on a communicator of their own, on the watchdog's thread:
// every rank sends one per second to rank 0, which answers each with the
// ranks it has not heard from for 3 s. So any rank whose operation times out
// can name the rank that stopped (or, when rank 0 itself stopped answering,
// say so).
//
// The deadline: [runtime] comm_timeout_s when set, else KOLOS_COMM_TIMEOUT_S,
// else 600 s. Work::wait() without an explicit timeout waits 10 s longer than
// the deadline while the watchdog runs, so the watchdog, not an exception
// unwinding through the groups, ends a stuck job.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace kolos::comm {

// Where this rank is, for the watchdog's message; -1: not in a step / not
// known. The engine sets the step, the schedules the micro-batch.
void set_progress_step(int64_t step);
void set_progress_micro_batch(int64_t micro_batch);

// Registers an operation that is now inside the communication library;
// returns a token for watchdog_end(). `describe` is called only if the
// operation times out. Cheap when no watchdog runs.
uint64_t watchdog_begin(std::function<std::string()> describe);
void watchdog_end(uint64_t token);
// Called (in order of registration, never concurrently) when an operation
// times out, just before the job is ended: the NCCL backend aborts its
// communicators here, since a kernel waiting for a stopped peer never
// returns. A hook must not block.
void add_watchdog_abort_hook(std::function<void()> hook);

// Starts this process's watchdog. Collective over MPI_COMM_WORLD (it creates
// the heartbeat communicator and learns every rank's host); the Runtime calls
// it once MPI is up, and stop_watchdog() before MPI_Finalize.
void start_watchdog(std::chrono::milliseconds timeout, int rank, int size,
                    const std::string& host);
void stop_watchdog();
bool watchdog_running();
// Changes the deadline of a running watchdog (the engine applies
// [runtime] comm_timeout_s).
void set_watchdog_timeout(std::chrono::milliseconds timeout);
std::chrono::milliseconds watchdog_timeout();

}  // namespace kolos::comm
