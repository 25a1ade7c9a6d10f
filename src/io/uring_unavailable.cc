// SPDX-License-Identifier: Apache-2.0
// The io_uring backend's entry points in a build without it
// (KVFILE_WITH_URING=OFF, or liburing missing): FileSystem::Default() then
// always chooses the POSIX backend (file_backends.h).
#include "io/file_backends.h"

namespace kvfile::internal {

namespace {
Status NoUring() {
  return Status::Unsupported("io_uring: this build of kvfile has no io_uring backend (built without liburing)");
}
}  // namespace

Status NewUringFileSystem(std::unique_ptr<FileSystem>* out, SyscallFilter*) {
  out->reset();
  return NoUring();
}

Status UringFileSystemInstance(FileSystem** out) {
  *out = nullptr;
  return NoUring();
}

uint64_t UringChainResubmissions() { return 0; }

}  // namespace kvfile::internal
