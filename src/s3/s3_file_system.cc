// SPDX-License-Identifier: Apache-2.0
// s3:// objects as kvfile Files (see s3_file_system.h).
//
// Reads: an object opens with one ranged GET of its first block (1 MiB),
// whose Content-Range gives the size; small reads go through a cache of
// up to 16 such blocks, fetched whole (the header, the commit record and
// the tables of a .kv, a pack or an index are small reads close together);
// reads of a block or more go straight into the caller's buffer (one of
// more than 8 MiB in pieces of at most 8 MiB, in flight together). A miss
// right after a cached block reads ahead (8 blocks in one GET). ReadBatch
// sends the GETs it needs together (up to 8 in flight), adjacent blocks
// merged into one request. A span announced by WillRead (verify announces
// each chunk) is fetched ahead of the reads: split into ranges of at most
// 8 MiB, up to 8 of them in flight at once, each GET on a thread of its
// own, and every read inside the span served from them; the ranges
// fetched ahead and not yet passed by the reads hold at most 64 MiB in
// the whole process. Every answer must carry the ETag the first one had:
// an object replaced while it is read is an error, not a mix.
#include "s3/s3_file_system.h"

#include <signal.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <ctime>
#include <deque>
#include <future>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <random>

#include "s3/s3_client.h"

namespace kvfile::s3 {

namespace {

constexpr uint64_t kBlock = 1u << 20;
constexpr size_t kCachedBlocks = 16;
constexpr uint64_t kReadAhead = 8;
constexpr int kReadsInFlight = 8;
constexpr int kPartsInFlight = 4;
constexpr uint64_t kAheadRangeBytes = 8u << 20;
constexpr size_t kAheadRanges = 8;
// Bytes of the ranges fetched ahead (WillRead) that every File of the
// process holds: launched and not yet passed by the reads; never more
// than kAheadBudget. The most it held since the last reset (a test hook).
std::atomic<uint64_t> g_ahead_bytes{0};
std::atomic<uint64_t> g_ahead_peak{0};

// Takes `bytes` of the budget if it has room for them.
bool ReserveAhead(uint64_t bytes) {
  uint64_t held = g_ahead_bytes.load();
  do {
    if (held + bytes > kAheadBudget) return false;
  } while (!g_ahead_bytes.compare_exchange_weak(held, held + bytes));
  const uint64_t now = held + bytes;
  for (uint64_t peak = g_ahead_peak.load(); peak < now && !g_ahead_peak.compare_exchange_weak(peak, now);) {
  }
  return true;
}

// Which object an s3:// path names, as a FileId: the path and the ETag of
// the object's current version, so that an object replaced between two
// opens is another file (the worker files of a parallel read, kvfile's
// "the file was replaced" check, compare them).
FileId ObjectId(const std::string& path, const std::string& etag) {
  std::string both = path + '\n' + etag;
  return FileId{0x5333 /* "S3" */, XXH3_64bits(both.data(), both.size())};
}

// The object (or prefix) an s3:// path names, and the process's client for
// it; a missing configuration is the path's usage error.
Status Resolve(const std::string& path, S3Url* url, Client** client) {
  KVFILE_RETURN_IF_ERROR(ParseS3Url(path, url));
  Status st = Client::Instance(client);
  if (!st.ok()) return Status::InvalidArgument(path + ": " + st.message());
  return Status::OK();
}

class S3ReadFile final : public File {
 public:
  S3ReadFile(Client* client, S3Url url, std::string path) : client_(client), url_(std::move(url)), path_(std::move(path)) {}
  ~S3ReadFile() override {
    std::lock_guard<std::mutex> lock(ahead_mu_);
    while (!ahead_.empty()) DropFirstAhead();
  }

