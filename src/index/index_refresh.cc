// SPDX-License-Identifier: Apache-2.0
// Keeping a directory's prefix index current, and the lookups FindPrefix
// answers: a directory through its (refreshed) index, a pack through the
// index beside it when that lists the pack as it is, else member by member.
//
// A refresh lists the .kv and .kvpack files under the directory with their
// size, times, device and inode, and hashes that list (the directory
// digest); a pack's members are entries PACK:MEMBER, each with the pack's
// size, times, device and inode. An index
// whose header holds the same digest is current and is used as it is.
// Otherwise the entries of the old index whose file is unchanged are kept,
// new and changed files are read, and both streams, each in index order,
// are merged into a new index file. New entries are sorted in memory in
// runs of at most kRunTokens tokens; a larger refresh writes each run as a
// temporary index file in the directory and merges them all, so memory
// stays bounded whatever the corpus size.
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <queue>
#include <unordered_map>

#include "format/endian.h"
#include "index/index_format.h"
#include "kvfile/pack.h"
#include "kvfile/prefix_index.h"
#include "kvfile/reader.h"
#include "s3/s3_file_system.h"
#include "s3/s3_url.h"

namespace kvfile {
namespace {

// Tokens of new entries held in memory before they are written as a run.
constexpr uint64_t kRunTokens = uint64_t{16} << 20;  // 64 MiB of token ids
uint64_t g_run_tokens = kRunTokens;

struct ScannedFile {
  PrefixEntry stat;  // path and change-detection fields only
  bool indexed = false;  // an unchanged entry of the old index covers it
};

bool SameFile(const PrefixEntry& a, const PrefixEntry& b) {
  return a.size == b.size && a.mtime_ns == b.mtime_ns && a.ctime_ns == b.ctime_ns && a.device == b.device &&
         a.inode == b.inode;
}

const std::vector<std::string> kIndexedSuffixes = {".kv", ".kvpack"};
constexpr std::string_view kPackSuffix = ".kvpack";
constexpr std::string_view kMemberMark = ".kvpack:";

bool IsPackPath(std::string_view path) { return path.ends_with(kPackSuffix); }

// Whether a file found under the directory gets entries: a .kv file whose
// path holds ".kvpack:" would read as a pack member, so it has none.
bool Indexable(const std::string& rel) {
  return !rel.empty() && rel.size() <= index::kMaxPathBytes && (IsPackPath(rel) || rel.find(kMemberMark) == std::string::npos);
}

// An object's change record (spec/INDEX.md 5): its size, its LastModified
// as both times, and its ETag's hash as the inode (so a replaced object
// differs, whatever its times).
void ObjectStat(const s3::RemoteObject& o, PrefixEntry* e) {
  e->size = o.size;
  e->mtime_ns = e->ctime_ns = o.mtime_ns;
  e->device = 0x5333;
  e->inode = o.etag_hash;
}

// A local file's change record; false when it is no regular file.
bool FileStat(const std::string& path, PrefixEntry* e) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  e->size = static_cast<uint64_t>(st.st_size);
  e->mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  e->ctime_ns = int64_t{st.st_ctim.tv_sec} * 1000000000 + st.st_ctim.tv_nsec;
  e->device = st.st_dev;
  e->inode = st.st_ino;
  return true;
}

// The .kv and .kvpack objects under an s3:// prefix, sorted by path.
Status ScanPrefix(const std::string& dir, std::vector<ScannedFile>* out) {
  std::vector<s3::RemoteObject> objects;
  KVFILE_RETURN_IF_ERROR(s3::ListPrefix(dir, kIndexedSuffixes, &objects));
  const std::string prefix = dir.ends_with('/') ? dir : dir + "/";
  for (const s3::RemoteObject& o : objects) {
    ScannedFile f;
    f.stat.path = o.path.substr(prefix.size());
    ObjectStat(o, &f.stat);
    if (!Indexable(f.stat.path)) continue;
    out->push_back(std::move(f));
  }
  std::sort(out->begin(), out->end(), [](const ScannedFile& a, const ScannedFile& b) { return a.stat.path < b.stat.path; });
  return Status::OK();
}

// The .kv and .kvpack regular files under `dir` (symlinks followed), sorted
// by path.
// A subdirectory that cannot be read is left out like an unreadable .kv
// file: counted in *unreadable, *first_unreadable naming it.
Status ScanDirectory(const std::string& dir, std::vector<ScannedFile>* out, uint64_t* unreadable,
                     std::string* first_unreadable) {
  namespace fs = std::filesystem;
  if (s3::IsS3Path(dir)) return ScanPrefix(dir, out);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Status::InvalidArgument(dir + ": not a directory");
  std::vector<WalkEntry> walked;
  KVFILE_RETURN_IF_ERROR(WalkDirectory(dir, kIndexedSuffixes, &walked));
  for (const WalkEntry& w : walked) {
    if (!w.error.ok()) {
      if ((*unreadable)++ == 0) *first_unreadable = w.error.message();
      continue;
    }
    ScannedFile f;
    if (!FileStat(w.path, &f.stat)) continue;
    f.stat.path = fs::path(w.path).lexically_relative(dir).generic_string();
    if (!Indexable(f.stat.path)) continue;
    out->push_back(std::move(f));
  }
  std::sort(out->begin(), out->end(), [](const ScannedFile& a, const ScannedFile& b) { return a.stat.path < b.stat.path; });
  return Status::OK();
}

// spec/INDEX.md 5: XXH3-64 over each file's record, in path order.
uint64_t DirectoryDigest(const std::vector<ScannedFile>& files) {
  format::ChecksumStream h;
  for (const ScannedFile& f : files) {
    uint8_t rec[44];
    format::StoreU32(rec, static_cast<uint32_t>(f.stat.path.size()));
    format::StoreU64(rec + 4, f.stat.size);
    format::StoreU64(rec + 12, static_cast<uint64_t>(f.stat.mtime_ns));
    format::StoreU64(rec + 20, static_cast<uint64_t>(f.stat.ctime_ns));
    format::StoreU64(rec + 28, f.stat.device);
    format::StoreU64(rec + 36, f.stat.inode);
    h.Update(rec, sizeof rec);
    h.Update(f.stat.path.data(), f.stat.path.size());
  }
  return h.Digest();
}

// Keeps the best match seen: the longest, then the first in index order.
struct BestMatch {
  std::span<const uint32_t> query;
  std::optional<uint64_t> fingerprint;
  std::optional<PrefixEntry> best;
  uint64_t matched = 0;

