// SPDX-License-Identifier: Apache-2.0
// The read-counting FileSystem (see progress_fs.h).
#include "progress_fs.h"

#include <filesystem>

#include "signals.h"

namespace kvfile::cli {

namespace {

// OK, or the interrupt error for `path` once a signal is pending.
Status Stopped(bool stop, const std::string& path) { return stop ? CheckInterrupt(path) : Status::OK(); }

// A File that forwards to the one it wraps, counts what it reads and (with
// `stop`) fails every I/O once a signal is pending.
class ReadProgressFile : public File {
 public:
  ReadProgressFile(std::unique_ptr<File> base, Progress* progress, bool stop)
      : base_(std::move(base)), progress_(progress), stop_(stop) {}

  Status ReadAt(uint64_t offset, void* buf, size_t n) override {
    KVFILE_RETURN_IF_ERROR(Stopped(stop_, path()));
    Status st = base_->ReadAt(offset, buf, n);
    if (st.ok() && progress_) progress_->Add(n);
    return st;
  }
  Status ReadBatch(std::span<const ReadRequest> requests) override {
    KVFILE_RETURN_IF_ERROR(Stopped(stop_, path()));
    Status st = base_->ReadBatch(requests);
    if (st.ok() && progress_) {
      uint64_t n = 0;
      for (const ReadRequest& r : requests) n += r.n;
      progress_->Add(n);
    }
    return st;
  }
  void WillRead(uint64_t offset, uint64_t n) override { base_->WillRead(offset, n); }
  Status WriteAt(uint64_t offset, const void* buf, size_t n) override {
    KVFILE_RETURN_IF_ERROR(Stopped(stop_, path()));
    return base_->WriteAt(offset, buf, n);
  }
  Status Sync() override {
    KVFILE_RETURN_IF_ERROR(Stopped(stop_, path()));
    return base_->Sync();
  }
  Status Truncate(uint64_t size) override { return base_->Truncate(size); }
  Status Size(uint64_t* size) override { return base_->Size(size); }
  Status NextData(uint64_t from, uint64_t* next) override { return base_->NextData(from, next); }
  Status LockExclusive() override { return base_->LockExclusive(); }
  Status Id(FileId* id) override { return base_->Id(id); }
  Status SubmitWrite(uint64_t offset, const void* buf, size_t n, bool sync_after) override {
    KVFILE_RETURN_IF_ERROR(Stopped(stop_, path()));
    return base_->SubmitWrite(offset, buf, n, sync_after);
  }
  Status WaitWrites() override { return base_->WaitWrites(); }
  const char* backend() const override { return base_->backend(); }
  const std::string& path() const override { return base_->path(); }

 private:
  std::unique_ptr<File> base_;
  Progress* progress_;
  bool stop_;
};

}  // namespace

Status ReadProgressFileSystem::Open(const std::string& path, OpenMode mode, std::unique_ptr<File>* out) {
  KVFILE_RETURN_IF_ERROR(Stopped(stop_, path));
  std::unique_ptr<File> file;
  Status st = base_->Open(path, mode, &file);
  if (!st.ok()) return st;
  *out = std::make_unique<ReadProgressFile>(std::move(file), progress_, stop_);
  return Status::OK();
}

Status ReadProgressFileSystem::Rename(const std::string& from, const std::string& to, bool replace) {
  KVFILE_RETURN_IF_ERROR(Stopped(stop_, to));
  return base_->Rename(from, to, replace);
}

namespace {
uint64_t SizeOf(const std::string& path) {
  std::error_code ec;
  uint64_t n = std::filesystem::file_size(path, ec);
  return ec ? 0 : n;
}
}  // namespace

UpgradeProgress::UpgradeProgress(std::string label, const std::string& path)
    : progress_(std::move(label), SizeOf(path)), fs_(FileSystem::Default(), &progress_) {}

}  // namespace kvfile::cli