  // The first GET: block 0, the size and the ETag.
  Status Open() {
    std::vector<uint8_t> block(kBlock);
    Request r = RangeGet(0, kBlock, block.data());
    Response resp;
    KVFILE_RETURN_IF_ERROR(client_->PerformMany(std::span<const Request>(&r, 1), std::span<Response>(&resp, 1), 1));
    if (resp.status == 416) {  // an empty object: no byte to range over
      size_ = 0;
      etag_ = resp.headers["etag"];
      return Status::OK();
    }
    if (resp.status != 206 && resp.status != 200) return client_->ErrorFor(r, resp);
    etag_ = resp.headers["etag"];
    const std::string& range = resp.headers["content-range"];
    size_t slash = range.rfind('/');
    if (resp.status == 206 && slash != std::string::npos)
      size_ = std::strtoull(range.c_str() + slash + 1, nullptr, 10);
    else
      size_ = resp.sink_bytes;  // 200: the whole object fitted in the block
    if (resp.sink_bytes != std::min<uint64_t>(size_, kBlock))
      return Status::IOError(path_ + ": the store sent " + std::to_string(resp.sink_bytes) +
                             " bytes of the first block");
    block.resize(resp.sink_bytes);
    Insert(0, std::move(block));
    return Status::OK();
  }

  Status ReadAt(uint64_t offset, void* buf, size_t n) override {
    ReadRequest one{offset, buf, n};
    return ReadBatch(std::span<const ReadRequest>(&one, 1));
  }

  void WillRead(uint64_t offset, uint64_t n) override {
    std::lock_guard<std::mutex> lock(ahead_mu_);
    while (!ahead_.empty()) DropFirstAhead();  // another span: what was left of the last one
    if (offset >= size_) return;
    n = std::min(n, size_ - offset);
    uint64_t ranges = (n + kAheadRangeBytes - 1) / kAheadRangeBytes;
    plan_next_ = offset;
    plan_end_ = offset + n;
    plan_range_ = ranges ? (n + ranges - 1) / ranges : 0;
    FillAhead();
  }

  Status ReadBatch(std::span<const ReadRequest> requests) override {
    for (const ReadRequest& q : requests)
      if (q.offset > size_ || q.n > size_ - q.offset)
        return Status::Corruption(path_ + ": unexpected end of file: " + std::to_string(q.n) + " bytes at offset " +
                                  std::to_string(q.offset) + " of a " + std::to_string(size_) + "-byte object");
    // The reads inside the ranges fetched ahead are served from them.
    std::vector<ReadRequest> rest;
    {
      std::lock_guard<std::mutex> lock(ahead_mu_);
      for (const ReadRequest& q : requests) {
        bool served = false;
        KVFILE_RETURN_IF_ERROR(ServeAhead(q, &served));
        if (!served) rest.push_back(q);
      }
    }
    return Fetch(rest);
  }

 private:
  // A range fetched ahead: its GET runs on a thread of its own.
  struct Ahead {
    uint64_t begin = 0;
    std::vector<uint8_t> data;
    std::shared_future<Status> done;  // destroyed first: waits for the GET
    uint64_t end() const { return begin + data.size(); }
  };

  // The answer to a ranged GET: a 206 (a 200 for the whole object), the
  // object's ETag, every byte asked for.
  Status CheckRange(const Request& get, Response& answer) const {
    if (answer.status != 206 && !(answer.status == 200 && get.range_begin == 0 && get.range_bytes == size_))
      return client_->ErrorFor(get, answer);
    if (answer.headers["etag"] != etag_)
      return Status::Busy(path_ + ": the object was replaced while it was read (ETag " + etag_ + " became " +
                          answer.headers["etag"] + ")");
    if (answer.sink_bytes != get.range_bytes)
      return Status::IOError(path_ + ": the store sent " + std::to_string(answer.sink_bytes) + " of " +
                             std::to_string(get.range_bytes) + " bytes at offset " + std::to_string(get.range_begin));
    return Status::OK();
  }

