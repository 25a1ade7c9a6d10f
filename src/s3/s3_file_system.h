// SPDX-License-Identifier: Apache-2.0
// s3:// paths in the library (docs/object-storage.md): a read-only File
// over ranged GETs, a FileSystem for s3:// paths, the prefix walk, and the
// multipart upload a PendingReplace commits a remote destination with.
// Declared whether or not the build has S3 (KVFILE_WITH_S3); without it
// each returns kUnsupported (s3_unavailable.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvfile/file.h"
#include "kvfile/status.h"

namespace kvfile::s3 {

// The process-wide FileSystem for s3:// paths.
Status S3FileSystemInstance(FileSystem** out);

// One object found under a prefix, with what tells that it changed.
struct RemoteObject {
  std::string path;  // "s3://bucket/key"
  uint64_t size = 0;
  int64_t mtime_ns = 0;     // its LastModified
  uint64_t etag_hash = 0;   // XXH3-64 of its ETag
};
// Every object under "s3://bucket/prefix" (a '/' is added when missing)
// whose key ends in one of `suffixes`, in key order (one ListObjectsV2
// request per 1000 keys).
Status ListPrefix(const std::string& dir, const std::vector<std::string>& suffixes, std::vector<RemoteObject>* out);

// The listing record of the one object `path` (one ListObjectsV2 request
// for the keys beside it that start with its key): the same fields
// ListPrefix gives; NotFound when there is no such object.
Status ListObject(const std::string& path, RemoteObject* out);

// WalkDirectory over a prefix: ListPrefix's paths.
Status WalkPrefix(const std::string& dir, const std::vector<std::string>& suffixes, std::vector<WalkEntry>* out);

// What a remote destination was at PendingReplace::Begin.
Status StatObject(const std::string& path, PathInfo* info);

// The marker kvfile stores beside an upload of `path` it started: the
// object path.kvupload-<16 hex digits of XXH3-64 of the upload id>
// holding "kvfile-upload\nUPLOAD_ID\nHOST\nPID\nCREATED\n" (CREATED:
// seconds since the epoch, on the creator's clock).
struct UploadMarker {
  std::string path;  // s3://bucket/KEY.kvupload-...
  std::string text;
};
UploadMarker MarkUpload(const std::string& path, const std::string& upload_id, const std::string& host, long pid,
                        int64_t created_s);

// Aborts the multipart uploads kvfile left for `path` (a process killed
// mid-upload) and deletes their markers: those whose marker (above) is
// older than KVFILE_S3_STALE_UPLOAD_S (a day by default), whatever host
// made it, and those of this host whose process is gone. Others' uploads
// (no marker) are never touched. *aborted counts them.
Status AbortStaleUploads(const std::string& path, int* aborted);

// Uploads the local file `local` (read through `fs`) to `path` by
// multipart: parts of max(8 MiB, size/10000), up to 4 in flight (memory:
// parts in flight x part size), the object appearing only when the upload
// completes. `original` is what `path` was when the replacement began
// (StatObject): an object another client created, replaced or removed
// meanwhile is not overwritten (Busy). Any failure aborts the upload and
// removes its marker.
Status UploadFile(FileSystem* fs, const std::string& local, const std::string& path, const PathInfo& original);

// The bytes that the ranges fetched ahead of the reads (File::WillRead)
// may hold in the process, over every open object.
inline constexpr uint64_t kAheadBudget = 64u << 20;
// Test hooks: the bytes they hold now, and the most they held since the
// last ResetPeakAheadBytes (never above kAheadBudget).
uint64_t AheadBytes();
uint64_t PeakAheadBytes();
void ResetPeakAheadBytes();

// Test hook: the part size (KVFILE_S3_PART_BYTES, at least 5 MiB, the S3
// minimum; default 8 MiB).
uint64_t PartBytes();

}  // namespace kvfile::s3
