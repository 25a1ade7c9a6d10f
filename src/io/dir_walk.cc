// SPDX-License-Identifier: Apache-2.0
// WalkDirectory (kvfile/file.h): the one recursive directory walk of the
// library and the CLI.
#include <dirent.h>
#include <sys/stat.h>

#include <cerrno>
#include <string>
#include <vector>

#include "kvfile/file.h"
#include "s3/s3_file_system.h"
#include "s3/s3_url.h"

namespace kvfile {

namespace {

std::string Join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

bool HasSuffix(const std::string& name, const std::vector<std::string>& suffixes) {
  for (const std::string& s : suffixes)
    if (name.size() > s.size() && name.ends_with(s)) return true;
  return false;
}

// Lists `dir`, descending into its subdirectories; a subdirectory that
// fails is recorded in *out and skipped.
Status Walk(const std::string& dir, const std::vector<std::string>& suffixes, std::vector<WalkEntry>* out) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoStatus(dir + ": open directory", errno);
  std::vector<std::string> subdirs;
  errno = 0;
  while (const dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    std::string path = Join(dir, name);
    unsigned char type = e->d_type;
    if (type == DT_UNKNOWN) {
      struct stat st;
      if (::lstat(path.c_str(), &st) != 0) type = DT_UNKNOWN;
      else type = S_ISDIR(st.st_mode) ? DT_DIR : S_ISLNK(st.st_mode) ? DT_LNK : S_ISREG(st.st_mode) ? DT_REG : DT_UNKNOWN;
    }
    if (type == DT_DIR) {
      subdirs.push_back(std::move(path));
    } else if ((type == DT_REG || type == DT_LNK) && HasSuffix(name, suffixes)) {
      struct stat st;  // a symlink counts when it leads to a regular file
      if (type == DT_REG || (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode))) out->push_back({path, Status::OK()});
    }
    errno = 0;
  }
  int err = errno;
  ::closedir(d);
  if (err != 0) return ErrnoStatus(dir + ": read directory", err);
  for (const std::string& sub : subdirs) {
    Status st = Walk(sub, suffixes, out);
    if (!st.ok()) out->push_back({sub, st});
  }
  return Status::OK();
}

}  // namespace

Status WalkDirectory(const std::string& dir, const std::vector<std::string>& suffixes, std::vector<WalkEntry>* out) {
  out->clear();
  if (s3::IsS3Path(dir)) return s3::WalkPrefix(dir, suffixes, out);  // a key prefix
  return Walk(dir, suffixes, out);
}

}  // namespace kvfile