  // Launches the next ranges of the announced span, up to kAheadRanges of
  // this File and kAheadBudget bytes of the process, never more: a range
  // the budget has no room for is launched once earlier ones are let go
  // (by this File or another), and until then the reads fetch their
  // bytes themselves. ahead_mu_ held.
  void FillAhead() {
    while (plan_next_ < plan_end_ && ahead_.size() < kAheadRanges) {
      uint64_t bytes = std::min(plan_range_, plan_end_ - plan_next_);
      if (!ReserveAhead(bytes)) return;
      auto a = std::make_unique<Ahead>();
      a->begin = plan_next_;
      a->data.resize(bytes);
      Ahead* at = a.get();
      try {
        a->done = std::async(std::launch::async, [this, at] {
                    Request get = RangeGet(at->begin, at->data.size(), at->data.data());
                    Response answer;
                    Status st = client_->PerformMany(std::span<const Request>(&get, 1), std::span<Response>(&answer, 1), 1);
                    return st.ok() ? CheckRange(get, answer) : st;
                  }).share();
      } catch (const std::system_error&) {  // no thread: the reads fetch the rest themselves
        g_ahead_bytes.fetch_sub(bytes);
        plan_end_ = plan_next_;
        return;
      }
      ahead_.push_back(std::move(a));
      plan_next_ += bytes;
    }
  }

  // Waits for the oldest range fetched ahead and lets it go. ahead_mu_ held.
  void DropFirstAhead() {
    ahead_.front()->done.wait();
    g_ahead_bytes.fetch_sub(ahead_.front()->data.size());
    ahead_.pop_front();
  }

  // Copies q out of the ranges fetched ahead if they hold all of it
  // (*served), once their GETs are done; the ranges the reads have passed
  // are let go and further ones launched. ahead_mu_ held.
  Status ServeAhead(const ReadRequest& q, bool* served) {
    *served = false;
    if (q.n == 0) return Status::OK();
    if (ahead_.empty() && plan_next_ < plan_end_) {
      FillAhead();  // the budget had no room when the span was announced: it may have now
      if (ahead_.empty()) {  // still none: q is read by the caller, and the span goes on after it
        if (q.offset + q.n > plan_next_) plan_next_ = std::min(plan_end_, q.offset + q.n);
        return Status::OK();
      }
    }
    if (ahead_.empty() || q.offset < ahead_.front()->begin || q.offset + q.n > ahead_.back()->end())
      return Status::OK();
    while (ahead_.front()->end() <= q.offset) DropFirstAhead();
    uint8_t* out = static_cast<uint8_t*>(q.buf);
    for (const auto& a : ahead_) {
      if (a->begin >= q.offset + q.n) break;
      KVFILE_RETURN_IF_ERROR(a->done.get());
      uint64_t from = std::max(q.offset, a->begin), to = std::min(q.offset + q.n, a->end());
      std::memcpy(out + (from - q.offset), a->data.data() + (from - a->begin), to - from);
    }
    *served = true;
    while (!ahead_.empty() && ahead_.front()->end() <= q.offset + q.n) DropFirstAhead();
    FillAhead();
    return Status::OK();
  }

  Request RangeGet(uint64_t begin, uint64_t bytes, void* sink) const {
    Request r;
    r.url = url_;
    r.has_range = true;
    r.range_begin = begin;
    r.range_bytes = bytes;
    r.sink = sink;
    r.sink_size = bytes;
    return r;
  }

