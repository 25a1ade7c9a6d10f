// SPDX-License-Identifier: Apache-2.0
// The S3 client over libcurl (see s3_client.h). No HTTP or signing code of
// kvfile's own: curl builds the requests and signs them (SigV4, 7.75+).
// What libcurl 7.88 needs from the caller, and gets here:
//  - x-amz-content-sha256 is not sent by curl: we add it (UNSIGNED-PAYLOAD,
//    or the empty body's hash), and curl then signs it;
//  - the query is signed exactly as given: CanonicalQuery builds it;
//  - the key is percent-encoded keeping '/' (UriEncode);
//  - an empty "Name:" header is signed but not sent: none is ever passed,
//    and every body goes with an explicit non-empty Content-Type.
#include "s3/s3_client.h"

#include <curl/curl.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

namespace kvfile::s3 {

namespace {

constexpr const char* kEmptySha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

std::atomic<uint64_t> g_requests{0};
std::atomic<int> g_in_flight{0};      // requests handed to curl, no final answer yet
std::atomic<int> g_max_in_flight{0};  // the most at once since the last reset

long EnvLong(const char* name, long fallback, long lo, long hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < lo || n > hi) return fallback;
  return n;
}

// Attempts per request (KVFILE_S3_ATTEMPTS, default 5) and the first
// backoff (KVFILE_S3_BACKOFF_MS, default 200), doubled per retry up to 5 s.
int MaxAttempts() {
  static const int n = static_cast<int>(EnvLong("KVFILE_S3_ATTEMPTS", 5, 1, 100));
  return n;
}
long BackoffMs(int attempt) {
  static const long base = EnvLong("KVFILE_S3_BACKOFF_MS", 200, 0, 60000);
  long ms = base << std::min(attempt - 1, 10);
  return std::min(ms, 5000L);
}

void Trace(const Request& r, const std::string& target, long status) {
  static const char* path = std::getenv("KVFILE_S3_TRACE");
  if (!path || !*path) return;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (FILE* f = std::fopen(path, "a")) {
    std::fprintf(f, "%s %s %ld\n", r.method.c_str(), target.c_str(), status);
    std::fclose(f);
  }
}

bool Retryable(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
      return true;
    default:
      return false;
  }
}

bool RetryableStatus(long status) { return status == 429 || status >= 500; }

std::string DecodeEntities(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out.push_back(s[i]);
      continue;
    }
    size_t semi = s.find(';', i);
    if (semi == std::string::npos) {
      out.push_back(s[i]);
      continue;
    }
    std::string ent = s.substr(i + 1, semi - i - 1);
    if (ent == "amp") out.push_back('&');
    else if (ent == "lt") out.push_back('<');
    else if (ent == "gt") out.push_back('>');
    else if (ent == "quot") out.push_back('"');
    else if (ent == "apos") out.push_back('\'');
    else if (ent.size() > 1 && ent[0] == '#') {
      long c = ent[1] == 'x' ? std::strtol(ent.c_str() + 2, nullptr, 16) : std::strtol(ent.c_str() + 1, nullptr, 10);
      if (c < 0x80) {
        out.push_back(static_cast<char>(c));
      } else {  // UTF-8
        if (c < 0x800) {
          out.push_back(static_cast<char>(0xC0 | (c >> 6)));
        } else {
          if (c < 0x10000) {
            out.push_back(static_cast<char>(0xE0 | (c >> 12)));
          } else {
            out.push_back(static_cast<char>(0xF0 | (c >> 18)));
            out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
          }
          out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
        }
        out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
      }
    } else {
      out += "&" + ent + ";";
    }
    i = semi;
  }
  return out;
}

std::string XmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '"') out += "&quot;";
    else out.push_back(c);
  }
  return out;
}

