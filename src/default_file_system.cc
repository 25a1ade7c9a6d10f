// FileSystem::Default(): which backend the library uses when the caller
// does not pass one.
#include "file_backends.h"

namespace kvfile {

FileSystem* FileSystem::Default() { return internal::PosixFileSystemInstance(); }

}  // namespace kvfile
