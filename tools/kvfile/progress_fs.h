// SPDX-License-Identifier: Apache-2.0
// A FileSystem that counts the bytes read through it into a Progress: the
// bar of a library step that reads a whole file but reports nothing while
// it does (repair's check, the v1 -> v2 upgrade of a writable open).
// UpgradeProgress puts the two together for that upgrade. Built with
// StopOnSignal, it also ends a long library step at a signal (signals.h):
// once one is pending, every read, write, sync, open and rename through it
// fails with "PATH: interrupted by SIG...", so the step stops at its next
// I/O and never renames a file into place after the signal.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kvfile/file.h"
#include "progress.h"

namespace kvfile::cli {

// Forwards everything to `base`; every successful read of a file opened
// through it adds its bytes to *progress (when not null). Both must outlive
// it, and it must outlive every File and Writer opened through it.
class ReadProgressFileSystem : public FileSystem {
 public:
  enum class Signals { kIgnore, kStop };
  ReadProgressFileSystem(FileSystem* base, Progress* progress, Signals signals = Signals::kIgnore)
      : base_(base), progress_(progress), stop_(signals == Signals::kStop) {}

  // Where the reads of files opened from now on count (nullptr: nowhere);
  // files opened before keep theirs. For a library step of several stages
  // that reads through one FileSystem (Repair's check, then its upgrade).
  void set_progress(Progress* progress) { progress_ = progress; }

  Status Open(const std::string& path, OpenMode mode, std::unique_ptr<File>* out) override;
  Status Rename(const std::string& from, const std::string& to, bool replace) override;
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

 private:
  FileSystem* base_;
  Progress* progress_;
  bool stop_;
};

// The bar of a v1 file's upgrade to v2 by Writer::Open (append, rewind,
// repair): "LABEL [###   ]  40%", the v1 file's bytes read of its size.
// Open the writer with WriterOptions::fs = fs(), and keep this object
// alive as long as the writer.
class UpgradeProgress {
 public:
  UpgradeProgress(std::string label, const std::string& path);
  FileSystem* fs() { return &fs_; }
  // The bar itself, for a ReadProgressFileSystem of the caller's
  // (ReadProgressFileSystem::set_progress) when the upgrade is one stage of
  // a library call that reads through one FileSystem (append).
  Progress* progress() { return &progress_; }
  void Finish() { progress_.Finish(); }

 private:
  Progress progress_;
  ReadProgressFileSystem fs_;
};

}  // namespace kvfile::cli
