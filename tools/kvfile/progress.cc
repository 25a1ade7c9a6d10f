// SPDX-License-Identifier: Apache-2.0
// The stderr progress bar (see progress.h).
#include "progress.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace kvfile::cli {

namespace {
std::atomic<bool> g_quiet{false};

// How long work runs before its bar or activity line appears: a second, or
// KVFILE_PROGRESS_DELAY_MS milliseconds (0 draws at once; the tests of the
// bar use it on inputs that take less than a second).
std::chrono::milliseconds Delay() {
  static const std::chrono::milliseconds delay = [] {
    const std::chrono::milliseconds fallback(1000);
    const char* v = std::getenv("KVFILE_PROGRESS_DELAY_MS");
    if (!v || !*v) return fallback;
    uint32_t ms = 0;
    const char* end = v + std::strlen(v);
    auto [p, ec] = std::from_chars(v, end, ms);
    if (ec != std::errc() || p != end) return fallback;
    return std::chrono::milliseconds(ms);
  }();
  return delay;
}

int64_t Nanos(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}
}  // namespace

void SetQuiet(bool quiet) { g_quiet = quiet; }

Progress::Progress(std::string label, uint64_t total)
    : label_(std::move(label)),
      total_(total),
      enabled_(!g_quiet && isatty(STDERR_FILENO) == 1 && total > 0),
      next_draw_ns_(Nanos(std::chrono::steady_clock::now() + Delay())) {}

Progress::~Progress() { Finish(); }

void Progress::Finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (drawn_) std::fprintf(stderr, "\r\033[K");
  drawn_ = false;
  enabled_ = false;
}

void Progress::Add(uint64_t n) {
  uint64_t done = done_.fetch_add(n) + n;
  if (!enabled_) return;
  // Nothing before the delay, then at most ten redraws a second, and the
  // full bar once when the work is done.
  const bool complete = done >= total_;
  const int64_t now = Nanos(std::chrono::steady_clock::now());
  if (!complete && now < next_draw_ns_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!enabled_ || complete_drawn_) return;
  if (now < next_draw_ns_.load(std::memory_order_relaxed) && !(complete && drawn_)) return;
  complete_drawn_ = complete;
  next_draw_ns_.store(now + 100'000'000, std::memory_order_relaxed);
  Draw(done);
}

void Progress::Draw(uint64_t done) {
  const int width = 30;
  double frac = total_ ? static_cast<double>(done) / static_cast<double>(total_) : 0.0;
  if (frac > 1) frac = 1;
  int filled = static_cast<int>(frac * width);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(width - filled), ' ');
  std::fprintf(stderr, "\r%s [%s] %3d%%", label_.c_str(), bar.c_str(), static_cast<int>(frac * 100));
  std::fflush(stderr);
  drawn_ = true;
}

struct Activity::State {
  std::string label;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool drawn = false;
  std::thread thread;
};

Activity::Activity(std::string label) : state_(std::make_unique<State>()) {
  state_->label = std::move(label);
  if (g_quiet || isatty(STDERR_FILENO) != 1) return;
  State* s = state_.get();
  s->thread = std::thread([s] {
    auto start = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(s->mu);
    if (s->cv.wait_for(lock, Delay(), [s] { return s->done; })) return;
    do {
      auto secs = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start);
      std::fprintf(stderr, "\r%s ... %lld s", s->label.c_str(), static_cast<long long>(secs.count()));
      std::fflush(stderr);
      s->drawn = true;
    } while (!s->cv.wait_for(lock, std::chrono::milliseconds(200), [s] { return s->done; }));
  });
}

Activity::~Activity() { Finish(); }

void Activity::Finish() {
  if (!state_->thread.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->done = true;
  }
  state_->cv.notify_all();
  state_->thread.join();
  if (state_->drawn) std::fprintf(stderr, "\r\033[K");
  state_->drawn = false;
}

std::function<void(const std::string&, uint64_t, uint64_t)> ProgressReports::Callback() {
  return [this](const std::string& label, uint64_t done, uint64_t total) {
    if (!bar_ || label != label_) {
      bar_ = std::make_unique<Progress>(label, total);
      label_ = label;
      shown_ = 0;
    }
    bar_->Add(done - std::min(done, shown_));
    shown_ = std::max(shown_, done);
  };
}

void ProgressReports::Finish() {
  if (bar_) bar_->Finish();
}

}  // namespace kvfile::cli
