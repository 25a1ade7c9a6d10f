// SPDX-License-Identifier: Apache-2.0
// Experimental tier (kvfile/formats/): may change between minor releases; docs/api.md, "Header tiers".
// Reading and writing the safetensors format, and the convention kvfile
// uses to exchange sessions with tensor libraries.
//
// The format: an 8-byte little-endian header length N, N bytes of a JSON
// object mapping tensor names to {"dtype", "shape", "data_offsets": [begin,
// end)} (plus an optional "__metadata__" map of strings), then the data
// region, which the tensors cover exactly, in row-major order, little-endian.
//
// The reader checks every rule of the format before it reads any tensor
// byte and refuses anything else with kCorruption and a message naming the
// rule and the tensor: header length at most 100 MB and within the file,
// first byte '{', a valid JSON object without duplicate keys (nested at most
// 128 levels, as in the format's reference parser), a known dtype,
// a shape whose element count and byte size do not overflow, data_offsets
// inside the data region whose size matches the shape, and tensors that
// cover the data region contiguously, without gaps or overlaps. It never
// loads tensor data it is not asked for: reads go through File::ReadAt.
// Unknown keys inside a tensor entry are ignored, as the reference does.
//
// The kvfile convention (DescribeKv and friends): one tensor per stream,
// named by the stream, shaped [layers, tokens, rows_per_token, row_width],
// BF16, F16 or F32; or, for an fp8 stream, "<stream>.codes" (F8_E4M3 or
// F8_E5M2, same shape) and "<stream>.scales" (F32, [layers, tokens,
// rows_per_token]); for an nvfp4 stream, "<stream>.codes" (U8, packed,
// [layers, tokens, n / 2] with n = rows_per_token * row_width),
// "<stream>.block_scales" (F8_E4M3, [layers, tokens, n / 16]) and
// "<stream>.scales" (F32, [layers, tokens]), its rows x width in the
// __metadata__ key "kvfile.shape.<stream>" ("8x128"; absent: 1 x n); a
// tensor "tokens" (I32, I64 or U32, [tokens]); and the __metadata__ keys
// "kvfile.model" and "kvfile.fingerprint" (16 hex digits). A stream present
// in some layers only (StreamSpec::layers) has them in the __metadata__ key
// "kvfile.layers.<stream>" ("0,4,8..11", FormatLayerList) and its tensors
// hold only those layers, in order ([that many layers, tokens, ...]); the
// file then gives the model's layer count in "kvfile.layer_count".
// A file that is valid safetensors but does not follow it gets
// kInvalidArgument.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvfile/export.h"
#include "kvfile/file.h"
#include "kvfile/geometry.h"
#include "kvfile/status.h"

namespace kvfile {
class Writer;
}

namespace kvfile::safetensors {

// The element types of the format (the byte-sized ones; the sub-byte F4 and
// F6 types are refused as unsupported).
enum class DType : uint8_t {
  kBool, kU8, kI8, kF8E5M2, kF8E4M3, kF8E8M0, kI16, kU16, kF16, kBF16,
  kI32, kU32, kF32, kC64, kF64, kI64, kU64,
};
KVFILE_EXPORT const char* DTypeName(DType d);      // "BF16", "F8_E4M3", ...
KVFILE_EXPORT size_t DTypeSize(DType d);           // bytes per element
KVFILE_EXPORT bool ParseDType(std::string_view name, DType* out);
// The one mapping between these and kvfile::Dtype. DType stays the format's
// own tag (most of its 17 values are no kvfile dtype): F8_E4M3, F8_E5M2,
// F16, BF16 and F32 are kvfile's five; KvDtypeOf is nullopt for the rest.
// DTypeOf is the inverse (kBF16 for a byte that is no Dtype).
KVFILE_EXPORT std::optional<Dtype> KvDtypeOf(DType d);
KVFILE_EXPORT DType DTypeOf(Dtype d);

inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the format's own cap
// What a header may list (spec/FORMAT.md 7.1): with these caps, what
// ParseHeader keeps stays within a few bytes per header byte plus a few MB.
inline constexpr size_t kMaxTensors = 65536;
inline constexpr size_t kMaxMetadataEntries = 65536;

struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;
  uint64_t begin = 0;  // data_offsets, relative to the start of the data region
  uint64_t end = 0;
  uint64_t elements = 0;  // product of the shape (1 for a scalar)

  uint64_t bytes() const { return end - begin; }
};

struct KVFILE_EXPORT Header {
  std::vector<TensorInfo> tensors;  // in data order (by begin offset)
  std::map<std::string, std::string> metadata;

  const TensorInfo* Find(std::string_view name) const;
};

// Parses and checks a JSON header for a data region of `data_bytes` bytes.
// kCorruption naming the first rule broken.
KVFILE_EXPORT Status ParseHeader(std::string_view json, uint64_t data_bytes, Header* out);

// Builds the header bytes (JSON, padded with spaces to a multiple of 8 so
// that the data region is 8-byte aligned) for tensors laid out one after
// the other in the given order. Fills each tensor's offsets and elements.
KVFILE_EXPORT Status BuildHeader(std::vector<TensorInfo>* tensors, const std::map<std::string, std::string>& metadata,
                   std::string* json);

// A safetensors file opened for reading.
class KVFILE_EXPORT SafetensorsFile {
 public:
  // Reads and checks the header (kCorruption with the path for a bad file).
  static Status Open(const std::string& path, FileSystem* fs, std::unique_ptr<SafetensorsFile>* out);

  const Header& header() const { return header_; }
  const std::string& path() const { return path_; }
  uint64_t data_offset() const { return data_offset_; }  // 8 + N
  // Reads bytes [offset, offset + n) of tensor t's data.
  Status Read(const TensorInfo& t, uint64_t offset, void* dst, size_t n);