  void Offer(const PrefixEntry& e) {
    if (query.empty() || (fingerprint && e.fingerprint != *fingerprint)) return;
    uint64_t l = index::CommonPrefix(e.tokens, query);
    if (l == 0 || l < matched || (l == matched && index::CompareEntries(e, *best) >= 0)) return;
    matched = l;
    best = e;
  }
  std::optional<PrefixMatch> Result() const {
    if (!best) return std::nullopt;
    return PrefixMatch{best->path, best->model_id, best->fingerprint, best->tokens.size(), matched};
  }
};

// A stream of entries in index order.
class Source {
 public:
  virtual ~Source() = default;
  // *e: the next entry, or nullptr at the end.
  virtual Status Next(const PrefixEntry** e) = 0;
};

class VectorSource : public Source {
 public:
  explicit VectorSource(std::vector<PrefixEntry> v) : v_(std::move(v)) {}
  Status Next(const PrefixEntry** e) override {
    *e = i_ < v_.size() ? &v_[i_++] : nullptr;
    return Status::OK();
  }

 private:
  std::vector<PrefixEntry> v_;
  size_t i_ = 0;
};

// An index file's entries, those `keep` accepts.
class IndexSource : public Source {
 public:
  IndexSource(PrefixIndex* ix, std::function<bool(const PrefixEntry&)> keep) : ix_(ix), keep_(std::move(keep)) {}
  Status Next(const PrefixEntry** e) override {
    while (i_ < ix_->entry_count()) {
      Status st = ix_->ReadEntry(i_++, &cur_);
      if (!st.ok()) return st;
      if (keep_(cur_)) {
        *e = &cur_;
        return Status::OK();
      }
    }
    *e = nullptr;
    return Status::OK();
  }

