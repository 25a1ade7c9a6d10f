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
//
// s3:// paths go to the object store's file system (src/s3/, when the
// build has it: KVFILE_WITH_S3), every other path to the chosen backend.
#include <cstdlib>
#include <string_view>

#include "io/file_backends.h"
#include "s3/s3_file_system.h"
#include "s3/s3_url.h"

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

namespace {

// Routes each path by its scheme: s3:// to the object store, the rest to
// the local backend.
class SchemeFileSystem final : public FileSystem {
 public:
  explicit SchemeFileSystem(FileSystem* local) : local_(local) {}
  Status Open(const std::string& path, OpenMode mode, std::unique_ptr<File>* out) override {
    FileSystem* fs;
    KVFILE_RETURN_IF_ERROR(For(path, &fs));
    return fs->Open(path, mode, out);
  }
  Status Rename(const std::string& from, const std::string& to, bool replace) override {
    FileSystem* fs;
    KVFILE_RETURN_IF_ERROR(For(from, &fs));
    if (s3::IsS3Path(from) != s3::IsS3Path(to))
      return Status::Unsupported(from + ": cannot be renamed to " + to + " (another store)");
    return fs->Rename(from, to, replace);
  }
  Status Remove(const std::string& path) override {
    FileSystem* fs;
    KVFILE_RETURN_IF_ERROR(For(path, &fs));
    return fs->Remove(path);
  }
  Status SyncDir(const std::string& dir) override {
    FileSystem* fs;
    KVFILE_RETURN_IF_ERROR(For(dir, &fs));
    return fs->SyncDir(dir);
  }
  Status Exists(const std::string& path, bool* exists) override {
    FileSystem* fs;
    KVFILE_RETURN_IF_ERROR(For(path, &fs));
    return fs->Exists(path, exists);
  }
  Status PathId(const std::string& path, FileId* id) override {
    FileSystem* fs;
    KVFILE_RETURN_IF_ERROR(For(path, &fs));
    return fs->PathId(path, id);
  }
  Status Stat(const std::string& path, PathInfo* info) override {
    FileSystem* fs;
    KVFILE_RETURN_IF_ERROR(For(path, &fs));
    return fs->Stat(path, info);
  }
  Status ResolveSymlinks(const std::string& path, std::string* target) override {
    FileSystem* fs;
    KVFILE_RETURN_IF_ERROR(For(path, &fs));
    return fs->ResolveSymlinks(path, target);
  }
  Status CopyAttributes(const PathInfo& like, const std::string& path) override {
    FileSystem* fs;
    KVFILE_RETURN_IF_ERROR(For(path, &fs));
    return fs->CopyAttributes(like, path);
  }
  Status ListDir(const std::string& dir, std::vector<std::string>* names) override {
    FileSystem* fs;
    KVFILE_RETURN_IF_ERROR(For(dir, &fs));
    return fs->ListDir(dir, names);
  }

 private:
  Status For(const std::string& path, FileSystem** fs) {
    if (!s3::IsS3Path(path)) {
      *fs = local_;
      return Status::OK();
    }
    Status st = s3::S3FileSystemInstance(fs);
    return st.ok() ? st : Status::Unsupported(path + st.message().substr(std::string_view("s3://").size()));
  }
  FileSystem* local_;
};

}  // namespace

}  // namespace internal

FileSystem* FileSystem::Default() {
  static FileSystem* const fs = [] {
    FileSystem* chosen = nullptr;
    (void)internal::MakeFileSystemFromEnv(std::getenv("KVFILE_IO"), &chosen);
    static internal::SchemeFileSystem routed(chosen);
    return static_cast<FileSystem*>(&routed);
  }();
  return fs;
}

}  // namespace kvfile