 private:
  std::string path_;
  std::unique_ptr<File> file_;
  Header header_;
  uint64_t data_offset_ = 0;
};

// Writes a safetensors file: the header is fixed at creation, then every
// byte of every tensor must be written (in any order) before Close().
// The file is created exclusively; the caller renames it into place.
class KVFILE_EXPORT SafetensorsWriter {
 public:
  static Status Create(const std::string& path, std::vector<TensorInfo> tensors,
                       const std::map<std::string, std::string>& metadata, FileSystem* fs,
                       std::unique_ptr<SafetensorsWriter>* out);
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // Writes bytes [offset, offset + n) of tensor `index`.
  Status Write(size_t index, uint64_t offset, const void* data, size_t n);
  // Checks that every tensor byte was written, then syncs. The writer is
  // unusable after.
  Status Close();

 private:
  std::string path_;
  std::unique_ptr<File> file_;
  std::vector<TensorInfo> tensors_;
  std::vector<uint64_t> written_;
  uint64_t data_offset_ = 0;
};

// ---- The kvfile convention -------------------------------------------------------

// The tensors of one stream: either `values` (decoded, BF16/F16/F32) or
// `codes` + `scales` (fp8 codes and their per-row scales), or `codes` +
// `block_scales` + `scales` (nvfp4: packed codes, E4M3 block scales, one
// scale per token).
// The suffix of the tensor that holds one stored part of a quantized
// stream: "<stream>.codes", "<stream>.block_scales", "<stream>.scales" (a
// raw stream's values are the tensor "<stream>", no suffix). The one table
// of these names; a name ending in ".block_scales" also ends in ".scales",
// so a name is matched against the parts in DtypePart order.
KVFILE_EXPORT const char* PartSuffix(DtypePart p);

struct KVFILE_EXPORT KvStream {
  std::string name;
  uint32_t rows_per_token = 0;
  uint32_t row_width = 0;
  const TensorInfo* values = nullptr;
  const TensorInfo* codes = nullptr;
  const TensorInfo* scales = nullptr;
  const TensorInfo* block_scales = nullptr;  // nvfp4 only
  std::vector<uint32_t> layers;  // "kvfile.layers.<name>"; empty: every layer

  bool is_codes() const { return codes != nullptr; }
  // The tensor of one stored part (codes, block_scales or scales).
  const TensorInfo*& part(DtypePart p);
  // The kvfile dtype of what the file holds: kBF16/kF16/kF32 for values,
  // kE4M3/kE5M2 for fp8 codes, kNvfp4 for nvfp4 codes.
  Dtype source_dtype() const;
};

struct KvTensors {
  uint32_t layers = 0;
  uint64_t tokens = 0;
  const TensorInfo* token_ids = nullptr;
  std::vector<KvStream> streams;  // in data order of their first tensor
  std::optional<std::string> model_id;
  std::optional<uint64_t> fingerprint;
};

// Checks the convention; pointers refer into `h`, which must outlive *out.
KVFILE_EXPORT Status DescribeKv(const Header& h, KvTensors* out);

// Reads the token ids; kInvalidArgument for a negative id or one above u32.
KVFILE_EXPORT Status ReadTokenIds(SafetensorsFile& f, const KvTensors& kv, std::vector<uint32_t>* out);

// Scans every value of every stream: finite values; for codes, no NaN (or
// e5m2 infinity) code, every block scale valid (nvfp4) and every scale a
// finite number > 0. kNonFinite naming the tensor, layer, token and row
// (not for nvfp4, whose row is the token) of the first bad one.
KVFILE_EXPORT Status CheckValues(SafetensorsFile& f, const KvTensors& kv);

// Reads tokens [t0, t0 + n) of `layer` of a stream's values or codes (and
// scales) into the buffers, resized as needed. nvfp4: `data` holds the
// codes and then the block scales, `scales` one scale per token.
KVFILE_EXPORT Status ReadStreamSlab(SafetensorsFile& f, const KvTensors& kv, const KvStream& s, uint32_t layer,
                      uint64_t t0, uint64_t n, std::vector<uint8_t>* data, std::vector<float>* scales);

// Appends every token of the file to `w`. stream_of[i] is the index in
// kv.streams of the writer's stream i. Values go in as they are (the writer
// quantizes or converts them); codes of the writer stream's own dtype (fp8
// or nvfp4) go in exactly, as pre-quantized rows; codes of another dtype are
// decoded to f32 first. `block_tokens` tokens per Append() call, all of them one
// append (AppendBatch::continued): on failure, none of it stays. `between`,
// if set, is called after each call but the last and before the last (the
// one that finishes the append); a non-OK status it returns (the CLI's
// "interrupted by a signal") ends the loop, with the append unfinished, and
// is returned.
KVFILE_EXPORT Status AppendAll(SafetensorsFile& f, const KvTensors& kv, std::span<const uint32_t> token_ids,
                 const std::vector<size_t>& stream_of, Writer& w, uint64_t block_tokens,
                 const std::function<Status()>& between = {});

// Tokens per append that keep one append's buffers within `budget` bytes
// when a token takes `bytes_per_token` bytes (at least 1, at most 65536).
KVFILE_EXPORT uint64_t BlockTokens(uint64_t bytes_per_token, uint64_t budget);

// "0123456789abcdef" <-> value; ParseFingerprint wants exactly 16 hex digits.
KVFILE_EXPORT std::string FingerprintHex(uint64_t v);
KVFILE_EXPORT bool ParseFingerprint(std::string_view s, uint64_t* out);

}  // namespace kvfile::safetensors
