// SPDX-License-Identifier: Apache-2.0
// Tests of Writer::Rewind (spec/RECOVERY.md section 5): the dead tokens of
// rewound chunks are never read, and no rewind wraps the epoch counter.

#include <sys/wait.h>
#include <unistd.h>

#include <functional>

#include "support/fault_fs.h"
#include "support/kv_test_util.h"
#include "support/testing_hooks.h"

namespace kvfile {
namespace {

using namespace kvfile::test;

// Rewinds cut chunks on disk: their dead tokens (still stored, replaced by
// later appends) must never be read.
TEST_F(ReadManyTest, RewoundFileWithDeadTokens) {
  const Geometry g = MixedGeometry();
  Sequence q1 = MakeSequence(g, Dtype::kF16, 35, 1);
  Sequence q2 = Splice(q1, MakeSequence(g, Dtype::kF16, 35, 2), 13);
  Sequence q3 = Splice(q2, MakeSequence(g, Dtype::kF16, 35, 3), 25);
  {
    std::unique_ptr<Writer> w;
    ASSERT_OK(hooks::CreateWriter(Path(), g, kIdentity, Options(8), &w));
    ASSERT_OK(w->Append(Batch(q1, 0, 30)));  // chunks [0,8) [8,16) [16,24) on disk
    ASSERT_OK(w->Rewind(13));
    ASSERT_OK(w->Append(Batch(q2, 13, 17)));  // [13,21) [21,29) on disk
    ASSERT_OK(w->Rewind(25));
    ASSERT_OK(w->Append(Batch(q3, 25, 10)));
    ASSERT_OK(w->Close());
  }
  auto r = Open(Path());
  ASSERT_NE(r, nullptr);
  ASSERT_TRUE(std::equal(r->tokens().begin(), r->tokens().end(), q3.tokens.begin(), q3.tokens.end()));
  std::vector<std::pair<uint32_t, uint32_t>> shape;  // (stored, live) per chunk
  for (const ChunkInfo& c : r->chunks()) shape.push_back({c.stored_tokens, c.live_tokens});
  const std::vector<std::pair<uint32_t, uint32_t>> want_shape = {{8, 8}, {8, 5}, {8, 8}, {8, 4}, {8, 8}, {2, 2}};
  ASSERT_EQ(shape, want_shape);
  CheckReadManyOverChunks(*r, q3, ComputeExpected(q3));
}

// The image of an empty file made with `o` (and `salt`) whose active commit
// record (sequence 2, slot 0) is rewritten with the last epoch, as a file
// that was rewound 2^32 - 2 times would hold.
testing::DiskImage AtTheLastEpoch(const std::string& path, const Geometry& g, WriterOptions o, uint64_t salt) {
  testing::FaultFs fs;
  o.fs = &fs;
  hooks::SetWriterSalt(salt);
  std::unique_ptr<Writer> w;
  Status st = hooks::CreateWriter(path, g, {"m", 1}, o, &w);
  hooks::SetWriterSalt(0);
  EXPECT_TRUE(st.ok()) << st.ToString();
  if (st.ok()) {
    EXPECT_TRUE(w->Close().ok());
  }
  testing::DiskImage img = fs.Image();
  format::CommitRecord c;
  c.sequence = 2;
  c.salt = salt;
  c.epoch = 0xFFFFFFFFu;
  format::EncodeCommitRecord(c, std::span<uint8_t, format::kCommitSlotSize>(img.at(path).data() + 4096, 4096));
  return img;
}

// A writer that opens a file with an exhausted epoch counter refuses to
// rewind: a wrapped epoch would make the file unreadable.
TEST(EpochLimit, RewindAtTheLastEpochIsRefused) {
  Geometry g;
  ASSERT_TRUE(GetPreset("tiny", Dtype::kE4M3, &g).ok());
  WriterOptions o;
  o.chunk_tokens = 4;
  testing::FaultFs disk(AtTheLastEpoch("/e/y.kv", g, o, 99));
  o.fs = &disk;
  std::unique_ptr<Writer> w;
  Status st = Writer::Open("/e/y.kv", o, &w);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const Sequence q = MakeSequence(g, Dtype::kF32, 5);
  ASSERT_TRUE(w->Append(Batch(q, 0, 5)).ok());
  ASSERT_TRUE(w->Sync().ok());
  st = w->Rewind(2);
  EXPECT_EQ(st.code(), Status::Code::kUnsupported) << st.ToString();
  EXPECT_EQ(st.message(), "/e/y.kv: the epoch counter is exhausted; rewrite the file with kvfile convert");
  EXPECT_EQ(w->token_count(), 5u);
}

// The upgrade of a v1 file goes on at the next epoch (its new file): at the
// last one it is refused by the same rule and with the same line as a
// rewind (CommitLog::BumpEpoch), and the v1 file is left as it was.
TEST(EpochLimit, UpgradeAtTheLastEpochIsRefused) {
  Geometry g;
  ASSERT_TRUE(GetPreset("tiny", Dtype::kE4M3, &g).ok());
  for (StreamSpec& s : g.streams) s.dtype = Dtype::kF32;  // v1 streams are raw
  WriterOptions o;
  o.chunk_tokens = 4;
  o.format_major = 1;
  const testing::DiskImage img = AtTheLastEpoch("/e/v1.kv", g, o, 98);
  testing::FaultFs disk(img);
  o.fs = &disk;
  o.format_major = 2;
  std::unique_ptr<Writer> w;
  Status st = Writer::Open("/e/v1.kv", o, &w);
  EXPECT_EQ(st.code(), Status::Code::kUnsupported) << st.ToString();
  EXPECT_EQ(st.message(), "/e/v1.kv: the epoch counter is exhausted; rewrite the file with kvfile convert");
  EXPECT_EQ(disk.Image(), img);
}

}  // namespace
}  // namespace kvfile

