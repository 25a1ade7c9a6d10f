// SPDX-License-Identifier: Apache-2.0
// Calling library objects from Python threads.
//
// The GIL is released for every call that does I/O or decoding, so other
// Python threads run while the disk works. Readers and writers are not safe
// for concurrent calls, so each Python wrapper serializes its calls with its
// own mutex, taken only after the GIL is given up and released before the
// GIL is taken back: no thread ever holds the mutex while it waits for the
// GIL, so taking the mutex with the GIL held (Reset) cannot deadlock.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "errors.h"
#include "kvfile/status.h"

namespace kvfile::python {

// Runs `call` (returning a Status) without the GIL and under `mu`, then
// raises its error, if any, as a kvfile exception. `call` must not touch
// Python objects.
template <typename Call>
void BlockingCall(std::mutex& mu, Call&& call) {
  Status st;
  {
    pybind11::gil_scoped_release release;
    std::lock_guard lock(mu);
    st = call();
  }
  ThrowIfError(st);
}

// A library object (Reader, Writer) owned by a Python wrapper.
template <typename T>
class Guarded {
 public:
  // `object` must not be null; `kind` ("reader") names it in messages.
  Guarded(std::unique_ptr<T> object, const char* kind)
      : object_(std::move(object)), path_(object_->path()), kind_(kind) {}

  // Returns `get(T&)`, run with the GIL held and under the mutex: for quick
  // calls (token ids, counts, geometry) that must not see a running call's
  // half-made changes. Raises FailedError once the object is reset. `get`
  // must return C++ values and touch no Python object: making one can run
  // arbitrary Python code (a finalizer, a thread switch) while the mutex is
  // held.
  template <typename Get>
  auto Inspect(Get&& get) {
    std::unique_lock lock(mu_);
    if (!object_) {
      lock.unlock();  // raising makes a Python object
      ThrowIfError(Closed());
    }
    return get(*object_);
  }

  // Runs `call(T&)` through BlockingCall. The object is looked up under the
  // mutex: another thread may have reset it since the caller's checks.
  template <typename Call>
  void Run(Call&& call) {
    BlockingCall(mu_, [&]() -> Status {
      if (!object_) return Closed();
      return call(*object_);
    });
  }

  // Destroys the object, after any call running in another thread. GIL held.
  void Reset() {
    std::lock_guard lock(mu_);
    object_.reset();
  }

 private:
  Status Closed() const { return Status::Failed(path_ + ": " + kind_ + " is closed"); }

  std::mutex mu_;
  std::unique_ptr<T> object_;
  const std::string path_;  // after object_: initialized from it
  const char* const kind_;
};

}  // namespace kvfile::python