// One transfer in flight.
struct Transfer {
  const Request* req = nullptr;
  Response* resp = nullptr;
  size_t index = 0;
  CURL* easy = nullptr;
  curl_slist* headers = nullptr;
  std::string url;
  std::string target;  // "/bucket/key?query", for the trace
  bool overflow = false;
  char error[CURL_ERROR_SIZE] = {};
};

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  Transfer* t = static_cast<Transfer*>(user);
  size_t bytes = size * n;
  Response* r = t->resp;
  // An error answer's body is kept whole (it names the error), not written
  // into the caller's buffer.
  long status = 0;
  curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &status);
  if (t->req->sink && status >= 200 && status < 300) {
    if (r->sink_bytes + bytes > t->req->sink_size) {
      t->overflow = true;
      return 0;  // more than asked for: the transfer fails
    }
    std::memcpy(static_cast<char*>(t->req->sink) + r->sink_bytes, data, bytes);
    r->sink_bytes += bytes;
    return bytes;
  }
  if (r->body.size() + bytes > (64u << 20)) {
    t->overflow = true;
    return 0;
  }
  r->body.append(data, bytes);
  return bytes;
}

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  Transfer* t = static_cast<Transfer*>(user);
  size_t bytes = size * n;
  std::string line(data, bytes);
  if (line.starts_with("HTTP/")) {
    t->resp->headers.clear();  // a new answer (after 100 Continue)
    return bytes;
  }
  size_t colon = line.find(':');
  if (colon == std::string::npos) return bytes;
  std::string name = line.substr(0, colon);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  size_t b = line.find_first_not_of(" \t", colon + 1);
  size_t e = line.find_last_not_of(" \t\r\n");
  t->resp->headers[name] = b == std::string::npos || e < b ? std::string() : line.substr(b, e - b + 1);
  return bytes;
}

// "2026-12-03T13:04:05.123Z" -> nanoseconds since the epoch (0 if not that).
int64_t ParseIsoTime(const std::string& s) {
  struct tm t = {};
  int ms = 0;
  if (std::sscanf(s.c_str(), "%d-%d-%dT%d:%d:%d.%dZ", &t.tm_year, &t.tm_mon, &t.tm_mday, &t.tm_hour, &t.tm_min,
                  &t.tm_sec, &ms) < 6)
    return 0;
  t.tm_year -= 1900;
  t.tm_mon -= 1;
  return static_cast<int64_t>(timegm(&t)) * 1000000000 + int64_t{ms} * 1000000;
}

}  // namespace

uint64_t RequestCount() { return g_requests.load(); }

int MaxRequestsInFlight() { return g_max_in_flight.load(); }
void ResetMaxRequestsInFlight() { g_max_in_flight.store(g_in_flight.load()); }

bool XmlTag(const std::string& xml, const std::string& tag, size_t* from, std::string* value) {
  const std::string open = "<" + tag + ">", close = "</" + tag + ">";
  size_t b = xml.find(open, *from);
  if (b == std::string::npos) return false;
  b += open.size();
  size_t e = xml.find(close, b);
  if (e == std::string::npos) return false;
  *value = DecodeEntities(xml.substr(b, e - b));
  *from = e + close.size();
  return true;
}

// Idle multi handles (each with its connection cache), reused.
struct Client::Pool {
  std::mutex mu;
  std::vector<CURLM*> idle;
  ~Pool() {
    for (CURLM* m : idle) curl_multi_cleanup(m);
  }
  CURLM* Take() {
    std::lock_guard<std::mutex> lock(mu);
    if (idle.empty()) return curl_multi_init();
    CURLM* m = idle.back();
    idle.pop_back();
    return m;
  }
  void Give(CURLM* m) {
    std::lock_guard<std::mutex> lock(mu);
    idle.push_back(m);
  }
};

Client::Client(S3Config config) : config_(std::move(config)), pool_(std::make_unique<Pool>()) {}
Client::~Client() = default;

Status Client::Instance(Client** out) {
  static Status resolved;
  static Client* const client = [] {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    S3Config c;
    resolved = ResolveS3Config([](const char* n) { return static_cast<const char*>(std::getenv(n)); }, &c);
    return resolved.ok() ? new Client(std::move(c)) : nullptr;
  }();
  *out = client;
  return resolved;
}

