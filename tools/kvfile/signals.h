// SPDX-License-Identifier: Apache-2.0
// SIGINT, SIGTERM and SIGHUP as a request to stop at a safe point.
//
// The handler only records the first signal. Verbs that write (or run long)
// install it and call CheckInterrupt() between batches, chunks and files;
// the error it returns propagates like any other, so destructors remove
// temporary files, and ReportError() maps it to exit status 128 + signal
// (130, 143, 129). A second signal takes the default action (the process
// ends at once). Read-only verbs that write nothing keep the default
// handling.
#pragma once

#include <string>

#include "kvfile/status.h"

namespace kvfile::cli {

// Installs the handlers (once; later calls do nothing).
void InstallSignalHandlers();

// The first signal received since InstallSignalHandlers(), or 0.
int PendingSignal();

// OK, or "PATH: interrupted by SIGINT" once a signal has been received.
Status CheckInterrupt(const std::string& path);

// "SIGINT", "SIGTERM", "SIGHUP" (or "signal N").
std::string SignalName(int sig);

}  // namespace kvfile::cli