  // The reads not served from the ranges fetched ahead: from the block
  // cache, or fetched now.
  Status Fetch(std::span<const ReadRequest> requests) {
    // Which blocks the small reads need, and which reads go direct.
    std::vector<uint64_t> missing;
    std::vector<const ReadRequest*> direct;
    // The cached blocks these reads use, held until they are copied: another
    // thread's reads may evict them from the cache meanwhile.
    std::map<uint64_t, std::shared_ptr<const std::vector<uint8_t>>> held;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const ReadRequest& q : requests) {
        if (q.n == 0) continue;
        if (q.n >= kBlock) {
          direct.push_back(&q);
          continue;
        }
        for (uint64_t b = q.offset / kBlock; b <= (q.offset + q.n - 1) / kBlock; ++b) {
          auto it = blocks_.find(b);
          if (it == blocks_.end()) missing.push_back(b);
          else held[b] = it->second;
        }
      }
    }
    std::sort(missing.begin(), missing.end());
    missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
    // Sequential reading (the block before the first missing one cached):
    // read ahead, up to kReadAhead blocks in the same request.
    if (!missing.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      uint64_t last = missing.back(), blocks = (size_ + kBlock - 1) / kBlock;
      if (missing.front() > 0 && blocks_.count(missing.front() - 1))
        for (uint64_t b = last + 1; b < blocks && b <= missing.front() + kReadAhead - 1; ++b)
          if (!blocks_.count(b)) missing.push_back(b);
    }
    // One GET per run of adjacent missing blocks, one per direct read.
    std::vector<Request> gets;
    std::vector<std::vector<uint8_t>> runs;
    std::vector<uint64_t> run_first;
    for (size_t i = 0; i < missing.size();) {
      size_t j = i + 1;
      while (j < missing.size() && missing[j] == missing[j - 1] + 1 && j - i < kReadAhead) ++j;
      uint64_t begin = missing[i] * kBlock, end = std::min(size_, (missing[j - 1] + 1) * kBlock);
      runs.emplace_back(end - begin);
      run_first.push_back(missing[i]);
      i = j;
    }
    for (size_t i = 0; i < runs.size(); ++i) gets.push_back(RangeGet(run_first[i] * kBlock, runs[i].size(), runs[i].data()));
    // A large direct read in pieces of at most kAheadRangeBytes, in flight together.
    for (const ReadRequest* q : direct) {
      uint64_t pieces = (q->n + kAheadRangeBytes - 1) / kAheadRangeBytes, piece = (q->n + pieces - 1) / pieces;
      for (uint64_t at = 0; at < q->n; at += piece)
        gets.push_back(RangeGet(q->offset + at, std::min<uint64_t>(piece, q->n - at), static_cast<uint8_t*>(q->buf) + at));
    }
    std::vector<Response> answers(gets.size());
    KVFILE_RETURN_IF_ERROR(client_->PerformMany(gets, answers, kReadsInFlight));
    for (size_t i = 0; i < gets.size(); ++i) KVFILE_RETURN_IF_ERROR(CheckRange(gets[i], answers[i]));
    std::lock_guard<std::mutex> lock(mu_);
    // The fetched blocks, split into the cache; then the small reads copied
    // from it (the fetched runs kept alive until then).
    std::map<uint64_t, const uint8_t*> fresh;
    for (size_t i = 0; i < runs.size(); ++i)
      for (uint64_t off = 0; off < runs[i].size(); off += kBlock) fresh[run_first[i] + off / kBlock] = runs[i].data() + off;
    for (const ReadRequest& q : requests) {
      if (q.n == 0 || q.n >= kBlock) continue;
      uint8_t* out = static_cast<uint8_t*>(q.buf);
      for (uint64_t at = q.offset; at < q.offset + q.n;) {
        uint64_t b = at / kBlock, in = at - b * kBlock;
        uint64_t take = std::min<uint64_t>(kBlock - in, q.offset + q.n - at);
        auto it = fresh.find(b);
        const uint8_t* src = it != fresh.end() ? it->second : held.at(b)->data();
        std::memcpy(out + (at - q.offset), src + in, take);
        at += take;
      }
    }
    for (const auto& [b, p] : fresh) {
      uint64_t bytes = std::min(kBlock, size_ - b * kBlock);
      InsertLocked(b, std::vector<uint8_t>(p, p + bytes));
    }
    return Status::OK();
  }

 public:
  Status WriteAt(uint64_t, const void*, size_t) override { return ReadOnly(); }
  Status Sync() override { return ReadOnly(); }
  Status Truncate(uint64_t) override { return ReadOnly(); }
  Status Size(uint64_t* size) override {
    *size = size_;
    return Status::OK();
  }
  Status LockExclusive() override { return Status::OK(); }  // objects are written whole, never in place
  Status Id(FileId* id) override {
    *id = ObjectId(path_, etag_);
    return Status::OK();
  }
  const char* backend() const override { return "s3"; }
  const std::string& path() const override { return path_; }

