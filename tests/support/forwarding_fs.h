// SPDX-License-Identifier: Apache-2.0
// A FileSystem that forwards every call to another (by default the real
// one): a test derives from it and overrides the one call it changes; and
// one such, BeforeSecondOpen, that injects another writer's change.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kvfile/file.h"

namespace kvfile::testing {

class ForwardingFs : public FileSystem {
 public:
  explicit ForwardingFs(FileSystem* base = FileSystem::Default()) : base_(base) {}
  Status Open(const std::string& path, OpenMode mode, std::unique_ptr<File>* out) override {
    return base_->Open(path, mode, out);
  }
  Status Rename(const std::string& from, const std::string& to, bool replace) override {
    return base_->Rename(from, to, replace);
  }
  Status Remove(const std::string& path) override { return base_->Remove(path); }
  Status SyncDir(const std::string& dir) override { return base_->SyncDir(dir); }
  Status Exists(const std::string& path, bool* exists) override { return base_->Exists(path, exists); }
  Status PathId(const std::string& path, FileId* id) override { return base_->PathId(path, id); }
  Status Stat(const std::string& path, PathInfo* info) override { return base_->Stat(path, info); }
  Status ResolveSymlinks(const std::string& path, std::string* target) override {
    return base_->ResolveSymlinks(path, target);
  }
  Status CopyAttributes(const PathInfo& like, const std::string& path) override {
    return base_->CopyAttributes(like, path);
  }
  Status ListDir(const std::string& dir, std::vector<std::string>* names) override {
    return base_->ListDir(dir, names);
  }

 protected:
  FileSystem* base_;
};

// The real file system, with one event injected: when `watched` is opened
// a second time (the first open has read the file's state; the second is a
// further thread's), `then` runs first: what another process does to the
// file while it is open.
class BeforeSecondOpen : public ForwardingFs {
 public:
  BeforeSecondOpen(std::string watched, std::function<void()> then)
      : watched_(std::move(watched)), then_(std::move(then)) {}
  Status Open(const std::string& path, OpenMode mode, std::unique_ptr<File>* out) override {
    if (path == watched_ && ++opens_ == 2) then_();
    return base_->Open(path, mode, out);
  }
  bool ran() const { return opens_ >= 2; }

 private:
  std::string watched_;
  std::function<void()> then_;
  int opens_ = 0;
};

}  // namespace kvfile::testing
