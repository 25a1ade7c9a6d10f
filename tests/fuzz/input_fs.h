// SPDX-License-Identifier: Apache-2.0
// InputFs: a read-only FileSystem whose one file is the fuzz input itself,
// read in place. The read-only targets use it rather than a FaultFs, which
// would copy the input (twice) for every run: with inputs of tens of KiB
// (a .kv file has 12 KiB of fixed header), those copies and the page
// faults they cause were a large share of each run's time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "kvfile/file.h"

namespace kvfile::fuzz {

class InputFs final : public FileSystem {
 public:
  // `bytes` must outlive the file system and every file opened from it.
  InputFs(std::string path, std::span<const uint8_t> bytes) : path_(std::move(path)), bytes_(bytes) {}

  // Only kRead of the one path succeeds; everything that would modify the
  // file system fails with EROFS.
  Status Open(const std::string& path, OpenMode mode, std::unique_ptr<File>* out) override;
  Status Rename(const std::string& from, const std::string& to, bool replace) override;
  Status Remove(const std::string& path) override;
  Status SyncDir(const std::string& dir) override;
  Status Exists(const std::string& path, bool* exists) override;
  Status PathId(const std::string& path, FileId* id) override;

 private:
  std::string path_;
  std::span<const uint8_t> bytes_;
};

}  // namespace kvfile::fuzz