 private:
  Status ReadOnly() const {
    return Status::Unsupported(path_ + ": objects are read-only; kvfile writes them whole (pack -o, convert, index -o)");
  }
  void Insert(uint64_t b, std::vector<uint8_t> bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    InsertLocked(b, std::move(bytes));
  }
  void InsertLocked(uint64_t b, std::vector<uint8_t> bytes) {
    if (blocks_.count(b)) return;
    blocks_[b] = std::make_shared<const std::vector<uint8_t>>(std::move(bytes));
    order_.push_back(b);
    while (order_.size() > kCachedBlocks) {
      blocks_.erase(order_.front());
      order_.pop_front();
    }
  }

  Client* client_;
  S3Url url_;
  std::string path_;
  uint64_t size_ = 0;
  std::string etag_;
  std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<const std::vector<uint8_t>>> blocks_;
  std::list<uint64_t> order_;  // oldest first
  // The span announced by WillRead: the ranges launched, in order, and
  // where the next one starts.
  std::mutex ahead_mu_;
  std::deque<std::unique_ptr<Ahead>> ahead_;
  uint64_t plan_next_ = 0, plan_end_ = 0, plan_range_ = 0;
};

class S3FileSystem final : public FileSystem {
 public:
  Status Open(const std::string& path, OpenMode mode, std::unique_ptr<File>* out) override {
    if (mode != OpenMode::kRead)
      return Status::Unsupported(path + ": objects are written whole (pack -o, convert, index -o), not opened for writing");
    S3Url url;
    Client* client;
    KVFILE_RETURN_IF_ERROR(Resolve(path, &url, &client));
    if (url.key.empty() || url.key.back() == '/') return Status::InvalidArgument(path + ": a prefix, not an object");
    auto f = std::make_unique<S3ReadFile>(client, url, path);
    KVFILE_RETURN_IF_ERROR(f->Open());
    *out = std::move(f);
    return Status::OK();
  }
  Status Rename(const std::string& from, const std::string&, bool) override {
    return Status::Unsupported(from + ": objects cannot be renamed");
  }
  Status Remove(const std::string& path) override {
    S3Url url;
    Client* client;
    KVFILE_RETURN_IF_ERROR(Resolve(path, &url, &client));
    return client->Delete(url);
  }
  Status SyncDir(const std::string&) override { return Status::OK(); }  // a completed upload is durable
  Status Exists(const std::string& path, bool* exists) override {
    PathInfo info;
    KVFILE_RETURN_IF_ERROR(StatObject(path, &info));
    *exists = info.exists;
    return Status::OK();
  }
  Status PathId(const std::string& path, FileId* id) override {
    PathInfo info;
    KVFILE_RETURN_IF_ERROR(StatObject(path, &info));
    if (!info.exists) return Status::NotFound(path + ": no such object");
    *id = info.id;
    return Status::OK();
  }
  Status Stat(const std::string& path, PathInfo* info) override { return StatObject(path, info); }
  Status ListDir(const std::string& dir, std::vector<std::string>* names) override {
    S3Url url;
    Client* client;
    KVFILE_RETURN_IF_ERROR(Resolve(dir, &url, &client));
    if (!url.key.empty() && url.key.back() != '/') url.key += '/';
    std::vector<ObjectInfo> objects;
    std::vector<std::string> prefixes;
    KVFILE_RETURN_IF_ERROR(client->List(url.bucket, url.key, "/", &objects, &prefixes));
    names->clear();
    for (const ObjectInfo& o : objects) names->push_back(o.key.substr(url.key.size()));
    for (const std::string& p : prefixes) names->push_back(p.substr(url.key.size(), p.size() - url.key.size() - 1));
    return Status::OK();
  }
};

// An upload's marker: KEY.kvupload-... (MarkUpload, s3_file_system.h).
constexpr std::string_view kMarkerInfix = ".kvupload-";
// The metadata an upload's object carries: the token of the run that
// uploaded it, which tells a Complete whose answer was lost whether the
// object there is the one it completed.
constexpr std::string_view kTokenHeader = "x-amz-meta-kvfile-upload";

std::string HostName() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "unknown";
  return host;
}

