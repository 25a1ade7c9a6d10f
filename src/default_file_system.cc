// SPDX-License-Identifier: Apache-2.0
// FileSystem::Default(): which backend the library uses when the caller
// does not pass one.
//
// io_uring when this process can set up a ring (probed once), else POSIX
// pread/pwrite. KVFILE_IO=posix or KVFILE_IO=uring forces one; a forced
// io_uring that cannot be initialised falls back to POSIX without printing
// anything (a static accessor has no way to fail), so check the backend
// actually used with `kvfile info --json` ("io_backend") or File::backend().
// KVFILE_IO is read once, at the first Default() call.
#include <cstdlib>
#include <string_view>

#include "file_backends.h"

namespace kvfile {

namespace internal {

Status MakeFileSystemFromEnv(const char* value, FileSystem** out) {
  std::string_view v = value ? std::string_view(value) : std::string_view();
  if (v == "posix") {
    *out = PosixFileSystemInstance();
    return Status::OK();
  }
  FileSystem* uring = nullptr;
  Status st = UringFileSystemInstance(&uring);
  if (st.ok() && uring != nullptr) {
    *out = uring;
    return Status::OK();
  }
  *out = PosixFileSystemInstance();
  if (v == "uring" || v == "io_uring")
    return st.WithContext("KVFILE_IO=" + std::string(v) + " falls back to posix");
  return Status::OK();  // the default choice: posix is a normal outcome
}

}  // namespace internal

FileSystem* FileSystem::Default() {
  static FileSystem* const fs = [] {
    FileSystem* chosen = nullptr;
    (void)internal::MakeFileSystemFromEnv(std::getenv("KVFILE_IO"), &chosen);
    return chosen;
  }();
  return fs;
}

}  // namespace kvfile
