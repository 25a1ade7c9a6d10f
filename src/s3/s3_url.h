// SPDX-License-Identifier: Apache-2.0
// s3:// paths (docs/object-storage.md): parsing, and the encodings an
// S3 request needs: object keys percent-encoded keeping '/', and a query
// string in the canonical order and encoding SigV4 signs (libcurl 7.88
// signs the query exactly as given).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvfile/status.h"

namespace kvfile::s3 {

// Whether `path` names an object store location ("s3://...").
bool IsS3Path(std::string_view path);

struct S3Url {
  std::string bucket;
  std::string key;  // may be empty (the bucket), or end in '/' (a prefix)
  // "s3://bucket/key", the form every error line names.
  std::string ToString() const;
};

// "s3://bucket/key" -> {bucket, key}. kInvalidArgument for anything else: no
// bucket, a bucket name S3 refuses (3-63 of [a-z0-9.-], starting and ending
// with a letter or digit), a key over 1024 bytes.
Status ParseS3Url(std::string_view path, S3Url* out);

// RFC 3986 percent-encoding of everything but A-Z a-z 0-9 - . _ ~; with
// keep_slash, '/' is kept too (object keys in the request path).
std::string UriEncode(std::string_view s, bool keep_slash);

// "a=1&b=&c=x%2Fy": the parameters sorted by name then value, each name and
// value UriEncode'd, '=' always written (a bare "uploads" is "uploads=").
using QueryParams = std::vector<std::pair<std::string, std::string>>;
std::string CanonicalQuery(QueryParams params);

// The key's parent "directory" in a listing: "a/b/c" -> "a/b/"; "c" -> "".
std::string KeyDirName(std::string_view key);

}  // namespace kvfile::s3
