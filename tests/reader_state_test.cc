// SPDX-License-Identifier: Apache-2.0
// Reader's view of the file itself (kvfile/file_state.h): the header flags,
// the commit record in force and the state of both commit slots, with one
// slot damaged and the other still in force.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "kvfile/reader.h"
#include "kvfile/writer.h"
#include "support/file_util.h"

namespace kvfile {
namespace {

// Two appends of 3 tokens, 2 tokens per chunk: chunks of 2, 1, 2, 1 tokens.
// One file per test (CTest runs the tests of this file in parallel).
std::string WriteSession() {
  std::string path = ::testing::TempDir() + "kvfile_reader_state_" +
                     ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".kv";
  Geometry g;
  g.layers = 1;
  g.streams = {{"k", 1, 4, Dtype::kE4M3}};
  WriterOptions o;
  o.chunk_tokens = 2;
  o.overwrite = true;
  std::unique_ptr<Writer> w;
  Status st = Writer::Create(path, g, {"m", 1}, o, &w);
  EXPECT_TRUE(st.ok()) << st.ToString();
  if (!st.ok()) return path;
  const float rows[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  const uint32_t ids[3] = {7, 8, 9};
  for (int i = 0; i < 2; ++i) {
    AppendBatch b;
    b.tokens = ids;
    b.blocks = {{Dtype::kF32, rows, nullptr}};
    EXPECT_TRUE(w->Append(b).ok());
    EXPECT_TRUE(w->Sync().ok());
  }
  EXPECT_TRUE(w->Close().ok());
  return path;
}

TEST(ReaderStateTest, CommitRecordAndBothSlots) {
  std::string path = WriteSession();
  std::unique_ptr<Reader> r;
  ASSERT_TRUE(Reader::Open(path, {}, &r).ok());
  EXPECT_EQ(r->required_flags(), 1u);  // append ends (format 2.1)
  EXPECT_EQ(r->optional_flags(), 0u);
  const CommitInfo& c = r->commit();
  EXPECT_EQ(c.tokens, 6u);
  EXPECT_EQ(c.chunks, r->chunks().size());
  EXPECT_EQ(c.chunks, 4u);
  EXPECT_EQ(c.end, r->chunks().back().offset + r->chunks().back().bytes);
  EXPECT_EQ(c.epoch, r->epoch());
  int active = r->active_commit_slot();
  EXPECT_EQ(static_cast<uint64_t>(active), c.sequence % 2);
  const auto& slots = r->commit_slots();
  EXPECT_TRUE(slots[active].valid);
  EXPECT_EQ(slots[active].sequence, c.sequence);
  EXPECT_EQ(slots[active].error, "");
  // Several commits were made: the other slot holds the one before.
  EXPECT_TRUE(slots[1 - active].valid);
  EXPECT_EQ(slots[1 - active].sequence, c.sequence - 1);
}

TEST(ReaderStateTest, DamagedInactiveSlotIsReportedAndTheOtherStaysInForce) {
  std::string path = WriteSession();
  std::unique_ptr<Reader> r;
  ASSERT_TRUE(Reader::Open(path, {}, &r).ok());
  const int active = r->active_commit_slot();
  const CommitInfo before = r->commit();
  r.reset();
  testing::FlipBit(path, 4096 + 4096 * static_cast<std::streamoff>(1 - active) + 8, 0);  // the sequence field
  ASSERT_TRUE(Reader::Open(path, {}, &r).ok());
  EXPECT_EQ(r->active_commit_slot(), active);
  EXPECT_EQ(r->commit().sequence, before.sequence);
  EXPECT_EQ(r->commit().tokens, 6u);
  const CommitSlotState& bad = r->commit_slots()[1 - active];
  EXPECT_FALSE(bad.valid);
  EXPECT_EQ(bad.sequence, 0u);
  EXPECT_EQ(bad.error, "commit slot checksum mismatch");
  EXPECT_TRUE(r->commit_slots()[active].valid);
}

}  // namespace
}  // namespace kvfile
