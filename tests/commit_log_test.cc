// SPDX-License-Identifier: Apache-2.0
// Tests of the commit log (src/writer/commit_log.h): the slot rule (sequence s in
// slot s % 2), the choice of the newest valid slot with the reason a slot
// is not valid, a new file's two slots, and the writer's commit: data
// synced first when unsynced, the record's exact bytes into the older slot,
// synced; a failed write or sync leaves the durable record as it was.
#include "writer/commit_log.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "support/fault_fs.h"

namespace kvfile::internal {
namespace {

using namespace kvfile::format;
using kvfile::testing::FaultFs;
using kvfile::testing::FsOp;

constexpr uint64_t kSalt = 0x0123456789abcdefull;

std::vector<uint8_t> Encoded(const CommitRecord& c) {
  std::vector<uint8_t> b(kCommitSlotSize);
  EncodeCommitRecord(c, std::span<uint8_t, kCommitSlotSize>(b.data(), kCommitSlotSize));
  return b;
}

void Put(std::vector<uint8_t>& fixed, int slot, const CommitRecord& c) {
  std::vector<uint8_t> b = Encoded(c);
  std::copy(b.begin(), b.end(), fixed.begin() + static_cast<ptrdiff_t>(kCommitSlotOffset[slot]));
}

CommitRecord Record(uint64_t seq, uint64_t tokens) {
  CommitRecord c;
  c.sequence = seq;
  c.salt = kSalt;
  c.epoch = 2;
  c.tokens = tokens;
  c.end = kDataOffset + 4096 * tokens;
  c.chunks = tokens;
  return c;
}

TEST(CommitLog, SlotOfASequence) {
  EXPECT_EQ(CommitSlotIndex(1), 1);
  EXPECT_EQ(CommitSlotIndex(2), 0);
  EXPECT_EQ(CommitSlotIndex(7), 1);
  EXPECT_EQ(CommitSlotOffset(1), 8192u);
  EXPECT_EQ(CommitSlotOffset(2), 4096u);
  EXPECT_EQ(CommitSlotOffset(1001), 8192u);
}

// The one epoch rule: the next epoch, none after the last.
TEST(CommitLog, BumpEpoch) {
  uint32_t next = 0;
  ASSERT_TRUE(CommitLog::BumpEpoch("/f.kv", 1, &next).ok());
  EXPECT_EQ(next, 2u);
  ASSERT_TRUE(CommitLog::BumpEpoch("/f.kv", 0xFFFFFFFEu, &next).ok());
  EXPECT_EQ(next, 0xFFFFFFFFu);
  next = 7;
  Status st = CommitLog::BumpEpoch("/f.kv", 0xFFFFFFFFu, &next);
  EXPECT_EQ(st.code(), Status::Code::kUnsupported);
  EXPECT_EQ(st.message(), "/f.kv: the epoch counter is exhausted; rewrite the file with kvfile convert");
  EXPECT_EQ(next, 7u);
}

TEST(CommitLog, InitialSlotsHoldSequenceOneAndTwo) {
  std::vector<uint8_t> fixed(kDataOffset);
  CommitRecord newest = EncodeInitialSlots(kSalt, 5, fixed);
  EXPECT_EQ(newest.sequence, 2u);
  EXPECT_EQ(newest.epoch, 5u);
  EXPECT_EQ(newest.tokens, 0u);
  EXPECT_EQ(newest.end, kDataOffset);
  CommitRecord one = newest;
  one.sequence = 1;
  EXPECT_EQ(std::vector<uint8_t>(fixed.begin() + 4096, fixed.begin() + 8192), Encoded(newest));
  EXPECT_EQ(std::vector<uint8_t>(fixed.begin() + 8192, fixed.end()), Encoded(one));
  CommitSlots s;
  ASSERT_TRUE(ReadCommitSlots(fixed, kSalt, &s));
  EXPECT_EQ(s.newest, newest);
  EXPECT_EQ(s.active_slot, 0);
  EXPECT_EQ(s.errors[0], "");
  EXPECT_EQ(s.errors[1], "");
}

TEST(CommitLog, NewestValidSlotWins) {
  std::vector<uint8_t> fixed(kDataOffset);
  Put(fixed, 1, Record(7, 3));
  Put(fixed, 0, Record(6, 2));
  CommitSlots s;
  ASSERT_TRUE(ReadCommitSlots(fixed, kSalt, &s));
  EXPECT_EQ(s.newest, Record(7, 3));
  EXPECT_EQ(s.active_slot, 1);
  // The newer slot torn: the older one wins, and the damage is named.
  fixed[8192 + 40] ^= 1;
  ASSERT_TRUE(ReadCommitSlots(fixed, kSalt, &s));
  EXPECT_EQ(s.newest, Record(6, 2));
  EXPECT_EQ(s.active_slot, 0);
  EXPECT_EQ(s.errors[0], "");
  EXPECT_EQ(s.errors[1].rfind("commit slot 1 at offset 8192: ", 0), 0u) << s.errors[1];
}

TEST(CommitLog, SlotsThatAreNotValid) {
  std::vector<uint8_t> fixed(kDataOffset);
  CommitRecord other = Record(9, 1);
  other.salt = kSalt + 1;  // another file's record
  Put(fixed, 1, other);
  Put(fixed, 0, Record(3, 1));  // sequence 3 belongs in slot 1
  CommitSlots s;
  EXPECT_FALSE(ReadCommitSlots(fixed, kSalt, &s));
  EXPECT_EQ(s.errors[0], "commit slot 0 at offset 4096: commit sequence 3 in the wrong slot");
  EXPECT_EQ(s.errors[1], "commit slot 1 at offset 8192: commit slot salt mismatch");
  Put(fixed, 0, Record(4, 1));
  ASSERT_TRUE(ReadCommitSlots(fixed, kSalt, &s));
  EXPECT_EQ(s.newest, Record(4, 1));
  EXPECT_EQ(s.errors[0], "");
}

class CommitLogWrite : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs_.Open("/f.kv", OpenMode::kCreateExclusive, &file_).ok());
    std::vector<uint8_t> fixed(kDataOffset);
    log_.Reset(EncodeInitialSlots(kSalt, 1, fixed));
    ASSERT_TRUE(file_->WriteAt(0, fixed.data(), fixed.size()).ok());
    ASSERT_TRUE(file_->Sync().ok());
    ops_before_ = fs_.log().size();
  }
  std::vector<FsOp> NewOps() const { return {fs_.log().begin() + static_cast<ptrdiff_t>(ops_before_), fs_.log().end()}; }

  FaultFs fs_;
  std::unique_ptr<File> file_;
  CommitLog log_;
  size_t ops_before_ = 0;
};

