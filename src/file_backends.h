// The file-system backends behind FileSystem::Default().
#pragma once

#include "kvfile/file.h"

namespace kvfile::internal {

// pread/pwrite/fdatasync; always available.
FileSystem* PosixFileSystemInstance();

}  // namespace kvfile::internal
