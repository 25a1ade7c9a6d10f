// SPDX-License-Identifier: Apache-2.0
// Whole inputs read with a cap (see input_file.h).
#include "input_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include "kvfile/file.h"

namespace kvfile::cli {

Status ReadWholeFile(const std::string& path, uint64_t limit, std::vector<uint8_t>* out) {
  std::unique_ptr<File> f;
  KVFILE_RETURN_IF_ERROR(FileSystem::Default()->Open(path, OpenMode::kRead, &f));
  uint64_t size = 0;
  KVFILE_RETURN_IF_ERROR(f->Size(&size));
  if (size > limit)
    return Status::Corruption(path + ": " + std::to_string(size) + " bytes; more than the " + std::to_string(limit) +
                              " bytes it may have");
  out->resize(size);
  return f->ReadAt(0, out->data(), size);
}

Status ReadWholeStdin(uint64_t limit, std::vector<uint8_t>* out) {
  out->clear();
  std::vector<uint8_t> buf(1 << 16);
  for (;;) {
    ssize_t n = ::read(STDIN_FILENO, buf.data(), buf.size());
    if (n == 0) return Status::OK();
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IOError("-: reading standard input: " + std::string(std::strerror(errno)));
    }
    if (static_cast<uint64_t>(n) > limit - out->size())
      return Status::InvalidArgument("-: more than " + std::to_string(limit) + " bytes on standard input");
    out->insert(out->end(), buf.begin(), buf.begin() + n);
  }
}

bool FileStartsWith(const std::string& path, std::string_view magic) {
  std::unique_ptr<File> f;
  if (!FileSystem::Default()->Open(path, OpenMode::kRead, &f).ok()) return false;
  uint64_t size = 0;
  if (!f->Size(&size).ok() || size < magic.size()) return false;
  std::string head(magic.size(), '\0');
  return f->ReadAt(0, head.data(), head.size()).ok() && head == magic;
}

bool IsObjectPrefix(const std::string& path) {
  if (!path.starts_with("s3://")) return false;
  return path.back() == '/' || path.find('/', 5) == std::string::npos;
}

Status OutputExists(const std::string& path, bool* exists) {
  if (path.starts_with("s3://")) return FileSystem::Default()->Exists(path, exists);
  std::error_code ec;
  *exists = std::filesystem::exists(path, ec);
  return Status::OK();
}

}  // namespace kvfile::cli