Status Client::PerformMany(std::span<const Request> requests, std::span<Response> responses, int in_flight) {
  if (requests.empty()) return Status::OK();
  CURLM* multi = pool_->Take();
  if (!multi) return Status::IOError(requests[0].url.ToString() + ": cannot start a curl multi handle");
  const std::string sigv4 = "aws:amz:" + config_.region + ":s3";
  std::vector<Transfer> transfers(requests.size());
  std::vector<size_t> waiting;  // indices not yet started, in order
  for (size_t i = requests.size(); i-- > 0;) waiting.push_back(i);
  std::vector<std::chrono::steady_clock::time_point> not_before(requests.size());
  std::mt19937 jitter(std::random_device{}());
  Status failure;
  int running_count = 0;

  auto start = [&](size_t i) {
    Transfer& t = transfers[i];
    const Request& r = requests[i];
    t = Transfer();
    t.req = &r;
    t.resp = &responses[i];
    t.index = i;
    Response& resp = responses[i];
    int attempts = resp.attempts;
    resp = Response();
    resp.attempts = attempts + 1;
    std::string path = "/" + r.url.bucket + (r.url.key.empty() ? "" : "/" + UriEncode(r.url.key, true));
    std::string query = CanonicalQuery(r.query);
    t.target = path + (query.empty() ? "" : "?" + query);
    t.url = config_.endpoint + t.target;
    t.easy = curl_easy_init();
    CURL* e = t.easy;
    curl_easy_setopt(e, CURLOPT_URL, t.url.c_str());
    curl_easy_setopt(e, CURLOPT_AWS_SIGV4, sigv4.c_str());
    // Apart, not as "key:secret": an access key may hold ':' (Swift's "account:user").
    curl_easy_setopt(e, CURLOPT_USERNAME, config_.access_key.c_str());
    curl_easy_setopt(e, CURLOPT_PASSWORD, config_.secret_key.c_str());
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, EnvLong("KVFILE_S3_CONNECT_TIMEOUT_MS", 10000, 1, 600000));
    // A stalled transfer (under 1 byte/s for 30 s) is a timeout, retried.
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, EnvLong("KVFILE_S3_STALL_S", 30, 1, 3600));
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, OnBody);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, OnHeader);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, t.error);
    bool has_body = r.method == "PUT" || r.method == "POST";
    t.headers = curl_slist_append(t.headers, has_body ? "x-amz-content-sha256: UNSIGNED-PAYLOAD"
                                                      : (std::string("x-amz-content-sha256: ") + kEmptySha256).c_str());
    if (!config_.session_token.empty())
      t.headers = curl_slist_append(t.headers, ("x-amz-security-token: " + config_.session_token).c_str());
    if (r.has_range)
      t.headers = curl_slist_append(
          t.headers, ("Range: bytes=" + std::to_string(r.range_begin) + "-" +
                      std::to_string(r.range_begin + r.range_bytes - 1)).c_str());
    for (const std::string& h : r.headers) t.headers = curl_slist_append(t.headers, h.c_str());
    if (r.method == "HEAD") {
      curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
    } else if (has_body) {
      bool typed = std::any_of(r.headers.begin(), r.headers.end(),
                               [](const std::string& h) { return strncasecmp(h.c_str(), "content-type:", 13) == 0; });
      if (!typed) t.headers = curl_slist_append(t.headers, "Content-Type: application/octet-stream");
      curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(r.body_size));
      curl_easy_setopt(e, CURLOPT_POSTFIELDS, r.body_size ? r.body : "");
      curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, r.method.c_str());
    } else if (r.method != "GET") {
      curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, r.method.c_str());
    }
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, t.headers);
    curl_easy_setopt(e, CURLOPT_PRIVATE, &t);
    curl_multi_add_handle(multi, e);
    ++running_count;
    g_requests.fetch_add(1);
    int now_in_flight = g_in_flight.fetch_add(1) + 1;
    for (int seen = g_max_in_flight.load(); seen < now_in_flight && !g_max_in_flight.compare_exchange_weak(seen, now_in_flight);) {
    }
  };
  auto finish = [&](Transfer& t) {
    curl_multi_remove_handle(multi, t.easy);
    curl_easy_cleanup(t.easy);
    curl_slist_free_all(t.headers);
    t.easy = nullptr;
    t.headers = nullptr;
    --running_count;
    g_in_flight.fetch_sub(1);
  };

  while (!waiting.empty() || running_count > 0) {
    auto now = std::chrono::steady_clock::now();
    // Start what may start: the lowest index first, not before its backoff.
    for (size_t k = waiting.size(); k-- > 0 && running_count < in_flight;) {
      size_t i = waiting[k];
      if (not_before[i] > now) continue;
      waiting.erase(waiting.begin() + static_cast<std::ptrdiff_t>(k));
      start(i);
    }
    int still = 0;
    curl_multi_perform(multi, &still);
    int queued = 0;
    while (CURLMsg* m = curl_multi_info_read(multi, &queued)) {
      if (m->msg != CURLMSG_DONE) continue;
      Transfer* t = nullptr;
      curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, reinterpret_cast<char**>(&t));
      CURLcode code = m->data.result;
      long status = 0;
      curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &status);
      Response& resp = *t->resp;
      Trace(*t->req, t->target, code == CURLE_OK ? status : 0);
      std::string why = t->error[0] ? t->error : curl_easy_strerror(code);
      finish(*t);
      bool retry = code == CURLE_OK ? RetryableStatus(status) : (Retryable(code) && !t->overflow);
      if (code == CURLE_OK) resp.status = status;
      if (retry && resp.attempts < MaxAttempts()) {
        long ms = BackoffMs(resp.attempts);
        ms = ms / 2 + static_cast<long>(jitter() % static_cast<unsigned>(ms / 2 + 1));
        not_before[t->index] = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
        waiting.push_back(t->index);
        std::sort(waiting.rbegin(), waiting.rend());
        continue;
      }
      if (code != CURLE_OK && failure.ok()) {
        std::string where = t->req->url.ToString();
        if (t->overflow)
          failure = Status::IOError(where + ": the store sent more bytes than asked for");
        else
          failure = Status::IOError(where + ": cannot reach " + config_.endpoint + ": " + why + " (" +
                                    std::to_string(resp.attempts) + (resp.attempts == 1 ? " attempt)" : " attempts)"));
      }
    }
    if (!failure.ok()) break;
    if (running_count > 0) {
      curl_multi_poll(multi, nullptr, 0, 100, nullptr);
    } else if (!waiting.empty()) {
      auto next = not_before[waiting.back()];
      for (size_t i : waiting) next = std::min(next, not_before[i]);
      std::this_thread::sleep_until(next);
    }
  }
  for (Transfer& t : transfers)
    if (t.easy) finish(t);
  pool_->Give(multi);
  return failure;
}

