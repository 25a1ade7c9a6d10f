// SPDX-License-Identifier: Apache-2.0
// Tests of safetensors::PlanAppend (kvfile/formats/safetensors_append.h): the
// geometries and the stream order of an append of safetensors tensors to a
// new file and to an existing one (v2 and v1), each stream's dtype rule,
// keep_raw, and the refusals (an nvfp4 stream into a v1 file, a geometry
// Validate refuses).

#include "kvfile/formats/safetensors_append.h"

#include <gtest/gtest.h>

#include <deque>

namespace kvfile::safetensors {
namespace {

// Tensors of the kvfile convention, described by hand: values (BF16) or
// codes (F8_E5M2 + scales) per stream, 2 layers.
class PlanAppendTest : public ::testing::Test {
 protected:
  void AddValues(const std::string& name, uint32_t rows = 2, uint32_t width = 16) {
    tensors_.push_back({name, DType::kBF16, {2, 5, rows, width}, 0, 0, 0});
    Add(name, rows, width).values = &tensors_.back();
  }
  void AddE5m2Codes(const std::string& name) {
    tensors_.push_back({name + ".codes", DType::kF8E5M2, {2, 5, 2, 16}, 0, 0, 0});
    KvStream& s = Add(name, 2, 16);
    s.codes = &tensors_.back();
    tensors_.push_back({name + ".scales", DType::kF32, {2, 5, 2}, 0, 0, 0});
    s.scales = &tensors_.back();
  }
  KvStream& Add(const std::string& name, uint32_t rows, uint32_t width) {
    kv_.layers = 2;
    kv_.tokens = 5;
    KvStream s;
    s.name = name;
    s.rows_per_token = rows;
    s.row_width = width;
    kv_.streams.push_back(s);
    return kv_.streams.back();
  }
  static Geometry File(std::vector<StreamSpec> streams) {
    Geometry g;
    g.layers = 2;
    g.streams = std::move(streams);
    return g;
  }
  static std::vector<Dtype> Dtypes(const Geometry& g) {
    std::vector<Dtype> d;
    for (const StreamSpec& s : g.streams) d.push_back(s.dtype);
    return d;
  }
  static std::vector<std::string> Names(const Geometry& g) {
    std::vector<std::string> n;
    for (const StreamSpec& s : g.streams) n.push_back(s.name);
    return n;
  }