TEST_F(CommitLogWrite, SyncsDataThenWritesTheOlderSlotAndSyncs) {
  log_.DataWritten();
  CommitRecord next = Record(0, 4);
  next.epoch = 1;
  ASSERT_TRUE(log_.Write(*file_, next).ok());
  next.sequence = 3;  // the durable record was sequence 2
  EXPECT_EQ(log_.durable(), next);
  EXPECT_EQ(log_.written_end(), next.end);
  std::vector<FsOp> ops = NewOps();
  ASSERT_EQ(ops.size(), 3u);
  EXPECT_EQ(ops[0].kind, FsOp::kSync);  // the data first
  EXPECT_EQ(ops[1].kind, FsOp::kWrite);
  EXPECT_EQ(ops[1].offset, 8192u);  // slot 1: it held sequence 1, the older
  EXPECT_EQ(ops[1].data, Encoded(next));
  EXPECT_EQ(ops[2].kind, FsOp::kSync);
  // Nothing unsynced since: the next commit goes to slot 0 with no data sync.
  ASSERT_TRUE(log_.Write(*file_, Record(0, 5)).ok());
  ops = NewOps();
  ASSERT_EQ(ops.size(), 5u);
  EXPECT_EQ(ops[3].kind, FsOp::kWrite);
  EXPECT_EQ(ops[3].offset, 4096u);
  EXPECT_EQ(ops[4].kind, FsOp::kSync);
  EXPECT_EQ(log_.durable().sequence, 4u);
}

TEST_F(CommitLogWrite, FailedRecordSyncKeepsTheDurableRecord) {
  const CommitRecord before = log_.durable();
  fs_.FailOn(FsOp::kSync, 0, EIO, false);
  Status st = log_.Write(*file_, Record(0, 4));
  EXPECT_EQ(st.code(), Status::Code::kIOError);
  EXPECT_EQ(log_.durable(), before);
  // The record was written (the file may hold it): its end is remembered.
  EXPECT_EQ(log_.written_end(), Record(0, 4).end);
  ASSERT_EQ(NewOps().size(), 1u);  // the failed sync is not recorded
  EXPECT_EQ(NewOps()[0].kind, FsOp::kWrite);
}

TEST_F(CommitLogWrite, FailedDataSyncWritesNoRecord) {
  log_.DataWritten();
  fs_.FailOn(FsOp::kSync, 0, EIO, false);
  EXPECT_FALSE(log_.Write(*file_, Record(0, 4)).ok());
  EXPECT_EQ(log_.durable().sequence, 2u);
  EXPECT_EQ(log_.written_end(), 0u);
  for (const FsOp& op : NewOps()) EXPECT_NE(op.kind, FsOp::kWrite);
}

}  // namespace
}  // namespace kvfile::internal