 private:
  PrefixIndex* ix_;
  std::function<bool(const PrefixEntry&)> keep_;
  uint64_t i_ = 0;
  PrefixEntry cur_;
};

// Merges sources (each in index order) into `sink`, in index order.
Status Merge(std::vector<std::unique_ptr<Source>>& sources, const std::function<Status(const PrefixEntry&)>& sink) {
  std::vector<const PrefixEntry*> head(sources.size());
  auto later = [&head](size_t a, size_t b) { return index::CompareEntries(*head[a], *head[b]) > 0; };
  std::priority_queue<size_t, std::vector<size_t>, decltype(later)> heap(later);
  for (size_t i = 0; i < sources.size(); ++i) {
    Status st = sources[i]->Next(&head[i]);
    if (!st.ok()) return st;
    if (head[i]) heap.push(i);
  }
  while (!heap.empty()) {
    size_t i = heap.top();
    heap.pop();
    Status st = sink(*head[i]);
    if (!st.ok()) return st;
    if (!(st = sources[i]->Next(&head[i])).ok()) return st;
    if (head[i]) heap.push(i);
  }
  return Status::OK();
}

struct Refresh {
  std::string dir;
  FileSystem* fs;
  bool write;
  PrefixIndexReport* report;
  BestMatch* best;  // nullptr: indexing only
  bool check_all = false;  // read every block of a current index before trusting it
  bool distrust = false;   // treat the index on disk as damaged (a lookup found damage)
  std::unique_ptr<PrefixIndex> fresh;  // set when the index on disk is current

  std::string IndexPath() const { return (std::filesystem::path(dir) / kPrefixIndexName).string(); }

  // Appends the entries of a new or changed file to *out (a .kv file: one;
  // a pack: one per member, all or none) and adds their token ids to
  // *tokens; a file that cannot be read adds none and is counted skipped.
  void ReadFile(const ScannedFile& f, std::vector<PrefixEntry>* out, uint64_t* tokens) {
    std::string full = (std::filesystem::path(dir) / f.stat.path).string();
    const size_t before = out->size();
    Status st = IsPackPath(f.stat.path) ? ReadPack(full, f.stat, out) : ReadKv(full, f.stat, out);
    if (!st.ok()) {
      out->resize(before);
      if (report->skipped++ == 0) report->first_skipped = st.message();
      return;
    }
    for (size_t i = before; i < out->size(); ++i) *tokens += (*out)[i].tokens.size();
    report->reread += out->size() - before;
  }

  Status ReadKv(const std::string& full, const PrefixEntry& stat, std::vector<PrefixEntry>* out) {
    std::unique_ptr<Reader> r;
    ReaderOptions ro;
    ro.fs = fs;
    KVFILE_RETURN_IF_ERROR(Reader::Open(full, ro, &r));
    PrefixEntry& e = out->emplace_back(stat);
    e.model_id = r->identity().model_id;
    e.fingerprint = r->identity().fingerprint;
    e.tokens.assign(r->tokens().begin(), r->tokens().end());
    return Status::OK();
  }

  Status ReadPack(const std::string& full, const PrefixEntry& stat, std::vector<PrefixEntry>* out) {
    std::unique_ptr<PackReader> pack;
    KVFILE_RETURN_IF_ERROR(PackReader::Open(full, fs, &pack));
    std::vector<uint32_t> chunk_ids;
    for (size_t i = 0; i < pack->members().size(); ++i) {
      const PackMember& m = pack->members()[i];
      PrefixEntry e = stat;
      e.path = stat.path + ":" + m.name;
      if (e.path.size() > index::kMaxPathBytes)
        return Status::InvalidArgument(full + ": member name '" + m.name + "' too long for the index");
      KVFILE_RETURN_IF_ERROR(pack->ReadMember(i, &e.tokens, &chunk_ids));
      e.model_id = pack->models()[m.model].identity.model_id;
      e.fingerprint = pack->models()[m.model].identity.fingerprint;
      out->push_back(std::move(e));
    }
    return Status::OK();
  }