namespace kvfile {
namespace {

using namespace kvfile::test;

// A rewind by another process while a reader has the file open (section 5
// of spec/RECOVERY.md, "Readers"): the reader's reads of chunks past the new
// end fail with kBusy and a line saying the file changed, never as damage;
// damage found with no rewind (even while a writer appends) is still
// damage.
class RewindUnderReader : public ReadManyTest {
 protected:
  // Runs `change` on the file in a child process (a real other process).
  void InChild(const std::function<void()>& change) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      change();
      ::_exit(::testing::Test::HasFailure() ? 1 : 0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the other process failed";
  }
  // In another process: rewinds the file to `to` tokens, then (when
  // `seed`) appends tokens up to 37 again with other rows.
  void RewindInChild(uint64_t to, uint64_t seed) {
    InChild([&] {
      std::unique_ptr<Writer> w;
      ASSERT_OK(Writer::Open(Path(), Options(8), &w));
      ASSERT_OK(w->Rewind(to));
      if (seed) ASSERT_OK(w->Append(Batch(MakeSequence(q_.g, Dtype::kBF16, 37, seed), to, 37 - to)));
      ASSERT_OK(w->Close());
    });
  }
  // Writes the file (37 tokens in chunks of 8), opens a reader, then
  // rewinds it to 10 in another process (RewindInChild).
  std::unique_ptr<Reader> OpenThenRewind(uint64_t seed) {
    Write();
    auto r = Open(Path());
    if (r) RewindInChild(10, seed);
    return r;
  }
  std::string Changed() const {
    return Path() + ": changed while being read (rewound or repaired by another process); read it again";
  }
  // Every way of reading tokens [24, end) (chunk 3) fails with `code` and
  // a message that starts with `message`.
  void ExpectReadsFail(Reader& r, uint64_t end, Code code, const std::string& message) {
    std::vector<uint8_t> rows((end - 24) * q_.ElemsPerToken(0) * 4);
    std::vector<std::pair<std::string, Status>> reads;
    reads.emplace_back("ReadRows", r.ReadRows(0, 0, 24, end, Dtype::kF32, rows.data()));
    RowsTarget t{0, 0, rows.data()};
    for (unsigned threads : {1u, 3u})
      reads.emplace_back("ReadMany threads " + std::to_string(threads),
                         r.ReadMany(std::span<const RowsTarget>(&t, 1), 24, end, Dtype::kF32, threads));
    reads.emplace_back("VerifyChunk", hooks::ReaderAccess::VerifyChunk(r, 3));
    for (const auto& [what, st] : reads) {
      SCOPED_TRACE(what);
      EXPECT_EQ(st.code(), code) << st.ToString();
      EXPECT_EQ(st.message().substr(0, message.size()), message) << st.message();
    }
  }
};

// Rewound to 10 and appended again: chunk 3's bytes are now a chunk of the
// new epoch. (Before: kCorruption, "payload checksum mismatch".)
TEST_F(RewindUnderReader, RewoundAndRewrittenIsAChange) {
  auto r = OpenThenRewind(7);
  ASSERT_NE(r, nullptr);
  ExpectReadsFail(*r, 32, Code::kBusy, Changed());
  std::vector<uint8_t> rows(8 * q_.ElemsPerToken(0) * 4);
  EXPECT_EQ(r->ReadRows(0, 0, 24, 32, Dtype::kF32, rows.data()).message(), Changed());  // the whole line
  // The chunks the rewind kept still read.
  ASSERT_OK(r->ReadRows(0, 0, 0, 8, Dtype::kF32, rows.data()));
}

// Rewound to 10 only: the file now ends before chunk 3. (Before:
// kCorruption, "unexpected end of file".)
TEST_F(RewindUnderReader, RewoundAndCutIsAChange) {
  auto r = OpenThenRewind(0);
  ASSERT_NE(r, nullptr);
  ExpectReadsFail(*r, 32, Code::kBusy, Changed());
}

// Real damage in chunk 3, and a writer appending meanwhile (a new commit
// record of the same epoch): still damage, named as such.
TEST_F(RewindUnderReader, DamageIsStillDamage) {
  q_ = MakeSequence(MixedGeometry(), Dtype::kBF16, 37, 3);
  WriteSequence(Path(), MakeSequence(q_.g, Dtype::kBF16, 30, 3), Options(8), {30});  // chunks [0,8) .. [24,30)
  auto r = Open(Path());
  ASSERT_NE(r, nullptr);
  DamageSection(Path(), *r, 3, 0, 0, 1);
  InChild([&] {
    std::unique_ptr<Writer> w;
    ASSERT_OK(Writer::Open(Path(), Options(8), &w));
    ASSERT_OK(w->Append(Batch(q_, 30, 7)));
    ASSERT_OK(w->Close());
  });
  ExpectReadsFail(*r, 30, Code::kCorruption, Path() + ": chunk 3 at offset ");
  std::vector<uint8_t> rows(8 * q_.ElemsPerToken(0) * 4);
  Status st = r->ReadRows(0, 0, 24, 30, Dtype::kF32, rows.data());
  EXPECT_NE(st.message().find("payload checksum mismatch"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace kvfile
