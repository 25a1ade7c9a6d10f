// SPDX-License-Identifier: Apache-2.0
// Experimental tier (kvfile/formats/): may change between minor releases; docs/api.md, "Header tiers".
// Mooncake Store's FP8 codec record, version 1 (RFC kvcache-ai/Mooncake#4346,
// wire format in that repository's mooncake-store/src/codec/README.md):
// single records, encoded and decoded byte for byte as that format says.
//
// A record is one tensor of fp16 or bf16 values stored as e4m3 codes with
// one f32 scale per group of `group_size` consecutive flattened elements
// (the last group may be short): scale = amax / 448 in f32 (1 for an
// all-zero group), code = e4m3(x / scale) rounded to nearest even and
// saturated at 448. Unlike kvfile's row rule (spec/CODEC.md) there is no
// FLT_MIN floor on the scale, and groups need not follow rows;
// docs/formats.md says what the converter does about both.
//
// ParseRecord checks everything (magic, version, reserved field, CRC,
// descriptor, sizes, every scale finite and > 0, no NaN code) before any
// caller buffer is written; a bad record is kCorruption naming the rule.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvfile/export.h"
#include "kvfile/status.h"

namespace kvfile::mooncake {

// The record's source dtype byte.
enum class SourceDtype : uint8_t { kF16 = 1, kBF16 = 2 };

inline constexpr size_t kMaxRank = 8;  // the format's rank limit (1..8)

struct KVFILE_EXPORT RecordDesc {
  SourceDtype dtype = SourceDtype::kBF16;
  uint32_t group_size = 0;
  std::vector<uint64_t> shape;  // rank 1..8, every dimension > 0
};

// Bytes of a record of `desc`: 32 + 8 rank + 4 ceil(n / group) + n.
// kInvalidArgument for a descriptor the format cannot hold (rank, a zero
// dimension or group size, a size overflowing 64 bits).
KVFILE_EXPORT Status RecordSize(const RecordDesc& desc, uint64_t* elements, uint64_t* bytes);

// "fp8-e4m3fn-v1-g<group_size>"
KVFILE_EXPORT std::string FormatId(uint32_t group_size);
// "__mc_codec__/fp8-e4m3fn-v1-g<group_size>/<logical_key>"
KVFILE_EXPORT std::string RepresentationKey(uint32_t group_size, std::string_view logical_key);
// A file name for a key: bytes [A-Za-z0-9._-] as they are, every other
// byte (the '/' of a key included) as %XX (upper-case hex). One path
// component, never "." or ".."; KeyFromFileName is its inverse and refuses
// any name this function does not produce.
KVFILE_EXPORT std::string FileNameForKey(std::string_view key);
KVFILE_EXPORT bool KeyFromFileName(std::string_view name, std::string* key);

// Mooncake's encoder: `values` holds n fp16 or bf16 bit patterns (desc.dtype),
// n the product of the shape. kNonFinite (naming the element) for a NaN or
// infinity; nothing is written to *out then.
KVFILE_EXPORT Status EncodeValues(const RecordDesc& desc, const uint16_t* values, std::vector<uint8_t>* out);
// A record from codes and scales already made (ceil(n / group) scales, n
// codes), as they are: kInvalidArgument for a scale that is not finite and
// > 0 or a NaN code (0x7F, 0xFF).
KVFILE_EXPORT Status EncodeCodes(const RecordDesc& desc, const float* scales, const uint8_t* codes,
                   std::vector<uint8_t>* out);

// A checked record; the pointers refer into the bytes given to ParseRecord.
struct KVFILE_EXPORT RecordView {
  RecordDesc desc;
  uint64_t elements = 0;
  uint64_t groups = 0;
  const uint8_t* scale_bytes = nullptr;  // groups little-endian f32
  const uint8_t* codes = nullptr;        // elements e4m3 codes
  float scale(uint64_t group) const;
};
KVFILE_EXPORT Status ParseRecord(std::span<const uint8_t> record, RecordView* out);

// Decodes a checked record into n values of its source dtype, as Mooncake's
// decoder does: code value * scale in f32, clamped to the dtype's finite
// range, rounded to nearest even (kvfile's DequantizeRows rule).
KVFILE_EXPORT void DecodeValues(const RecordView& rec, uint16_t* dst);
// The same, into f32 (the product, clamped to the f32 finite range).
KVFILE_EXPORT void DecodeF32(const RecordView& rec, float* dst);

// "fp16 (1)" or "bf16 (2)": a source dtype and its byte, as errors name it.
KVFILE_EXPORT std::string SourceDtypeName(SourceDtype d);
// The first group of a checked record holding a value its source dtype
// cannot hold (code value x scale, in f32, at or beyond the point where
// rounding to the dtype overflows: 65520 for fp16, 0x7F7F8000 as f32 for
// bf16), or rec.groups when there is none. Mooncake's encoder never writes
// one (a scale is the group's amax / 448, amax finite in the dtype); its
// decoder would clamp it, so an import that kept the codes and scales would
// hold other values than Mooncake decodes.
KVFILE_EXPORT uint64_t FindGroupBeyondDtype(const RecordView& rec);

// CRC-32/IEEE (zlib's crc32) of a record with bytes 24..27 taken as zero.
KVFILE_EXPORT uint32_t RecordCrc(std::span<const uint8_t> record);

}  // namespace kvfile::mooncake
