// SPDX-License-Identifier: Apache-2.0
// The codec rows of the dtype table (see dtype_codec.h).
#include "codec/dtype_codec.h"

#include <cstring>

#include "codec/nvfp4.h"
#include "kvfile/codec.h"

namespace kvfile::codec {

namespace {

// Raw values: stored as they are (converted to the stored dtype).
bool EncodeRaw(Dtype stored, Dtype src_dtype, const void* src, size_t rows, size_t width, const PartsOut& out,
               size_t* bad_row) {
  const size_t bad = FindNonFinite(src_dtype, src, rows * width);
  if (bad < rows * width) {
    *bad_row = bad / width;
    return false;
  }
  ConvertRaw(src_dtype, src, rows * width, stored, out.codes);
  return true;
}
void DecodeRaw(Dtype stored, const PartsIn& in, size_t rows, size_t width, Dtype dst_dtype, void* dst) {
  ConvertRaw(stored, in.codes, rows * width, dst_dtype, dst);
}
RowCheck CheckRaw(Dtype stored, const PartsIn& in, size_t rows, size_t width) {
  const size_t bad = FindNonFinite(stored, in.codes, rows * width);
  if (bad < rows * width) return {RowFault::kNonFiniteValue, bad / width};
  return {};
}

// fp8: a code per element and an f32 scale per row.
bool EncodeFp8(Dtype stored, Dtype src_dtype, const void* src, size_t rows, size_t width, const PartsOut& out,
               size_t* bad_row) {
  return QuantizeRows(stored, src_dtype, src, rows, width, static_cast<uint8_t*>(out.codes), out.row_scales,
                      bad_row);
}
void DecodeFp8(Dtype stored, const PartsIn& in, size_t rows, size_t width, Dtype dst_dtype, void* dst) {
  DequantizeRows(stored, static_cast<const uint8_t*>(in.codes), in.row_scales, rows, width, dst_dtype, dst);
}
// All codes of the block before any scale.
RowCheck CheckFp8(Dtype stored, const PartsIn& in, size_t rows, size_t width) {
  const size_t bad = FindInvalidCode(stored, static_cast<const uint8_t*>(in.codes), rows * width);
  if (bad < rows * width) return {RowFault::kNonFiniteCode, bad / width};
  const size_t bad_scale = FindInvalidScale(in.row_scales, rows);
  if (bad_scale < rows) return {RowFault::kInvalidScale, bad_scale};
  return {};
}

// nvfp4: packed E2M1 codes, an E4M3 block scale per 16 elements, an f32
// scale per row (every E2M1 code is valid).
bool EncodeNvfp4(Dtype, Dtype src_dtype, const void* src, size_t rows, size_t width, const PartsOut& out,
                 size_t* bad_row) {
  return nvfp4::QuantizeRows(src_dtype, src, rows, width, static_cast<uint8_t*>(out.codes), out.block_scales,
                             out.row_scales, bad_row);
}
void DecodeNvfp4(Dtype, const PartsIn& in, size_t rows, size_t width, Dtype dst_dtype, void* dst) {
  nvfp4::DequantizeRows(static_cast<const uint8_t*>(in.codes), in.block_scales, in.row_scales, rows, width,
                        dst_dtype, dst);
}
// All block scales before any row scale.
RowCheck CheckNvfp4(Dtype, const PartsIn& in, size_t rows, size_t width) {
  const size_t blocks = rows * width / nvfp4::kBlock;
  const size_t bad = nvfp4::FindInvalidBlockScale(in.block_scales, blocks);
  if (bad < blocks) return {RowFault::kInvalidBlockScale, bad / (width / nvfp4::kBlock)};
  const size_t bad_scale = FindInvalidScale(in.row_scales, rows);
  if (bad_scale < rows) return {RowFault::kInvalidScale, bad_scale};
  return {};
}

// In the order of kDtypeTable (kvfile/dtype.h).
constexpr DtypeCodec kCodecs[] = {
    {Dtype::kE4M3, EncodeFp8, DecodeFp8, CheckFp8},       {Dtype::kE5M2, EncodeFp8, DecodeFp8, CheckFp8},
    {Dtype::kBF16, EncodeRaw, DecodeRaw, CheckRaw},       {Dtype::kF16, EncodeRaw, DecodeRaw, CheckRaw},
    {Dtype::kF32, EncodeRaw, DecodeRaw, CheckRaw},        {Dtype::kNvfp4, EncodeNvfp4, DecodeNvfp4, CheckNvfp4},
};
static_assert(sizeof(kCodecs) / sizeof(kCodecs[0]) == kDtypeCount, "one codec row per Dtype");
static_assert([] {
  for (size_t i = 0; i < kDtypeCount; ++i)
    if (kCodecs[i].dtype != kDtypeTable[i].dtype) return false;
  return true;
}(), "kCodecs in the order of kDtypeTable");

}  // namespace

const DtypeCodec* CodecOf(Dtype d) {
  const size_t slot = DtypeSlot(d);
  return slot < kDtypeCount ? &kCodecs[slot] : nullptr;
}

PartsIn AtRow(Dtype d, const PartsIn& p, uint64_t rows, uint64_t width) {
  PartsIn q = p;
  for (DtypePart part : {DtypePart::kCodes, DtypePart::kBlockScales, DtypePart::kRowScales})
    if (p.part(part)) q.set_part(part, static_cast<const uint8_t*>(p.part(part)) + PartBytes(d, part, rows, width));
  return q;
}

PartsOut AtRow(Dtype d, const PartsOut& p, uint64_t rows, uint64_t width) {
  PartsOut q = p;
  for (DtypePart part : {DtypePart::kCodes, DtypePart::kBlockScales, DtypePart::kRowScales})
    if (p.part(part)) q.set_part(part, static_cast<uint8_t*>(p.part(part)) + PartBytes(d, part, rows, width));
  return q;
}

void CopyParts(Dtype d, const PartsIn& from, uint64_t rows, uint64_t width, const PartsOut& to) {
  const DtypeInfo* info = FindDtype(d);
  for (size_t i = 0; info && i < info->part_count; ++i) {
    const DtypePart part = info->parts[i];
    std::memcpy(to.part(part), from.part(part), PartBytes(d, part, rows, width));
  }
}

void ZeroParts(Dtype d, uint64_t rows, uint64_t width, const PartsOut& to) {
  const DtypeInfo* info = FindDtype(d);
  for (size_t i = 0; info && i < info->part_count; ++i) {
    const DtypePart part = info->parts[i];
    std::memset(to.part(part), 0, PartBytes(d, part, rows, width));
  }
}

bool HasEveryPart(Dtype d, const PartsIn& p) {
  const DtypeInfo* info = FindDtype(d);
  if (info == nullptr) return false;
  for (size_t i = 0; i < info->part_count; ++i)
    if (p.part(info->parts[i]) == nullptr) return false;
  return true;
}

}  // namespace kvfile::codec