// A token no other upload has: 128 random bits, in hex.
std::string UploadToken() {
  std::random_device rd;
  char hex[33];
  std::snprintf(hex, sizeof hex, "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  return hex;
}

// Seconds after which any run that writes KEY aborts an upload a marker
// names, whatever host made it (KVFILE_S3_STALE_UPLOAD_S, default a day).
int64_t StaleUploadSeconds() {
  static const int64_t n = [] {
    const char* v = std::getenv("KVFILE_S3_STALE_UPLOAD_S");
    char* end = nullptr;
    long long s = v && *v ? std::strtoll(v, &end, 10) : -1;
    return s >= 0 && end && *end == '\0' ? static_cast<int64_t>(s) : int64_t{86400};
  }();
  return n;
}

bool Alive(long pid) { return pid > 0 && pid <= INT32_MAX && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM); }

}  // namespace

UploadMarker MarkUpload(const std::string& path, const std::string& upload_id, const std::string& host, long pid,
                        int64_t created_s) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(upload_id.data(), upload_id.size())));
  return {path + std::string(kMarkerInfix) + hex, "kvfile-upload\n" + upload_id + "\n" + host + "\n" +
                                                      std::to_string(pid) + "\n" + std::to_string(created_s) + "\n"};
}

uint64_t AheadBytes() { return g_ahead_bytes.load(); }
uint64_t PeakAheadBytes() { return g_ahead_peak.load(); }
void ResetPeakAheadBytes() { g_ahead_peak.store(g_ahead_bytes.load()); }

uint64_t PartBytes() {
  static const uint64_t n = [] {
    const char* v = std::getenv("KVFILE_S3_PART_BYTES");
    uint64_t bytes = v ? std::strtoull(v, nullptr, 10) : 0;
    return bytes >= (5u << 20) ? bytes : uint64_t{8} << 20;
  }();
  return n;
}

Status S3FileSystemInstance(FileSystem** out) {
  static S3FileSystem fs;
  *out = &fs;
  return Status::OK();
}

Status StatObject(const std::string& path, PathInfo* info) {
  S3Url url;
  Client* client;
  KVFILE_RETURN_IF_ERROR(Resolve(path, &url, &client));
  *info = PathInfo();
  if (url.key.empty() || url.key.back() == '/') {  // a prefix: "exists" when it has objects
    std::vector<ObjectInfo> objects;
    KVFILE_RETURN_IF_ERROR(client->List(url.bucket, url.key, "/", &objects, nullptr));
    info->exists = !objects.empty();
    return Status::OK();
  }
  std::string etag;
  KVFILE_RETURN_IF_ERROR(client->Head(url, &info->exists, nullptr, &etag));
  info->regular = info->exists;
  info->mode = 0644;
  info->links = 1;
  if (info->exists) info->id = ObjectId(path, etag);
  return Status::OK();
}

namespace {
// An object's listing record, as ListPrefix and ListObject give it.
RemoteObject Listed(const std::string& bucket, const ObjectInfo& o) {
  return {S3Url{bucket, o.key}.ToString(), o.size, o.mtime_ns, XXH3_64bits(o.etag.data(), o.etag.size())};
}
}  // namespace

Status ListPrefix(const std::string& dir, const std::vector<std::string>& suffixes, std::vector<RemoteObject>* out) {
  S3Url url;
  Client* client;
  KVFILE_RETURN_IF_ERROR(Resolve(dir, &url, &client));
  if (!url.key.empty() && url.key.back() != '/') url.key += '/';
  std::vector<ObjectInfo> objects;
  KVFILE_RETURN_IF_ERROR(client->List(url.bucket, url.key, "", &objects, nullptr));
  out->clear();
  for (const ObjectInfo& o : objects)
    for (const std::string& s : suffixes)
      if (o.key.ends_with(s)) {
        out->push_back(Listed(url.bucket, o));
        break;
      }
  return Status::OK();
}

