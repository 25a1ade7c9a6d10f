// SPDX-License-Identifier: Apache-2.0
// A progress bar on stderr for work that takes more than about a second.
//
// Drawn only when stderr is a terminal and --quiet was not given, so scripts
// and CI logs see nothing on stderr but errors. Thread-safe Add(); first
// drawn after a second (KVFILE_PROGRESS_DELAY_MS milliseconds where set),
// then redrawn at most ten times a second and once at 100%; erased when
// done.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace kvfile::cli {

// Set by the global --quiet flag.
void SetQuiet(bool quiet);

class Progress {
 public:
  Progress(std::string label, uint64_t total);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void Add(uint64_t done);
  // Erases the bar (also done by the destructor); call it before printing
  // the result.
  void Finish();

 private:
  void Draw(uint64_t done);  // with mu_ held

  std::string label_;
  uint64_t total_;
  std::atomic<bool> enabled_;
  std::atomic<uint64_t> done_{0};
  // steady_clock nanoseconds before which nothing is (re)drawn.
  std::atomic<int64_t> next_draw_ns_;
  std::mutex mu_;
  bool drawn_ = false;           // a bar is on the screen
  bool complete_drawn_ = false;  // the 100% bar was drawn
};

// For a step whose progress cannot be counted (the library's recovery
// scan, a v1 upgrade, a whole-file check): on a terminal, after the delay,
// "LABEL ... 3 s" on stderr, redrawn from a thread of its own every 0.2 s
// until Finish() (or the destructor) erases it. Same conditions as Progress.
class Activity {
 public:
  explicit Activity(std::string label);
  ~Activity();
  Activity(const Activity&) = delete;
  Activity& operator=(const Activity&) = delete;
  void Finish();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The bars of a library call that reports its steps as (label, done,
// total) (kvfile::ConvertOptions::progress): Callback() draws one Progress
// per label, made at the step's first report; Finish() (or the
// destructor) erases the last. The callback must not outlive this object.
class ProgressReports {
 public:
  std::function<void(const std::string& label, uint64_t done, uint64_t total)> Callback();
  void Finish();

 private:
  std::unique_ptr<Progress> bar_;
  std::string label_;
  uint64_t shown_ = 0;
};

}  // namespace kvfile::cli
