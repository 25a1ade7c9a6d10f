// SPDX-License-Identifier: Apache-2.0
// The safetensors reader and writer: the file format (the kvfile convention on
// top of it is kvfile_naming.cc; see safetensors.h).
#include "kvfile/formats/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>

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

}  // namespace kvfile::safetensors
