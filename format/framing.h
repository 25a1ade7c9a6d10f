// SPDX-License-Identifier: Apache-2.0
// The framing the containers of the project share, and their one checksum.
//
// A .kv file (spec/FORMAT.md 3), a .kvpack archive (spec/PACK.md 2) and a
// prefix index (spec/INDEX.md 2) each begin with a fixed-size header laid
// out as
//
//   0             u8[8]  magic
//   8             u16    major version
//   10            u16    minor version
//   12            u32    header bytes (the header's fixed size)
//   16            u64    required flags (formats with flags)
//   24            u64    optional flags (formats with flags)
//   ...                  the format's own fields; reserved bytes are zero
//   header - 8    u64    XXH3-64 of bytes [0, header - 8)
//
// A FrameSpec describes one container's header; EncodeFrame/SealRecord
// write it and ParseFrame checks it, in the order every format follows:
// magic, major version (an unknown major is unsupported, not damaged: a
// file from the future must not read as a damaged one), checksum, header
// size, required flags (an unknown bit is unsupported), reserved bytes.
// Each format turns a FrameFault into its own error text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

struct XXH3_state_s;

namespace kvfile::format {

// XXH3-64 with seed 0: the one checksum of every format.
uint64_t Checksum(const void* data, size_t n);

// Whether a checksum stored in a file matches the one computed from its
// bytes. Every checksum comparison of the library goes through here so that
// a fuzzing build (KVFILE_FUZZING_SKIP_CHECKSUMS, tests/fuzz/) can make them
// all pass in one place: otherwise nearly every mutated input would stop at
// a checksum and never reach the parsers behind it.
bool ChecksumMatches(uint64_t stored, uint64_t computed);

// The same checksum over bytes that arrive in pieces, in order.
class ChecksumStream {
 public:
  ChecksumStream();
  ~ChecksumStream();
  ChecksumStream(const ChecksumStream&) = delete;
  ChecksumStream& operator=(const ChecksumStream&) = delete;
  void Reset();  // back to no bytes
  void Update(const void* data, size_t n);
  uint64_t Digest() const;

 private:
  XXH3_state_s* state_;
};

// A fixed-size record whose last 8 bytes hold the checksum of the bytes
// before them (a container header, a .kv commit slot): SealRecord stores
// it, RecordChecksumMatches compares it (through ChecksumMatches).
void SealRecord(std::span<uint8_t> record);
bool RecordChecksumMatches(std::span<const uint8_t> record);

// True if every byte of `bytes` is zero.
bool AllZero(std::span<const uint8_t> bytes);

// Bytes [begin, end) of a record.
struct ByteRange {
  size_t begin, end;
};
// The first of `ranges` (in their order) holding a nonzero byte of
// `bytes`, or none.
std::optional<ByteRange> FirstNonzero(std::span<const ByteRange> ranges, std::span<const uint8_t> bytes);

namespace frame {
inline constexpr size_t kMagic = 0;           // u8[8]
inline constexpr size_t kMagicBytes = 8;
inline constexpr size_t kMajor = 8;           // u16
inline constexpr size_t kMinor = 10;          // u16
inline constexpr size_t kHeaderBytes = 12;    // u32
inline constexpr size_t kRequiredFlags = 16;  // u64, formats with flags
inline constexpr size_t kOptionalFlags = 24;  // u64, formats with flags
inline constexpr size_t kFlagsEnd = 32;
}  // namespace frame

// A major version a build reads, with the required flag bits it knows in it.
struct FrameVersion {
  uint16_t major;
  uint64_t known_required_flags;
};

struct FrameSpec {
  std::span<const uint8_t, frame::kMagicBytes> magic;
  size_t header_bytes;  // the header's fixed size; the checksum is its last 8 bytes
  std::span<const FrameVersion> versions;  // the majors this build reads
  bool has_flags;  // required and optional flags at frame::kRequiredFlags and kOptionalFlags
  // Bytes that must be zero, checked last; a format whose other fields come
  // first in its checks leaves this empty and calls FirstNonzero itself.
  std::span<const ByteRange> reserved;
};

struct FrameFields {
  uint16_t major = 0;
  uint16_t minor = 0;
  uint64_t required_flags = 0;  // 0 unless spec.has_flags
  uint64_t optional_flags = 0;  // 0 unless spec.has_flags
};

enum class FrameFault {
  kNone,
  kMagic,          // at frame::kMagic
  kMajor,          // a major not in spec.versions (unsupported)
  kChecksum,       // at header_bytes - 8
  kHeaderBytes,    // the size field is not spec.header_bytes
  kRequiredFlags,  // a bit the major does not know (unsupported)
  kReserved,       // at the start of the first nonzero reserved range
};

struct FrameCheck {
  FrameFault fault = FrameFault::kNone;
  size_t at = 0;  // offset of the failing field in the header
  FrameFields fields;  // as read (those read before the fault)
};

// Zeroes the header (spec.header_bytes bytes), then writes the magic, the
// version, the header size and, with flags, the flags. The format writes its
// own fields after, then SealRecord(header).
void EncodeFrame(const FrameSpec& spec, const FrameFields& fields, std::span<uint8_t> header);
// `header` holds at least spec.header_bytes bytes; only those are read.
FrameCheck ParseFrame(const FrameSpec& spec, std::span<const uint8_t> header);

}  // namespace kvfile::format
