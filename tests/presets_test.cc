// SPDX-License-Identifier: Apache-2.0
// Tests of the built-in geometry presets (src/geometry/presets.cc).

#include "support/kv_test_util.h"

namespace kvfile {
namespace {

using namespace kvfile::test;

TEST(Presets, AreTheDocumentedShapes) {
  std::vector<std::string> names = PresetNames();
  EXPECT_EQ(names, (std::vector<std::string>{"llama-3.1-8b", "qwen2.5-7b", "deepseek-v3",
                                             "dsa-mixed", "glm-5.2", "tiny"}));
  Geometry g = Preset("dsa-mixed", Dtype::kE5M2);
  ASSERT_EQ(g.streams.size(), 3u);
  EXPECT_EQ(g.layers, 61u);
  EXPECT_EQ(g.streams[0], (StreamSpec{"latent", 1, 512, Dtype::kE5M2}));
  EXPECT_EQ(g.streams[1], (StreamSpec{"rope", 1, 64, Dtype::kE5M2}));
  EXPECT_EQ(g.streams[2], (StreamSpec{"indexer", 1, 128, Dtype::kBF16}));
  // GLM-5.2: 78 MLA layers, the bf16 indexer in 21 of them (0, 4, ..., 76, 77).
  g = Preset("glm-5.2");
  EXPECT_EQ(g.layers, 78u);
  ASSERT_EQ(g.streams.size(), 3u);
  EXPECT_EQ(g.streams[0], (StreamSpec{"latent", 1, 512, Dtype::kE4M3}));
  EXPECT_EQ(g.streams[1], (StreamSpec{"rope", 1, 64, Dtype::kE4M3}));
  std::vector<uint32_t> indexer;
  for (uint32_t l = 0; l < 78; l += 4) indexer.push_back(l);
  indexer.push_back(77);
  EXPECT_EQ(g.streams[2], (StreamSpec{"indexer", 1, 128, Dtype::kBF16, indexer}));
  EXPECT_EQ(g.SectionCount(), 78u * 2 + 21);
  // Per token: 78 x (516 + 68) e4m3 bytes with scales, 21 x 256 bf16 bytes.
  EXPECT_EQ(g.PayloadBytesPerToken(), 78u * (516 + 68) + 21u * 256);
  g = Preset("tiny");
  EXPECT_EQ(g.layers, 2u);
  EXPECT_EQ(g.streams[0], (StreamSpec{"k", 2, 16, Dtype::kE4M3}));
  Geometry unused;
  EXPECT_TRUE(HasCode(GetPreset("nope", Dtype::kE4M3, &unused), Code::kInvalidArgument, {"tiny"}));
  EXPECT_TRUE(HasCode(GetPreset("tiny", Dtype::kBF16, &unused), Code::kInvalidArgument));
}

}  // namespace
}  // namespace kvfile
