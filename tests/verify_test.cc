// SPDX-License-Identifier: Apache-2.0
// Tests of VerifyFile (src/reader/verify.cc) with worker threads: a clean file,
// and findings in chunk order whatever the thread count; the checks of
// nvfp4 sections (block scales and row scales under a valid checksum).

#include "support/forwarding_fs.h"
#include "support/kv_test_util.h"

namespace kvfile {
namespace {

using namespace kvfile::test;

// ---- VerifyFile with worker threads ------------------------------------------------------------

std::string Describe(const std::vector<VerifyFinding>& findings) {
  std::string s;
  for (const VerifyFinding& f : findings)
    s += (f.error ? "error" : "warning") + std::string(" chunk ") + std::to_string(f.chunk) + " offset " +
         std::to_string(f.offset) + ": " + f.message + "\n";
  return s;
}

VerifyReport Verify(const std::string& path, unsigned threads, bool quick = false) {
  VerifyOptions o;
  o.threads = threads;
  o.quick = quick;
  VerifyReport rep;
  Status st = VerifyFile(path, o, &rep);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(rep.opened);
  return rep;
}

// ---- VerifyFile under a rewind ------------------------------------------------------------------

// A file rewound to 10 tokens and appended to again (new rows over the old
// chunks) while verify reads it: verify fails with kBusy saying the file
// changed, not with findings of damage. (Before: an error finding,
// "payload checksum mismatch", for each rewritten chunk.)
TEST_F(KvFileTest, RewindDuringVerifyIsAChange) {
  const Sequence q = MakeSequence(Preset("tiny"), Dtype::kBF16, 40, 8);
  WriteSequence(Path(), q, Options(4), {40});
  testing::BeforeSecondOpen fs(Path(), [&] {
    std::unique_ptr<Writer> w;
    ASSERT_OK(Writer::Open(Path(), Options(4), &w));
    ASSERT_OK(w->Rewind(10));
    ASSERT_OK(w->Append(Batch(MakeSequence(q.g, Dtype::kBF16, 40, 9), 10, 30)));
    ASSERT_OK(w->Close());
  });
  VerifyOptions o;
  o.fs = &fs;
  o.threads = 2;
  VerifyReport rep;
  Status st = VerifyFile(Path(), o, &rep);
  EXPECT_EQ(st.code(), Code::kBusy) << st.ToString() << "\n" << Describe(rep.findings);
  EXPECT_EQ(st.message(), Path() + ": changed while being read (rewound or repaired by another process); read it again");
}

class VerifyThreadsTest : public KvFileTest {
 protected:
  // tiny, 203 tokens in chunks of 4: 51 chunks of 4096 bytes, the last short.
  void Write() {
    q_ = MakeSequence(Preset("tiny"), Dtype::kBF16, 203, 8);
    WriteSequence(Path(), q_, Options(4), Sizes(Schedule::kMixed, q_.n, 4));
    ASSERT_OK(Reader::Open(Path(), {}, &r_));
    ASSERT_EQ(r_->chunks().size(), 51u);
  }
  Sequence q_;
  std::unique_ptr<Reader> r_;
};

TEST_F(VerifyThreadsTest, CleanFileHasNoFindings) {
  ASSERT_NO_FATAL_FAILURE(Write());
  for (unsigned threads : {0u, 1u, 2u, 4u, 64u}) {
    for (bool quick : {false, true}) {
      SCOPED_TRACE(std::to_string(threads) + (quick ? " quick" : ""));
      VerifyReport rep = Verify(Path(), threads, quick);
      EXPECT_EQ(rep.findings.size(), 0u) << Describe(rep.findings);
      EXPECT_EQ(rep.tokens, 203u);
      EXPECT_EQ(rep.chunks, 51u);
      EXPECT_EQ(rep.bytes, FileSize(Path()));
      EXPECT_EQ(rep.valid_end, FileSize(Path()));
    }
  }
}

TEST_F(VerifyThreadsTest, FindingsAreTheSameInChunkOrderWhateverTheThreadCount) {
  ASSERT_NO_FATAL_FAILURE(Write());
  // Checksum damage in chunks 7 and 41 (a code, a scale), an invalid code
  // under a valid checksum in chunk 23, and a torn tail.
  DamageSection(Path(), *r_, 41, 1, 1, 3);
  DamageSection(Path(), *r_, 7, 0, 0, 60);
  ChunkLayout layout;
  ASSERT_OK(ComputeChunkLayout(q_.g, 4, &layout));
  XorByte(Path(), r_->chunks()[41].offset + layout.section(0, 1).scales_offset + 1, 0x04);
  const uint64_t c23 = r_->chunks()[23].offset;
  uint8_t nan_code = 0xFF;
  PokeBytes(Path(), c23 + layout.section(1, 0).offset + 2 * 32 + 5, &nan_code, 1);  // token 94
  Reseal(Path(), c23, layout);
  Bytes garbage(100, 0x42);
  PokeBytes(Path(), FileSize(Path()), garbage.data(), garbage.size());

  VerifyReport one = Verify(Path(), 1);
  ASSERT_EQ(one.findings.size(), 4u) << Describe(one.findings);
  const int64_t want_chunks[] = {7, 23, 41, 51};
  for (size_t i = 0; i < 3; ++i) {
    const VerifyFinding& f = one.findings[i];
    EXPECT_TRUE(f.error);
    EXPECT_EQ(f.chunk, want_chunks[i]);
    EXPECT_EQ(f.offset, static_cast<int64_t>(r_->chunks()[f.chunk].offset));
    EXPECT_EQ(f.message.rfind("chunk " + std::to_string(f.chunk) + " at offset " + std::to_string(f.offset), 0), 0u)
        << f.message;
  }
  EXPECT_NE(one.findings[0].message.find("layer 0 stream 'k'"), std::string::npos) << one.findings[0].message;
  EXPECT_NE(one.findings[1].message.find("non-finite code at token 94"), std::string::npos) << one.findings[1].message;
  EXPECT_NE(one.findings[2].message.find("checksum"), std::string::npos) << one.findings[2].message;
  EXPECT_FALSE(one.findings[3].error);  // the torn tail, a warning, last
  EXPECT_EQ(one.findings[3].chunk, want_chunks[3]);
  EXPECT_EQ(one.torn_tail_bytes, 100u);

  const std::string want = Describe(one.findings);
  for (unsigned threads : {2u, 4u, 16u}) {
    for (int run = 0; run < 10; ++run) {
      VerifyReport rep = Verify(Path(), threads);
      ASSERT_EQ(Describe(rep.findings), want) << "threads " << threads << ", run " << run;
    }
  }
  // quick: structure only; payload damage is not seen, the tail is.
  for (unsigned threads : {1u, 2u, 4u}) {
    VerifyReport rep = Verify(Path(), threads, /*quick=*/true);
    ASSERT_EQ(Describe(rep.findings), Describe({one.findings[3]})) << "threads " << threads;
  }
}

// ---- nvfp4 sections ----------------------------------------------------------------------------

// An nvfp4 file (10 tokens, chunks of 4) with one stored byte of chunk 1
// replaced and its checksums recomputed: verify names the section and the
// token, and the read of that section fails.
class VerifyNvfp4Test : public KvFileTest {
 protected:
  void WriteAndDamage(bool block_scale, uint64_t index_in_section, const void* bytes, size_t n) {
    ASSERT_NO_FATAL_FAILURE(WriteNvfp4(Path(), Nvfp4Rows(10), 4, 10, false));
    std::unique_ptr<Reader> r;
    ASSERT_OK(Reader::Open(Path(), {}, &r));
    ASSERT_EQ(r->chunks().size(), 3u);
    ASSERT_OK(ComputeChunkLayout(r->geometry(), 4, &layout_));
    offset_ = r->chunks()[1].offset;
    const format::SectionLayout& sec = layout_.section(1, 0);  // layer 1, stream 'k'
    PokeBytes(Path(), offset_ + (block_scale ? sec.block_scales_offset : sec.scales_offset) + index_in_section,
              bytes, n);
    Reseal(Path(), offset_, layout_);
  }
  void ExpectFinding(const std::string& what) {
    VerifyReport rep = Verify(Path(), 1);
    ASSERT_EQ(rep.findings.size(), 1u) << Describe(rep.findings);
    EXPECT_TRUE(rep.findings[0].error);
    EXPECT_EQ(rep.findings[0].chunk, 1);
    EXPECT_EQ(rep.findings[0].message,
              "chunk 1 at offset " + std::to_string(offset_) + ": layer 1 stream 'k': " + what);
    std::unique_ptr<Reader> r;
    ASSERT_OK(Reader::Open(Path(), {}, &r));
    std::vector<float> rows(10 * 32, 7.0f);
    EXPECT_TRUE(HasCode(r->ReadRows(1, 0, 0, 10, Dtype::kF32, rows.data()), Code::kCorruption, {what}));
    EXPECT_EQ(rows, std::vector<float>(10 * 32, 7.0f));
    ASSERT_OK(r->ReadRows(0, 0, 0, 10, Dtype::kF32, rows.data()));  // the other layer reads
  }
  ChunkLayout layout_;
  uint64_t offset_ = 0;
};

TEST_F(VerifyNvfp4Test, CleanFileHasNoFindings) {
  ASSERT_NO_FATAL_FAILURE(WriteNvfp4(Path(), Nvfp4Rows(10), 4, 3, false));
  EXPECT_EQ(Verify(Path(), 2).findings.size(), 0u);
}

TEST_F(VerifyNvfp4Test, BlockScaleWithBit7Set) {
  const uint8_t b = 0x81;
  ASSERT_NO_FATAL_FAILURE(WriteAndDamage(true, 2 * 2 + 1, &b, 1));  // token 4 + 2, its second block
  ExpectFinding("invalid block scale at token 6");
}

TEST_F(VerifyNvfp4Test, BlockScaleNaN) {
  const uint8_t b = 0x7F;
  ASSERT_NO_FATAL_FAILURE(WriteAndDamage(true, 3 * 2, &b, 1));  // token 7, first block
  ExpectFinding("invalid block scale at token 7");
}

TEST_F(VerifyNvfp4Test, RowScaleZeroOrSubnormal) {
  for (float bad : {0.0f, 1e-40f, -1.0f, std::numeric_limits<float>::infinity()}) {
    SCOPED_TRACE(bad);
    ASSERT_NO_FATAL_FAILURE(WriteAndDamage(false, 1 * 4, &bad, 4));  // token 5
    ExpectFinding("invalid scale at token 5");
    std::filesystem::remove(Path());
  }
}

}  // namespace
}  // namespace kvfile
