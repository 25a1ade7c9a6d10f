// SPDX-License-Identifier: Apache-2.0
// Opening and locking the files a writer writes: the file itself, a new
// file created under a temporary name, and the leftover of an interrupted
// upgrade. Each makes sure the file locked is the one the path names.
#pragma once

#include <memory>
#include <string>

#include "kvfile/file.h"

namespace kvfile::internal {

// Opens `path` for writing and takes its writer lock, making sure the file
// locked is still the one the path names: another process may have renamed
// a new file over it (an upgrade, a create with overwrite) while this one
// waited for the lock.
Status OpenLocked(FileSystem& fs, const std::string& path, std::unique_ptr<File>* out);

// Creates `path` exclusively and locks it. A leftover file of that name (a
// crashed create or upgrade) is removed first unless a live writer holds
// its lock. kBusy if another process creates the same name meanwhile
// (*out is left empty: the file is the other's). Any other failure after
// the create leaves the file in *out, for the caller to remove.
Status CreateLocked(FileSystem& fs, const std::string& path, std::unique_ptr<File>* out);

// Self-healing: with the file's lock held no upgrade of it can be running,
// so a <path>.kvupgrade is a crash's leftover; the original is whole.
// Removes it (durably); *removed says whether there was one.
Status RemoveLeftoverUpgrade(FileSystem& fs, const std::string& path, bool* removed);

}  // namespace kvfile::internal
