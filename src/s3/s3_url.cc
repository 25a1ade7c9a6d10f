// SPDX-License-Identifier: Apache-2.0
#include "s3/s3_url.h"

#include <algorithm>

namespace kvfile::s3 {

namespace {
constexpr std::string_view kScheme = "s3://";

bool BucketChar(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-'; }
bool Alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }
}  // namespace

bool IsS3Path(std::string_view path) { return path.starts_with(kScheme); }

std::string S3Url::ToString() const { return std::string(kScheme) + bucket + "/" + key; }

Status ParseS3Url(std::string_view path, S3Url* out) {
  if (!IsS3Path(path)) return Status::InvalidArgument(std::string(path) + ": not an s3:// path");
  std::string_view rest = path.substr(kScheme.size());
  size_t slash = rest.find('/');
  std::string_view bucket = rest.substr(0, slash);
  std::string_view key = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
  if (bucket.size() < 3 || bucket.size() > 63 || !std::all_of(bucket.begin(), bucket.end(), BucketChar) ||
      !Alnum(bucket.front()) || !Alnum(bucket.back()))
    return Status::InvalidArgument(std::string(path) +
                                   ": not a bucket name (3 to 63 of a-z, 0-9, '.', '-'; s3://BUCKET/KEY)");
  if (key.size() > 1024) return Status::InvalidArgument(std::string(path) + ": object key over 1024 bytes");
  // A "." or ".." segment would be collapsed by the HTTP layer into another
  // key than the one named (a/../x.kv is x.kv): such keys are refused.
  for (size_t at = 0; at <= key.size();) {
    size_t end = key.find('/', at);
    if (end == std::string_view::npos) end = key.size();
    std::string_view seg = key.substr(at, end - at);
    if (seg == "." || seg == "..")
      return Status::InvalidArgument(std::string(path) + ": an object key with a '" + std::string(seg) +
                                     "' segment (it would name another key over HTTP)");
    at = end + 1;
  }
  out->bucket = std::string(bucket);
  out->key = std::string(key);
  return Status::OK();
}

std::string UriEncode(std::string_view s, bool keep_slash) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
                 c == '.' || c == '_' || c == '~' || (keep_slash && c == '/');
    if (plain) {
      out.push_back(ch);
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

std::string CanonicalQuery(QueryParams params) {
  for (auto& [k, v] : params) {
    k = UriEncode(k, false);
    v = UriEncode(v, false);
  }
  std::sort(params.begin(), params.end());
  std::string q;
  for (const auto& [k, v] : params) {
    if (!q.empty()) q += '&';
    q += k + "=" + v;
  }
  return q;
}

std::string KeyDirName(std::string_view key) {
  size_t slash = key.rfind('/');
  return slash == std::string_view::npos ? std::string() : std::string(key.substr(0, slash + 1));
}

}  // namespace kvfile::s3
