// SPDX-License-Identifier: Apache-2.0
// The NVFP4 element conversion over every finite f32, against the digest of
// NVIDIA's conversion (tests/vectors/README.md). Label `long`.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <vector>

#include "codec/nvfp4.h"

namespace kvfile::codec::nvfp4 {
namespace {

TEST(Nvfp4Exhaustive, EveryFiniteF32MatchesNvidiasDigest) {
  uLong crc = crc32(0L, Z_NULL, 0);
  std::vector<uint8_t> buf;
  buf.reserve(1 << 24);
  uint64_t count = 0;
  for (uint64_t b = 0; b <= 0xFFFFFFFFull; ++b) {
    if (((b >> 23) & 0xFF) == 0xFF) continue;
    const uint32_t bits = static_cast<uint32_t>(b);
    float x;
    std::memcpy(&x, &bits, 4);
    buf.push_back(EncodeE2M1(x));
    ++count;
    if (buf.size() == buf.capacity()) {
      crc = crc32(crc, buf.data(), static_cast<uInt>(buf.size()));
      buf.clear();
    }
  }
  crc = crc32(crc, buf.data(), static_cast<uInt>(buf.size()));
  EXPECT_EQ(count, 4278190080u);
  EXPECT_EQ(crc, 0xd52698cbu);
}

}  // namespace
}  // namespace kvfile::codec::nvfp4
