// SPDX-License-Identifier: Apache-2.0
// The shared header frame and the checksum (format/framing.h).
#include "format/framing.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "format/endian.h"

namespace kvfile::format {

uint64_t Checksum(const void* data, size_t n) { return XXH3_64bits(data, n); }

bool ChecksumMatches(uint64_t stored, uint64_t computed) {
#ifdef KVFILE_FUZZING_SKIP_CHECKSUMS
  (void)stored;
  (void)computed;
  return true;
#else
  return stored == computed;
#endif
}

ChecksumStream::ChecksumStream() : state_(XXH3_createState()) {
  if (state_ == nullptr) throw std::bad_alloc();
  XXH3_64bits_reset(state_);
}
ChecksumStream::~ChecksumStream() { XXH3_freeState(state_); }
void ChecksumStream::Reset() { XXH3_64bits_reset(state_); }
void ChecksumStream::Update(const void* data, size_t n) { XXH3_64bits_update(state_, data, n); }
uint64_t ChecksumStream::Digest() const { return XXH3_64bits_digest(state_); }

void SealRecord(std::span<uint8_t> record) {
  const size_t body = record.size() - 8;
  StoreU64(record.data() + body, Checksum(record.data(), body));
}

bool RecordChecksumMatches(std::span<const uint8_t> record) {
  const size_t body = record.size() - 8;
  return ChecksumMatches(LoadU64(record.data() + body), Checksum(record.data(), body));
}

bool AllZero(std::span<const uint8_t> bytes) {
  // OR of eight bytes at a time, no early exit: section padding runs to
  // kilobytes, and a loop without a branch per byte vectorizes (and keeps
  // the fuzz build's comparison tracing to one compare per input).
  const uint8_t* p = bytes.data();
  size_t n = bytes.size();
  uint64_t any = 0;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    any |= word;
  }
  for (; n > 0; ++p, --n) any |= *p;
  return any == 0;
}

std::optional<ByteRange> FirstNonzero(std::span<const ByteRange> ranges, std::span<const uint8_t> bytes) {
  for (const ByteRange& r : ranges)
    if (!AllZero(bytes.subspan(r.begin, r.end - r.begin))) return r;
  return std::nullopt;
}

void EncodeFrame(const FrameSpec& spec, const FrameFields& fields, std::span<uint8_t> header) {
  uint8_t* p = header.data();
  std::memset(p, 0, spec.header_bytes);
  std::memcpy(p + frame::kMagic, spec.magic.data(), frame::kMagicBytes);
  StoreU16(p + frame::kMajor, fields.major);
  StoreU16(p + frame::kMinor, fields.minor);
  StoreU32(p + frame::kHeaderBytes, static_cast<uint32_t>(spec.header_bytes));
  if (spec.has_flags) {
    StoreU64(p + frame::kRequiredFlags, fields.required_flags);
    StoreU64(p + frame::kOptionalFlags, fields.optional_flags);
  }
}

FrameCheck ParseFrame(const FrameSpec& spec, std::span<const uint8_t> header) {
  const auto in = header.first(spec.header_bytes);
  const uint8_t* p = in.data();
  FrameCheck c;
  auto fail = [&c](FrameFault f, size_t at) {
    c.fault = f;
    c.at = at;
    return c;
  };
  if (std::memcmp(p + frame::kMagic, spec.magic.data(), frame::kMagicBytes) != 0)
    return fail(FrameFault::kMagic, frame::kMagic);
  c.fields.major = LoadU16(p + frame::kMajor);
  c.fields.minor = LoadU16(p + frame::kMinor);
  auto version = std::find_if(spec.versions.begin(), spec.versions.end(),
                              [&](const FrameVersion& v) { return v.major == c.fields.major; });
  if (version == spec.versions.end()) return fail(FrameFault::kMajor, frame::kMajor);
  if (!RecordChecksumMatches(in)) return fail(FrameFault::kChecksum, spec.header_bytes - 8);
  if (LoadU32(p + frame::kHeaderBytes) != spec.header_bytes) return fail(FrameFault::kHeaderBytes, frame::kHeaderBytes);
  if (spec.has_flags) {
    c.fields.required_flags = LoadU64(p + frame::kRequiredFlags);
    c.fields.optional_flags = LoadU64(p + frame::kOptionalFlags);
    if ((c.fields.required_flags & ~version->known_required_flags) != 0)
      return fail(FrameFault::kRequiredFlags, frame::kRequiredFlags);
  }
  if (std::optional<ByteRange> r = FirstNonzero(spec.reserved, in)) return fail(FrameFault::kReserved, r->begin);
  return c;
}

}  // namespace kvfile::format
