// SPDX-License-Identifier: Apache-2.0
// The Mooncake driver of kvfile::Convert (driver.h): a .kv file <-> a
// directory of Mooncake FP8 codec records (kvfile/formats/mooncake.h, the record
// codec) with a manifest.json: one record per (chunk, layer, fp8 stream).
// docs/formats.md describes the directory.
//
// The directory output's transaction (BeginDirectoryOutput and
// CommitDirectoryOutput, which Convert calls around the export): the tree
// is written under a temporary name next to OUT and put in place when
// complete; an existing OUT (only one this driver wrote, with force) is
// exchanged with it in one rename (renameat2 RENAME_EXCHANGE; where the file
// system lacks it, renamed aside first) and removed after, and its mode,
// owner and group carry over. A symlink OUT is followed (the link stays).
// Temporary directories of killed runs are removed by the next export to
// the same OUT.
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <tuple>

#include "convert/driver.h"
#include "kvfile/codec.h"
#include "kvfile/file.h"
#include "kvfile/formats/mooncake.h"
#include "kvfile/reader.h"
#include "kvfile/replace.h"
#include "kvfile/formats/safetensors.h"
#include "kvfile/writer.h"

namespace kvfile::convert {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr char kManifest[] = "manifest.json";
constexpr char kManifestFormat[] = "kvfile-mooncake";
constexpr int kManifestVersion = 1;
constexpr uint64_t kMaxManifestBytes = uint64_t{1} << 30;

std::string LogicalKey(uint64_t fingerprint, const std::string& stream, uint32_t layer, uint64_t b, uint64_t e) {
  return "kvfile/" + safetensors::FingerprintHex(fingerprint) + "/" + stream + "/L" + std::to_string(layer) + "/T" +
         std::to_string(b) + "-" + std::to_string(e);
}

Status WriteWhole(const std::string& path, const void* data, size_t n) {
  std::unique_ptr<File> f;
  KVFILE_RETURN_IF_ERROR(FileSystem::Default()->Open(path, OpenMode::kCreateExclusive, &f));
  KVFILE_RETURN_IF_ERROR(f->WriteAt(0, data, n));
  return f->Sync();
}

void RemoveTree(const std::string& dir) {
  std::error_code ec;
  fs::remove_all(dir, ec);
}

// `name` is "<base>.kvtmp-<pid>" or "<base>.kvold-<pid>" (<base>: OUT's
// name or, where that is too long, its TempStem): *old says which.
bool IsTempOf(const std::string& base, const std::string& name, long* pid, bool* old) {
  for (const char* tag : {".kvtmp-", ".kvold-"}) {
    std::string prefix = base + tag;
    if (!name.starts_with(prefix)) prefix = TempStem(base) + tag;
    if (!name.starts_with(prefix) || name.size() == prefix.size() || name.size() - prefix.size() > 9) continue;
    std::string digits = name.substr(prefix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos) return false;
    *pid = std::stol(digits);
    *old = tag[3] == 'o';
    return true;
  }
  return false;
}

// Removes what exports to `out` killed mid-way left (their process is
// gone): temporary trees, and old trees renamed aside, except that an old
// tree whose OUT is missing (killed between the two renames of the
// fallback) is put back.
void RemoveStaleTemps(const fs::path& out) {
  std::error_code ec;
  std::string base = out.filename().string();
  fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    long pid = 0;
    bool old = false;
    std::string name = e.path().filename().string();
    if (!IsTempOf(base, name, &pid, &old) || pid == getpid()) continue;
    if (pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM)) continue;  // alive
    if (old && !fs::exists(fs::symlink_status(out, ec))) {
      fs::rename(e.path(), out, ec);
      if (!ec) continue;
    }
    stale.push_back(e.path());
  }
  for (const fs::path& p : stale) RemoveTree(p.string());
}

// Gives `dir` and every file in it the mode, owner and group of `like_dir`
// and of the file `like_file` (the tree being replaced).
Status CopyTreeAttributes(const std::string& like_dir, const std::string& like_file, const std::string& dir) {
  FileSystem* fs = FileSystem::Default();
  PathInfo d, f;
  KVFILE_RETURN_IF_ERROR(fs->Stat(like_dir, &d));
  KVFILE_RETURN_IF_ERROR(fs->Stat(like_file, &f));
  std::error_code ec;
  if (f.exists)
    for (const auto& e : fs::directory_iterator(dir, ec))
      KVFILE_RETURN_IF_ERROR(fs->CopyAttributes(f, e.path().string()));
  if (ec) return Status::IOError(dir + ": " + ec.message());
  return d.exists ? fs->CopyAttributes(d, dir) : Status::OK();
}

// rename(2) with renameat2's flags; false with errno EINVAL or ENOSYS where
// the file system or kernel has no such rename.
bool Rename2(const std::string& from, const std::string& to, unsigned flags) {
  return ::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), flags) == 0;
}