Status Client::ErrorFor(const Request& r, const Response& resp) const {
  std::string where = r.url.ToString();
  size_t at = 0;
  std::string code, message;
  XmlTag(resp.body, "Code", &at, &code);
  at = 0;
  XmlTag(resp.body, "Message", &at, &message);
  std::string detail = code.empty() ? "" : " (" + code + (message.empty() ? "" : ": " + message) + ")";
  long s = resp.status;
  if (s == 403 || s == 401)
    return Status::IOError(where + ": access denied" + detail + "; the credentials come from " +
                           config_.credentials_source);
  if (code == "NoSuchBucket" || (s == 404 && r.url.key.empty()))
    return Status::NotFound(where + ": no such bucket '" + r.url.bucket + "' at " + config_.endpoint);
  if (code == "NoSuchUpload") return Status::NotFound(where + ": the multipart upload is gone" + detail);
  if (s == 404) return Status::NotFound(where + ": no such object");
  if (s == 412) return Status::Busy(where + ": the object was replaced while it was read");
  if (RetryableStatus(s))
    return Status::IOError(where + ": the store answered " + std::to_string(s) + detail + " " +
                           std::to_string(resp.attempts) + (resp.attempts == 1 ? " time" : " times"));
  return Status::IOError(where + ": the store refused " + r.method + " with " + std::to_string(s) + detail);
}

Status Client::Call(const Request& r, Response* resp) {
  KVFILE_RETURN_IF_ERROR(PerformMany(std::span<const Request>(&r, 1), std::span<Response>(resp, 1), 1));
  if (resp->status < 200 || resp->status > 299) return ErrorFor(r, *resp);
  // CompleteMultipartUpload may answer 200 with an error in the body.
  if (r.method == "POST" && resp->body.find("<Error>") != std::string::npos) {
    Response as_error = *resp;
    as_error.status = 500;
    return ErrorFor(r, as_error);
  }
  return Status::OK();
}

