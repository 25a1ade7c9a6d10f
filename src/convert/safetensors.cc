// SPDX-License-Identifier: Apache-2.0
// The safetensors reader and writer, and the kvfile convention on top of them
// (see safetensors.h).
#include "kvfile/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>

#include "codec/dtype_codec.h"
#include "codec/row_check.h"
#include "kvfile/codec.h"
#include "format/endian.h"
#include "format/geometry.h"
#include "kvfile/writer.h"

namespace kvfile::safetensors {

// Tensor data is little-endian; rows are handed to the codec as they are read.
static_assert(std::endian::native == std::endian::little,
              "the safetensors reader hands tensor bytes to the codec as they are");

namespace {

// The format's element types, and the one mapping between them and
// kvfile::Dtype (KvDtypeOf, DTypeOf): the kvfile Dtype of the five that
// have one.
struct DTypeEntry {
  DType dtype;
  const char* name;
  size_t size;
  std::optional<Dtype> kv;
};

constexpr DTypeEntry kDTypes[] = {
    {DType::kBool, "BOOL", 1, std::nullopt},
    {DType::kU8, "U8", 1, std::nullopt},
    {DType::kI8, "I8", 1, std::nullopt},
    {DType::kF8E5M2, "F8_E5M2", 1, Dtype::kE5M2},
    {DType::kF8E4M3, "F8_E4M3", 1, Dtype::kE4M3},
    {DType::kF8E8M0, "F8_E8M0", 1, std::nullopt},
    {DType::kI16, "I16", 2, std::nullopt},
    {DType::kU16, "U16", 2, std::nullopt},
    {DType::kF16, "F16", 2, Dtype::kF16},
    {DType::kBF16, "BF16", 2, Dtype::kBF16},
    {DType::kI32, "I32", 4, std::nullopt},
    {DType::kU32, "U32", 4, std::nullopt},
    {DType::kF32, "F32", 4, Dtype::kF32},
    {DType::kC64, "C64", 8, std::nullopt},
    {DType::kF64, "F64", 8, std::nullopt},
    {DType::kI64, "I64", 8, std::nullopt},
    {DType::kU64, "U64", 8, std::nullopt},
};

// Newer versions of the format define packed sub-byte types; a byte-level
// tensor layout cannot describe them, so they are refused as unsupported.
constexpr int kMaxJsonDepth = 128;
// The values (numbers, strings, arrays) one tensor entry's known fields may
// hold: a shape of up to a thousand dimensions.
constexpr size_t kMaxEntryValues = 1024;

bool IsSubByteDType(std::string_view name) {
  return name == "F4" || name == "F6_E2M3" || name == "F6_E3M2";
}

std::string Quote(std::string_view s) { return "'" + std::string(s) + "'"; }

bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

// nlohmann's messages start with "[json.exception.parse_error.101] ".
std::string CleanJsonError(const char* what) {
  std::string s = what;
  if (!s.empty() && s[0] == '[') {
    size_t close = s.find("] ");
    if (close != std::string::npos) s = s.substr(close + 2);
  }
  return s;
}

// Reads a JSON unsigned integer, refusing negatives, fractions and
// numbers beyond u64 (which the JSON library reads as floating point).
bool GetUnsigned(const nlohmann::json& v, uint64_t* out) {
  if (!v.is_number_unsigned()) return false;
  *out = v.get<uint64_t>();
  return true;
}

std::string JsonText(const nlohmann::json& v) {
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

Status ParseTensor(const std::string& name, const nlohmann::json& v, uint64_t data_bytes, TensorInfo* t) {
  std::string where = "tensor " + Quote(name);
  if (!v.is_object()) return Status::Corruption(where + ": entry is not a JSON object");
  auto dtype_it = v.find("dtype");
  auto shape_it = v.find("shape");
  auto offsets_it = v.find("data_offsets");
  if (dtype_it == v.end()) return Status::Corruption(where + ": no \"dtype\"");
  if (shape_it == v.end()) return Status::Corruption(where + ": no \"shape\"");
  if (offsets_it == v.end()) return Status::Corruption(where + ": no \"data_offsets\"");
  if (!dtype_it->is_string()) return Status::Corruption(where + ": \"dtype\" is not a string");
  const std::string& dtype = dtype_it->get_ref<const std::string&>();
  t->name = name;
  if (!ParseDType(dtype, &t->dtype)) {
    if (IsSubByteDType(dtype))
      return Status::Unsupported(where + ": sub-byte dtype " + Quote(dtype) + " is not supported");
    return Status::Corruption(where + ": unknown dtype " + Quote(dtype));
  }
  if (!shape_it->is_array()) return Status::Corruption(where + ": \"shape\" is not an array");
  t->shape.clear();
  uint64_t elements = 1;
  for (const auto& d : *shape_it) {
    uint64_t dim;
    if (!GetUnsigned(d, &dim))
      return Status::Corruption(where + ": shape dimension " + JsonText(d) + " is not an unsigned integer");
    t->shape.push_back(dim);
    if (MulOverflows(elements, dim, &elements))
      return Status::Corruption(where + ": shape " + JsonText(*shape_it) + " overflows 64 bits");
  }
  t->elements = elements;
  uint64_t bytes;
  if (MulOverflows(elements, DTypeSize(t->dtype), &bytes))
    return Status::Corruption(where + ": shape " + JsonText(*shape_it) + " of " + dtype +
                              " overflows 64 bits of bytes");
  if (!offsets_it->is_array() || offsets_it->size() != 2 || !GetUnsigned((*offsets_it)[0], &t->begin) ||
      !GetUnsigned((*offsets_it)[1], &t->end))
    return Status::Corruption(where + ": \"data_offsets\" " + JsonText(*offsets_it) +
                              " is not two unsigned integers");
  std::string range = "data_offsets [" + std::to_string(t->begin) + ", " + std::to_string(t->end) + ")";
  if (t->begin > t->end) return Status::Corruption(where + ": " + range + " ends before it begins");
  if (t->end > data_bytes)
    return Status::Corruption(where + ": " + range + " outside the data region of " +
                              std::to_string(data_bytes) + " bytes");
  if (t->end - t->begin != bytes)
    return Status::Corruption(where + ": " + range + " holds " + std::to_string(t->end - t->begin) +
                              " bytes; shape " + JsonText(*shape_it) + " of " + dtype + " needs " +
                              std::to_string(bytes));
  return Status::OK();
}

}  // namespace

const char* DTypeName(DType d) {
  for (const DTypeEntry& e : kDTypes)
    if (e.dtype == d) return e.name;
  return "?";
}

size_t DTypeSize(DType d) {
  for (const DTypeEntry& e : kDTypes)
    if (e.dtype == d) return e.size;
  return 1;
}

bool ParseDType(std::string_view name, DType* out) {
  for (const DTypeEntry& e : kDTypes)
    if (name == e.name) {
      *out = e.dtype;
      return true;
    }
  return false;
}

std::optional<Dtype> KvDtypeOf(DType d) {
  for (const DTypeEntry& e : kDTypes)
    if (e.dtype == d) return e.kv;
  return std::nullopt;
}

DType DTypeOf(Dtype d) {
  for (const DTypeEntry& e : kDTypes)
    if (e.kv == d) return e.dtype;
  return DType::kBF16;
}

const TensorInfo* Header::Find(std::string_view name) const {
  for (const TensorInfo& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

namespace {

// The header read as a stream of events (nlohmann's SAX interface), in one
// pass and keeping only what the importer uses: tensor names, each entry's
// "dtype", "shape" and "data_offsets", and the metadata strings. A DOM of
// the whole header cost 20-30 bytes of memory per byte of a header of
// short keys; here memory is bounded by the caps below and the bytes of
// what is kept. Unknown keys of an entry are skipped unread, as the
// reference parser ignores them (their nesting is still bounded).
// Duplicates are refused where they would be ambiguous: tensor names,
// metadata keys and an entry's own fields. After the first error the rest
// is only lexed, so that a header that is not JSON is reported as such.
class HeaderReader final : public nlohmann::json_sax<nlohmann::json> {
 public:
  using json = nlohmann::json;
  explicit HeaderReader(uint64_t data_bytes) : data_bytes_(data_bytes) {}

  bool null() override { return Scalar([] { return json(); }); }
  bool boolean(bool b) override { return Scalar([b] { return json(b); }); }
  bool number_integer(number_integer_t v) override { return Scalar([v] { return json(v); }); }
  bool number_unsigned(number_unsigned_t v) override { return Scalar([v] { return json(v); }); }
  bool number_float(number_float_t v, const string_t&) override { return Scalar([v] { return json(v); }); }
  bool string(string_t& s) override;
  bool binary(binary_t&) override { return Scalar([] { return json(); }); }  // not in JSON text
  bool start_object(std::size_t) override { return Open(true); }
  bool start_array(std::size_t) override { return Open(false); }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }
  bool key(string_t& k) override;
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    syntax_error_ = CleanJsonError(e.what());
    return false;
  }

  bool too_deep() const { return too_deep_; }
  const std::string& syntax_error() const { return syntax_error_; }
  const Status& error() const { return error_; }
  Header& header() { return header_; }

 private:
  enum class Section { kNone, kMetadata, kTensor, kSkipped };
  static constexpr const char* kFields[] = {"dtype", "shape", "data_offsets"};

  bool failed() const { return !error_.ok(); }
  void Fail(Status st) {
    if (!failed()) error_ = std::move(st);
    build_.clear();
    section_ = Section::kSkipped;
  }
  std::string Where() const { return "tensor " + Quote(key_); }
  // Adds a value of a known field (at depth 2 or inside one being built).
  json* Store(json v);
  template <typename Make>
  bool Scalar(Make make);
  bool Open(bool object);
  bool Close();

  uint64_t data_bytes_;
  Header header_;
  Status error_;
  std::string syntax_error_;
  bool too_deep_ = false;
  int depth_ = 0;                  // open objects and arrays
  Section section_ = Section::kNone;
  std::string key_;                // the current top-level key
  std::set<std::string> names_;    // top-level keys so far
  std::string meta_key_;           // the current __metadata__ key
  int field_ = -1;                 // the current entry key's index in kFields, or -1 (skipped)
  json entry_;                     // the current tensor entry's known fields
  size_t entry_values_ = 0;
  std::vector<json*> build_;       // containers of a known field being built
  std::string build_key_;          // the current key in the innermost of them
};

nlohmann::json* HeaderReader::Store(json v) {
  if (++entry_values_ > kMaxEntryValues) {
    Fail(Status::Corruption(Where() + ": entry holds more than " + std::to_string(kMaxEntryValues) + " values"));
    return nullptr;
  }
  if (build_.empty()) return &(entry_[kFields[field_]] = std::move(v));
  json& top = *build_.back();
  if (top.is_array()) {
    top.push_back(std::move(v));
    return &top.back();
  }
  return &(top[build_key_] = std::move(v));
}

template <typename Make>
bool HeaderReader::Scalar(Make make) {
  if (failed() || section_ == Section::kSkipped) return true;
  if (depth_ == 0) {
    Fail(Status::Corruption("header is not a JSON object"));
  } else if (depth_ == 1) {
    Fail(Status::Corruption(key_ == "__metadata__" ? std::string("__metadata__ is not a JSON object")
                                                   : Where() + ": entry is not a JSON object"));
  } else if (depth_ == 2 && section_ == Section::kMetadata) {
    Fail(Status::Corruption("__metadata__ value of " + Quote(meta_key_) + " is not a string"));
  } else if (section_ == Section::kTensor && (depth_ == 2 ? field_ >= 0 : !build_.empty())) {
    Store(make());
  }
  return true;
}

bool HeaderReader::string(string_t& s) {
  if (!failed() && depth_ == 2 && section_ == Section::kMetadata) {
    header_.metadata.emplace(meta_key_, std::move(s));
    return true;
  }
  return Scalar([&s] { return json(std::move(s)); });
}

bool HeaderReader::key(string_t& k) {
  if (failed()) return true;
  if (depth_ == 1) {
    if (!names_.insert(k).second) {
      Fail(Status::Corruption("tensor " + Quote(k) + " appears twice in the header"));
    } else if (names_.size() > kMaxTensors + 1) {  // + 1: __metadata__
      Fail(Status::Corruption("header lists more than " + std::to_string(kMaxTensors) + " tensors"));
    } else {
      key_ = std::move(k);
    }
  } else if (depth_ == 2 && section_ == Section::kMetadata) {
    if (header_.metadata.contains(k)) {
      Fail(Status::Corruption("duplicate key " + Quote(k) + " in the header"));
    } else if (header_.metadata.size() >= kMaxMetadataEntries) {
      Fail(Status::Corruption("__metadata__ holds more than " + std::to_string(kMaxMetadataEntries) + " entries"));
    } else {
      meta_key_ = std::move(k);
    }
  } else if (depth_ == 2 && section_ == Section::kTensor) {
    field_ = -1;
    for (int i = 0; i < 3; ++i)
      if (k == kFields[i]) field_ = i;
    if (field_ >= 0 && entry_.contains(k)) Fail(Status::Corruption("duplicate key " + Quote(k) + " in the header"));
  } else if (!build_.empty()) {
    build_key_ = std::move(k);
  }
  return true;
}

bool HeaderReader::Open(bool object) {
  // Nesting is bounded as in the format's reference parser (128 levels; a
  // header needs 3): a deep header stops the parse at once.
  if (depth_ >= kMaxJsonDepth) {
    too_deep_ = true;
    return false;
  }
  int d = depth_++;
  if (failed() || (d > 0 && section_ == Section::kSkipped)) return true;
  if (d == 0) {
    if (!object) Fail(Status::Corruption("header is not a JSON object"));
  } else if (d == 1) {
    if (key_ == "__metadata__") {
      if (object) section_ = Section::kMetadata;
      else Fail(Status::Corruption("__metadata__ is not a JSON object"));
    } else if (object) {
      section_ = Section::kTensor;
      entry_ = json::object();
      entry_values_ = 0;
      field_ = -1;
    } else {
      Fail(Status::Corruption(Where() + ": entry is not a JSON object"));
    }
  } else if (d == 2 && section_ == Section::kMetadata) {
    Fail(Status::Corruption("__metadata__ value of " + Quote(meta_key_) + " is not a string"));
  } else if (section_ == Section::kTensor && (d == 2 ? field_ >= 0 : !build_.empty())) {
    json* c = Store(object ? json::object() : json::array());
    if (c != nullptr) build_.push_back(c);
  }  // else an unknown key's value, skipped
  return true;
}

bool HeaderReader::Close() {
  int d = --depth_;
  if (failed()) return true;
  if (!build_.empty()) {
    build_.pop_back();
  } else if (d == 1) {
    if (section_ == Section::kTensor) {
      TensorInfo t;
      Status st = ParseTensor(key_, entry_, data_bytes_, &t);
      if (!st.ok()) {
        Fail(std::move(st));
        return true;
      }
      header_.tensors.push_back(std::move(t));
      entry_ = json();
    }
    section_ = Section::kNone;
  }
  return true;
}

}  // namespace

Status ParseHeader(std::string_view json, uint64_t data_bytes, Header* out) {
  if (json.empty()) return Status::Corruption("header is empty");
  if (json[0] != '{') {
    char first[8];
    std::snprintf(first, sizeof first, "0x%02x", static_cast<unsigned char>(json[0]));
    return Status::Corruption(std::string("header does not start with '{' (first byte ") + first + ")");
  }
  HeaderReader reader(data_bytes);
  try {
    nlohmann::json::sax_parse(json.begin(), json.end(), &reader);
  } catch (const std::bad_alloc&) {
    return Status::IOError("out of memory parsing a header of " + std::to_string(json.size()) + " bytes");
  }
  if (reader.too_deep())
    return Status::Corruption("header nests JSON deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  if (!reader.syntax_error().empty()) return Status::Corruption("header is not valid JSON: " + reader.syntax_error());
  if (!reader.error().ok()) return reader.error();
  Header h = std::move(reader.header());
  std::stable_sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected = 0;
  for (const TensorInfo& t : h.tensors) {
    if (t.begin != expected) {
      std::string range = "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + ")";
      if (t.begin > expected)
        return Status::Corruption("tensor " + Quote(t.name) + ": " + range + " leaves a gap: bytes [" +
                                  std::to_string(expected) + ", " + std::to_string(t.begin) +
                                  ") of the data region belong to no tensor");
      return Status::Corruption("tensor " + Quote(t.name) + ": " + range +
                                " overlaps the tensor before it, which ends at " + std::to_string(expected));
    }
    expected = t.end;
  }
  if (expected != data_bytes)
    return Status::Corruption("the tensors cover " + std::to_string(expected) + " bytes of the " +
                              std::to_string(data_bytes) + "-byte data region");
  *out = std::move(h);
  return Status::OK();
}

Status BuildHeader(std::vector<TensorInfo>* tensors, const std::map<std::string, std::string>& metadata,
                   std::string* json) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (TensorInfo& t : *tensors) {
    if (t.name == "__metadata__" || !names.insert(t.name).second)
      return Status::InvalidArgument("tensor name " + Quote(t.name) + " used twice or reserved");
    uint64_t elements = 1, bytes;
    for (uint64_t d : t.shape)
      if (MulOverflows(elements, d, &elements))
        return Status::InvalidArgument("tensor " + Quote(t.name) + ": shape overflows 64 bits");
    if (MulOverflows(elements, DTypeSize(t.dtype), &bytes) || offset + bytes < offset)
      return Status::InvalidArgument("tensor " + Quote(t.name) + ": size overflows 64 bits");
    t.elements = elements;
    t.begin = offset;
    t.end = offset + bytes;
    offset = t.end;
    j[t.name] = {{"dtype", DTypeName(t.dtype)}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
  }
  std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  s.append((8 - s.size() % 8) % 8, ' ');
  if (s.size() > kMaxHeaderBytes)
    return Status::InvalidArgument("header of " + std::to_string(s.size()) + " bytes exceeds the format's limit");
  *json = std::move(s);
  return Status::OK();
}

// ---- Reading ----------------------------------------------------------------------

Status SafetensorsFile::Open(const std::string& path, FileSystem* fs, std::unique_ptr<SafetensorsFile>* out) {
  if (fs == nullptr) fs = FileSystem::Default();
  auto f = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  f->path_ = path;
  KVFILE_RETURN_IF_ERROR(fs->Open(path, OpenMode::kRead, &f->file_));
  uint64_t size = 0;
  KVFILE_RETURN_IF_ERROR(f->file_->Size(&size));
  if (size < 8)
    return Status::Corruption(path + ": file is " + std::to_string(size) +
                              " bytes, shorter than the 8-byte header length");
  uint8_t len_bytes[9] = {};
  KVFILE_RETURN_IF_ERROR(f->file_->ReadAt(0, len_bytes, size > 8 ? 9 : 8));
  // The header is a JSON object: it begins with '{' (the safetensors
  // format). Anything else is another kind of file, whatever its first 8
  // bytes would give as a length.
  if (size == 8 || len_bytes[8] != '{')
    return Status::Corruption(path + ": not a safetensors file (no JSON header after the 8-byte header length)");
  uint64_t n = format::LoadU64(len_bytes);
  // Both limits are checked before anything is allocated for the header.
  if (n > kMaxHeaderBytes)
    return Status::Corruption(path + ": header length " + std::to_string(n) + " exceeds the limit of " +
                              std::to_string(kMaxHeaderBytes) + " bytes");
  if (n > size - 8)
    return Status::Corruption(path + ": header length " + std::to_string(n) + " runs past the end of the " +
                              std::to_string(size) + "-byte file");
  std::string json(n, '\0');
  KVFILE_RETURN_IF_ERROR(f->file_->ReadAt(8, json.data(), n));
  Status st = ParseHeader(json, size - 8 - n, &f->header_);
  if (!st.ok()) return st.WithContext(path);
  f->data_offset_ = 8 + n;
  *out = std::move(f);
  return Status::OK();
}

Status SafetensorsFile::Read(const TensorInfo& t, uint64_t offset, void* dst, size_t n) {
  if (offset > t.bytes() || n > t.bytes() - offset)
    return Status::InvalidArgument(path_ + ": read of " + std::to_string(n) + " bytes at " +
                                   std::to_string(offset) + " outside tensor " + Quote(t.name));
  if (n == 0) return Status::OK();
  return file_->ReadAt(data_offset_ + t.begin + offset, dst, n);
}

// ---- Writing ----------------------------------------------------------------------

Status SafetensorsWriter::Create(const std::string& path, std::vector<TensorInfo> tensors,
                                 const std::map<std::string, std::string>& metadata, FileSystem* fs,
                                 std::unique_ptr<SafetensorsWriter>* out) {
  if (fs == nullptr) fs = FileSystem::Default();
  std::string json;
  Status st = BuildHeader(&tensors, metadata, &json);
  if (!st.ok()) return st.WithContext(path);
  auto w = std::unique_ptr<SafetensorsWriter>(new SafetensorsWriter());
  w->path_ = path;
  KVFILE_RETURN_IF_ERROR(fs->Open(path, OpenMode::kCreateExclusive, &w->file_));
  std::string head(8, '\0');
  format::StoreU64(reinterpret_cast<uint8_t*>(head.data()), json.size());
  head += json;
  KVFILE_RETURN_IF_ERROR(w->file_->WriteAt(0, head.data(), head.size()));
  w->data_offset_ = head.size();
  w->written_.assign(tensors.size(), 0);
  w->tensors_ = std::move(tensors);
  *out = std::move(w);
  return Status::OK();
}

Status SafetensorsWriter::Write(size_t index, uint64_t offset, const void* data, size_t n) {
  if (!file_) return Status::Failed(path_ + ": writer is closed");
  if (index >= tensors_.size()) return Status::InvalidArgument(path_ + ": no tensor " + std::to_string(index));
  const TensorInfo& t = tensors_[index];
  if (offset > t.bytes() || n > t.bytes() - offset)
    return Status::InvalidArgument(path_ + ": write of " + std::to_string(n) + " bytes at " +
                                   std::to_string(offset) + " outside tensor " + Quote(t.name));
  KVFILE_RETURN_IF_ERROR(file_->WriteAt(data_offset_ + t.begin + offset, data, n));
  written_[index] += n;
  return Status::OK();
}

Status SafetensorsWriter::Close() {
  if (!file_) return Status::Failed(path_ + ": writer is closed");
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (written_[i] != tensors_[i].bytes())
      return Status::InvalidArgument(path_ + ": tensor " + Quote(tensors_[i].name) + " has " +
                                     std::to_string(written_[i]) + " of its " +
                                     std::to_string(tensors_[i].bytes()) + " bytes written");
  Status st = file_->Sync();
  file_.reset();
  return st;
}

// ---- The kvfile convention --------------------------------------------------------------

const char* PartSuffix(DtypePart p) {
  switch (p) {
    case DtypePart::kCodes: return ".codes";
    case DtypePart::kBlockScales: return ".block_scales";
    case DtypePart::kRowScales: return ".scales";
  }
  return "";
}

const TensorInfo*& KvStream::part(DtypePart p) {
  switch (p) {
    case DtypePart::kCodes: return codes;
    case DtypePart::kBlockScales: return block_scales;
    case DtypePart::kRowScales: return scales;
  }
  return codes;
}

Dtype KvStream::source_dtype() const {
  if (block_scales) return Dtype::kNvfp4;
  const TensorInfo* t = codes ? codes : values;
  return KvDtypeOf(t->dtype).value_or(Dtype::kBF16);
}

uint64_t BlockTokens(uint64_t bytes_per_token, uint64_t budget) {
  if (bytes_per_token == 0) return 65536;
  return std::clamp<uint64_t>(budget / bytes_per_token, 1, 65536);
}

std::string FingerprintHex(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

bool ParseFingerprint(std::string_view s, uint64_t* out) {
  if (s.size() != 16) return false;
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else return false;
    v = v << 4 | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

namespace {

std::string ShapeText(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() > suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The shape [layers, tokens, rows_per_token, row_width] of an nvfp4 stream's
// three tensors: codes U8 [layers, tokens, n / 2] (n = rows_per_token *
// row_width, a multiple of 16), block scales F8_E4M3 [layers, tokens, n / 16],
// scales F32 [layers, tokens]; rows x width from __metadata__
// "kvfile.shape.<stream>" ("ROWSxWIDTH"), else 1 x n.
Status Nvfp4Shape(const Header& h, const KvStream& s, std::vector<uint64_t>* shape) {
  const TensorInfo& c = *s.codes;
  const TensorInfo& b = *s.block_scales;
  const TensorInfo& sc = *s.scales;
  auto wrong_dtype = [](const TensorInfo& t, const char* want) {
    return Status::InvalidArgument("tensor " + Quote(t.name) + " is " + DTypeName(t.dtype) + "; " + want);
  };
  if (c.dtype != DType::kU8) return wrong_dtype(c, "nvfp4 codes (beside block scales) must be U8");
  if (b.dtype != DType::kF8E4M3) return wrong_dtype(b, "block scales must be F8_E4M3");
  if (sc.dtype != DType::kF32) return wrong_dtype(sc, "scales must be F32");
  if (c.shape.size() != 3 || c.shape[2] == 0 || c.shape[2] % 8 != 0)
    return Status::InvalidArgument("tensor " + Quote(c.name) + " has shape " + ShapeText(c.shape) +
                                   "; expected [layers, tokens, n / 2], n = rows_per_token * row_width a "
                                   "multiple of 16");
  const uint64_t n = c.shape[2] * 2;
  for (auto [t, want] : {std::pair{&b, std::vector<uint64_t>{c.shape[0], c.shape[1], n / 16}},
                         std::pair{&sc, std::vector<uint64_t>{c.shape[0], c.shape[1]}}})
    if (t->shape != want)
      return Status::InvalidArgument("tensor " + Quote(t->name) + " has shape " + ShapeText(t->shape) +
                                     "; expected " + ShapeText(want));
  uint64_t rows = 1, width = n;
  const std::string key = "kvfile.shape." + s.name;
  if (auto it = h.metadata.find(key); it != h.metadata.end()) {
    const std::string& v = it->second;
    const char* end = v.data() + v.size();
    auto r = std::from_chars(v.data(), end, rows);
    bool ok = r.ec == std::errc() && r.ptr != end && *r.ptr == 'x';
    if (ok) {
      auto w = std::from_chars(r.ptr + 1, end, width);
      ok = w.ec == std::errc() && w.ptr == end && rows != 0 && n % rows == 0 && width == n / rows;
    }
    if (!ok)
      return Status::InvalidArgument("__metadata__ " + Quote(key) + " is " + Quote(v) + "; expected ROWSxWIDTH with " +
                                     "ROWS * WIDTH = " + std::to_string(n) + " (the elements of a token)");
  }
  *shape = {c.shape[0], c.shape[1], rows, width};
  return Status::OK();
}

}  // namespace

Status DescribeKv(const Header& h, KvTensors* out) {
  KvTensors kv;
  auto stream_named = [&](const std::string& name) -> KvStream& {
    for (KvStream& s : kv.streams)
      if (s.name == name) return s;
    kv.streams.push_back({});
    kv.streams.back().name = name;
    return kv.streams.back();
  };
  for (const TensorInfo& t : h.tensors) {
    if (t.name == "tokens") {
      if (t.dtype != DType::kI32 && t.dtype != DType::kI64 && t.dtype != DType::kU32)
        return Status::InvalidArgument("tensor 'tokens' is " + std::string(DTypeName(t.dtype)) +
                                       "; token ids must be I32, I64 or U32");
      if (t.shape.size() != 1)
        return Status::InvalidArgument("tensor 'tokens' has shape " + ShapeText(t.shape) + "; expected [tokens]");
      kv.token_ids = &t;
      continue;
    }
    // "<stream>" (values) or "<stream><suffix>" (a part), the parts in
    // DtypePart order: ".block_scales" before ".scales".
    std::string base = t.name;
    std::optional<DtypePart> part;
    for (DtypePart p : {DtypePart::kCodes, DtypePart::kBlockScales, DtypePart::kRowScales}) {
      const std::string_view suffix = PartSuffix(p);
      if (!EndsWith(t.name, suffix)) continue;
      base = t.name.substr(0, t.name.size() - suffix.size());
      part = p;
      break;
    }
    if (!format::IsValidStreamName(base))
      return Status::InvalidArgument("tensor " + Quote(t.name) + ": " + Quote(base) +
                                     " is not a stream name (1-31 characters of [a-z0-9_.-])");
    KvStream& s = stream_named(base);
    (part ? s.part(*part) : s.values) = &t;
  }
  if (kv.token_ids == nullptr) return Status::InvalidArgument("no 'tokens' tensor");
  if (kv.streams.empty()) return Status::InvalidArgument("no stream tensors");
  kv.tokens = kv.token_ids->shape[0];
  // With layer sets the model's layer count is stated, not taken from a tensor.
  std::optional<uint32_t> layer_count;
  if (auto it = h.metadata.find("kvfile.layer_count"); it != h.metadata.end()) {
    uint32_t n = 0;
    auto r = std::from_chars(it->second.data(), it->second.data() + it->second.size(), n);
    if (r.ec != std::errc() || r.ptr != it->second.data() + it->second.size() || n == 0 || n > format::kMaxLayers)
      return Status::InvalidArgument("__metadata__ 'kvfile.layer_count' is " + Quote(it->second) + "; expected 1.." +
                                     std::to_string(format::kMaxLayers));
    layer_count = n;
    kv.layers = n;
  }
  bool first = !layer_count;
  for (KvStream& s : kv.streams) {
    std::string where = "stream " + Quote(s.name);
    if (s.values && (s.codes || s.scales || s.block_scales))
      return Status::InvalidArgument(where + ": both " + Quote(s.name) + " and " +
                                     Quote(s.name + PartSuffix(s.codes    ? DtypePart::kCodes
                                                               : s.scales ? DtypePart::kRowScales
                                                                          : DtypePart::kBlockScales)) +
                                     " are present");
    if (!s.values && !s.codes)
      return Status::InvalidArgument(
          where + ": " + Quote(s.name + PartSuffix(s.scales ? DtypePart::kRowScales : DtypePart::kBlockScales)) +
          " without " + Quote(s.name + PartSuffix(DtypePart::kCodes)));
    if (s.codes && !s.scales)
      return Status::InvalidArgument(where + ": " + Quote(s.name + PartSuffix(DtypePart::kCodes)) + " without " +
                                     Quote(s.name + PartSuffix(DtypePart::kRowScales)));
    const TensorInfo& t = s.values ? *s.values : *s.codes;
    const std::optional<Dtype> kd = KvDtypeOf(t.dtype);
    if (s.values && (!kd || IsFp8(*kd)))
      return Status::InvalidArgument("tensor " + Quote(t.name) + " is " + DTypeName(t.dtype) +
                                     "; stream values must be BF16, F16 or F32");
    if (s.codes && !s.block_scales && (!kd || !IsFp8(*kd)))
      return Status::InvalidArgument("tensor " + Quote(t.name) + " is " + DTypeName(t.dtype) +
                                     "; codes must be F8_E4M3 or F8_E5M2" +
                                     (t.dtype == DType::kU8 ? " (U8: nvfp4 codes, with " +
                                                                  Quote(s.name + PartSuffix(DtypePart::kBlockScales)) + ")"
                                                            : std::string()));
    std::vector<uint64_t> shape = t.shape;  // [layers, tokens, rows_per_token, row_width]
    if (s.block_scales) KVFILE_RETURN_IF_ERROR(Nvfp4Shape(h, s, &shape));
    if (shape.size() != 4)
      return Status::InvalidArgument("tensor " + Quote(t.name) + " has shape " + ShapeText(t.shape) +
                                     "; expected [layers, tokens, rows_per_token, row_width]");
    if (shape[0] == 0 || shape[0] > format::kMaxLayers)
      return Status::InvalidArgument("tensor " + Quote(t.name) + ": " + std::to_string(shape[0]) +
                                     " layers, outside 1.." + std::to_string(format::kMaxLayers));
    if (shape[2] == 0 || shape[2] > format::kMaxRowsPerToken)
      return Status::InvalidArgument("tensor " + Quote(t.name) + ": " + std::to_string(shape[2]) +
                                     " rows per token, outside 1.." + std::to_string(format::kMaxRowsPerToken));
    if (shape[3] == 0 || shape[3] > format::kMaxRowWidth)
      return Status::InvalidArgument("tensor " + Quote(t.name) + ": row width " + std::to_string(shape[3]) +
                                     " outside 1.." + std::to_string(format::kMaxRowWidth));
    if (auto it = h.metadata.find("kvfile.layers." + s.name); it != h.metadata.end()) {
      Status ls = ParseLayerList(it->second, &s.layers);
      if (!ls.ok()) return Status::InvalidArgument("__metadata__ " + Quote(it->first) + ": " + ls.message());
      if (!layer_count)
        return Status::InvalidArgument("__metadata__ " + Quote(it->first) +
                                       " without 'kvfile.layer_count' (the model's layers)");
      if (s.layers.empty() || s.layers.back() >= *layer_count)
        return Status::InvalidArgument("__metadata__ " + Quote(it->first) + " names layers outside 0.." +
                                       std::to_string(*layer_count - 1));
      if (shape[0] != s.layers.size())
        return Status::InvalidArgument("tensor " + Quote(t.name) + " has " + std::to_string(shape[0]) +
                                       " layers; " + Quote(it->first) + " names " + std::to_string(s.layers.size()));
      if (s.layers.size() == *layer_count) s.layers.clear();  // every layer
    } else {
      if (first) kv.layers = static_cast<uint32_t>(shape[0]);
      first = false;
      if (shape[0] != kv.layers)
        return Status::InvalidArgument("tensor " + Quote(t.name) + " has " + std::to_string(shape[0]) +
                                       " layers; the other streams have " + std::to_string(kv.layers));
    }
    if (shape[1] != kv.tokens)
      return Status::InvalidArgument("tensor " + Quote(t.name) + " has " + std::to_string(shape[1]) +
                                     " tokens; 'tokens' has " + std::to_string(kv.tokens));
    s.rows_per_token = static_cast<uint32_t>(shape[2]);
    s.row_width = static_cast<uint32_t>(shape[3]);
    if (s.scales && !s.block_scales) {
      if (s.scales->dtype != DType::kF32)
        return Status::InvalidArgument("tensor " + Quote(s.scales->name) + " is " + DTypeName(s.scales->dtype) +
                                       "; scales must be F32");
      std::vector<uint64_t> want = {shape[0], shape[1], shape[2]};
      if (s.scales->shape != want)
        return Status::InvalidArgument("tensor " + Quote(s.scales->name) + " has shape " +
                                       ShapeText(s.scales->shape) + "; expected " + ShapeText(want));
    }
  }
  if (auto it = h.metadata.find("kvfile.model"); it != h.metadata.end()) {
    if (it->second.size() > format::hdr::kModelIdCapacity - 1)
      return Status::InvalidArgument("__metadata__ 'kvfile.model' is " + std::to_string(it->second.size()) +
                                     " bytes; a model id has at most 255");
    kv.model_id = it->second;
  }
  if (auto it = h.metadata.find("kvfile.fingerprint"); it != h.metadata.end()) {
    uint64_t fp;
    if (!ParseFingerprint(it->second, &fp))
      return Status::InvalidArgument("__metadata__ 'kvfile.fingerprint' is " + Quote(it->second) +
                                     "; expected 16 hex digits");
    kv.fingerprint = fp;
  }
  *out = std::move(kv);
  return Status::OK();
}

Status ReadTokenIds(SafetensorsFile& f, const KvTensors& kv, std::vector<uint32_t>* out) {
  const TensorInfo& t = *kv.token_ids;
  std::vector<uint8_t> raw(t.bytes());
  KVFILE_RETURN_IF_ERROR(f.Read(t, 0, raw.data(), raw.size()));
  std::vector<uint32_t> ids(kv.tokens);
  for (uint64_t i = 0; i < kv.tokens; ++i) {
    int64_t v;
    if (t.dtype == DType::kI64) v = static_cast<int64_t>(format::LoadU64(&raw[i * 8]));
    else if (t.dtype == DType::kI32) v = static_cast<int32_t>(format::LoadU32(&raw[i * 4]));
    else v = format::LoadU32(&raw[i * 4]);
    if (v < 0 || static_cast<uint64_t>(v) > format::kMaxTokenId)
      return Status::InvalidArgument(f.path() + ": tensor 'tokens': token " + std::to_string(i) + " has id " +
                                     std::to_string(v) + "; token ids are 0.." + std::to_string(format::kMaxTokenId));
    ids[i] = static_cast<uint32_t>(v);
  }
  *out = std::move(ids);
  return Status::OK();
}

Status ReadStreamSlab(SafetensorsFile& f, const KvTensors& kv, const KvStream& s, uint32_t model_layer,
                      uint64_t t0, uint64_t n, std::vector<uint8_t>* data, std::vector<float>* scales) {
  // The tensors hold the stream's own layers only.
  const uint32_t layer = s.layers.empty() ? model_layer
                                          : static_cast<uint32_t>(std::lower_bound(s.layers.begin(), s.layers.end(),
                                                                                   model_layer) - s.layers.begin());
  if (s.block_scales) {
    // nvfp4: one row per token; the codes, then the block scales, in data.
    const uint64_t e = uint64_t{s.rows_per_token} * s.row_width;
    const uint64_t first = uint64_t{layer} * kv.tokens + t0;
    data->resize(n * (e / 2 + e / 16));
    scales->resize(n);
    KVFILE_RETURN_IF_ERROR(f.Read(*s.codes, first * e / 2, data->data(), n * e / 2));
    KVFILE_RETURN_IF_ERROR(f.Read(*s.block_scales, first * e / 16, data->data() + n * e / 2, n * e / 16));
    return f.Read(*s.scales, first * 4, scales->data(), n * 4);
  }
  const TensorInfo& t = s.codes ? *s.codes : *s.values;
  uint64_t per_token = uint64_t{s.rows_per_token} * s.row_width * DTypeSize(t.dtype);
  uint64_t first = uint64_t{layer} * kv.tokens + t0;
  data->resize(n * per_token);
  KVFILE_RETURN_IF_ERROR(f.Read(t, first * per_token, data->data(), data->size()));
  if (s.codes) {
    uint64_t rows = n * s.rows_per_token;
    scales->resize(rows);
    KVFILE_RETURN_IF_ERROR(f.Read(*s.scales, first * s.rows_per_token * 4, scales->data(), rows * 4));
  }
  return Status::OK();
}

namespace {
// The parts of a slab as ReadStreamSlab reads it: the codes (or values),
// then the block scales, in `data`; the row scales in `scales`.
codec::PartsIn SlabParts(Dtype d, const std::vector<uint8_t>& data, const std::vector<float>& scales, uint64_t rows,
                         uint64_t width) {
  codec::PartsIn p{data.data()};
  if (PartBytes(d, DtypePart::kBlockScales, rows, width))
    p.block_scales = data.data() + PartBytes(d, DtypePart::kCodes, rows, width);
  if (PartBytes(d, DtypePart::kRowScales, rows, width)) p.row_scales = scales.data();
  return p;
}
}  // namespace

Status CheckValues(SafetensorsFile& f, const KvTensors& kv) {
  std::vector<uint8_t> data;
  std::vector<float> scales;
  for (const KvStream& s : kv.streams) {
    const TensorInfo& t = s.codes ? *s.codes : *s.values;
    uint64_t elems_per_token = uint64_t{s.rows_per_token} * s.row_width;
    uint64_t block = std::max<uint64_t>(1, (uint64_t{64} << 20) / (elems_per_token * DTypeSize(t.dtype)));
    Dtype dt = s.source_dtype();
    for (uint32_t l = 0; l < kv.layers; ++l) {
      if (!s.layers.empty() && !std::binary_search(s.layers.begin(), s.layers.end(), l)) continue;
      for (uint64_t t0 = 0; t0 < kv.tokens; t0 += block) {
        uint64_t n = std::min(block, kv.tokens - t0);
        KVFILE_RETURN_IF_ERROR(ReadStreamSlab(f, kv, s, l, t0, n, &data, &scales));
        // A per-token row (nvfp4) is a token's elements, so a fault names no row.
        const CodecRows cr = CodecRowsOf(dt, s.rows_per_token, s.row_width);
        const bool per_token = FindDtype(dt)->quantization == Quantization::kPerToken;
        auto where = [&](uint64_t row, const std::string& tensor) {
          return f.path() + ": tensor " + Quote(tensor) + ": layer " + std::to_string(l) + ", token " +
                 (per_token
                      ? std::to_string(t0 + row)
                      : std::to_string(t0 + row / s.rows_per_token) + ", row " + std::to_string(row % s.rows_per_token));
        };
        const uint64_t rows = n * cr.per_token;
        codec::RowCheck rc = codec::CodecOf(dt)->check(dt, SlabParts(dt, data, scales, rows, cr.width), rows, cr.width);
        if (rc.fault == codec::RowFault::kInvalidBlockScale)
          return Status::NonFinite(where(rc.row, s.block_scales->name) +
                                   ": invalid block scale (bit 7 set, or 0x7F)");
        if (rc.fault == codec::RowFault::kNonFiniteCode)
          return Status::NonFinite(where(rc.row, t.name) + ": non-finite code");
        if (rc.fault == codec::RowFault::kInvalidScale)
          return Status::NonFinite(where(rc.row, s.scales->name) + ": invalid scale (scales must be finite and > 0)");
        if (rc.fault == codec::RowFault::kNonFiniteValue)
          return Status::NonFinite(where(rc.row, t.name) + ": non-finite value");
      }
    }
  }
  return Status::OK();
}

Status AppendAll(SafetensorsFile& f, const KvTensors& kv, std::span<const uint32_t> token_ids,
                 const std::vector<size_t>& stream_of, Writer& w, uint64_t block_tokens,
                 const std::function<Status()>& between) {
  const Geometry& g = w.geometry();
  size_t S = g.streams.size();
  if (stream_of.size() != S || g.layers != kv.layers || token_ids.size() != kv.tokens)
    return Status::InvalidArgument(f.path() + ": the input does not match the writer's geometry");
  size_t blocks = static_cast<size_t>(g.layers) * S;
  std::vector<std::vector<uint8_t>> data(blocks);
  std::vector<std::vector<float>> scales(blocks);
  std::vector<std::vector<float>> decoded(blocks);
  block_tokens = std::max<uint64_t>(block_tokens, 1);
  for (uint64_t t0 = 0; t0 < kv.tokens; t0 += block_tokens) {
    uint64_t n = std::min(block_tokens, kv.tokens - t0);
    AppendBatch batch;
    batch.tokens = token_ids.subspan(t0, n);
    // One append, whatever the number of blocks: all or nothing.
    batch.continued = t0 + n < kv.tokens;
    for (uint32_t l = 0; l < g.layers; ++l) {
      for (size_t s = 0; s < S; ++s) {
        const KvStream& src = kv.streams[stream_of[s]];
        const StreamSpec& spec = g.streams[s];
        size_t i = l * S + s;
        if (!g.InLayer(l, static_cast<uint32_t>(s))) {
          batch.blocks.push_back({});  // the stream is not in this layer
          continue;
        }
        KVFILE_RETURN_IF_ERROR(ReadStreamSlab(f, kv, src, l, t0, n, &data[i], &scales[i]));
        Dtype from = src.source_dtype();
        // The parts as the slab holds them (nvfp4: one row per token, the
        // block scales after the codes).
        const CodecRows cr = CodecRowsOf(from, spec.rows_per_token, spec.row_width);
        const uint64_t rows = n * cr.per_token, width = cr.width;
        const codec::PartsIn parts = SlabParts(from, data[i], scales[i], rows, width);
        if (!src.is_codes()) {
          batch.blocks.push_back({from, data[i].data(), nullptr});
        } else if (from == spec.dtype) {
          batch.blocks.push_back({from, data[i].data(), parts.row_scales, parts.block_scales});
        } else {
          // Codes of another quantized dtype (or into a raw stream): decode
          // to f32 and let the writer quantize or convert. The decoder wants
          // valid codes and scales.
          const codec::DtypeCodec& codec = *codec::CodecOf(from);
          codec::RowCheck rc = codec.check(from, parts, rows, width);
          if (!rc.ok())
            return Status::NonFinite(f.path() + ": stream " + Quote(src.name) + ": layer " + std::to_string(l) +
                                     ", token " + std::to_string(t0 + rc.row / cr.per_token) + ": " +
                                     codec::RowFaultText(rc.fault));
          decoded[i].resize(rows * width);
          codec.decode(from, parts, rows, width, Dtype::kF32, decoded[i].data());
          batch.blocks.push_back({Dtype::kF32, decoded[i].data(), nullptr});
        }
      }
    }
    // The last Append finishes (commits) the append: `between` comes
    // before it, so that a stop it asks for leaves none of the append.
    if (between && !batch.continued) KVFILE_RETURN_IF_ERROR(between());
    Status st = w.Append(batch);
    // The writer's I/O errors name the file written, not this input.
    if (!st.ok()) return st.code() == Status::Code::kIOError ? st : st.WithContext(f.path());
    if (between && batch.continued) KVFILE_RETURN_IF_ERROR(between());
  }
  return Status::OK();
}

}  // namespace kvfile::safetensors
