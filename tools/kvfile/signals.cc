// SPDX-License-Identifier: Apache-2.0
// The signal handlers of the kvfile CLI (see signals.h).
#include "signals.h"

#include <signal.h>

#include <atomic>
#include <csignal>

namespace kvfile::cli {

namespace {

// Written by the handler: a lock-free atomic is async-signal-safe.
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);
std::atomic<bool> g_installed{false};

extern "C" void OnSignal(int sig) {
  int none = 0;
  g_signal.compare_exchange_strong(none, sig);
  // Any second signal of the three, not only the same one, takes the
  // default action (signal() is async-signal-safe).
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGHUP, SIG_DFL);
}

}  // namespace

void InstallSignalHandlers() {
  if (g_installed.exchange(true)) return;
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  // SA_RESTART: system calls in flight resume instead of failing with EINTR.
  // The handler resets all three: a second signal takes the default action.
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
}

int PendingSignal() { return g_signal.load(); }

std::string SignalName(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return "signal " + std::to_string(sig);
  }
}

Status CheckInterrupt(const std::string& path) {
  int sig = PendingSignal();
  if (sig == 0) return Status::OK();
  return Status::Failed(path + ": interrupted by " + SignalName(sig));
}


}  // namespace kvfile::cli
