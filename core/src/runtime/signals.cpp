#include "kolos/core/signals.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <initializer_list>
#include <string>

namespace kolos {
namespace {

volatile std::sig_atomic_t g_stop = 0;
volatile std::sig_atomic_t g_signal = 0;
volatile std::sig_atomic_t g_setup = 1;
// The whole set-up message per signal, written by set_stop_context() and
// then only read (by the handler), so that one write(2) prints it and the
// lines of several ranks do not interleave.
char g_term_message[256] = "kolos: SIGTERM during set-up: the run ends before its first step\n";
char g_int_message[256] = "kolos: SIGINT during set-up: the run ends before its first step\n";

void write_all(const char* text) {
  size_t left = std::strlen(text);
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, text, left);
    if (n <= 0) return;
    text += n;
    left -= static_cast<size_t>(n);
  }
}

// Async-signal-safe: write(2) and _exit(2) only.
[[noreturn]] void end_during_setup(int signal) {
  write_all(signal == SIGTERM ? g_term_message : g_int_message);
  ::_exit(128 + signal);
}

void compose(char (&out)[256], const char* signal, const std::string& where) {
  std::string text = std::string("kolos: ") + signal + " during set-up" + where +
                     ": the run ends before its first step (nothing to save)\n";
  text.resize(std::min(text.size(), sizeof out - 1));
  std::memcpy(out, text.data(), text.size());
  out[text.size()] = '\0';
}

// Internal linkage, and no C language linkage (which would give it an
// external name even here): an `on_stop_signal` of the executable's would
// otherwise interpose, and sigaction() below would install that one.
void on_stop_signal(int signal) {
  if (g_setup && (signal == SIGTERM || signal == SIGINT)) end_during_setup(signal);
  if (signal == SIGINT && g_stop) {
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
    return;
  }
  g_signal = signal;
  g_stop = 1;
}

}  // namespace

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // MPI and file I/O carry on; the loop polls the flag
  for (int signal : {SIGTERM, SIGUSR1, SIGINT}) sigaction(signal, &action, nullptr);
}

bool stop_requested() { return g_stop != 0; }
int stop_signal() { return g_signal; }
void request_stop() { g_stop = 1; }
void clear_stop_request() {
  g_stop = 0;
  g_signal = 0;
}

void set_stop_context(int rank, int size, const std::string& host) {
  const std::string where =
      size > 1 ? " on rank " + std::to_string(rank) + " (" + host + ")" : std::string();
  compose(g_term_message, "SIGTERM", where);
  compose(g_int_message, "SIGINT", where);
}

void end_setup_phase() { g_setup = 0; }
bool in_setup_phase() { return g_setup != 0; }

}  // namespace kolos