// One record entry of manifest.json as read: its fields, each kept only
// when it has the JSON type the import needs (its range is checked later).
struct ManifestRecord {
  enum : unsigned { kLayer = 1, kGroup = 2, kBegin = 4, kEnd = 8, kStream = 16, kKey = 32, kFile = 64, kAll = 127 };
  unsigned have = 0;
  uint64_t layer = 0, group = 0, begin = 0, end = 0;
  std::string stream, key, file;
};

// What an import uses of manifest.json, read as a stream of events
// (nlohmann's SAX interface, as safetensors::ParseHeader reads a header):
// the small top-level values as JSON ("format", "version", "source_dtype", "layers",
// "streams", "model_id", "fingerprint", "tokens"), "token_ids" straight
// into u32s and "records" into ManifestRecords; anything else is skipped
// unread. A DOM of a 24 MB manifest took 804 MiB; this keeps about the
// manifest's own size. A repeated key's last value counts, as in a DOM.
class ManifestReader final : public nlohmann::json_sax<json> {
 public:
  enum class ArrayState { kAbsent, kArray, kOther };

  bool null() override { return Value(json()); }
  bool boolean(bool b) override { return Value(json(b)); }
  bool number_integer(number_integer_t v) override { return Value(json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return Value(json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return Value(json(v)); }
  bool string(string_t& s) override { return Value(json(std::move(s))); }
  bool binary(binary_t&) override { return Value(json()); }  // not in JSON text
  bool start_object(std::size_t) override { return Open(true); }
  bool start_array(std::size_t) override { return Open(false); }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }
  bool key(string_t& k) override;
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    not_object_ = true;
    return false;
  }

  // False if the text is not JSON or not an object.
  bool Parse(const std::vector<uint8_t>& bytes) {
    try {
      json::sax_parse(bytes.begin(), bytes.end(), this);
    } catch (const std::bad_alloc&) {
      not_object_ = true;
    }
    return !not_object_;
  }
  // Reads only the top-level fields (format, version, streams, ...): the
  // token ids and the records are skipped unread, as for a sniff.
  void TopFieldsOnly() { top_only_ = true; }
  json& top() { return top_; }
  ArrayState token_ids_state() const { return tokens_state_; }
  uint64_t token_ids_seen() const { return tokens_seen_; }
  bool token_ids_u32() const { return tokens_u32_; }
  std::vector<uint32_t>& token_ids() { return tokens_; }
  ArrayState records_state() const { return records_state_; }
  std::vector<ManifestRecord>& records() { return records_; }

 private:
  enum class Mode { kNone, kKept, kTokens, kRecords, kSkipped };
  // Values a kept key's value may hold ("streams": at most 16 of 4 fields).
  static constexpr size_t kMaxKeptValues = 4096;

  static bool IsKept(const std::string& k) {
    for (const char* name :
         {"format", "version", "source_dtype", "layers", "streams", "model_id", "fingerprint", "tokens"})
      if (k == name) return true;
    return false;
  }
  bool Value(json v);
  void SetField(json v);  // of the record being read, from the value of inner_key_
  bool Open(bool object);
  bool Close();
  json* Store(json v);

  json top_ = json::object();
  bool not_object_ = false;
  int depth_ = 0;  // open objects and arrays
  Mode mode_ = Mode::kNone;
  bool top_only_ = false;
  std::string top_key_, inner_key_;
  std::vector<json*> build_;  // containers of a kept value being built
  size_t kept_values_ = 0;
  ArrayState tokens_state_ = ArrayState::kAbsent, records_state_ = ArrayState::kAbsent;
  uint64_t tokens_seen_ = 0;
  bool tokens_u32_ = true;
  std::vector<uint32_t> tokens_;
  std::vector<ManifestRecord> records_;
  ManifestRecord record_;
  bool in_record_ = false;
};

bool ManifestReader::key(string_t& k) {
  if (depth_ == 1) top_key_ = std::move(k);
  else inner_key_ = std::move(k);
  return true;
}

json* ManifestReader::Store(json v) {
  if (++kept_values_ > kMaxKeptValues) {  // too large for what the key holds: its value counts as invalid
    top_[top_key_] = json();
    build_.clear();
    mode_ = Mode::kSkipped;
    return nullptr;
  }
  json& in = *build_.back();
  if (in.is_array()) {
    in.push_back(std::move(v));
    return &in.back();
  }
  return &(in[inner_key_] = std::move(v));
}

bool ManifestReader::Value(json v) {
  if (depth_ == 0) {
    not_object_ = true;
    return false;
  }
  if (depth_ == 1) {
    if (top_key_ == "token_ids") tokens_state_ = ArrayState::kOther;
    else if (top_key_ == "records") records_state_ = ArrayState::kOther;
    else if (IsKept(top_key_)) top_[top_key_] = std::move(v);
    return true;
  }
  if (mode_ == Mode::kKept) {
    Store(std::move(v));
  } else if (mode_ == Mode::kTokens && depth_ == 2) {
    ++tokens_seen_;
    if (v.is_number_unsigned() && v.get<uint64_t>() <= UINT32_MAX) tokens_.push_back(v.get<uint32_t>());
    else tokens_u32_ = false;
  } else if (mode_ == Mode::kRecords && depth_ == 2) {
    records_.emplace_back();  // not an object: a record without fields
  } else if (mode_ == Mode::kRecords && depth_ == 3) {
    SetField(std::move(v));
  }
  return true;
}

