// SPDX-License-Identifier: Apache-2.0
// Temporary files without names, for the copies the read-only verbs make
// (`-` for standard input, PACK:MEMBER): their bytes belong to an open
// descriptor only, so the kernel frees them whenever the process ends,
// SIGKILL included, and nothing is ever left in $TMPDIR.
#pragma once

#include <signal.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kvfile/file.h"
#include "kvfile/status.h"

namespace kvfile::cli {

// $TMPDIR, else /tmp.
std::string TempDirectory();

// SIGINT, SIGTERM and SIGHUP held back while it lives (a signal that
// arrives meanwhile is delivered when it ends): for the few instructions
// during which a temporary file has a name.
class HoldSignals {
 public:
  HoldSignals();
  ~HoldSignals();
  HoldSignals(const HoldSignals&) = delete;
  HoldSignals& operator=(const HoldSignals&) = delete;

 private:
  sigset_t old_;
};

// A new empty file in TempDirectory(), open for reading and writing, that
// no name refers to: O_TMPFILE; where the file system has none (EOPNOTSUPP,
// or EISDIR from a kernel older than 3.11), a mkstemp file unlinked at
// once, with the signals above held in between. Errors name `what`.
Status CreateUnnamedFile(const std::string& what, int* fd);

// "/proc/self/fd/N", the path by which this process opens descriptor
// `fd` again (while ProcFdAvailable()).
std::string ReopenPath(int fd);
// Whether /proc/self/fd can be read (false where /proc is not mounted).
bool ProcFdAvailable();

// A FileSystem in which the directory `dir` (a path that names nothing)
// holds files without names: a file created there is CreateUnnamedFile's,
// and every name in it lives in this object only (open, rename, remove,
// list, stat); every other path goes to `base`. It lets a library step that
// writes a file by name (PackReader::Materialize: a temporary file renamed
// over the destination) write one that vanishes with the process. Needs
// /proc (ReopenPath). `base` must outlive it, and it every File opened
// through it.
class UnnamedFileSystem : public FileSystem {
 public:
  UnnamedFileSystem(FileSystem* base, std::string dir) : base_(base), dir_(std::move(dir)) {}
  ~UnnamedFileSystem() override;
  UnnamedFileSystem(const UnnamedFileSystem&) = delete;
  UnnamedFileSystem& operator=(const UnnamedFileSystem&) = delete;

  // The descriptor of the file `path` names in `dir` (still owned by this
  // object), or -1.
  int Descriptor(const std::string& path) const;

  Status Open(const std::string& path, OpenMode mode, std::unique_ptr<File>* out) override;
  Status Rename(const std::string& from, const std::string& to, bool replace) override;
  Status Remove(const std::string& path) override;
  Status SyncDir(const std::string& dir) override;
  Status Exists(const std::string& path, bool* exists) override;
  Status PathId(const std::string& path, FileId* id) override;
  Status Stat(const std::string& path, PathInfo* info) override;
  Status ResolveSymlinks(const std::string& path, std::string* target) override;
  Status CopyAttributes(const PathInfo& like, const std::string& path) override;
  Status ListDir(const std::string& dir, std::vector<std::string>* names) override;

 private:
  bool Mine(const std::string& path) const { return DirName(path) == dir_; }
  Status Find(const std::string& path, int* fd) const;

  FileSystem* base_;
  std::string dir_;
  std::map<std::string, int> files_;  // path in dir_ -> descriptor
};

}  // namespace kvfile::cli
