#include "kolos/core/signals.h"

#include <signal.h>

#include <csignal>
#include <initializer_list>

namespace kolos {
namespace {

volatile std::sig_atomic_t g_stop = 0;
volatile std::sig_atomic_t g_signal = 0;

extern "C" void on_stop_signal(int signal) {
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

}  // namespace kolos
