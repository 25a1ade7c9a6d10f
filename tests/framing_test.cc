// SPDX-License-Identifier: Apache-2.0
// The framing module (format/framing.h): the header frame every container
// shares (encode, parse, each field's refusal, reserved bytes), the record
// checksum over exactly its declared bytes, and the frames of the three
// containers (.kv, .kvpack, prefix index) as their decoders use them.
#include "format/framing.h"

#include <xxhash.h>

#include <array>
#include <vector>

#include "format/endian.h"
#include "format/header.h"
#include "index/index_format.h"
#include "pack/pack_format.h"

namespace kvfile::format {
namespace {

constexpr uint8_t kTestMagic[8] = {0x89, 'T', 'S', 'T', '\r', '\n', 0x1A, '\n'};
constexpr FrameVersion kTestVersions[] = {{3, 0x5}, {1, 0}};
constexpr ByteRange kTestReserved[] = {{40, 44}, {48, 56}};
constexpr FrameSpec kTest = {kTestMagic, 64, kTestVersions, true, kTestReserved};

// A sealed 64-byte test header (3.7, required 0x5, optional 0xF0, a field
// at 32) in a
// buffer of 80 bytes: the 16 past the header are 0xEE.
std::vector<uint8_t> Sealed(FrameFields f = {3, 7, 0x5, 0xF0}) {
  std::vector<uint8_t> b(80, 0xEE);
  EncodeFrame(kTest, f, b);
  StoreU64(b.data() + 32, 0x1122334455667788);  // a field of the format's own
  SealRecord(std::span<uint8_t>(b.data(), 64));
  return b;
}

void Reseal(std::vector<uint8_t>& b) { SealRecord(std::span<uint8_t>(b.data(), 64)); }

TEST(Framing, EncodeWritesTheFrameAndParseReadsItBack) {
  std::vector<uint8_t> b = Sealed();
  const uint8_t prefix[32] = {0x89, 'T', 'S', 'T', '\r', '\n', 0x1A, '\n',  // magic
                              3, 0, 7, 0,                                    // major 3, minor 7
                              64, 0, 0, 0,                                   // header bytes
                              5, 0, 0, 0, 0, 0, 0, 0,                        // required flags
                              0xF0, 0, 0, 0, 0, 0, 0, 0};                    // optional flags
  EXPECT_EQ(std::vector<uint8_t>(b.begin(), b.begin() + 32), std::vector<uint8_t>(prefix, prefix + 32));
  // Zeroed around the format's field (32..40), the checksum last, the
  // bytes past the header untouched.
  EXPECT_TRUE(AllZero(std::span<const uint8_t>(b.data() + 40, 16)));
  EXPECT_EQ(LoadU64(b.data() + 56), XXH3_64bits(b.data(), 56));
  EXPECT_EQ(std::vector<uint8_t>(b.begin() + 64, b.end()), std::vector<uint8_t>(16, 0xEE));

  FrameCheck c = ParseFrame(kTest, b);
  EXPECT_EQ(c.fault, FrameFault::kNone);
  EXPECT_EQ(c.fields.major, 3);
  EXPECT_EQ(c.fields.minor, 7);
  EXPECT_EQ(c.fields.required_flags, 0x5u);
  EXPECT_EQ(c.fields.optional_flags, 0xF0u);  // unknown optional bits are no fault
}

TEST(Framing, EachFieldIsRefusedNamingItsOffset) {
  struct Case {
    const char* what;
    void (*damage)(std::vector<uint8_t>&);
    FrameFault fault;
    size_t at;
  } cases[] = {
      {"magic", [](std::vector<uint8_t>& b) { b[3] ^= 1; }, FrameFault::kMagic, 0},
      {"major 2", [](std::vector<uint8_t>& b) { StoreU16(b.data() + 8, 2); Reseal(b); }, FrameFault::kMajor, 8},
      {"checksum", [](std::vector<uint8_t>& b) { b[33] ^= 1; }, FrameFault::kChecksum, 56},
      {"header bytes", [](std::vector<uint8_t>& b) { StoreU32(b.data() + 12, 128); Reseal(b); },
       FrameFault::kHeaderBytes, 12},
      {"required bit 1", [](std::vector<uint8_t>& b) { StoreU64(b.data() + 16, 0x7); Reseal(b); },
       FrameFault::kRequiredFlags, 16},
      {"reserved 50", [](std::vector<uint8_t>& b) { b[50] = 1; Reseal(b); }, FrameFault::kReserved, 48},
      {"reserved 41 and 55", [](std::vector<uint8_t>& b) { b[55] = 1; b[41] = 0x80; Reseal(b); },
       FrameFault::kReserved, 40},
  };
  for (const Case& k : cases) {
    std::vector<uint8_t> b = Sealed();
    k.damage(b);
    FrameCheck c = ParseFrame(kTest, b);
    EXPECT_EQ(c.fault, k.fault) << k.what;
    EXPECT_EQ(c.at, k.at) << k.what;
  }
}

// Each range of the spec's reserved list is checked, the first nonzero one
// named; bytes outside every range (the format's own fields) are free.
TEST(Framing, EveryReservedRangeMustBeZero) {
  static constexpr ByteRange ranges[] = {{20, 24}, {30, 31}, {48, 56}};
  constexpr FrameSpec spec = {kTestMagic, 64, kTestVersions, false, ranges};
  for (size_t i = 16; i < 56; ++i) {
    std::vector<uint8_t> b(64, 0);
    EncodeFrame(spec, {1, 0, 0, 0}, b);
    b[i] = 0x40;
    SealRecord(b);
    FrameCheck c = ParseFrame(spec, b);
    const ByteRange* in = nullptr;
    for (const ByteRange& r : ranges)
      if (i >= r.begin && i < r.end) in = &r;
    if (in) {
      EXPECT_EQ(c.fault, FrameFault::kReserved) << i;
      EXPECT_EQ(c.at, in->begin) << i;
    } else {
      EXPECT_EQ(c.fault, FrameFault::kNone) << i;
    }
  }
}

// A frame without flags reads none and refuses none: bytes 16..31 are the
// format's own.
TEST(Framing, WithoutFlagsBytes16To31AreTheFormats) {
  constexpr FrameSpec spec = {kTestMagic, 64, kTestVersions, false, {}};
  std::vector<uint8_t> b(64, 0);
  EncodeFrame(spec, {1, 0, 0xFF, 0xFF}, b);
  EXPECT_TRUE(AllZero(std::span<const uint8_t>(b.data() + 16, 16)));
  StoreU64(b.data() + 16, ~uint64_t{0});
  SealRecord(b);
  FrameCheck c = ParseFrame(spec, b);
  EXPECT_EQ(c.fault, FrameFault::kNone);
  EXPECT_EQ(c.fields.required_flags, 0u);
}

// The required bits a build knows are per major: major 1 of kTest knows none.
TEST(Framing, RequiredFlagsAreKnownPerMajor) {
  std::vector<uint8_t> b = Sealed({1, 0, 0x1, 0});
  FrameCheck c = ParseFrame(kTest, b);
  EXPECT_EQ(c.fault, FrameFault::kRequiredFlags);
  EXPECT_EQ(c.fields.major, 1);
  EXPECT_EQ(c.fields.required_flags, 0x1u);
  EXPECT_EQ(ParseFrame(kTest, Sealed({1, 0, 0, 0})).fault, FrameFault::kNone);
  EXPECT_EQ(ParseFrame(kTest, Sealed({3, 0, 0x4, 0})).fault, FrameFault::kNone);
}

// The version comes before the checksum (a file from the future is
// unsupported, not damaged), the magic before both.
TEST(Framing, MagicThenVersionThenChecksum) {
  std::vector<uint8_t> b = Sealed();
  StoreU16(b.data() + 8, 4);  // not resealed: the checksum is wrong too
  FrameCheck c = ParseFrame(kTest, b);
  EXPECT_EQ(c.fault, FrameFault::kMajor);
  EXPECT_EQ(c.fields.major, 4);
  b[0] = 0;
  EXPECT_EQ(ParseFrame(kTest, b).fault, FrameFault::kMagic);
}

// The checksum covers exactly [0, header - 8): every byte of it counts, the
// bytes past the header do not, and it is XXH3-64 with seed 0.
TEST(Framing, ChecksumCoversExactlyTheDeclaredBytes) {
  EXPECT_EQ(Checksum("", 0), 0x2D06800538D394C2ull);
  for (size_t i = 0; i < 56; ++i) {
    std::vector<uint8_t> b = Sealed();
    b[i] ^= 0x10;
    if (i < 10) continue;  // the magic and the major fail before the checksum
    EXPECT_EQ(ParseFrame(kTest, b).fault, FrameFault::kChecksum) << i;
    EXPECT_FALSE(RecordChecksumMatches(std::span<const uint8_t>(b.data(), 64))) << i;
  }
  std::vector<uint8_t> b = Sealed();
  for (size_t i = 64; i < b.size(); ++i) b[i] ^= 0xFF;
  EXPECT_EQ(ParseFrame(kTest, b).fault, FrameFault::kNone);
  EXPECT_TRUE(RecordChecksumMatches(std::span<const uint8_t>(b.data(), 64)));

  std::array<uint8_t, 24> record{};
  for (size_t i = 0; i < 16; ++i) record[i] = static_cast<uint8_t>(i * 37 + 1);
  SealRecord(record);
  EXPECT_EQ(LoadU64(record.data() + 16), XXH3_64bits(record.data(), 16));
  EXPECT_TRUE(RecordChecksumMatches(record));

  ChecksumStream s;
  s.Update(record.data(), 5);
  s.Update(record.data() + 5, 11);
  EXPECT_EQ(s.Digest(), XXH3_64bits(record.data(), 16));
  s.Reset();
  EXPECT_EQ(s.Digest(), Checksum("", 0));
}

// The frames of the packs and the index, as their decoders use them: a
// reserved byte anywhere in a listed range is refused, the rest of the
// header is the format's.
TEST(Framing, PackAndIndexFramesListTheirReservedBytes) {
  struct Container {
    const char* name;
    const FrameSpec* spec;
    std::vector<size_t> reserved;
  } containers[] = {
      {"pack", &pack::kFrame, {112, 113, 119}},
      {"index", &index::kFrame, {28, 31, 96, 104, 112, 119}},
  };
  for (const Container& k : containers) {
    ASSERT_EQ(k.spec->header_bytes, 128u) << k.name;
    std::vector<uint8_t> b(128);
    EncodeFrame(*k.spec, {1, 0, 0, 0}, b);
    SealRecord(b);
    EXPECT_EQ(ParseFrame(*k.spec, b).fault, FrameFault::kNone) << k.name;
    for (size_t i : k.reserved) {
      std::vector<uint8_t> d = b;
      d[i] = 1;
      SealRecord(d);
      EXPECT_EQ(ParseFrame(*k.spec, d).fault, FrameFault::kReserved) << k.name << " byte " << i;
    }
  }
}

// Every container checks its major version before its header checksum:
// a damaged header from the future is unsupported. (The index checked the
// checksum first, and called such a header damaged.)
TEST(Framing, EveryContainerChecksItsVersionBeforeItsChecksum) {
  std::vector<uint8_t> idx(index::kHeaderBytes);
  index::EncodeHeader(index::Header{}, idx.data());
  StoreU16(idx.data() + 8, 2);
  index::Header h;
  Status st = index::DecodeHeader("/d/.kvfile-index", idx.data(), &h);
  EXPECT_EQ(st.code(), Status::Code::kUnsupported) << st.ToString();
  EXPECT_EQ(st.message(), "/d/.kvfile-index: index format 2 (this build reads 1)");

  FileHeader fh;
  fh.salt = 9;
  fh.chunk_tokens = 16;
  fh.geometry.layers = 1;
  fh.geometry.streams = {{"k", 1, 8, Dtype::kE4M3}};
  std::array<uint8_t, kHeaderSize> kv{};
  EncodeFileHeader(fh, kv);
  StoreU16(kv.data() + 8, 3);
  FileHeader out;
  st = DecodeFileHeader(kv, &out);
  EXPECT_EQ(st.code(), Status::Code::kUnsupported) << st.ToString();
  EXPECT_EQ(st.message(), "format major version 3 is not supported (this build reads 1 and 2)");

  std::vector<uint8_t> pk(pack::kHeaderBytes);
  EncodeFrame(pack::kFrame, {pack::kMajor, pack::kMinor, 0, 0}, pk);
  SealRecord(pk);
  StoreU16(pk.data() + 8, 2);
  EXPECT_EQ(ParseFrame(pack::kFrame, pk).fault, FrameFault::kMajor);
}

}  // namespace
}  // namespace kvfile::format
