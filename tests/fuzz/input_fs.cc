// SPDX-License-Identifier: Apache-2.0
// InputFs (see input_fs.h).
#include "fuzz/input_fs.h"

#include <cerrno>
#include <cstring>

namespace kvfile::fuzz {

namespace {

constexpr FileId kInputId{1, 1};

class InputFile final : public File {
 public:
  InputFile(const std::string& path, std::span<const uint8_t> bytes) : path_(path), bytes_(bytes) {}

  Status ReadAt(uint64_t offset, void* buf, size_t n) override {
    if (offset > bytes_.size() || bytes_.size() - offset < n)
      return Status::Corruption(path_ + ": unexpected end of file at offset " + std::to_string(offset));
    if (n > 0) std::memcpy(buf, bytes_.data() + offset, n);
    return Status::OK();
  }
  Status WriteAt(uint64_t, const void*, size_t) override { return ErrnoStatus(path_ + ": write", EBADF); }
  Status Sync() override { return Status::OK(); }
  Status Truncate(uint64_t) override { return ErrnoStatus(path_ + ": truncate", EBADF); }
  Status Size(uint64_t* size) override {
    *size = bytes_.size();
    return Status::OK();
  }
  Status LockExclusive() override { return Status::OK(); }
  Status Id(FileId* id) override {
    *id = kInputId;
    return Status::OK();
  }
  const char* backend() const override { return "fuzz-input"; }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  std::span<const uint8_t> bytes_;
};

}  // namespace

Status InputFs::Open(const std::string& path, OpenMode mode, std::unique_ptr<File>* out) {
  if (mode != OpenMode::kRead) return ErrnoStatus(path, EROFS);
  if (path != path_) return ErrnoStatus(path, ENOENT);
  *out = std::make_unique<InputFile>(path_, bytes_);
  return Status::OK();
}

Status InputFs::Rename(const std::string& from, const std::string&, bool) {
  return ErrnoStatus("rename " + from, EROFS);
}

Status InputFs::Remove(const std::string& path) { return ErrnoStatus("remove " + path, EROFS); }

Status InputFs::SyncDir(const std::string&) { return Status::OK(); }

Status InputFs::Exists(const std::string& path, bool* exists) {
  *exists = path == path_;
  return Status::OK();
}

Status InputFs::PathId(const std::string& path, FileId* id) {
  if (path != path_) return ErrnoStatus(path, ENOENT);
  *id = kInputId;
  return Status::OK();
}

}  // namespace kvfile::fuzz
