// SPDX-License-Identifier: Apache-2.0
// The read-counting FileSystem (see progress_fs.h).
#include "progress_fs.h"

#include <filesystem>

namespace kvfile::cli {

namespace {

// A File that forwards to the one it wraps and counts what it reads.
class ReadProgressFile : public File {
 public:
  ReadProgressFile(std::unique_ptr<File> base, Progress* progress) : base_(std::move(base)), progress_(progress) {}

  Status ReadAt(uint64_t offset, void* buf, size_t n) override {
    Status st = base_->ReadAt(offset, buf, n);
    if (st.ok()) progress_->Add(n);
    return st;
  }
  Status ReadBatch(std::span<const ReadRequest> requests) override {
    Status st = base_->ReadBatch(requests);
    if (st.ok()) {
      uint64_t n = 0;
      for (const ReadRequest& r : requests) n += r.n;
      progress_->Add(n);
    }
    return st;
  }
  Status WriteAt(uint64_t offset, const void* buf, size_t n) override { return base_->WriteAt(offset, buf, n); }
  Status Sync() override { return base_->Sync(); }
  Status Truncate(uint64_t size) override { return base_->Truncate(size); }
  Status Size(uint64_t* size) override { return base_->Size(size); }
  Status NextData(uint64_t from, uint64_t* next) override { return base_->NextData(from, next); }
  Status LockExclusive() override { return base_->LockExclusive(); }
  Status Id(FileId* id) override { return base_->Id(id); }
  Status SubmitWrite(uint64_t offset, const void* buf, size_t n, bool sync_after) override {
    return base_->SubmitWrite(offset, buf, n, sync_after);
  }
  Status WaitWrites() override { return base_->WaitWrites(); }
  const char* backend() const override { return base_->backend(); }
  const std::string& path() const override { return base_->path(); }

 private:
  std::unique_ptr<File> base_;
  Progress* progress_;
};

}  // namespace

Status ReadProgressFileSystem::Open(const std::string& path, OpenMode mode, std::unique_ptr<File>* out) {
  std::unique_ptr<File> file;
  Status st = base_->Open(path, mode, &file);
  if (!st.ok()) return st;
  *out = std::make_unique<ReadProgressFile>(std::move(file), progress_);
  return Status::OK();
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