  std::deque<TensorInfo> tensors_;  // stable addresses for KvStream's pointers
  KvTensors kv_;
};

TEST_F(PlanAppendTest, NewFileTakesTheInputsGeometry) {
  AddValues("k");
  AddE5m2Codes("v");
  AddValues("idx", 1, 8);
  AppendPlan plan;
  AppendPlanOptions o;
  o.keep_raw = {"idx"};
  ASSERT_TRUE(PlanAppend(kv_, nullptr, 0, o, "a.kv", "in.safetensors", &plan).ok());
  EXPECT_EQ(Names(plan.file), (std::vector<std::string>{"k", "v", "idx"}));
  // Values default to e4m3, codes keep theirs, keep_raw is bf16.
  EXPECT_EQ(Dtypes(plan.file), (std::vector<Dtype>{Dtype::kE4M3, Dtype::kE5M2, Dtype::kBF16}));
  EXPECT_EQ(plan.file.layers, 2u);
  EXPECT_EQ(plan.file.streams[2].rows_per_token, 1u);
  EXPECT_EQ(plan.file.streams[2].row_width, 8u);
  EXPECT_TRUE(plan.want == plan.file);
  EXPECT_EQ(plan.stream_of, (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(plan.upgrade_dtype, Dtype::kE4M3);
  // dtype applies to values and codes alike.
  o.dtype = Dtype::kNvfp4;
  ASSERT_TRUE(PlanAppend(kv_, nullptr, 0, o, "a.kv", "in.safetensors", &plan).ok());
  EXPECT_EQ(Dtypes(plan.file), (std::vector<Dtype>{Dtype::kNvfp4, Dtype::kNvfp4, Dtype::kBF16}));
  EXPECT_EQ(plan.upgrade_dtype, Dtype::kE4M3) << "the upgrade writes fp8 only";
  o.dtype = Dtype::kE5M2;
  ASSERT_TRUE(PlanAppend(kv_, nullptr, 0, o, "a.kv", "in.safetensors", &plan).ok());
  EXPECT_EQ(plan.upgrade_dtype, Dtype::kE5M2);
}

TEST_F(PlanAppendTest, NewFileGeometryIsValidated) {
  AddValues("k", 2, 15);  // a row width that is no multiple of 16: refused for nvfp4
  AppendPlanOptions o;
  o.dtype = Dtype::kNvfp4;
  AppendPlan plan;
  Geometry g = File({{"k", 2, 15, Dtype::kNvfp4, {}}});
  Status want = g.Validate();
  ASSERT_FALSE(want.ok());
  Status st = PlanAppend(kv_, nullptr, 0, o, "a.kv", "in.safetensors", &plan);
  EXPECT_EQ(st.code(), want.code());
  EXPECT_EQ(st.message(), "in.safetensors: " + want.message());
}

TEST_F(PlanAppendTest, ExistingFileOrdersStreamsByNameAndKeepsItsDtypes) {
  AddValues("v");
  AddValues("extra", 1, 8);
  AddValues("k");
  AddValues("raw");
  const Geometry file = File({{"k", 2, 16, Dtype::kE5M2, {}}, {"raw", 2, 16, Dtype::kF16, {}},
                              {"v", 2, 16, Dtype::kE4M3, {}}});
  AppendPlan plan;
  ASSERT_TRUE(PlanAppend(kv_, &file, 2, {}, "a.kv", "in.safetensors", &plan).ok());
  EXPECT_TRUE(plan.file == file);
  // The file's order first, then what the file lacks (CheckExpected names it).
  EXPECT_EQ(Names(plan.want), (std::vector<std::string>{"k", "raw", "v", "extra"}));
  EXPECT_EQ(plan.stream_of, (std::vector<size_t>{2, 3, 0, 1}));
  EXPECT_EQ(Dtypes(plan.want), (std::vector<Dtype>{Dtype::kE5M2, Dtype::kF16, Dtype::kE4M3, Dtype::kE4M3}));
  // dtype overrides a quantized stream's, never a raw one's.
  AppendPlanOptions o;
  o.dtype = Dtype::kE4M3;
  ASSERT_TRUE(PlanAppend(kv_, &file, 2, o, "a.kv", "in.safetensors", &plan).ok());
  EXPECT_EQ(Dtypes(plan.want), (std::vector<Dtype>{Dtype::kE4M3, Dtype::kF16, Dtype::kE4M3, Dtype::kE4M3}));
  Status st = CheckExpected({"m", 1}, plan.file, {"m", 1}, plan.want);
  EXPECT_FALSE(st.ok()) << "the k dtype and the extra stream differ";
}

TEST_F(PlanAppendTest, V1FileIsPlannedAsUpgraded) {
  AddValues("k");
  AddValues("v");
  const Geometry v1 = File({{"k", 2, 16, Dtype::kBF16, {}}, {"v", 2, 16, Dtype::kF32, {}}});
  AppendPlanOptions o;
  o.upgrade_dtype = Dtype::kE5M2;
  o.keep_raw = {"v"};
  AppendPlan plan;
  ASSERT_TRUE(PlanAppend(kv_, &v1, 1, o, "a.kv", "in.safetensors", &plan).ok());
  EXPECT_EQ(Dtypes(plan.file), (std::vector<Dtype>{Dtype::kE5M2, Dtype::kF32}));
  EXPECT_EQ(Dtypes(plan.want), (std::vector<Dtype>{Dtype::kE5M2, Dtype::kF32}));
  EXPECT_TRUE(CheckExpected({"m", 1}, plan.file, {"m", 1}, plan.want).ok());
  // A v2 file of the same geometry is not upgraded.
  ASSERT_TRUE(PlanAppend(kv_, &v1, 2, o, "a.kv", "in.safetensors", &plan).ok());
  EXPECT_TRUE(plan.file == v1);
}

TEST_F(PlanAppendTest, Nvfp4IntoAV1FileIsRefused) {
  AddValues("k");
  const Geometry v1 = File({{"k", 2, 16, Dtype::kBF16, {}}});
  AppendPlanOptions o;
  o.dtype = Dtype::kNvfp4;
  AppendPlan plan;
  Status st = PlanAppend(kv_, &v1, 1, o, "a.kv", "in.safetensors", &plan);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "a.kv: stream 'k' would be appended as nvfp4 (from in.safetensors), but a v1 file is upgraded to e4m3 "
            "or e5m2 first; write an nvfp4 copy with `kvfile convert --dtype nvfp4` and append to that");
  // Kept raw by the upgrade, the stream is no fp8 one: its dtype rule
  // keeps it raw, and the plan goes ahead.
  o.keep_raw = {"k"};
  ASSERT_TRUE(PlanAppend(kv_, &v1, 1, o, "a.kv", "in.safetensors", &plan).ok());
  EXPECT_EQ(Dtypes(plan.want), (std::vector<Dtype>{Dtype::kBF16}));
}

}  // namespace
}  // namespace kvfile::safetensors