void ManifestReader::SetField(json v) {
  ManifestRecord& r = record_;
  auto number = [&](unsigned bit, uint64_t* out) {
    r.have &= ~bit;
    if (v.is_number_unsigned()) *out = v.get<uint64_t>(), r.have |= bit;
  };
  auto text = [&](unsigned bit, std::string* out) {
    r.have &= ~bit;
    if (v.is_string()) *out = std::move(v.get_ref<std::string&>()), r.have |= bit;
  };
  if (inner_key_ == "layer") number(ManifestRecord::kLayer, &r.layer);
  else if (inner_key_ == "group_size") number(ManifestRecord::kGroup, &r.group);
  else if (inner_key_ == "begin") number(ManifestRecord::kBegin, &r.begin);
  else if (inner_key_ == "end") number(ManifestRecord::kEnd, &r.end);
  else if (inner_key_ == "stream") text(ManifestRecord::kStream, &r.stream);
  else if (inner_key_ == "key") text(ManifestRecord::kKey, &r.key);
  else if (inner_key_ == "file") text(ManifestRecord::kFile, &r.file);
}

bool ManifestReader::Open(bool object) {
  int d = depth_++;
  if (d == 0) {
    if (!object) {
      not_object_ = true;
      return false;
    }
  } else if (d == 1) {
    mode_ = Mode::kSkipped;
    if (top_only_ && (top_key_ == "token_ids" || top_key_ == "records")) {
      // skipped unread (TopFieldsOnly)
    } else if (top_key_ == "token_ids") {
      tokens_state_ = object ? ArrayState::kOther : ArrayState::kArray;
      tokens_.clear();
      tokens_seen_ = 0;
      tokens_u32_ = true;
      if (!object) mode_ = Mode::kTokens;
    } else if (top_key_ == "records") {
      records_state_ = object ? ArrayState::kOther : ArrayState::kArray;
      records_.clear();
      if (!object) mode_ = Mode::kRecords;
    } else if (IsKept(top_key_)) {
      json& v = top_[top_key_] = object ? json::object() : json::array();
      build_.assign(1, &v);
      kept_values_ = 0;
      mode_ = Mode::kKept;
    }
  } else if (mode_ == Mode::kKept) {
    if (json* c = Store(object ? json::object() : json::array())) build_.push_back(c);
  } else if (mode_ == Mode::kTokens && d == 2) {
    ++tokens_seen_;  // a container: not a token id
    tokens_u32_ = false;
  } else if (mode_ == Mode::kRecords && d == 2) {
    record_ = {};
    in_record_ = object;
    if (!object) records_.emplace_back();
  } else if (mode_ == Mode::kRecords && d == 3) {
    SetField(json());  // a container as a field's value: the field is invalid
  }
  return true;
}

bool ManifestReader::Close() {
  int d = --depth_;
  if (mode_ == Mode::kKept && !build_.empty()) build_.pop_back();
  if (mode_ == Mode::kRecords && d == 2 && in_record_) {
    records_.push_back(std::move(record_));
    in_record_ = false;
  }
  if (d == 1) mode_ = Mode::kNone;
  return true;
}


struct RecordRef {
  std::string file;
  uint32_t group = 0;
};

template <typename T>
bool GetUint(const json& j, const char* key, T max, T* out) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number_unsigned()) return false;
  uint64_t v = j[key].get<uint64_t>();
  if (v > static_cast<uint64_t>(max)) return false;
  *out = static_cast<T>(v);
  return true;
}

