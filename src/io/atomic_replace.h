// SPDX-License-Identifier: Apache-2.0
// Replacing a whole file atomically (spec/RECOVERY.md, "Replacing a file"):
// the library-internal helpers; the PendingReplace class itself is public,
// kvfile/replace.h.
//
// A PendingReplace is made for a destination path before anything is
// written. The caller writes the complete new file at temp_path() (in the
// destination's directory) and closes it; Commit() then makes it durable,
// takes the destination's writer lock, checks that the path still names
// the file it named at the start, gives the new file the old one's mode,
// owner and group, renames it over the destination and syncs the
// directory. Until that rename the destination is exactly as it was; a
// PendingReplace destroyed without a successful Commit() removes its
// temporary file.
#pragma once

#include <memory>
#include <string>

#include "kvfile/file.h"
#include "kvfile/replace.h"
#include "kvfile/status.h"

namespace kvfile::internal {

// Takes the writer lock, waiting up to a second for it. A writer killed
// with io_uring requests in flight keeps its lock until the kernel has torn
// down its ring, which it does asynchronously shortly after the process
// dies; a restarted engine must not fail on that. A live writer keeps the
// lock, and the caller gets kBusy after the wait.
Status LockWithGrace(File& file);

// Whether `name` (a bare file name) is a temporary file of a replacement
// of the file named `dest_name`: <dest>.kvtmp-<pid>-<n>, the names a
// Writer::Create on it makes (<temp>.kvnew), the older convert's
// <dest>.kvtmp-<pid>, or <dest>.kvnew. *pid is the creator's process id,
// or 0 where the name has none.
bool IsReplaceTemp(const std::string& dest_name, const std::string& name, long* pid);

// PendingReplace is public (kvfile/replace.h).
using kvfile::PendingReplace;


}  // namespace kvfile::internal
