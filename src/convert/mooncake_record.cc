// SPDX-License-Identifier: Apache-2.0
// Mooncake FP8 codec record v1: encoder, checked parser, decoder
// (kvfile/formats/mooncake.h). The wire constants of the record live here only.
#include "kvfile/formats/mooncake.h"

#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "kvfile/codec.h"
#include "format/endian.h"

namespace kvfile::mooncake {

namespace {

// ---- Wire layout of a version 1 record (all little-endian) ----
constexpr uint8_t kMagic[8] = {'M', 'C', 'K', 'V', 'F', 'P', '8', 0};
constexpr uint16_t kVersion = 1;
constexpr size_t kOffVersion = 8;     // u16
constexpr size_t kOffDtype = 10;      // u8: 1 fp16, 2 bf16
constexpr size_t kOffRank = 11;       // u8
constexpr size_t kOffGroup = 12;      // u32
constexpr size_t kOffElements = 16;   // u64
constexpr size_t kOffCrc = 24;        // u32, CRC32/IEEE with this field zeroed
constexpr size_t kOffReserved = 28;   // u32, zero
constexpr size_t kHeaderBytes = 32;   // then rank u64 dims, scales, codes
constexpr float kE4M3Max = 448.0f;

bool IsNanCode(uint8_t c) { return (c & 0x7F) == 0x7F; }
bool ValidScale(float s) { return std::isfinite(s) && s > 0.0f; }

float Widen(SourceDtype d, uint16_t bits) {
  return d == SourceDtype::kF16 ? codec::F16ToF32(bits) : codec::Bf16ToF32(bits);
}

void WriteHeader(const RecordDesc& desc, uint64_t n, std::vector<uint8_t>* out) {
  uint8_t* p = out->data();
  std::memcpy(p, kMagic, 8);
  format::StoreU16(p + kOffVersion, kVersion);
  p[kOffDtype] = static_cast<uint8_t>(desc.dtype);
  p[kOffRank] = static_cast<uint8_t>(desc.shape.size());
  format::StoreU32(p + kOffGroup, desc.group_size);
  format::StoreU64(p + kOffElements, n);
  for (size_t d = 0; d < desc.shape.size(); ++d) format::StoreU64(p + kHeaderBytes + 8 * d, desc.shape[d]);
}

void Seal(std::vector<uint8_t>* out) {
  format::StoreU32(out->data() + kOffCrc, RecordCrc(*out));
}

}  // namespace

Status RecordSize(const RecordDesc& desc, uint64_t* elements, uint64_t* bytes) {
  if (desc.dtype != SourceDtype::kF16 && desc.dtype != SourceDtype::kBF16)
    return Status::InvalidArgument("source dtype " + std::to_string(static_cast<int>(desc.dtype)) +
                                   " is neither 1 (fp16) nor 2 (bf16)");
  if (desc.shape.empty() || desc.shape.size() > kMaxRank)
    return Status::InvalidArgument("rank " + std::to_string(desc.shape.size()) + " is not in 1..8");
  if (desc.group_size == 0) return Status::InvalidArgument("group size 0");
  uint64_t n = 1;
  for (uint64_t d : desc.shape) {
    if (d == 0) return Status::InvalidArgument("a shape dimension is 0");
    if (n > UINT64_MAX / d) return Status::InvalidArgument("the element count overflows 64 bits");
    n *= d;
  }
  uint64_t groups = (n - 1) / desc.group_size + 1;
  uint64_t head = kHeaderBytes + 8 * desc.shape.size();
  if (groups > (UINT64_MAX - head - n) / 4) return Status::InvalidArgument("the record size overflows 64 bits");
  *elements = n;
  *bytes = head + 4 * groups + n;
  return Status::OK();
}

std::string FormatId(uint32_t group_size) { return "fp8-e4m3fn-v1-g" + std::to_string(group_size); }

std::string RepresentationKey(uint32_t group_size, std::string_view logical_key) {
  return "__mc_codec__/" + FormatId(group_size) + "/" + std::string(logical_key);
}

namespace {
bool SafeByte(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '-';
}
int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;  // lower case is never produced, so never accepted
}
}  // namespace

std::string FileNameForKey(std::string_view key) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string s;
  for (unsigned char c : key) {
    if (SafeByte(c)) {
      s += static_cast<char>(c);
    } else {
      s += '%';
      s += kHex[c >> 4];
      s += kHex[c & 15];
    }
  }
  // "." and ".." name directories: their dots are escaped too.
  if (s == "." || s == "..") {
    std::string e;
    for (size_t i = 0; i < s.size(); ++i) e += "%2E";
    return e;
  }
  return s;
}