  Status Run() {
    std::vector<ScannedFile> files;
    uint64_t unreadable_dirs = 0;
    std::string first_unreadable_dir;
    Status st = ScanDirectory(dir, &files, &unreadable_dirs, &first_unreadable_dir);
    if (!st.ok()) return st;
    report->files = files.size();
    uint64_t digest = DirectoryDigest(files);
    const std::string index_path = IndexPath();
    std::unique_ptr<PrefixIndex> old;
    // An object store's index is opened without asking first whether it
    // exists (a request saved); only "no such object" means it does not.
    Status opened;
    bool exists = false;
    if (s3::IsS3Path(index_path)) {
      opened = PrefixIndex::Open(index_path, fs, &old);
      exists = opened.code() != Status::Code::kNotFound;
      if (exists && !opened.ok() && !opened.IsDataError()) return opened;  // the store failed, not the index
    } else {
      exists = std::filesystem::exists(index_path);
      if (exists && !distrust) opened = PrefixIndex::Open(index_path, fs, &old);
    }
    if (exists && (distrust || !opened.ok())) {
      old.reset();
      report->rebuilt = true;
    }
    if (old && old->directory_digest() == digest && check_all) {
      PrefixEntry e;
      for (uint64_t i = 0; old && i < old->entry_count(); ++i)
        if (!old->ReadEntry(i, &e).ok()) {
          old.reset();
          report->rebuilt = true;
        }
    }
    if (old && old->directory_digest() == digest) {
      report->was_fresh = true;
      report->indexed = old->entry_count();
      report->skipped = old->skipped();
      fresh = std::move(old);
      return Status::OK();
    }
    // Which files the old index covers unchanged (a damaged block: none).
    std::unordered_map<std::string_view, size_t> by_path;
    for (size_t i = 0; i < files.size(); ++i) by_path.emplace(files[i].stat.path, i);
    // The file an entry came from: its path, or for PACK:MEMBER the pack.
    auto file_of = [&](const PrefixEntry& e) -> ScannedFile* {
      std::string_view p = e.path;
      auto it = by_path.find(p);
      for (size_t at = p.find(kMemberMark); it == by_path.end() && at != std::string_view::npos;
           at = p.find(kMemberMark, at + 1))
        it = by_path.find(p.substr(0, at + kPackSuffix.size()));
      return it == by_path.end() ? nullptr : &files[it->second];
    };
    auto unchanged = [&](const PrefixEntry& e) {
      ScannedFile* f = file_of(e);
      return f && SameFile(f->stat, e);
    };
    if (old) {
      PrefixEntry e;
      for (uint64_t i = 0; i < old->entry_count(); ++i) {
        if (!old->ReadEntry(i, &e).ok()) {
          for (ScannedFile& f : files) f.indexed = false;
          old.reset();
          report->rebuilt = true;
          break;
        }
        if (unchanged(e)) file_of(e)->indexed = true;
      }
    }
    std::unique_ptr<PrefixIndexWriter> writer;
    if (write) {
      st = PrefixIndexWriter::Begin(index_path, fs, &writer);
      if (!st.ok()) {
        if (!best) return st;
        report->not_written = st.message();
      }
    }
    // New entries, in sorted runs; runs past the first are spilled to
    // temporary index files when the directory is writable.
    std::vector<std::unique_ptr<Source>> sources;
    std::vector<std::unique_ptr<PrefixIndex>> runs;
    std::vector<std::string> run_paths;
    struct RemoveRuns {
      FileSystem* fs;
      std::vector<std::string>* paths;
      ~RemoveRuns() {
        for (const std::string& p : *paths) (void)fs->Remove(p);
      }
    } remove_runs{fs, &run_paths};
    std::vector<PrefixEntry> pending;
    uint64_t pending_tokens = 0;
    auto spill = [&]() -> Status {
      std::sort(pending.begin(), pending.end(), PrefixEntryLess);
      std::string run = index_path + ".run" + std::to_string(run_paths.size());
      std::unique_ptr<PrefixIndexWriter> w;
      Status s = PrefixIndexWriter::Begin(run, fs, &w);
      for (size_t i = 0; s.ok() && i < pending.size(); ++i) s = w->Add(pending[i]);
      if (s.ok()) s = w->Finish(0);
      if (s.ok()) run_paths.push_back(run);
      std::unique_ptr<PrefixIndex> ix;
      if (s.ok()) s = PrefixIndex::Open(run, fs, &ix);
      if (!s.ok()) return s;
      sources.push_back(std::make_unique<IndexSource>(ix.get(), [](const PrefixEntry&) { return true; }));
      runs.push_back(std::move(ix));
      pending.clear();
      pending_tokens = 0;
      return Status::OK();
    };
    report->skipped += unreadable_dirs;
    if (unreadable_dirs > 0 && report->first_skipped.empty()) report->first_skipped = first_unreadable_dir;
    for (const ScannedFile& f : files) {
      if (f.indexed) continue;
      ReadFile(f, &pending, &pending_tokens);
      if (pending_tokens >= g_run_tokens && writer && !(st = spill()).ok()) return st;
    }
    std::sort(pending.begin(), pending.end(), PrefixEntryLess);
    sources.push_back(std::make_unique<VectorSource>(std::move(pending)));
    if (old) sources.push_back(std::make_unique<IndexSource>(old.get(), unchanged));
    st = Merge(sources, [&](const PrefixEntry& e) -> Status {
      ++report->indexed;
      if (best) best->Offer(e);
      return writer ? writer->Add(e) : Status::OK();
    });
    if (!st.ok()) return st;
    report->kept = report->indexed - report->reread;
    if (!writer) return Status::OK();
    if (!(st = writer->Finish(digest, report->skipped)).ok()) {
      if (!best) return st;
      report->not_written = st.message();
      return Status::OK();
    }
    report->written = true;
    return Status::OK();
  }
};

// A pack's lookup through the index beside it (its directory's index):
// *used when that index lists the pack as it is now (entries PACK:MEMBER
// holding the pack's current size, times, device and inode; a refresh
// writes all of a pack's members or none), answered without reading the
// pack. A missing, damaged or older index, or one without the pack, is
// not used (the caller scans the pack); only a failure of the store, or a
// signal, is an error.
Status FindInPackIndex(const std::string& path, FileSystem* fs, BestMatch* best, std::optional<PrefixMatch>* out,
                       PrefixIndexReport* report, bool* used) {
  *used = false;
  const bool remote = s3::IsS3Path(path);
  const size_t slash = path.find_last_of('/');
  PrefixEntry pack;
  pack.path = slash == std::string::npos ? path : path.substr(slash + 1);
  const std::string index_path = (std::filesystem::path(DirName(path)) / kPrefixIndexName).string();
  std::unique_ptr<PrefixIndex> ix;
  if (remote) {
    // The index first (opened without asking whether it exists: a missing
    // one costs its one GET), then the pack's listing record: at most 3
    // requests in all for an index of up to 64 MiB.
    Status st = PrefixIndex::Open(index_path, fs, &ix);
    if (!st.ok()) return st.code() == Status::Code::kNotFound || st.IsDataError() ? Status::OK() : st;
    s3::RemoteObject o;
    st = s3::ListObject(path, &o);
    if (!st.ok()) return st.code() == Status::Code::kNotFound ? Status::OK() : st;
    ObjectStat(o, &pack);
  } else {
    if (!FileStat(path, &pack) || !std::filesystem::exists(index_path)) return Status::OK();
    if (!PrefixIndex::Open(index_path, fs, &ix).ok()) return Status::OK();
  }
  const std::string mark = pack.path + ":";
  auto of_pack = [&](const PrefixEntry& e) { return e.path.starts_with(mark) && SameFile(e, pack); };
  Status st = ix->Lookup(best->query, best->fingerprint, of_pack, out);
  if (st.IsDataError()) return Status::OK();
  if (!st.ok()) return st;
  if (*out) {
    (*out)->path.erase(0, mark.size());
    *used = report->was_fresh = true;
    return Status::OK();
  }
  // No match: the answer only if the index lists the pack at all; the
  // count of its members is the "searched" of the answer.
  uint64_t members = 0;
  PrefixEntry e;
  for (uint64_t i = 0; i < ix->entry_count(); ++i) {
    st = ix->ReadEntry(i, &e);
    if (st.IsDataError()) return Status::OK();
    if (!st.ok()) return st;
    members += of_pack(e);
  }
  if (members == 0) return Status::OK();
  report->files = report->indexed = members;
  *used = report->was_fresh = true;
  return Status::OK();
}

Status FindInPack(const std::string& path, FileSystem* fs, BestMatch* best, PrefixIndexReport* report) {
  std::unique_ptr<PackReader> pack;
  Status st = PackReader::Open(path, fs, &pack);
  if (!st.ok()) return st;
  std::vector<uint32_t> chunk_ids;
  PrefixEntry e;
  for (size_t i = 0; i < pack->members().size(); ++i) {
    const PackMember& m = pack->members()[i];
    const PackModel& model = pack->models()[m.model];
    if (best->fingerprint && model.identity.fingerprint != *best->fingerprint) continue;
    if (!(st = pack->ReadMember(i, &e.tokens, &chunk_ids)).ok()) return st;
    e.path = m.name;
    e.model_id = model.identity.model_id;
    e.fingerprint = model.identity.fingerprint;
    best->Offer(e);
  }
  report->files = report->indexed = pack->members().size();
  return Status::OK();
}

}  // namespace

