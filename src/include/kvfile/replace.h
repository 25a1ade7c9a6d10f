// SPDX-License-Identifier: Apache-2.0
// Replacing a whole file atomically (spec/RECOVERY.md, "Replacing a file"):
// what the kvfile CLI writes every output file through.
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
//
// An s3://bucket/key destination (docs/object-storage.md) is staged in
// a temporary file under $TMPDIR (or /tmp), and Commit() uploads it by
// multipart: the object appears only when the upload completes. Begin
// aborts the uploads of the same key left by a killed kvfile.
#pragma once

#include <memory>
#include <string>

#include "kvfile/export.h"
#include "kvfile/file.h"
#include "kvfile/status.h"

namespace kvfile {

// Temporary names (spec/RECOVERY.md section 9, "Temporary names"). Every temporary
// file or directory kvfile makes next to a destination is named by the
// destination's base name followed by a suffix of at most
// kMaxTempSuffixBytes (".kvnew", ".kvupgrade", ".kvtmp-<pid>-<n>", ...),
// and must fit a file name's 255 bytes whatever the destination's length.
inline constexpr size_t kMaxTempSuffixBytes = 48;
// The base name temporary names of `base_name` start with when the whole
// name does not fit: `base_name` itself if it leaves kMaxTempSuffixBytes of
// the 255, else its first 190 bytes (cut back to a UTF-8 character
// boundary), "~" and 16 hex digits of XXH3-64 of the whole name. A
// PendingReplace's temporary file always starts with it.
KVFILE_EXPORT std::string TempStem(const std::string& base_name);
// `path` with `suffix` (at most kMaxTempSuffixBytes) appended to its base
// name where that fits in 255 bytes, else TempStem(base name) + suffix; in
// `path`'s directory. The one rule for every other temporary name.
KVFILE_EXPORT std::string TempPathFor(const std::string& path, const std::string& suffix);

class KVFILE_EXPORT PendingReplace {
 public:
  // Prepares the replacement of `dest` (fs: nullptr for the default).
  // A symlink is followed to its final target, which is what gets
  // replaced (the link stays a link). Refuses, touching nothing, a
  // destination that exists and is not a regular file. Removes the stale
  // temporary files of earlier replacements of the same destination: those
  // whose creating process is gone and that no process holds locked.
  static Status Begin(const std::string& dest, FileSystem* fs, std::unique_ptr<PendingReplace>* out);

  ~PendingReplace();
  PendingReplace(const PendingReplace&) = delete;
  PendingReplace& operator=(const PendingReplace&) = delete;

  // Where the caller writes the new file (not created yet).
  const std::string& temp_path() const { return temp_; }
  // The path replaced: dest, with symlinks followed.
  const std::string& target() const { return target_; }
  // What the target was at Begin (exists == false: nothing there).
  const PathInfo& original() const { return original_; }
  // Stale temporary files Begin removed.
  int removed_stale() const { return removed_stale_; }

  // Replaces the destination with the file at temp_path(), which must be
  // complete and closed. kBusy if a writer holds the destination or it was
  // replaced, removed or created meanwhile; the destination is then
  // unchanged. After a failure the temporary file is still removed by the
  // destructor.
  Status Commit();

 private:
  PendingReplace() = default;
  Status RemoveStaleTemps();
  Status BeginRemote();

  FileSystem* fs_ = nullptr;
  std::string dest_;
  std::string target_;
  std::string temp_;
  PathInfo original_;
  int removed_stale_ = 0;
  bool committed_ = false;
  bool remote_ = false;  // an s3:// destination, uploaded by Commit
};

}  // namespace kvfile
