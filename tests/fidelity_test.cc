// SPDX-License-Identifier: Apache-2.0
// The measures of `kvfile bench --fidelity` (tools/kvfile/fidelity.h) on
// inputs whose answers are known by hand, and the command's output.
#include "fidelity.h"

#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/cli_run.h"

namespace kvfile::testing {
namespace {

using fidelity::AddDotProducts;
using fidelity::AttentionOutput;
using fidelity::BetaForEntropy;
using fidelity::RelativeL2;
using fidelity::SoftmaxEntropy;

TEST(FidelityMetrics, RelativeL2IsTheNormOfTheDifferenceOverTheNorm) {
  // ||(3, 4)|| = 5; the difference (0, -1) or (1, 1) ...
  const float a[] = {3, 4};
  const float b[] = {3, 5};
  EXPECT_DOUBLE_EQ(RelativeL2(a, b, 2), 0.2);
  const float c[] = {2, 2, 1};
  const float d[] = {2, 0, 1};  // difference (0, 2, 0), norm of c = 3
  EXPECT_DOUBLE_EQ(RelativeL2(c, d, 3), 2.0 / 3.0);
  EXPECT_EQ(RelativeL2(a, a, 2), 0.0);
  const float zero[] = {0, 0};
  EXPECT_EQ(RelativeL2(zero, zero, 2), 0.0);
  EXPECT_TRUE(std::isinf(RelativeL2(zero, a, 2)));
}

TEST(FidelityMetrics, EntropyOfUniformAndOfTwoLogits) {
  const double z[] = {1, 1, 1, 1};
  EXPECT_DOUBLE_EQ(SoftmaxEntropy(z, 4, 5.0), std::log(4.0));
  // softmax(beta * (0, log 3)) at beta 1 = (1/4, 3/4): H = log 4 - (3/4) log 3.
  const double two[] = {0, std::log(3.0)};
  EXPECT_NEAR(SoftmaxEntropy(two, 2, 1.0), std::log(4.0) - 0.75 * std::log(3.0), 1e-15);
  EXPECT_DOUBLE_EQ(SoftmaxEntropy(two, 2, 0.0), std::log(2.0));
}

TEST(FidelityMetrics, BetaForEntropyHitsTheTarget) {
  // Two logits (0, 1): the entropy at beta is that of (1, e^beta)
  // normalized; the beta giving probabilities (1/4, 3/4) is log 3.
  const double two[] = {0, 1};
  const double target = std::log(4.0) - 0.75 * std::log(3.0);
  const double beta = BetaForEntropy(two, 2, target / std::log(2.0));
  EXPECT_NEAR(beta, std::log(3.0), 1e-9);
  // Equal logits: no beta changes the entropy.
  const double same[] = {2, 2, 2};
  EXPECT_EQ(BetaForEntropy(same, 3, 0.5), 0.0);
}

TEST(FidelityMetrics, AttentionOutputIsTheSoftmaxWeightedSumOfValues) {
  // Logits (0, log 3) at beta 1: weights (1/4, 3/4). Values, stride 3, d 2:
  // rows (4, 8, x) and (0, 4, x): output (1, 5).
  const double z[] = {0, std::log(3.0)};
  const float v[] = {4, 8, 99, 0, 4, 99};
  double out[2];
  AttentionOutput(z, 2, 1.0, v, 3, 2, out);
  EXPECT_NEAR(out[0], 1.0, 1e-15);
  EXPECT_NEAR(out[1], 5.0, 1e-15);
  // Dot products accumulate: keys (1, 2), (3, -1) at stride 2.
  const float q[] = {2, 1};
  const float k[] = {1, 2, 3, -1};
  double acc[2] = {10, 0};
  AddDotProducts(q, k, 2, 2, 2, acc);
  EXPECT_EQ(acc[0], 14.0);
  EXPECT_EQ(acc[1], 5.0);
}

TEST(FidelityMeasure, SharperAttentionAndCoarserDtypesMoveMore) {
  fidelity::Result r;
  ASSERT_TRUE(fidelity::Measure({.preset = "tiny", .tokens = 64, .layers = 0, .sharpness = {0.9, 0.1}}, &r).ok());
  EXPECT_EQ(r.layers, 2u);
  EXPECT_EQ(r.heads, 2u);
  EXPECT_EQ(r.key_dim, 16u);
  ASSERT_EQ(r.dtypes.size(), 3u);
  EXPECT_EQ(r.dtypes[0].dtype, "e4m3");
  EXPECT_EQ(r.dtypes[2].dtype, "nvfp4");
  // Bits per element: 8 + 32/16 (fp8 row of 16), 4 + 8/16 + 32/32 (nvfp4 token of 2 x 16).
  EXPECT_DOUBLE_EQ(r.dtypes[0].bits_per_element, 10.0);
  EXPECT_DOUBLE_EQ(r.dtypes[2].bits_per_element, 5.5);
  for (size_t s = 0; s < 2; ++s) {
    EXPECT_GT(r.dtypes[0].element[s].median, 0);
    EXPECT_GT(r.dtypes[1].element[s].median, r.dtypes[0].element[s].median);
    EXPECT_GT(r.dtypes[2].element[s].median, r.dtypes[0].element[s].median);
    EXPECT_GE(r.dtypes[2].element[s].max, r.dtypes[2].element[s].median);
  }
  EXPECT_FALSE(fidelity::Measure({.preset = "nope", .tokens = 8, .layers = 0, .sharpness = {0.5}}, &r).ok());
}

TEST(FidelityCli, TablePerPresetWithEveryDtype) {
  CliRun r = Kvfile("bench --fidelity --preset tiny --tokens 64");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("kvfile bench --fidelity: tiny, 64 tokens, 2 layers, 2 queries per layer (key dim 16)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("attn H=0.90   attn H=0.50   attn H=0.10"), std::string::npos) << r.out;
  for (const char* d : {"\ne4m3 ", "\ne5m2 ", "\nnvfp4 "}) EXPECT_NE(r.out.find(d), std::string::npos) << d;
}

TEST(FidelityCli, JsonOrdersTheTiers) {
  CliRun r = Kvfile("bench --fidelity --preset tiny --tokens 64 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json doc = nlohmann::json::parse(r.out);
  ASSERT_EQ(doc["fidelity"].size(), 1u);
  const auto& p = doc["fidelity"][0];
  EXPECT_EQ(p["preset"], "tiny");
  EXPECT_EQ(p["tokens"], 64);
  ASSERT_EQ(p["dtypes"].size(), 3u);
  const auto& e4m3 = p["dtypes"][0];
  const auto& nvfp4 = p["dtypes"][2];
  EXPECT_EQ(e4m3["dtype"], "e4m3");
  EXPECT_EQ(nvfp4["dtype"], "nvfp4");
  for (const char* s : {"k", "v"}) {
    EXPECT_GT(e4m3["element"][s]["median"].get<double>(), 0) << s;
    EXPECT_GT(nvfp4["element"][s]["median"].get<double>(), e4m3["element"][s]["median"].get<double>()) << s;
  }
  ASSERT_EQ(nvfp4["attention"].size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_GT(e4m3["attention"][i]["median"].get<double>(), 0);
    EXPECT_GT(nvfp4["attention"][i]["median"].get<double>(), e4m3["attention"][i]["median"].get<double>());
  }
}

TEST(FidelityCli, DefaultPresetNearTheIssuesFigure) {
  // Element errors hardly depend on the token count: a few tokens and
  // layers of llama-3.1-8b give the V figure issue 18 quotes for e4m3
  // (2.57%). Its K figure (1.55%) is not this generator's: K rows here have
  // outlier channels 8-40x larger, which set the row scale and push the
  // other elements towards e4m3's subnormal range (about 1.9%).
  CliRun r = Kvfile("bench --fidelity --tokens 64 --layers 4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json doc = nlohmann::json::parse(r.out);
  const auto& e4m3 = doc["fidelity"][0]["dtypes"][0];
  EXPECT_NEAR(e4m3["element"]["v"]["median"].get<double>(), 0.0257, 0.0005);
  EXPECT_GT(e4m3["element"]["k"]["median"].get<double>(), 0.0155);
  EXPECT_LT(e4m3["element"]["k"]["median"].get<double>(), 0.025);
}

TEST(FidelityCli, BadPresetIsOneLine) {
  CliRun r = Kvfile("bench --fidelity --preset no-such-model");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no-such-model"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
}

}  // namespace
}  // namespace kvfile::testing
