// SPDX-License-Identifier: Apache-2.0
// The golden fixture: the worked example of spec/FORMAT.md, written by the
// library and compared byte for byte with tests/fixtures/example_v2.kv
// (version 2.1; example_v2_0.kv is the same example as 2.0 wrote it).
//
// KVFILE_REGENERATE_GOLDEN=1 rewrites the fixture instead (only when the
// format changes on purpose, which also means a new version number).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "kvfile/reader.h"
#include "kvfile/writer.h"
#include "support/testing_hooks.h"

namespace kvfile {
namespace {

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

Geometry ExampleGeometry(uint16_t major = 2) {
  Geometry g;
  g.layers = 1;
  g.streams = {{"k", 1, 4, major == 2 ? Dtype::kE4M3 : Dtype::kF32}, {"idx", 1, 2, Dtype::kBF16}};
  return g;
}

// Writes the example of spec/FORMAT.md, "Worked example" (v2), or of its
// v1 section (the same data, "k" stored raw as f32).
void WriteExample(const std::string& path, uint16_t major = 2) {
  WriterOptions opt;
  opt.format_major = major;
  opt.chunk_tokens = 2;
  hooks::SetWriterSalt(0x1122334455667788ull);
  opt.overwrite = true;
  std::unique_ptr<Writer> w;
  ASSERT_TRUE(hooks::CreateWriter(path, ExampleGeometry(major), {"example/tiny", 0x0123456789ABCDEFull}, opt, &w).ok());
  const float k[8] = {1.0f, -2.0f, 0.5f, 448.0f, 0.0f, 0.0f, 0.0f, -0.0f};
  const uint16_t idx[4] = {0x3FC0, 0xC040, 0x3E80, 0x42C8};  // bf16 1.5, -3, 0.25, 100
  const uint32_t tokens[2] = {101, 202};
  AppendBatch b;
  b.tokens = tokens;
  b.blocks = {{Dtype::kF32, k, nullptr}, {Dtype::kBF16, idx, nullptr}};
  ASSERT_TRUE(w->Append(b).ok());
  ASSERT_TRUE(w->Close().ok());
}

void CheckGolden(const std::string& name, uint16_t major, size_t size) {
  std::string fixture = std::string(KVFILE_TEST_DATA "/fixtures/").append(name);
  std::string out = testing::TempDir() + "kvfile_golden_" + name;
  WriteExample(out, major);
  std::vector<uint8_t> written = ReadAll(out);
  std::remove(out.c_str());
  if (std::getenv("KVFILE_REGENERATE_GOLDEN") != nullptr) {
    std::ofstream(fixture, std::ios::binary).write(reinterpret_cast<const char*>(written.data()),
                                                   static_cast<std::streamsize>(written.size()));
    GTEST_SKIP() << "regenerated " << fixture;
  }
  std::vector<uint8_t> golden = ReadAll(fixture);
  ASSERT_EQ(golden.size(), size) << "fixture missing or wrong size: " << fixture;
  ASSERT_EQ(written.size(), golden.size());
  for (size_t i = 0; i < golden.size(); ++i)
    ASSERT_EQ(written[i], golden[i]) << "first difference at byte offset " << i;
}

TEST(Golden, ExampleFileIsByteIdentical) { CheckGolden("example_v2.kv", 2, 16384); }
TEST(Golden, ExampleV1FileIsByteIdentical) { CheckGolden("example_v1.kv", 1, 16384); }

TEST(Golden, ExampleV1ReadsBackAndQuantizesLikeV2) {
  std::string fixture = std::string(KVFILE_TEST_DATA "/fixtures/example_v1.kv");
  std::unique_ptr<Reader> r;
  Status st = Reader::Open(fixture, {}, &r);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(r->major_version(), 1);
  EXPECT_EQ(r->geometry(), ExampleGeometry(1));
  float k[8];
  ASSERT_TRUE(r->ReadRows(0, 0, 0, 2, Dtype::kF32, k).ok());
  const float want[8] = {1.0f, -2.0f, 0.5f, 448.0f, 0.0f, 0.0f, 0.0f, -0.0f};
  EXPECT_EQ(0, std::memcmp(k, want, sizeof k));
  uint8_t codes[8];
  float scales[2];
  ASSERT_TRUE(r->ReadCodes(0, 0, 0, 2, codes, scales).ok());
  const uint8_t want_codes[8] = {0x38, 0xC0, 0x30, 0x7E, 0x00, 0x00, 0x00, 0x80};
  EXPECT_EQ(0, std::memcmp(codes, want_codes, 8));
  EXPECT_EQ(scales[0], 1.0f);
  EXPECT_EQ(scales[1], 1.0f);
}

// example_v2.kv is version 2.1; example_v2_0.kv is the same example as
// version 2.0 wrote it (no append ends), kept to prove 2.0 files still read.
class GoldenV2 : public ::testing::TestWithParam<std::pair<const char*, int>> {};

TEST_P(GoldenV2, ExampleFileReadsBack) {
  std::string fixture = std::string(KVFILE_TEST_DATA "/fixtures/").append(GetParam().first);
  std::unique_ptr<Reader> r;
  Status st = Reader::Open(fixture, {}, &r);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(r->major_version(), 2);
  EXPECT_EQ(r->minor_version(), GetParam().second);
  EXPECT_EQ(r->identity().model_id, "example/tiny");
  EXPECT_EQ(r->identity().fingerprint, 0x0123456789ABCDEFull);
  EXPECT_EQ(r->geometry(), ExampleGeometry());
  ASSERT_EQ(r->token_count(), 2u);
  EXPECT_EQ(r->tokens()[0], 101u);
  EXPECT_EQ(r->tokens()[1], 202u);
  uint8_t codes[8];
  float scales[2];
  ASSERT_TRUE(r->ReadCodes(0, 0, 0, 2, codes, scales).ok());
  const uint8_t want_codes[8] = {0x38, 0xC0, 0x30, 0x7E, 0x00, 0x00, 0x00, 0x80};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(codes[i], want_codes[i]) << "code " << i;
  EXPECT_EQ(scales[0], 1.0f);
  EXPECT_EQ(scales[1], 1.0f);
  uint16_t idx[4];
  ASSERT_TRUE(r->ReadRows(0, 1, 0, 2, Dtype::kBF16, idx).ok());
  EXPECT_EQ(idx[0], 0x3FC0);
  EXPECT_EQ(idx[1], 0xC040);
  EXPECT_EQ(idx[2], 0x3E80);
  EXPECT_EQ(idx[3], 0x42C8);
}

INSTANTIATE_TEST_SUITE_P(Versions, GoldenV2,
                         ::testing::Values(std::pair{"example_v2.kv", 1}, std::pair{"example_v2_0.kv", 0}));

}  // namespace
}  // namespace kvfile
