// SPDX-License-Identifier: Apache-2.0
// The colibri driver through the library (kvfile/convert.h): the upstream-
// checked .coli_kv fixtures (fixtures/seeds/, make_fixtures.py) imported
// and exported byte for byte, COLIKV1, the indexer in some layers, damage
// refused with one line, detection by magic, a verified prefix, interrupts
// and the one chunk-size rule. The CLI's contract is in convert_seeds_test.
#include <gtest/gtest.h>

#include <filesystem>

#include "convert/driver.h"
#include "kvfile/convert.h"
#include "kvfile/reader.h"
#include "kvfile/writer.h"
#include "support/file_util.h"
#include "support/scratch_dir.h"

namespace kvfile {
namespace {

namespace fs = std::filesystem;
using testing::ReadFile;
using testing::WriteFile;

class ConvertColi : public testing::ScratchDirTest {
 protected:
  static std::string Fixture(const char* name) {
    return std::string(KVFILE_TEST_DATA "/fixtures/seeds/").append(name);
  }
  static ConvertOptions To(Format f, bool v1 = false) {
    ConvertOptions o;
    o.to = f;
    o.coli.v1 = v1;
    return o;
  }
};

// COLIKV2 -> .kv -> COLIKV2 is the fixture without its 7 uncommitted bytes;
// -> COLIKV1 is the v1 layout of its decoded rows.
TEST_F(ConvertColi, ImportAndExportByteExact) {
  ConvertReport rep;
  ASSERT_TRUE(Convert(Fixture("coli_v2.coli_kv"), P("a.kv"), To(Format::kKv), &rep).ok());
  EXPECT_EQ(rep.from, Format::kColi);
  EXPECT_EQ(rep.tokens, 3u);
  EXPECT_EQ(rep.summary, "COLIKV2, 3 tokens, 2 layers (latent 4, rope 2, indexer 3), vocab 100");
  EXPECT_EQ(rep.notes, std::vector<std::string>{Fixture("coli_v2.coli_kv") +
                                                ": 7 bytes past the record count ignored (an uncommitted append, "
                                                "as colibri ignores it)"});
  ASSERT_TRUE(Convert(P("a.kv"), P("b.coli_kv"), To(Format::kColi), &rep).ok());
  EXPECT_EQ(rep.summary, "COLIKV2, 3 tokens");
  EXPECT_TRUE(rep.notes.empty());
  std::string want = ReadFile(Fixture("coli_v2.coli_kv"));
  EXPECT_EQ(ReadFile(P("b.coli_kv")), want.substr(0, want.size() - 7));
  ASSERT_TRUE(Convert(P("a.kv"), P("c.coli_kv"), To(Format::kColi, true), &rep).ok());
  EXPECT_EQ(rep.summary, "COLIKV1, 3 tokens");
  EXPECT_EQ(ReadFile(P("c.coli_kv")), ReadFile(Fixture("coli_v2_as_v1.coli_kv")));
  ASSERT_TRUE(Convert(Fixture("coli_v1.coli_kv"), P("v1.kv"), To(Format::kKv), &rep).ok());
  EXPECT_EQ(rep.notes, std::vector<std::string>{Fixture("coli_v1.coli_kv") +
                                                ": COLIKV1 f32 latent and rope rows quantized to e4m3 (kvfile's "
                                                "row rule)"});
}

// GLM-5.2's depth: the indexer in 21 of 78 layers, named by
// o.coli.indexer_layers; the export writes the fixture's bytes back.
TEST_F(ConvertColi, IndexerLayersRoundTrip) {
  const std::string in = Fixture("coli_glm_partial.coli_kv");
  Status st = Convert(in, P("a.kv"), To(Format::kKv), nullptr);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(st.message(), in + ": the indexer is in 21 of 78 layers and a colibri header does not say which: give "
                               "them (--indexer-layers, e.g. 0..20 or 0,4,8)");
  EXPECT_FALSE(fs::exists(P("a.kv")));
  ConvertOptions o = To(Format::kKv);
  o.coli.indexer_layers = "0,4,8,12,16,20,24,28,32,36,40,44,48,52,56,60,64,68,72,76,77";
  ASSERT_TRUE(Convert(in, P("a.kv"), o, nullptr).ok());
  ASSERT_TRUE(Convert(P("a.kv"), P("b.coli_kv"), To(Format::kColi), nullptr).ok());
  EXPECT_EQ(ReadFile(P("b.coli_kv")), ReadFile(in));
}

// Damage: a file cut inside its committed records is kCorruption with one
// line; COLIKV3 kUnsupported; nothing written either way. The magic decides
// whatever the name.
TEST_F(ConvertColi, DamageIsRefusedAndTheMagicDecides) {
  std::string full = ReadFile(Fixture("coli_v2.coli_kv"));
  WriteFile(P("cut.coli_kv"), full.substr(0, 100));
  Status st = Convert(P("cut.coli_kv"), P("a.kv"), To(Format::kKv), nullptr);
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_EQ(st.message(), P("cut.coli_kv") + ": the file ends inside record 1 of 3 (56 bytes each): the committed "
                                             "records are not all there");
  EXPECT_FALSE(fs::exists(P("a.kv")));
  std::string v3 = full;
  v3[6] = '3';
  WriteFile(P("session.bin"), v3);
  Format f;
  ASSERT_TRUE(DetectFormat(P("session.bin"), false, nullptr, &f).ok());
  EXPECT_EQ(f, Format::kColi);
  st = Convert(P("session.bin"), P("a.kv"), To(Format::kKv), nullptr);
  EXPECT_EQ(st.code(), Status::Code::kUnsupported);
  EXPECT_EQ(st.message(), P("session.bin") + ": COLIKV3 (PolarQuant rows) is not supported; only COLIKV1 and COLIKV2");
  EXPECT_FALSE(fs::exists(P("a.kv")));
  WriteFile(P("session.bin"), full);
  ASSERT_TRUE(Convert(P("session.bin"), P("a.kv"), To(Format::kKv), nullptr).ok());
}

// The driver exports the `tokens` it is given (a salvaged prefix).
TEST_F(ConvertColi, ExportsTheTokensItIsGiven) {
  ASSERT_TRUE(Convert(Fixture("coli_v2.coli_kv"), P("a.kv"), To(Format::kKv), nullptr).ok());
  std::unique_ptr<Reader> r;
  ASSERT_TRUE(Reader::Open(P("a.kv"), {}, &r).ok());
  ConvertReport rep;
  ConvertOptions o = To(Format::kColi);
  ASSERT_TRUE(convert::kColiDriver.export_kv(*r, P("a.kv"), 2, o, P("two.coli_kv"), &rep).ok());
  EXPECT_EQ(rep.summary, "COLIKV2, 2 tokens");
  std::string want = ReadFile(Fixture("coli_v2.coli_kv")), got = ReadFile(P("two.coli_kv"));
  ASSERT_EQ(got.size(), 40u + 2 * 56);
  EXPECT_EQ(got.substr(0, 32), want.substr(0, 32));  // magic, h[0..5]
  EXPECT_EQ(got[32], 2);                              // h[6]: the record count
  EXPECT_EQ(got.substr(36), want.substr(36, 4 + 2 * 56));
}

// interrupted() stops both directions (kFailed "OUT: interrupted"), OUT absent; o.chunk_tokens gives
// the import's chunks, else the one rule.
TEST_F(ConvertColi, InterruptAndChunkSize) {
  ConvertOptions o = To(Format::kKv);
  o.interrupted = [] { return true; };
  Status st = Convert(Fixture("coli_v2.coli_kv"), P("a.kv"), o, nullptr);
  EXPECT_EQ(st.code(), Status::Code::kFailed);
  EXPECT_EQ(st.message(), P("a.kv") + ": interrupted");
  EXPECT_FALSE(fs::exists(P("a.kv")));
  ASSERT_TRUE(Convert(Fixture("coli_v2.coli_kv"), P("a.kv"), To(Format::kKv), nullptr).ok());
  std::unique_ptr<Reader> r;
  ASSERT_TRUE(Reader::Open(P("a.kv"), {}, &r).ok());
  EXPECT_EQ(r->nominal_chunk_tokens(), 256u);
  ConvertOptions e = To(Format::kColi);
  e.interrupted = [] { return true; };
  st = Convert(P("a.kv"), P("a.coli_kv"), e, nullptr);
  EXPECT_EQ(st.code(), Status::Code::kFailed);
  EXPECT_EQ(st.message(), P("a.coli_kv") + ": interrupted");
  EXPECT_FALSE(fs::exists(P("a.coli_kv")));
  o = To(Format::kKv);
  o.chunk_tokens = 2;
  ASSERT_TRUE(Convert(Fixture("coli_v2.coli_kv"), P("b.kv"), o, nullptr).ok());
  ASSERT_TRUE(Reader::Open(P("b.kv"), {}, &r).ok());
  EXPECT_EQ(r->nominal_chunk_tokens(), 2u);
  EXPECT_EQ(r->chunks().size(), 2u);
}

}  // namespace
}  // namespace kvfile
