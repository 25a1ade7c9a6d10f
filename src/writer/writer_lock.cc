// SPDX-License-Identifier: Apache-2.0
// Opening and locking a writer's files (see writer_lock.h).
#include "writer/writer_lock.h"

#include "io/atomic_replace.h"

namespace kvfile::internal {

Status OpenLocked(FileSystem& fs, const std::string& path, std::unique_ptr<File>* out) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    std::unique_ptr<File> file;
    KVFILE_RETURN_IF_ERROR(fs.Open(path, OpenMode::kReadWrite, &file));
    KVFILE_RETURN_IF_ERROR(LockWithGrace(*file));
    FileId locked, named;
    KVFILE_RETURN_IF_ERROR(file->Id(&locked));
    Status st = fs.PathId(path, &named);
    if (st.ok() && locked == named) {
      *out = std::move(file);
      return Status::OK();
    }
    if (!st.ok() && st.code() != Status::Code::kNotFound) return st;
  }
  return Status::Busy(path + ": the file keeps being replaced while opening it");
}

Status CreateLocked(FileSystem& fs, const std::string& path, std::unique_ptr<File>* out) {
  std::unique_ptr<File> file;
  Status st = fs.Open(path, OpenMode::kCreateExclusive, &file);
  if (!st.ok()) {
    // A leftover of a crashed create or upgrade holds nothing acknowledged:
    // remove it, unless a live writer holds its lock. It is removed while
    // locked, and only if the name still refers to the file locked.
    std::unique_ptr<File> stale;
    if (fs.Open(path, OpenMode::kReadWrite, &stale).ok()) {
      KVFILE_RETURN_IF_ERROR(LockWithGrace(*stale));
      FileId locked, named;
      KVFILE_RETURN_IF_ERROR(stale->Id(&locked));
      if (fs.PathId(path, &named).ok() && named == locked) KVFILE_RETURN_IF_ERROR(fs.Remove(path));
      stale.reset();
      st = fs.Open(path, OpenMode::kCreateExclusive, &file);
    }
    if (!st.ok()) return st;
  }
  // Between the exclusive create and the lock, another creator may have
  // taken this name for its own file: then this one gives up.
  st = file->LockExclusive();
  FileId mine, named;
  if (st.ok()) st = file->Id(&mine);
  if (st.ok() && (!fs.PathId(path, &named).ok() || !(named == mine)))
    return Status::Busy(path + ": another process is creating the same file");
  *out = std::move(file);
  return st;
}

Status RemoveLeftoverUpgrade(FileSystem& fs, const std::string& path, bool* removed) {
  std::string tmp = TempPathFor(path, ".kvupgrade");
  bool exists = false;
  KVFILE_RETURN_IF_ERROR(fs.Exists(tmp, &exists));
  *removed = false;
  if (!exists) return Status::OK();
  KVFILE_RETURN_IF_ERROR(fs.Remove(tmp));
  KVFILE_RETURN_IF_ERROR(fs.SyncDir(DirName(path)));
  *removed = true;
  return Status::OK();
}

}  // namespace kvfile::internal
