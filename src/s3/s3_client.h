// SPDX-License-Identifier: Apache-2.0
// The S3 client (docs/object-storage.md): libcurl with its own SigV4
// signing (CURLOPT_AWS_SIGV4), path-style requests, connections reused
// through a pool of curl multi handles, several requests in flight, and
// bounded retries with backoff on 5xx, 429, resets and timeouts. Every
// failure becomes one Status whose message starts with the s3:// path.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "kvfile/status.h"
#include "s3/s3_config.h"
#include "s3/s3_url.h"

namespace kvfile::s3 {

struct Request {
  std::string method = "GET";  // GET, HEAD, PUT, POST, DELETE
  S3Url url;                   // url.key empty: the bucket itself
  QueryParams query;
  std::vector<std::string> headers;  // "Name: value", never an empty value
  const void* body = nullptr;        // PUT/POST body (kept by the caller)
  size_t body_size = 0;
  bool has_range = false;  // "Range: bytes=range_begin-(range_begin+range_bytes-1)"
  uint64_t range_begin = 0;
  uint64_t range_bytes = 0;
  void* sink = nullptr;  // GET body written here (at most sink_size bytes), else into Response::body
  size_t sink_size = 0;
};

struct Response {
  long status = 0;                            // the final HTTP status
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  size_t sink_bytes = 0;
  int attempts = 0;
};

// One object of a listing.
struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
  int64_t mtime_ns = 0;  // LastModified
  std::string etag;
};

// One multipart upload in progress.
struct UploadInfo {
  std::string key;
  std::string upload_id;
};

class Client {
 public:
  // The process-wide client, its configuration resolved from the
  // environment at the first call; the resolution's failure every time.
  static Status Instance(Client** out);
  explicit Client(S3Config config);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const S3Config& config() const { return config_; }

  // Sends each request (retrying as the header says), up to `in_flight` at
  // once. OK once every request has a final HTTP answer (any status: see
  // ErrorFor); else the first transport failure left after the retries.
  Status PerformMany(std::span<const Request> requests, std::span<Response> responses, int in_flight);
  // One request; its final answer must be 2xx (else ErrorFor's Status).
  Status Call(const Request& request, Response* response);
  // The one-line Status for a final non-2xx answer: 403 names the
  // credentials' source, 404 the key or the bucket, 5xx/429 the attempts.
  Status ErrorFor(const Request& request, const Response& response) const;

  // Object operations, each one request unless it says otherwise.
  // Whether the object exists, and its size (HEAD); *headers: the answer's
  // headers (names lower-cased).
  Status Head(const S3Url& url, bool* exists, uint64_t* size, std::string* etag = nullptr,
              std::map<std::string, std::string>* headers = nullptr);
  Status Delete(const S3Url& url);
  Status PutSmall(const S3Url& url, const std::string& body);
  Status GetSmall(const S3Url& url, std::string* body);
  // Every object under `prefix` (ListObjectsV2, one request per 1000 keys);
  // with a delimiter, also the common prefixes ("directories").
  Status List(const std::string& bucket, const std::string& prefix, const std::string& delimiter,
              std::vector<ObjectInfo>* objects, std::vector<std::string>* prefixes);
  // Multipart uploads (ListMultipartUploads, one request per 1000).
  Status ListUploads(const std::string& bucket, const std::string& prefix, std::vector<UploadInfo>* out);
  // `metadata`: "x-amz-meta-NAME: value" headers the completed object keeps.
  Status CreateUpload(const S3Url& url, std::string* upload_id, const std::vector<std::string>& metadata = {});
  Status AbortUpload(const S3Url& url, const std::string& upload_id);
  // parts[i] is part i+1's ETag. `if_absent`: with If-None-Match: *, so
  // that the store refuses to complete over an object that exists (Swift's
  // s3api and AWS S3 honour it). *how: the final answer's status, the
  // error code of its body, and the attempts (a retried Complete whose
  // first answer was lost may find the upload gone: NoSuchUpload).
  struct Completion {
    long status = 0;
    std::string code;
    int attempts = 0;
  };
  Status CompleteUpload(const S3Url& url, const std::string& upload_id, const std::vector<std::string>& parts,
                        bool if_absent = false, Completion* how = nullptr);

 private:
  struct Pool;
  S3Config config_;
  std::unique_ptr<Pool> pool_;
};

// Requests sent by this process, every attempt counted (for tests and the
// figures). KVFILE_S3_TRACE=FILE also appends one line per attempt to FILE:
// "METHOD /bucket/key?query STATUS" (STATUS 0: no answer).
uint64_t RequestCount();
// The most requests this process had in flight at once, over all threads
// (an attempt counts from its start to its answer), since the last reset.
int MaxRequestsInFlight();
void ResetMaxRequestsInFlight();

// The text of the first <tag>...</tag> in `xml` at or after `*from` (XML
// entities decoded); false if none. *from moves past it.
bool XmlTag(const std::string& xml, const std::string& tag, size_t* from, std::string* value);

}  // namespace kvfile::s3