Status Client::Head(const S3Url& url, bool* exists, uint64_t* size, std::string* etag,
                    std::map<std::string, std::string>* headers) {
  Request r;
  r.method = "HEAD";
  r.url = url;
  Response resp;
  KVFILE_RETURN_IF_ERROR(PerformMany(std::span<const Request>(&r, 1), std::span<Response>(&resp, 1), 1));
  if (resp.status == 404) {
    // A HEAD answer has no body to tell a missing key from a missing
    // bucket: ask about the bucket.
    Request b;
    b.method = "HEAD";
    b.url.bucket = url.bucket;
    Response bresp;
    KVFILE_RETURN_IF_ERROR(PerformMany(std::span<const Request>(&b, 1), std::span<Response>(&bresp, 1), 1));
    if (bresp.status == 404) return ErrorFor(r, Response{404, {}, "<Code>NoSuchBucket</Code>", 0, 1});
    if (bresp.status != 200) return ErrorFor(b, bresp);
    *exists = false;
    return Status::OK();
  }
  if (resp.status != 200) return ErrorFor(r, resp);
  *exists = true;
  if (size) *size = std::strtoull(resp.headers["content-length"].c_str(), nullptr, 10);
  if (etag) *etag = resp.headers["etag"];
  if (headers) *headers = std::move(resp.headers);
  return Status::OK();
}

Status Client::Delete(const S3Url& url) {
  Request r;
  r.method = "DELETE";
  r.url = url;
  Response resp;
  return Call(r, &resp);
}

Status Client::PutSmall(const S3Url& url, const std::string& body) {
  Request r;
  r.method = "PUT";
  r.url = url;
  r.body = body.data();
  r.body_size = body.size();
  Response resp;
  return Call(r, &resp);
}

Status Client::GetSmall(const S3Url& url, std::string* body) {
  Request r;
  r.url = url;
  Response resp;
  KVFILE_RETURN_IF_ERROR(Call(r, &resp));
  *body = std::move(resp.body);
  return Status::OK();
}

Status Client::List(const std::string& bucket, const std::string& prefix, const std::string& delimiter,
                    std::vector<ObjectInfo>* objects, std::vector<std::string>* prefixes) {
  std::string token;
  for (;;) {
    Request r;
    r.url.bucket = bucket;
    r.query = {{"list-type", "2"}, {"prefix", prefix}};
    if (!delimiter.empty()) r.query.emplace_back("delimiter", delimiter);
    if (!token.empty()) r.query.emplace_back("continuation-token", token);
    Response resp;
    Status st = Call(r, &resp);
    if (!st.ok()) {
      if (st.code() == Status::Code::kNotFound)
        return Status::NotFound(S3Url{bucket, prefix}.ToString() + ": no such bucket '" + bucket + "' at " +
                                config_.endpoint);
      return st;
    }
    size_t at = 0;
    // <Contents> blocks on the raw text (keys decoded one by one).
    for (size_t pos = 0;;) {
      size_t b = resp.body.find("<Contents>", pos);
      if (b == std::string::npos) break;
      size_t e = resp.body.find("</Contents>", b);
      if (e == std::string::npos) break;
      std::string raw = resp.body.substr(b, e - b);
      size_t k = 0;
      ObjectInfo o;
      std::string size;
      if (XmlTag(raw, "Key", &k, &o.key)) {
        k = 0;
        if (XmlTag(raw, "Size", &k, &size)) o.size = std::strtoull(size.c_str(), nullptr, 10);
        k = 0;
        XmlTag(raw, "ETag", &k, &o.etag);
        k = 0;
        std::string when;
        if (XmlTag(raw, "LastModified", &k, &when)) o.mtime_ns = ParseIsoTime(when);
        objects->push_back(std::move(o));
      }
      pos = e;
    }
    if (prefixes) {
      for (size_t pos = 0;;) {
        size_t b = resp.body.find("<CommonPrefixes>", pos);
        if (b == std::string::npos) break;
        size_t k = b;
        std::string p;
        if (!XmlTag(resp.body, "Prefix", &k, &p)) break;
        prefixes->push_back(std::move(p));
        pos = k;
      }
    }
    std::string truncated;
    at = 0;
    XmlTag(resp.body, "IsTruncated", &at, &truncated);
    at = 0;
    if (truncated != "true" || !XmlTag(resp.body, "NextContinuationToken", &at, &token) || token.empty()) break;
  }
  return Status::OK();
}