// The input directory of an import, opened once: the manifest and every
// record are opened relative to it (openat), so they all come from the
// directory the import began with, whatever another process renames over
// its path meanwhile (an export with --force exchanges whole directories,
// then removes the old one). Unchanged() tells whether the path still names
// that directory and the directory still exists: a record gone from it, or
// a path that names another directory by the end, makes the import refuse
// rather than write a file from either.
class ImportDir {
 public:
  ~ImportDir() {
    if (fd_ >= 0) ::close(fd_);
  }
  Status Open(const std::string& path) {
    path_ = path;
    fd_ = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd_ < 0) return ErrnoStatus(path, errno);
    if (::fstat(fd_, &st_) != 0) return ErrnoStatus(path + ": stat", errno);
    return Status::OK();
  }
  std::string PathOf(const std::string& name) const { return (fs::path(path_) / name).string(); }
  bool Exists(const std::string& name) const {
    struct stat st;
    return ::fstatat(fd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
  }
  // The whole file `name` of the directory, of at most `limit` bytes: not
  // a regular file, missing or larger is refused before anything is read.
  Status Read(const std::string& name, uint64_t limit, std::vector<uint8_t>* out) const {
    const std::string path = PathOf(name);
    int fd = ::openat(fd_, name.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO does not block
    if (fd < 0) return ErrnoStatus(path, errno);
    struct stat st;
    Status s = ::fstat(fd, &st) != 0 ? ErrnoStatus(path + ": stat", errno)
               : !S_ISREG(st.st_mode) ? NotRegular(path)
               : static_cast<uint64_t>(st.st_size) > limit
                   ? Status::Corruption(path + ": " + std::to_string(st.st_size) + " bytes; expected " +
                                        std::to_string(limit))
                   : Status::OK();
    if (s.ok()) {
      out->resize(static_cast<size_t>(st.st_size));
      for (size_t at = 0; s.ok() && at < out->size();) {
        ssize_t n = ::pread(fd, out->data() + at, out->size() - at, static_cast<off_t>(at));
        if (n > 0) at += static_cast<size_t>(n);
        else if (n == 0) s = Status::Corruption(path + ": unexpected end of file");
        else if (errno != EINTR) s = ErrnoStatus(path, errno);
      }
    }
    ::close(fd);
    return s;
  }
  // The file system's refusal of a file that is not a regular one ("not a
  // regular file (a FIFO)"), asked of it by path, so that the wording has
  // one owner.
  static Status NotRegular(const std::string& path) {
    std::unique_ptr<File> f;
    Status st = FileSystem::Default()->Open(path, OpenMode::kRead, &f);
    return st.ok() ? Status::InvalidArgument(path + ": not a regular file") : st;
  }
  // Busy (exit 2: no data is at fault) if the path names another directory
  // now, or this one was removed.
  Status Unchanged() const {
    struct stat now, still;
    if (::stat(path_.c_str(), &now) != 0 || now.st_dev != st_.st_dev || now.st_ino != st_.st_ino ||
        ::fstat(fd_, &still) != 0 || still.st_nlink == 0)
      return Status::Busy(path_ + ": changed while it was read (another process replaced or removed it); not converted");
    return Status::OK();
  }

 private:
  std::string path_;
  int fd_ = -1;
  struct stat st_ {};
};


// Whether `dir` holds a manifest.json of the format this driver writes.
bool IsMooncakeDir(const std::string& dir) {
  ImportDir d;
  std::vector<uint8_t> bytes;
  if (!d.Open(dir).ok() || !d.Read(kManifest, kMaxManifestBytes, &bytes).ok()) return false;
  ManifestReader reader;
  reader.TopFieldsOnly();  // the import reads the rest
  if (!reader.Parse(bytes)) return false;
  const json& j = reader.top();
  return j.contains("format") && j["format"] == kManifestFormat;
}

// ---- .kv -> directory ----------------------------------------------------------------------

// The first `tokens` tokens of `in` (named in_name) -> a new directory `dir`.
Status ExportKv(Reader& in, const std::string& in_name, uint64_t tokens, const ConvertOptions& o,
                const std::string& dir, ConvertReport* report) {
  const std::optional<uint32_t>& group_size = o.mooncake.group_size;
  if (group_size && *group_size == 0) return Status::InvalidArgument("--group-size must be at least 1");
  Reader* r = &in;
  std::string rotation;  // rows of a llama.cpp import that may be rotated (llama_driver.cc)
  KVFILE_RETURN_IF_ERROR(CheckPlainRows(in_name, *r, &rotation));
  const Geometry& g = r->geometry();
  json streams = json::array(), skipped = json::array(), records = json::array();
  std::vector<uint32_t> fp8;
  for (uint32_t s = 0; s < g.streams.size(); ++s) {
    const StreamSpec& spec = g.streams[s];
    if (IsFp8(spec.dtype)) {
      fp8.push_back(s);
      streams.push_back({{"name", spec.name},
                         {"rows_per_token", spec.rows_per_token},
                         {"row_width", spec.row_width},
                         {"dtype", DtypeName(spec.dtype)}});
    } else {
      skipped.push_back(spec.name);
    }
  }
  if (fp8.empty()) return Status::InvalidArgument(in_name + ": no fp8 stream: Mooncake records hold e4m3 codes");
  for (uint32_t s : fp8)
    if (!g.streams[s].layers.empty())
      return Status::InvalidArgument(in_name + ": stream '" + g.streams[s].name +
                                     "' is in some layers only; a Mooncake manifest has every stream in every layer");
  uint64_t exact = 0, requantized = 0;
  std::vector<uint8_t> codes, rec;
  std::vector<float> scales;
  std::vector<uint16_t> values;
  std::error_code ec;
  if (!fs::create_directory(dir, ec)) return Status::IOError(dir + ": " + ec.message());
  const uint64_t fp = r->identity().fingerprint;
  const std::string label = "export " + in_name;
  for (const ChunkInfo& c : r->chunks()) {
    // Each chunk's live tokens below `tokens` (a salvaged prefix may end inside one).
    if (c.live_tokens == 0 || c.first_token >= tokens) continue;
    uint64_t b = c.first_token, e = std::min(b + c.live_tokens, tokens);
    for (uint32_t l = 0; l < g.layers; ++l) {
      for (uint32_t s : fp8) {
        KVFILE_RETURN_IF_ERROR(CheckInterrupted(o, report->out_name));
        const StreamSpec& spec = g.streams[s];
        uint32_t group = group_size.value_or(spec.row_width);
        mooncake::RecordDesc d;
        d.dtype = mooncake::SourceDtype::kBF16;
        d.group_size = group;
        d.shape = {e - b, spec.rows_per_token, spec.row_width};
        uint64_t rows = (e - b) * spec.rows_per_token, n = rows * spec.row_width;
        Status st;
        if (spec.dtype == Dtype::kE4M3 && group == spec.row_width) {
          // One group per row: the codes and scales move as stored.
          codes.resize(n);
          scales.resize(rows);
          KVFILE_RETURN_IF_ERROR(r->ReadCodes(l, s, b, e, codes.data(), scales.data()));
          st = mooncake::EncodeCodes(d, scales.data(), codes.data(), &rec);
          ++exact;
        } else {
          values.resize(n);
          KVFILE_RETURN_IF_ERROR(r->ReadRows(l, s, b, e, Dtype::kBF16, values.data()));
          st = mooncake::EncodeValues(d, values.data(), &rec);
          ++requantized;
        }
        if (!st.ok()) return st.WithContext(in_name);
        std::string key = LogicalKey(fp, spec.name, l, b, e);
        std::string file = mooncake::FileNameForKey(mooncake::RepresentationKey(group, key));
        KVFILE_RETURN_IF_ERROR(WriteWhole((fs::path(dir) / file).string(), rec.data(), rec.size()));
        records.push_back({{"key", key}, {"file", file}, {"layer", l}, {"stream", spec.name}, {"begin", b},
                           {"end", e}, {"group_size", group}});
      }
    }
    Progress(o, label, e, tokens);
  }
  json m = {{"format", kManifestFormat},
            {"version", kManifestVersion},
            {"model_id", r->identity().model_id},
            {"fingerprint", safetensors::FingerprintHex(fp)},
            {"source_dtype", "bf16"},
            {"layers", g.layers},
            {"tokens", tokens},
            {"streams", streams},
            {"skipped_raw_streams", skipped},
            {"token_ids", std::vector<uint32_t>(r->tokens().begin(), r->tokens().begin() + tokens)},
            {"records", records}};
  std::string text = m.dump(1, ' ', false, json::error_handler_t::replace) + "\n";
  KVFILE_RETURN_IF_ERROR(WriteWhole((fs::path(dir) / kManifest).string(), text.data(), text.size()));
  KVFILE_RETURN_IF_ERROR(FileSystem::Default()->SyncDir(dir));
  report->tokens = tokens;
  report->summary = std::to_string(records.size()) + " Mooncake records (" + std::to_string(exact) +
                    " with codes and scales as stored, " + std::to_string(requantized) + " requantized), " +
                    std::to_string(tokens) + " tokens";
  std::string parts;
  if (requantized > 0)
    parts = std::to_string(requantized) + " records decoded and requantized (lossy: " +
            (group_size ? "--group-size " + std::to_string(*group_size) + " is not the row width, or " : "") +
            "a stream is not e4m3)";
  if (!skipped.empty())
    parts += (parts.empty() ? "" : "; ") + std::string("raw streams not exported (Mooncake records are fp8): ") +
             skipped.dump();
  std::string note = parts.empty() ? "" : report->out_name + ": " + parts;
  if (!rotation.empty()) note = note.empty() ? rotation : note + "; " + rotation;
  if (!note.empty()) report->notes.push_back(std::move(note));
  return Status::OK();
}


// ---- directory -> .kv ------------------------------------------------------------------------

Status ImportFrom(const std::string& in, const ConvertOptions& o, const ImportDir& dir, const std::string& kv_path,
                  ConvertReport* report);

// IN (a record directory) -> a new .kv at kv_path.
Status ImportKv(const std::string& in, const ConvertOptions& o, const std::string& kv_path, ConvertReport* report) {
  if (o.dtype || !o.keep_raw.empty() || o.kv_major != 2)
    return Status::InvalidArgument(in + ": a Mooncake directory is imported as its e4m3 codes into a format 2 .kv "
                                   "file: a dtype, raw streams or format 1 do not apply");
  ImportDir dir;
  KVFILE_RETURN_IF_ERROR(dir.Open(in));
  Status st = ImportFrom(in, o, dir, kv_path, report);
  // A failure that another process's change of the directory explains is
  // reported as that change, and so is a success that read a directory the
  // path no longer names.
  Status changed = dir.Unchanged();
  return changed.ok() ? st : changed;
}

Status ImportFrom(const std::string& in, const ConvertOptions& o, const ImportDir& dir, const std::string& kv_path,
                  ConvertReport* report) {
  std::string mpath = dir.PathOf(kManifest);
  auto bad = [&mpath](const std::string& why) { return Status::Corruption(mpath + ": " + why); };
  ManifestReader reader;
  {
    std::vector<uint8_t> bytes;
    KVFILE_RETURN_IF_ERROR(dir.Read(kManifest, kMaxManifestBytes, &bytes));
    if (!reader.Parse(bytes)) return bad("not a JSON object");
  }
  json& m = reader.top();
  uint32_t version = 0;
  if (!GetUint(m, "version", UINT32_MAX, &version) || version != kManifestVersion)
    return bad("\"version\" is not 1");
  // Every record's dtype byte must say the same (Mooncake's decoder refuses
  // a record whose dtype is not the one the caller gives).
  const json* sd = m.contains("source_dtype") ? &m["source_dtype"] : nullptr;
  if (!sd || !sd->is_string() || (*sd != "fp16" && *sd != "bf16"))
    return bad("\"source_dtype\" is not \"fp16\" or \"bf16\"");
  const mooncake::SourceDtype source = *sd == "fp16" ? mooncake::SourceDtype::kF16 : mooncake::SourceDtype::kBF16;
  Geometry g;
  if (!GetUint(m, "layers", UINT32_MAX, &g.layers)) return bad("\"layers\" is not an unsigned integer");
  if (!m.contains("streams") || !m["streams"].is_array() || m["streams"].size() > 16)
    return bad("\"streams\" is not an array of at most 16 streams");
  for (const json& s : m["streams"]) {
    StreamSpec spec;
    if (!s.is_object() || !s.contains("name") || !s["name"].is_string()) return bad("a stream without a name");
    spec.name = s["name"].get<std::string>();
    if (!GetUint(s, "rows_per_token", UINT32_MAX, &spec.rows_per_token) ||
        !GetUint(s, "row_width", UINT32_MAX, &spec.row_width))
      return bad("stream '" + spec.name + "': rows_per_token and row_width must be unsigned integers");
    spec.dtype = Dtype::kE4M3;
    g.streams.push_back(spec);
  }
  Status st = g.Validate();
  if (!st.ok()) return bad(st.message());
  ModelIdentity id;
  if (!m.contains("model_id") || !m["model_id"].is_string()) return bad("\"model_id\" is not a string");
  id.model_id = m["model_id"].get<std::string>();
  if (id.model_id.size() > 255) return bad("\"model_id\" is longer than 255 bytes");
  if (!m.contains("fingerprint") || !m["fingerprint"].is_string() ||
      !safetensors::ParseFingerprint(m["fingerprint"].get<std::string>(), &id.fingerprint))
    return bad("\"fingerprint\" is not 16 hex digits");
  uint64_t T = 0;
  if (!GetUint(m, "tokens", UINT64_MAX, &T)) return bad("\"tokens\" is not an unsigned integer");
  if (reader.token_ids_state() != ManifestReader::ArrayState::kArray || reader.token_ids_seen() != T)
    return bad("\"token_ids\" is not an array of \"tokens\" ids");
  if (!reader.token_ids_u32()) return bad("a token id is not a u32");
  std::vector<uint32_t> ids = std::move(reader.token_ids());
  // Records by token range, then (layer, stream).
  std::map<std::pair<uint64_t, uint64_t>, std::map<std::pair<uint32_t, uint32_t>, RecordRef>> ranges;
  if (reader.records_state() != ManifestReader::ArrayState::kArray) return bad("\"records\" is not an array");
  for (ManifestRecord& rj : reader.records()) {
    if (rj.have != ManifestRecord::kAll || rj.layer > UINT32_MAX || rj.group > UINT32_MAX)
      return bad("a record entry lacks layer, stream, begin, end, group_size, key or file");
    const uint32_t layer = static_cast<uint32_t>(rj.layer), group = static_cast<uint32_t>(rj.group);
    const uint64_t b = rj.begin, e = rj.end;
    const std::string& key = rj.key;
    std::optional<uint32_t> s = g.FindStream(rj.stream);
    if (!s) return bad("a record of stream '" + rj.stream + "', which \"streams\" does not list");
    if (layer >= g.layers || b >= e || e > T || group == 0)
      return bad("record '" + key + "': layer, token range or group size out of range");
    if (rj.file != mooncake::FileNameForKey(mooncake::RepresentationKey(group, key)))
      return bad("record '" + key + "': file '" + rj.file + "' is not the name of its representation key");
    auto& slot = ranges[{b, e}][{layer, *s}];
    if (!slot.file.empty()) return bad("record '" + key + "': a second record for the same layer, stream and tokens");
    slot = {std::move(rj.file), group};
  }
  reader.records().clear();
  reader.records().shrink_to_fit();
  uint64_t next = 0;
  for (const auto& [range, recs] : ranges) {
    if (range.first != next)
      return bad("the records' token ranges do not tile [0, " + std::to_string(T) + ") (gap or overlap at token " +
                 std::to_string(std::min(range.first, next)) + ")");
    if (recs.size() != uint64_t{g.layers} * g.streams.size())
      return bad("tokens [" + std::to_string(range.first) + ", " + std::to_string(range.second) + ") have " +
                 std::to_string(recs.size()) + " records, not one per layer and stream");
    next = range.second;
  }
  if (next != T) return bad("the records end at token " + std::to_string(next) + " of " + std::to_string(T));
  WriterOptions wo;
  wo.threads = 0;  // quantize on every core (the bytes do not depend on it)
  wo.chunk_tokens = ChunkTokens(o, g, 256, in);
  std::unique_ptr<Writer> w;
  KVFILE_RETURN_IF_ERROR(Writer::Create(kv_path, g, id, wo, &w));
  const std::string label = "import " + in;
  size_t S = g.streams.size();
  uint64_t exact = 0, requantized = 0;
  std::vector<std::vector<uint8_t>> files(g.layers * S);
  std::vector<std::vector<float>> scales(g.layers * S);
  std::vector<std::vector<uint16_t>> values(g.layers * S);
  for (const auto& [range, recs] : ranges) {
    uint64_t n = range.second - range.first;
    AppendBatch batch;
    batch.tokens = std::span<const uint32_t>(ids).subspan(range.first, n);
    for (const auto& [ls, ref] : recs) {
      KVFILE_RETURN_IF_ERROR(CheckInterrupted(o, in));
      const StreamSpec& spec = g.streams[ls.second];
      size_t i = ls.first * S + ls.second;
      std::string path = dir.PathOf(ref.file);
      mooncake::RecordDesc want;
      want.group_size = ref.group;
      want.shape = {n, spec.rows_per_token, spec.row_width};
      uint64_t elements = 0, size = 0;
      st = mooncake::RecordSize(want, &elements, &size);
      if (!st.ok()) return Status::Corruption(path + ": " + st.message());
      if (!dir.Exists(ref.file)) return Status::Corruption(path + ": missing (the manifest lists it)");
      KVFILE_RETURN_IF_ERROR(dir.Read(ref.file, size, &files[i]));
      mooncake::RecordView v;
      st = mooncake::ParseRecord(files[i], &v);
      if (!st.ok()) return Status::Corruption(path + ": " + st.message());
      if (v.desc.shape != want.shape || v.desc.group_size != ref.group)
        return Status::Corruption(path + ": shape or group size differ from the manifest's");
      if (v.desc.dtype != source)
        return Status::Corruption(path + ": the record's source dtype is " + mooncake::SourceDtypeName(v.desc.dtype) +
                                  ", the manifest's source_dtype is " + mooncake::SourceDtypeName(source));
      uint64_t beyond = mooncake::FindGroupBeyondDtype(v);
      if (beyond < v.groups)
        return Status::Corruption(path + ": group " + std::to_string(beyond) +
                                  " holds a value beyond the range of its source dtype " +
                                  mooncake::SourceDtypeName(v.desc.dtype));
      uint64_t rows = n * spec.rows_per_token;
      scales[i].resize(v.groups);
      for (uint64_t k = 0; k < v.groups; ++k) scales[i][k] = v.scale(k);
      if (ref.group == spec.row_width && codec::FindInvalidScale(scales[i].data(), rows) == rows) {
        batch.blocks.push_back({Dtype::kE4M3, v.codes, scales[i].data()});
        ++exact;
      } else {
        // Groups that are not rows, or a scale below FLT_MIN (Mooncake has
        // no floor): decode and let the writer quantize with kvfile's rule.
        values[i].resize(elements);
        mooncake::DecodeValues(v, values[i].data());
        batch.blocks.push_back(
            {v.desc.dtype == mooncake::SourceDtype::kF16 ? Dtype::kF16 : Dtype::kBF16, values[i].data(), nullptr});
        ++requantized;
      }
    }
    // blocks must be in (layer, stream) order: the map iterates that way.
    st = w->Append(batch);
    if (!st.ok()) return st.WithContext(in);
    Progress(o, label, range.second, T);
  }
  KVFILE_RETURN_IF_ERROR(w->Close());
  report->tokens = T;
  report->summary = std::to_string(exact + requantized) + " Mooncake records (" + std::to_string(exact) +
                    " with codes and scales as stored, " + std::to_string(requantized) + " requantized), " +
                    std::to_string(T) + " tokens";
  if (requantized > 0)
    report->notes.push_back(in + ": " + std::to_string(requantized) +
                            " records decoded and requantized with kvfile's row rule (lossy: groups are not rows, or "
                            "a scale is below FLT_MIN)");
  return Status::OK();
}


// A directory whose manifest.json says this format, or one whose
// manifest.json is not a regular file (a FIFO): the import refuses that
// with one line, rather than the directory being taken for something else.
bool Sniff(std::span<const uint8_t>, const std::string& path, bool dir) {
  if (!dir) return false;
  std::error_code ec;
  fs::path m = fs::path(path) / kManifest;
  return IsMooncakeDir(path) || (fs::exists(fs::symlink_status(m, ec)) && !fs::is_regular_file(m, ec));
}

// What BeginDirectoryOutput found, for CommitDirectoryOutput: by temporary
// directory (a Convert runs Begin, the export, then Commit in one thread;
// several may run at once).
struct PendingOutput {
  std::string target;  // OUT with symlinks followed
  bool exists = false;
  PathInfo original;   // what OUT was at Begin
};
std::mutex pending_mu;
std::map<std::string, PendingOutput>& Pending() {
  static std::map<std::string, PendingOutput> pending;
  return pending;
}

}  // namespace