Status ListObject(const std::string& path, RemoteObject* out) {
  S3Url url;
  Client* client;
  KVFILE_RETURN_IF_ERROR(Resolve(path, &url, &client));
  std::vector<ObjectInfo> objects;
  std::vector<std::string> deeper;  // keys under KEY/ are rolled up, not listed
  KVFILE_RETURN_IF_ERROR(client->List(url.bucket, url.key, "/", &objects, &deeper));
  auto it = std::find_if(objects.begin(), objects.end(), [&](const ObjectInfo& o) { return o.key == url.key; });
  if (it == objects.end()) return Status::NotFound(path + ": no such object");
  *out = Listed(url.bucket, *it);
  return Status::OK();
}

Status WalkPrefix(const std::string& dir, const std::vector<std::string>& suffixes, std::vector<WalkEntry>* out) {
  std::vector<RemoteObject> objects;
  KVFILE_RETURN_IF_ERROR(ListPrefix(dir, suffixes, &objects));
  out->clear();
  for (RemoteObject& o : objects) out->push_back({std::move(o.path), Status::OK()});
  return Status::OK();
}

Status AbortStaleUploads(const std::string& path, int* aborted) {
  *aborted = 0;
  S3Url url;
  Client* client;
  KVFILE_RETURN_IF_ERROR(Resolve(path, &url, &client));
  std::vector<ObjectInfo> markers;
  KVFILE_RETURN_IF_ERROR(client->List(url.bucket, url.key + std::string(kMarkerInfix), "", &markers, nullptr));
  const std::string host = HostName();
  const int64_t now = static_cast<int64_t>(::time(nullptr));
  for (const ObjectInfo& m : markers) {
    S3Url marker{url.bucket, m.key};
    std::string text;
    Status st = client->GetSmall(marker, &text);
    if (st.code() == Status::Code::kNotFound) continue;  // another run cleaned it meanwhile
    KVFILE_RETURN_IF_ERROR(st);
    std::vector<std::string> lines;
    for (size_t at = 0; at < text.size();) {
      size_t nl = text.find('\n', at);
      if (nl == std::string::npos) nl = text.size();
      lines.push_back(text.substr(at, nl - at));
      at = nl + 1;
    }
    if (lines.size() < 4 || lines[0] != "kvfile-upload" ||
        MarkUpload(url.ToString(), lines[1], "", 0, 0).path != marker.ToString())
      continue;
    long pid = std::strtol(lines[3].c_str(), nullptr, 10);
    // Its age: from the time it holds, else (a marker without one) from
    // the store's LastModified.
    int64_t created = lines.size() >= 5 ? std::strtoll(lines[4].c_str(), nullptr, 10) : m.mtime_ns / 1000000000;
    bool stale = now - created >= StaleUploadSeconds() ||
                 (lines[2] == host && pid != ::getpid() && !Alive(pid));  // this host: its process is gone
    if (!stale) continue;  // a live upload of this host, or another host's younger than the limit
    KVFILE_RETURN_IF_ERROR(client->AbortUpload(url, lines[1]));
    KVFILE_RETURN_IF_ERROR(client->Delete(marker));
    ++*aborted;
  }
  return Status::OK();
}