void index::SetRunTokensForTesting(uint64_t tokens) { g_run_tokens = tokens ? tokens : kRunTokens; }

Status IndexDirectory(const std::string& dir, FileSystem* fs, PrefixIndexReport* report) {
  PrefixIndexReport local;
  if (!report) report = &local;
  *report = PrefixIndexReport{};
  Refresh r{dir, fs ? fs : FileSystem::Default(), true, report, nullptr, /*check_all=*/true, false, nullptr};
  return r.Run();
}

Status FindPrefix(const std::string& path, std::span<const uint32_t> query, const PrefixFindOptions& options,
                  std::optional<PrefixMatch>* out, PrefixIndexReport* report) {
  PrefixIndexReport local;
  if (!report) report = &local;
  *report = PrefixIndexReport{};
  out->reset();
  FileSystem* fs = options.fs ? options.fs : FileSystem::Default();
  BestMatch best{query, options.fingerprint, std::nullopt, 0};
  std::error_code ec;
  // An s3:// path ending in '/' is a key prefix, searched as a directory.
  const bool prefix = s3::IsS3Path(path) && path.ends_with('/');
  if (!prefix && !std::filesystem::is_directory(path, ec)) {
    bool used = false;
    Status st = FindInPackIndex(path, fs, &best, out, report, &used);
    if (!st.ok() || used) return st;
    out->reset();
    st = FindInPack(path, fs, &best, report);
    if (st.ok()) *out = best.Result();
    return st;
  }
  Refresh r{path, fs, options.write_index, report, &best, false, false, nullptr};
  Status st = r.Run();
  if (!st.ok()) return st;
  if (r.fresh) {
    st = r.fresh->Lookup(query, options.fingerprint, out);
    if (!st.IsDataError()) return st;
    // A damaged block of a current index: never trusted, rebuilt.
    out->reset();
    *report = PrefixIndexReport{};
    Refresh again{path, fs, options.write_index, report, &best, false, /*distrust=*/true, nullptr};
    if (!(st = again.Run()).ok()) return st;
  }
  *out = best.Result();
  return Status::OK();
}

}  // namespace kvfile