Status Client::ListUploads(const std::string& bucket, const std::string& prefix, std::vector<UploadInfo>* out) {
  std::string key_marker, id_marker;
  for (;;) {
    Request r;
    r.url.bucket = bucket;
    r.query = {{"uploads", ""}, {"prefix", prefix}};
    if (!key_marker.empty()) {
      r.query.emplace_back("key-marker", key_marker);
      r.query.emplace_back("upload-id-marker", id_marker);
    }
    Response resp;
    KVFILE_RETURN_IF_ERROR(Call(r, &resp));
    for (size_t pos = 0;;) {
      size_t b = resp.body.find("<Upload>", pos);
      if (b == std::string::npos) break;
      size_t e = resp.body.find("</Upload>", b);
      if (e == std::string::npos) break;
      std::string raw = resp.body.substr(b, e - b);
      UploadInfo u;
      size_t k = 0;
      XmlTag(raw, "Key", &k, &u.key);
      k = 0;
      XmlTag(raw, "UploadId", &k, &u.upload_id);
      out->push_back(std::move(u));
      pos = e;
    }
    std::string truncated;
    size_t at = 0;
    XmlTag(resp.body, "IsTruncated", &at, &truncated);
    if (truncated != "true") break;
    at = 0;
    XmlTag(resp.body, "NextKeyMarker", &at, &key_marker);
    at = 0;
    XmlTag(resp.body, "NextUploadIdMarker", &at, &id_marker);
    if (key_marker.empty()) break;
  }
  return Status::OK();
}

Status Client::CreateUpload(const S3Url& url, std::string* upload_id, const std::vector<std::string>& metadata) {
  Request r;
  r.method = "POST";
  r.url = url;
  r.query = {{"uploads", ""}};
  r.headers = metadata;
  Response resp;
  KVFILE_RETURN_IF_ERROR(Call(r, &resp));
  size_t at = 0;
  if (!XmlTag(resp.body, "UploadId", &at, upload_id) || upload_id->empty())
    return Status::IOError(url.ToString() + ": the store's answer to starting an upload has no UploadId");
  return Status::OK();
}

Status Client::AbortUpload(const S3Url& url, const std::string& upload_id) {
  Request r;
  r.method = "DELETE";
  r.url = url;
  r.query = {{"uploadId", upload_id}};
  Response resp;
  Status st = PerformMany(std::span<const Request>(&r, 1), std::span<Response>(&resp, 1), 1);
  if (!st.ok()) return st;
  if (resp.status == 404 || (resp.status >= 200 && resp.status < 300)) return Status::OK();  // gone either way
  return ErrorFor(r, resp);
}

Status Client::CompleteUpload(const S3Url& url, const std::string& upload_id, const std::vector<std::string>& parts,
                              bool if_absent, Completion* how) {
  std::string xml = "<CompleteMultipartUpload>";
  for (size_t i = 0; i < parts.size(); ++i)
    xml += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>" + XmlEscape(parts[i]) +
           "</ETag></Part>";
  xml += "</CompleteMultipartUpload>";
  Request r;
  r.method = "POST";
  r.url = url;
  r.query = {{"uploadId", upload_id}};
  r.headers = {"Content-Type: application/xml"};
  if (if_absent) r.headers.push_back("If-None-Match: *");
  r.body = xml.data();
  r.body_size = xml.size();
  Response resp;
  Status st = Call(r, &resp);
  if (how) {
    // An error may come in a 200's body (after the store's heartbeats).
    size_t at = 0;
    how->code.clear();
    XmlTag(resp.body, "Code", &at, &how->code);
    how->status = resp.status;
    how->attempts = resp.attempts;
  }
  return st;
}

}  // namespace kvfile::s3