Status UploadFile(FileSystem* fs, const std::string& local, const std::string& path, const PathInfo& original) {
  S3Url url;
  Client* client;
  KVFILE_RETURN_IF_ERROR(Resolve(path, &url, &client));
  std::unique_ptr<File> in;
  KVFILE_RETURN_IF_ERROR(fs->Open(local, OpenMode::kRead, &in));
  uint64_t size = 0;
  KVFILE_RETURN_IF_ERROR(in->Size(&size));
  uint64_t part = std::max<uint64_t>(PartBytes(), (size + 9999) / 10000);
  uint64_t parts = std::max<uint64_t>(1, (size + part - 1) / part);

  std::string upload_id;
  const std::string token = UploadToken();
  KVFILE_RETURN_IF_ERROR(client->CreateUpload(url, &upload_id, {std::string(kTokenHeader) + ": " + token}));
  const UploadMarker mark =
      MarkUpload(url.ToString(), upload_id, HostName(), ::getpid(), static_cast<int64_t>(::time(nullptr)));
  const S3Url marker{url.bucket, url.key + mark.path.substr(url.ToString().size())};
  auto abort = [&](Status why) {
    (void)client->AbortUpload(url, upload_id);
    (void)client->Delete(marker);
    return why;
  };
  Status st = client->PutSmall(marker, mark.text);
  if (!st.ok()) return abort(st);
  std::vector<std::string> etags(parts);
  std::vector<std::vector<uint8_t>> buffers(kPartsInFlight);
  for (uint64_t first = 0; first < parts; first += kPartsInFlight) {
    uint64_t count = std::min<uint64_t>(kPartsInFlight, parts - first);
    std::vector<Request> puts(count);
    for (uint64_t i = 0; i < count; ++i) {
      uint64_t begin = (first + i) * part, bytes = std::min(part, size - begin);
      buffers[i].resize(bytes);
      if (bytes) st = in->ReadAt(begin, buffers[i].data(), bytes);
      if (!st.ok()) return abort(st);
      puts[i].method = "PUT";
      puts[i].url = url;
      puts[i].query = {{"partNumber", std::to_string(first + i + 1)}, {"uploadId", upload_id}};
      puts[i].body = buffers[i].data();
      puts[i].body_size = bytes;
    }
    std::vector<Response> answers(count);
    st = client->PerformMany(puts, answers, kPartsInFlight);
    if (!st.ok()) return abort(st);
    for (uint64_t i = 0; i < count; ++i) {
      if (answers[i].status < 200 || answers[i].status > 299) return abort(client->ErrorFor(puts[i], answers[i]));
      etags[first + i] = answers[i].headers["etag"];
      if (etags[first + i].empty())
        return abort(Status::IOError(path + ": the store's answer to part " + std::to_string(first + i + 1) +
                                     " has no ETag"));
    }
  }
  // The last point to stop: a File that reports a stop (the CLI's, after a
  // signal) fails this empty read, and the upload is aborted, not completed.
  st = in->ReadAt(0, nullptr, 0);
  if (!st.ok()) return abort(st);
  // The key must still be what it was at the start. Absent: the Complete
  // carries If-None-Match: *, and the store refuses it if the key appeared
  // meanwhile. Present: the store cannot be asked to complete over one
  // version only (Swift's s3api refuses If-Match on a Complete whatever the
  // ETag), so a HEAD right before it compares the version; another
  // client's replacement between the two is not seen (docs/object-storage.md).
  if (original.exists) {
    bool exists = false;
    std::string etag;
    st = client->Head(url, &exists, nullptr, &etag);
    if (!st.ok()) return abort(st);
    if (!exists)
      return abort(Status::Busy(path + ": removed by another client while the new object was uploaded; not replaced"));
    if (!(ObjectId(path, etag) == original.id))
      return abort(Status::Busy(path + ": replaced by another client while the new object was uploaded; not replaced"));
  }
  Client::Completion how;
  st = client->CompleteUpload(url, upload_id, etags, /*if_absent=*/!original.exists, &how);
  const bool precondition = how.status == 412 || how.code == "PreconditionFailed";
  if (!st.ok() && (precondition || how.code == "NoSuchUpload")) {
    // A Complete retried after its answer was lost may find the upload
    // gone (NoSuchUpload: AWS S3 answers so once it completed it) or, with
    // If-None-Match, the key present: the object there is this upload's
    // when it carries its token. Otherwise the upload was aborted, or the
    // key is another client's, and the failure stands.
    bool exists = false;
    std::map<std::string, std::string> headers;
    if (client->Head(url, &exists, nullptr, nullptr, &headers).ok() && exists &&
        headers[std::string(kTokenHeader)] == token)
      st = Status::OK();
    else if (precondition)
      st = Status::Busy(path + ": created by another client while the new object was uploaded; not replaced");
  }
  if (!st.ok()) return abort(st);
  (void)client->Delete(marker);  // the object is whole; a marker left is cleaned by the next writer
  return Status::OK();
}

}  // namespace kvfile::s3
