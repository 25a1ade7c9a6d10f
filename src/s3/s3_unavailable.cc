// SPDX-License-Identifier: Apache-2.0
// s3:// paths in a build without S3 support (KVFILE_WITH_S3=OFF, or libcurl
// missing): every entry point says so.
#include "s3/s3_file_system.h"

namespace kvfile::s3 {

namespace {
Status NoS3(const std::string& path) {
  return Status::Unsupported(path + ": this kvfile was built without S3 support (KVFILE_WITH_S3=OFF or no libcurl)");
}
}  // namespace

Status S3FileSystemInstance(FileSystem** out) {
  *out = nullptr;
  return NoS3("s3://");
}
Status ListPrefix(const std::string& dir, const std::vector<std::string>&, std::vector<RemoteObject>*) {
  return NoS3(dir);
}
Status ListObject(const std::string& path, RemoteObject*) { return NoS3(path); }
Status WalkPrefix(const std::string& dir, const std::vector<std::string>&, std::vector<WalkEntry>*) {
  return NoS3(dir);
}
Status StatObject(const std::string& path, PathInfo*) { return NoS3(path); }
Status AbortStaleUploads(const std::string& path, int*) { return NoS3(path); }
Status UploadFile(FileSystem*, const std::string&, const std::string& path, const PathInfo&) { return NoS3(path); }
UploadMarker MarkUpload(const std::string& path, const std::string&, const std::string&, long, int64_t) {
  return {path, ""};
}
uint64_t AheadBytes() { return 0; }
uint64_t PeakAheadBytes() { return 0; }
void ResetPeakAheadBytes() {}
uint64_t PartBytes() { return 8u << 20; }

}  // namespace kvfile::s3
