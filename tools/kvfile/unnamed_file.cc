// SPDX-License-Identifier: Apache-2.0
// Temporary files without names (see unnamed_file.h).
#include "unnamed_file.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace kvfile::cli {

std::string TempDirectory() {
  const char* dir = std::getenv("TMPDIR");
  return dir && *dir ? dir : "/tmp";
}

HoldSignals::HoldSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, s);
  pthread_sigmask(SIG_BLOCK, &set, &old_);
}

HoldSignals::~HoldSignals() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

Status CreateUnnamedFile(const std::string& what, int* fd) {
  const std::string dir = TempDirectory();
  int f = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (f < 0 && (errno == EOPNOTSUPP || errno == EISDIR)) {
    std::string name = dir + "/kvfile-XXXXXX";
    HoldSignals hold;
    f = ::mkostemp(name.data(), O_CLOEXEC);
    if (f >= 0 && ::unlink(name.c_str()) != 0) {
      int err = errno;
      ::close(f);
      ::unlink(name.c_str());
      return Status::IOError(what + ": cannot remove the name of a temporary file " + name + ": " +
                             std::strerror(err));
    }
  }
  if (f < 0) return Status::IOError(what + ": cannot create a temporary file in " + dir + ": " + std::strerror(errno));
  *fd = f;
  return Status::OK();
}

std::string ReopenPath(int fd) { return "/proc/self/fd/" + std::to_string(fd); }

bool ProcFdAvailable() { return ::access("/proc/self/fd", R_OK | X_OK) == 0; }

UnnamedFileSystem::~UnnamedFileSystem() {
  for (const auto& [path, fd] : files_) ::close(fd);
}

int UnnamedFileSystem::Descriptor(const std::string& path) const {
  auto it = files_.find(path);
  return it == files_.end() ? -1 : it->second;
}

Status UnnamedFileSystem::Find(const std::string& path, int* fd) const {
  *fd = Descriptor(path);
  if (*fd < 0) return Status::NotFound(path + ": " + std::strerror(ENOENT));
  return Status::OK();
}

Status UnnamedFileSystem::Open(const std::string& path, OpenMode mode, std::unique_ptr<File>* out) {
  if (!Mine(path)) return base_->Open(path, mode, out);
  int fd = -1;
  if (mode == OpenMode::kCreateExclusive) {
    if (files_.count(path)) return Status::IOError(path + ": " + std::strerror(EEXIST));
    KVFILE_RETURN_IF_ERROR(CreateUnnamedFile(path, &fd));
    files_[path] = fd;
    return base_->Open(ReopenPath(fd), OpenMode::kReadWrite, out);
  }
  KVFILE_RETURN_IF_ERROR(Find(path, &fd));
  return base_->Open(ReopenPath(fd), mode, out);
}

Status UnnamedFileSystem::Rename(const std::string& from, const std::string& to, bool replace) {
  if (!Mine(from) && !Mine(to)) return base_->Rename(from, to, replace);
  if (!Mine(from) || !Mine(to)) return Status::IOError(from + ": " + std::strerror(EXDEV));
  int fd = -1;
  KVFILE_RETURN_IF_ERROR(Find(from, &fd));
  if (from == to) return Status::OK();
  auto old = files_.find(to);
  if (old != files_.end()) {
    if (!replace) return Status::IOError(to + ": " + std::strerror(EEXIST));
    ::close(old->second);
    files_.erase(old);
  }
  files_.erase(from);
  files_[to] = fd;
  return Status::OK();
}

Status UnnamedFileSystem::Remove(const std::string& path) {
  if (!Mine(path)) return base_->Remove(path);
  int fd = -1;
  KVFILE_RETURN_IF_ERROR(Find(path, &fd));
  ::close(fd);
  files_.erase(path);
  return Status::OK();
}

Status UnnamedFileSystem::SyncDir(const std::string& dir) {
  return dir == dir_ ? Status::OK() : base_->SyncDir(dir);
}

Status UnnamedFileSystem::Exists(const std::string& path, bool* exists) {
  if (!Mine(path)) return base_->Exists(path, exists);
  *exists = files_.count(path) > 0;
  return Status::OK();
}

Status UnnamedFileSystem::PathId(const std::string& path, FileId* id) {
  if (!Mine(path)) return base_->PathId(path, id);
  PathInfo info;
  KVFILE_RETURN_IF_ERROR(Stat(path, &info));
  if (!info.exists) return Status::NotFound(path + ": " + std::strerror(ENOENT));
  *id = info.id;
  return Status::OK();
}

Status UnnamedFileSystem::Stat(const std::string& path, PathInfo* info) {
  if (!Mine(path)) return base_->Stat(path, info);
  *info = PathInfo{};
  int fd = Descriptor(path);
  if (fd < 0) return Status::OK();
  KVFILE_RETURN_IF_ERROR(base_->Stat(ReopenPath(fd), info));
  info->links = 1;  // the one name this object gives it
  return Status::OK();
}

Status UnnamedFileSystem::ResolveSymlinks(const std::string& path, std::string* target) {
  if (!Mine(path)) return base_->ResolveSymlinks(path, target);
  *target = path;
  return Status::OK();
}

Status UnnamedFileSystem::CopyAttributes(const PathInfo& like, const std::string& path) {
  if (!Mine(path)) return base_->CopyAttributes(like, path);
  return Status::OK();  // a file no one else can open keeps its 0600
}

Status UnnamedFileSystem::ListDir(const std::string& dir, std::vector<std::string>* names) {
  if (dir != dir_) return base_->ListDir(dir, names);
  names->clear();
  for (const auto& [path, fd] : files_) names->push_back(path.substr(dir_.size() + 1));
  return Status::OK();
}

}  // namespace kvfile::cli