bool KeyFromFileName(std::string_view name, std::string* key) {
  std::string k;
  for (size_t i = 0; i < name.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(name[i]);
    if (SafeByte(c)) {
      k += static_cast<char>(c);
      continue;
    }
    if (c != '%' || i + 2 >= name.size()) return false;
    int hi = HexValue(name[i + 1]), lo = HexValue(name[i + 2]);
    if (hi < 0 || lo < 0) return false;
    k += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  // Only the canonical spelling is accepted (no %41 for 'A').
  if (FileNameForKey(k) != name) return false;
  *key = std::move(k);
  return true;
}

uint32_t RecordCrc(std::span<const uint8_t> record) {
  static const uint8_t kZero[4] = {0, 0, 0, 0};
  uLong crc = crc32(0L, Z_NULL, 0);
  auto add = [&crc](const uint8_t* p, size_t n) {
    while (n > 0) {
      uInt step = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
      crc = crc32(crc, p, step);
      p += step;
      n -= step;
    }
  };
  if (record.size() <= kOffCrc) {
    add(record.data(), record.size());
    return static_cast<uint32_t>(crc);
  }
  add(record.data(), kOffCrc);
  size_t z = std::min<size_t>(4, record.size() - kOffCrc);
  add(kZero, z);
  if (record.size() > kOffCrc + 4) add(record.data() + kOffCrc + 4, record.size() - kOffCrc - 4);
  return static_cast<uint32_t>(crc);
}

Status EncodeValues(const RecordDesc& desc, const uint16_t* values, std::vector<uint8_t>* out) {
  uint64_t n = 0, bytes = 0;
  KVFILE_RETURN_IF_ERROR(RecordSize(desc, &n, &bytes));
  for (uint64_t i = 0; i < n; ++i)
    if (!std::isfinite(Widen(desc.dtype, values[i])))
      return Status::NonFinite("element " + std::to_string(i) + " is not finite");
  std::vector<uint8_t> rec(bytes, 0);
  WriteHeader(desc, n, &rec);
  uint64_t groups = (n - 1) / desc.group_size + 1;
  uint8_t* scales = rec.data() + kHeaderBytes + 8 * desc.shape.size();
  uint8_t* codes = scales + 4 * groups;
  for (uint64_t g = 0; g < groups; ++g) {
    uint64_t b = g * desc.group_size, e = std::min<uint64_t>(n, b + desc.group_size);
    float amax = 0.0f;
    for (uint64_t i = b; i < e; ++i) amax = std::max(amax, std::fabs(Widen(desc.dtype, values[i])));
    // Mooncake's rule: amax / 448 in f32, no floor; 1 for an all-zero group.
    float scale = amax == 0.0f ? 1.0f : amax / kE4M3Max;
    format::StoreU32(scales + 4 * g, std::bit_cast<uint32_t>(scale));
    for (uint64_t i = b; i < e; ++i)
      codes[i] = codec::EncodeElement(Widen(desc.dtype, values[i]) / scale, Dtype::kE4M3);
  }
  Seal(&rec);
  *out = std::move(rec);
  return Status::OK();
}

Status EncodeCodes(const RecordDesc& desc, const float* scales, const uint8_t* codes, std::vector<uint8_t>* out) {
  uint64_t n = 0, bytes = 0;
  KVFILE_RETURN_IF_ERROR(RecordSize(desc, &n, &bytes));
  uint64_t groups = (n - 1) / desc.group_size + 1;
  for (uint64_t g = 0; g < groups; ++g)
    if (!ValidScale(scales[g])) return Status::InvalidArgument("scale " + std::to_string(g) + " is not finite and > 0");
  for (uint64_t i = 0; i < n; ++i)
    if (IsNanCode(codes[i])) return Status::InvalidArgument("code " + std::to_string(i) + " is a NaN code");
  std::vector<uint8_t> rec(bytes, 0);
  WriteHeader(desc, n, &rec);
  uint8_t* s = rec.data() + kHeaderBytes + 8 * desc.shape.size();
  for (uint64_t g = 0; g < groups; ++g) format::StoreU32(s + 4 * g, std::bit_cast<uint32_t>(scales[g]));
  std::memcpy(s + 4 * groups, codes, n);
  Seal(&rec);
  *out = std::move(rec);
  return Status::OK();
}

float RecordView::scale(uint64_t group) const {
  return std::bit_cast<float>(format::LoadU32(scale_bytes + 4 * group));
}

Status ParseRecord(std::span<const uint8_t> r, RecordView* out) {
  const uint8_t* p = r.data();
  if (r.size() < kHeaderBytes)
    return Status::Corruption("record of " + std::to_string(r.size()) + " bytes is shorter than its 32-byte header");
  if (std::memcmp(p, kMagic, 8) != 0) return Status::Corruption("bad magic (not MCKVFP8\\0)");
  uint16_t version = format::LoadU16(p + kOffVersion);
  if (version != kVersion)
    return Status::Corruption("record version " + std::to_string(version) + " (only version 1 is known)");
  if (format::LoadU32(p + kOffReserved) != 0) return Status::Corruption("reserved field is not zero");
  uint32_t crc = format::LoadU32(p + kOffCrc);
  if (crc != RecordCrc(r)) return Status::Corruption("CRC32 mismatch");
  RecordDesc d;
  uint8_t dt = p[kOffDtype];
  if (dt != 1 && dt != 2) return Status::Corruption("source dtype " + std::to_string(dt) + " is neither 1 nor 2");
  d.dtype = static_cast<SourceDtype>(dt);
  size_t rank = p[kOffRank];
  if (rank < 1 || rank > kMaxRank) return Status::Corruption("rank " + std::to_string(rank) + " is not in 1..8");
  if (r.size() < kHeaderBytes + 8 * rank) return Status::Corruption("record ends inside its shape");
  d.group_size = format::LoadU32(p + kOffGroup);
  for (size_t i = 0; i < rank; ++i) d.shape.push_back(format::LoadU64(p + kHeaderBytes + 8 * i));
  uint64_t n = 0, bytes = 0;
  Status st = RecordSize(d, &n, &bytes);
  if (!st.ok()) return Status::Corruption("descriptor: " + st.message());
  uint64_t declared = format::LoadU64(p + kOffElements);
  if (declared != n)
    return Status::Corruption("element count " + std::to_string(declared) + " is not the shape's " + std::to_string(n));
  if (bytes != r.size())
    return Status::Corruption("record is " + std::to_string(r.size()) + " bytes; its descriptor needs " +
                              std::to_string(bytes));
  RecordView v;
  v.desc = std::move(d);
  v.elements = n;
  v.groups = (n - 1) / v.desc.group_size + 1;
  v.scale_bytes = p + kHeaderBytes + 8 * rank;
  v.codes = v.scale_bytes + 4 * v.groups;
  for (uint64_t g = 0; g < v.groups; ++g)
    if (!ValidScale(v.scale(g)))
      return Status::Corruption("scale " + std::to_string(g) + " is not finite and > 0");
  size_t bad = codec::FindInvalidCode(Dtype::kE4M3, v.codes, n);
  if (bad < n) return Status::Corruption("code " + std::to_string(bad) + " is a NaN code");
  *out = std::move(v);
  return Status::OK();
}

void DecodeF32(const RecordView& rec, float* dst) {
  const float kMax = std::bit_cast<float>(0x7F7FFFFFu);
  for (uint64_t g = 0; g < rec.groups; ++g) {
    float s = rec.scale(g);
    uint64_t b = g * rec.desc.group_size, e = std::min<uint64_t>(rec.elements, b + rec.desc.group_size);
    for (uint64_t i = b; i < e; ++i) {
      float v = codec::DecodeElement(rec.codes[i], Dtype::kE4M3) * s;
      if (std::isinf(v)) v = std::copysign(kMax, v);
      dst[i] = v;
    }
  }
}

std::string SourceDtypeName(SourceDtype d) {
  return d == SourceDtype::kF16 ? "fp16 (1)" : d == SourceDtype::kBF16 ? "bf16 (2)" : std::to_string(static_cast<int>(d));
}

uint64_t FindGroupBeyondDtype(const RecordView& rec) {
  // Half a unit in the last place above the largest finite value: a tie
  // there rounds to even, which is infinity.
  const float bound = rec.desc.dtype == SourceDtype::kF16 ? 65520.0f : std::bit_cast<float>(0x7F7F8000u);
  for (uint64_t g = 0; g < rec.groups; ++g) {
    uint64_t b = g * rec.desc.group_size, e = std::min<uint64_t>(rec.elements, b + rec.desc.group_size);
    uint8_t top = 0;  // e4m3 magnitudes grow with their low 7 bits
    for (uint64_t i = b; i < e; ++i) top = std::max<uint8_t>(top, rec.codes[i] & 0x7F);
    if (!(codec::DecodeElement(top, Dtype::kE4M3) * rec.scale(g) < bound)) return g;
  }
  return rec.groups;
}

void DecodeValues(const RecordView& rec, uint16_t* dst) {
  bool f16 = rec.desc.dtype == SourceDtype::kF16;
  for (uint64_t g = 0; g < rec.groups; ++g) {
    float s = rec.scale(g);
    uint64_t b = g * rec.desc.group_size, e = std::min<uint64_t>(rec.elements, b + rec.desc.group_size);
    for (uint64_t i = b; i < e; ++i) {
      float v = codec::DecodeElement(rec.codes[i], Dtype::kE4M3) * s;
      dst[i] = f16 ? codec::F32ToF16(v) : codec::F32ToBf16(v);
    }
  }
}

}  // namespace kvfile::mooncake