// The directory formats are Mooncake's only: `d` is its driver.
Status BeginDirectoryOutput(const Driver&, const std::string& out_name, bool force, std::string* tmp_dir) {
  // A symlink OUT: its final target is what gets replaced, as for files.
  std::string target;
  KVFILE_RETURN_IF_ERROR(FileSystem::Default()->ResolveSymlinks(out_name, &target));
  fs::path out = fs::path(target).lexically_normal();
  if (out.filename().empty()) out = out.parent_path();
  RemoveStaleTemps(out);
  std::error_code ec;
  PendingOutput p;
  p.target = out.string();
  p.exists = fs::exists(fs::symlink_status(out, ec));
  KVFILE_RETURN_IF_ERROR(FileSystem::Default()->Stat(p.target, &p.original));
  if (p.exists) {
    if (!force) return Status::InvalidArgument(out_name + ": exists; use --force to replace it");
    if (!fs::is_directory(fs::symlink_status(out, ec)) || !IsMooncakeDir(p.target))
      return Status::InvalidArgument(out_name +
                                     ": exists and is not a Mooncake directory written by kvfile convert; not replaced");
  }
  *tmp_dir = TempPathFor(p.target, ".kvtmp-" + std::to_string(getpid()));
  RemoveTree(*tmp_dir);
  std::lock_guard<std::mutex> lock(pending_mu);
  Pending()[*tmp_dir] = std::move(p);
  return Status::OK();
}

Status CommitDirectoryOutput(const Driver&, const std::string& tmp_dir, const std::string& out_name) {
  PendingOutput p;
  {
    std::lock_guard<std::mutex> lock(pending_mu);
    auto it = Pending().find(tmp_dir);
    if (it == Pending().end())
      return Status::InvalidArgument(tmp_dir + ": no BeginDirectoryOutput for this directory");
    p = std::move(it->second);
    Pending().erase(it);
  }
  const fs::path out = p.target;
  const std::string parent = out.has_parent_path() ? out.parent_path().string() : ".";
  std::error_code ec;
  if (p.exists) KVFILE_RETURN_IF_ERROR(CopyTreeAttributes(p.target, (out / kManifest).string(), tmp_dir));
  if (p.exists && Rename2(tmp_dir, p.target, RENAME_EXCHANGE)) {
    // OUT is the new tree; the old one, now under the temporary name, is
    // removed, unless it is not the one Begin checked.
    PathInfo swapped;
    Status st = FileSystem::Default()->Stat(tmp_dir, &swapped);
    if (!st.ok() || !(swapped.id == p.original.id)) {
      // Swapped back; else both stay, rather than remove the wrong one: the
      // other tree leaves the temporary name, which the caller removes.
      if (!Rename2(tmp_dir, p.target, RENAME_EXCHANGE))
        fs::rename(tmp_dir, TempPathFor(p.target, ".kvkept-" + std::to_string(getpid())), ec);
      return st.ok() ? Status::Busy(out_name + ": replaced by another process while the new directory was "
                                               "written; not replaced")
                     : st;
    }
    RemoveTree(tmp_dir);
  } else if (p.exists && errno != EINVAL && errno != ENOSYS) {
    return ErrnoStatus(out_name + ": rename into place", errno);
  } else {
    std::string old;
    if (p.exists) {
      old = TempPathFor(p.target, ".kvold-" + std::to_string(getpid()));
      RemoveTree(old);
      fs::rename(out, old, ec);
      if (ec) return Status::IOError(out_name + ": cannot move the old directory aside: " + ec.message());
    }
    // Not over a directory made meanwhile (rename(2) replaces an empty one).
    bool renamed = Rename2(tmp_dir, p.target, RENAME_NOREPLACE);
    if (!renamed && (errno == EINVAL || errno == ENOSYS)) {
      fs::rename(tmp_dir, out, ec);
      renamed = !ec;
      if (ec) errno = ec.value();
    }
    if (!renamed) {
      int err = errno;
      std::error_code ec2;
      if (p.exists) fs::rename(old, out, ec2);
      return ErrnoStatus(out_name + ": rename into place", err);
    }
    if (!old.empty()) RemoveTree(old);
  }
  return FileSystem::Default()->SyncDir(parent);
}

// Found by its manifest (a directory has no suffix to go by).
extern const Driver kMooncakeDriver = {Format::kMooncake, true, nullptr, Sniff, ImportKv, ExportKv};

}  // namespace kvfile::convert
