// SPDX-License-Identifier: Apache-2.0
// Tests of Repair (kvfile/repair.h, src/writer/repair.cc): the decision on
// each kind of verify finding, with and without force; a dry run changes
// nothing, byte for byte; the leftover of an interrupted upgrade; a stop
// at a stage.

#include "kvfile/repair.h"
#include "kvfile/replace.h"
#include "support/kv_test_util.h"

namespace kvfile {
namespace {

using namespace kvfile::test;

// DamageTest's file: tiny, e4m3, 20 tokens in chunks of 8, three chunks of
// 4096 bytes from format::kDataOffset.
class RepairTest : public DamageTest {
 protected:
  RepairReport Run(bool force, bool dry_run, Status* st) {
    RepairOptions o;
    o.force = force;
    o.dry_run = dry_run;
    RepairReport rep;
    *st = Repair(Path(), o, &rep);
    return rep;
  }
  // A dry run, forced or not, leaves every byte; returns its report.
  RepairReport DryRun(bool force, Status* st) {
    const Bytes before = ReadFileBytes(Path());
    RepairReport rep = Run(force, true, st);
    EXPECT_EQ(ReadFileBytes(Path()), before) << "a dry run changed the file";
    EXPECT_FALSE(rep.repaired);
    return rep;
  }
  // Chunk 0 committed, chunks 1 and 2 whole but past the commit record
  // (the slots of an 8-token file over the chunks of the 20-token one).
  void WriteUncommittedTail() {
    g_ = Preset("tiny", Dtype::kE4M3);
    q_ = MakeSequence(g_, Dtype::kF32, 20, 5);
    std::unique_ptr<Writer> w;
    ASSERT_OK(Writer::Create(Path(), g_, kIdentity, Options(8), &w));
    ASSERT_OK(w->Append(Batch(q_, 0, 8)));
    ASSERT_OK(w->Close());
    const Bytes head = ReadFileBytes(Path());
    ASSERT_OK(Writer::Open(Path(), Options(8), &w));
    ASSERT_OK(w->Append(Batch(q_, 8, 12)));
    ASSERT_OK(w->Close());
    PokeBytes(Path(), 0, head.data(), format::kDataOffset);
    ASSERT_EQ(FileSize(Path()), format::kDataOffset + 3 * 4096);
  }
  VerifyFindingKind OnlyKind(const RepairReport& rep) {
    EXPECT_EQ(rep.check.findings.size(), 1u);
    return rep.check.findings.empty() ? VerifyFindingKind::kUnreadable : rep.check.findings[0].kind;
  }
};

TEST_F(RepairTest, HealthyFileIsLeftAsItIs) {
  ASSERT_NO_FATAL_FAILURE(Write());
  const Bytes before = ReadFileBytes(Path());
  for (bool dry_run : {true, false}) {
    Status st;
    RepairReport rep = Run(false, dry_run, &st);
    ASSERT_OK(st);
    EXPECT_TRUE(rep.healthy);
    EXPECT_FALSE(rep.repaired);
    EXPECT_EQ(rep.tokens, 20u);
    EXPECT_EQ(rep.cut, -1);
    EXPECT_EQ(rep.refused, -1);
    EXPECT_EQ(ReadFileBytes(Path()), before);
  }
}

TEST_F(RepairTest, TornTailIsCutWithoutForce) {
  ASSERT_NO_FATAL_FAILURE(Write());
  const Bytes healthy = ReadFileBytes(Path());
  Bytes garbage(100, 0x42);
  PokeBytes(Path(), FileSize(Path()), garbage.data(), garbage.size());
  Status st;
  RepairReport dry = DryRun(false, &st);
  ASSERT_OK(st);
  EXPECT_EQ(OnlyKind(dry), VerifyFindingKind::kTornTail);
  EXPECT_FALSE(dry.check.findings[0].error);
  EXPECT_EQ(dry.cut, 0);
  EXPECT_EQ(dry.cut_finding(), &dry.check.findings[0]);
  EXPECT_EQ(dry.check.valid_end, healthy.size());
  EXPECT_EQ(dry.check.torn_tail_bytes, 100u);
  RepairReport rep = Run(false, false, &st);
  ASSERT_OK(st);
  EXPECT_TRUE(rep.repaired);
  EXPECT_EQ(rep.recovery.truncated_bytes, 100u);
  EXPECT_EQ(rep.tokens, 20u);
  EXPECT_EQ(ReadFileBytes(Path()), healthy) << "repair must leave exactly the valid file";
}

TEST_F(RepairTest, DamagedCommitSlotIsRewritten) {
  ASSERT_NO_FATAL_FAILURE(Write());
  const Bytes healthy = ReadFileBytes(Path());
  // The checksum of slot 1 (the one a file written by one close does not use).
  XorByte(Path(), format::kCommitSlotOffset[1] + format::kCommitSlotSize - 1, 0x01);
  Status st;
  RepairReport dry = DryRun(false, &st);
  ASSERT_OK(st);
  ASSERT_EQ(OnlyKind(dry), VerifyFindingKind::kCommitSlot);
  EXPECT_EQ(dry.check.findings[0].offset, static_cast<int64_t>(format::kCommitSlotOffset[1]));
  EXPECT_EQ(dry.cut, -1);
  RepairReport rep = Run(false, false, &st);
  ASSERT_OK(st);
  EXPECT_TRUE(rep.recovery.slot_rewritten);
  EXPECT_EQ(rep.tokens, 20u);
  VerifyReport after;
  ASSERT_OK(VerifyFile(Path(), {}, &after));
  EXPECT_TRUE(after.findings.empty());
  const Bytes repaired = ReadFileBytes(Path());
  EXPECT_EQ(Bytes(repaired.begin() + format::kDataOffset, repaired.end()),
            Bytes(healthy.begin() + format::kDataOffset, healthy.end()))
      << "the chunks are untouched";
}

TEST_F(RepairTest, DamageBeforeTheEndIsCutOnlyWithForce) {
  ASSERT_NO_FATAL_FAILURE(WriteUncommittedTail());
  const uint64_t chunk1 = ChunkOffset(1);
  XorByte(Path(), chunk1 + 2000, 0x10);  // chunk 1's payload; chunk 2 still whole
  const Bytes damaged = ReadFileBytes(Path());
  Status st;
  RepairReport dry = DryRun(false, &st);
  ASSERT_EQ(OnlyKind(dry), VerifyFindingKind::kDamageBeforeEnd);
  const std::string refusal = Path() + ": " + dry.check.findings[0].message +
                              "; not repaired (cutting the file at offset " + std::to_string(chunk1) +
                              " drops the valid chunks after it; use --force to do it)";
  EXPECT_TRUE(HasCode(st, Code::kCorruption, {refusal}));
  EXPECT_EQ(st.message(), refusal);
  EXPECT_EQ(dry.refused, 0);
  RepairReport refused = Run(false, false, &st);
  EXPECT_EQ(st.message(), refusal);
  EXPECT_EQ(refused.refused_finding(), &refused.check.findings[0]);
  EXPECT_FALSE(refused.repaired);
  EXPECT_EQ(ReadFileBytes(Path()), damaged);

  RepairReport forced_dry = DryRun(true, &st);
  ASSERT_OK(st);
  EXPECT_EQ(forced_dry.cut, 0);
  EXPECT_EQ(forced_dry.refused, -1);
  RepairReport rep = Run(true, false, &st);
  ASSERT_OK(st);
  EXPECT_TRUE(rep.repaired);
  EXPECT_EQ(rep.recovery.truncated_bytes, 2 * 4096u);
  EXPECT_TRUE(rep.recovery.dropped_after_damage);
  EXPECT_EQ(rep.tokens, 8u);
  EXPECT_EQ(FileSize(Path()), chunk1);
  const Bytes repaired = ReadFileBytes(Path());
  EXPECT_EQ(Bytes(repaired.begin() + format::kDataOffset, repaired.end()),
            Bytes(damaged.begin() + format::kDataOffset, damaged.begin() + chunk1));
}

TEST_F(RepairTest, CommittedDataMissingIsCutOnlyWithForce) {
  ASSERT_NO_FATAL_FAILURE(Write());
  const uint64_t chunk2 = ChunkOffset(2);
  std::filesystem::resize_file(Path(), chunk2 + 1000);
  const Bytes cut = ReadFileBytes(Path());
  Status st;
  RepairReport dry = DryRun(false, &st);
  ASSERT_EQ(OnlyKind(dry), VerifyFindingKind::kCommittedDataMissing);
  const std::string refusal = Path() + ": " + dry.check.findings[0].message +
                              "; not repaired (the commit record would no longer count the missing tokens; use "
                              "--force to cut the file at offset " + std::to_string(chunk2) +
                              " and commit the 16 tokens before it)";
  EXPECT_EQ(st.code(), Code::kCorruption);
  EXPECT_EQ(st.message(), refusal);
  RepairReport refused = Run(false, false, &st);
  EXPECT_EQ(st.message(), refusal);
  EXPECT_EQ(refused.refused, 0);
  EXPECT_EQ(ReadFileBytes(Path()), cut);

  RepairReport forced_dry = DryRun(true, &st);
  ASSERT_OK(st);
  EXPECT_EQ(forced_dry.cut, 0);
  EXPECT_EQ(forced_dry.committed_tokens_lost, 4u);
  RepairReport rep = Run(true, false, &st);
  ASSERT_OK(st);
  EXPECT_TRUE(rep.repaired);
  EXPECT_EQ(rep.recovery.dropped_committed_tokens, 4u);
  EXPECT_EQ(rep.tokens, 16u);
  EXPECT_EQ(FileSize(Path()), chunk2);
  VerifyReport after;
  ASSERT_OK(VerifyFile(Path(), {}, &after));
  EXPECT_TRUE(after.findings.empty());
}

TEST_F(RepairTest, DamagedChunkIsRefusedEvenWithForce) {
  ASSERT_NO_FATAL_FAILURE(Write());
  XorByte(Path(), ChunkOffset(1) + 2000, 0x10);
  const Bytes damaged = ReadFileBytes(Path());
  for (bool force : {false, true}) {
    for (bool dry_run : {true, false}) {
      SCOPED_TRACE(std::string(force ? "force" : "") + (dry_run ? " dry run" : ""));
      Status st;
      RepairReport rep = Run(force, dry_run, &st);
      ASSERT_EQ(OnlyKind(rep), VerifyFindingKind::kDamagedChunk);
      EXPECT_EQ(rep.check.findings[0].chunk, 1);
      EXPECT_EQ(st.code(), Code::kCorruption);
      EXPECT_EQ(st.message(),
                Path() + ": " + rep.check.findings[0].message + "; not repaired (damage, not a crash's leftovers)");
      EXPECT_EQ(rep.refused, 0);
      EXPECT_EQ(ReadFileBytes(Path()), damaged);
    }
  }
}

TEST_F(RepairTest, UnreadableFileIsRefused) {
  ASSERT_NO_FATAL_FAILURE(Write());
  XorByte(Path(), 0, 0xFF);  // the magic
  const Bytes damaged = ReadFileBytes(Path());
  for (bool force : {false, true}) {
    Status st;
    RepairReport rep = Run(force, false, &st);
    ASSERT_EQ(OnlyKind(rep), VerifyFindingKind::kUnreadable);
    EXPECT_FALSE(rep.check.opened);
    EXPECT_EQ(st.code(), Code::kCorruption);
    EXPECT_EQ(st.message(),
              Path() + ": " + rep.check.findings[0].message + "; not repaired (damage, not a crash's leftovers)");
    EXPECT_EQ(ReadFileBytes(Path()), damaged);
  }
}

// The leftover of an interrupted upgrade is removed (not in a dry run),
// even when the repair is then refused.
TEST_F(RepairTest, LeftoverOfAnInterruptedUpgradeIsRemoved) {
  ASSERT_NO_FATAL_FAILURE(Write());
  XorByte(Path(), ChunkOffset(1) + 2000, 0x10);
  const std::string leftover = TempPathFor(Path(), ".kvupgrade");
  { std::ofstream(leftover) << "half an upgrade"; }
  Status st;
  RepairReport dry = DryRun(false, &st);
  EXPECT_EQ(dry.leftover, leftover);
  EXPECT_FALSE(dry.leftover_removed);
  EXPECT_TRUE(std::filesystem::exists(leftover));
  RepairReport rep = Run(false, false, &st);
  EXPECT_EQ(st.code(), Code::kCorruption);
  EXPECT_EQ(rep.leftover, leftover);
  EXPECT_TRUE(rep.leftover_removed);
  EXPECT_FALSE(std::filesystem::exists(leftover));
}

// A v1 file with a torn tail: the plan names the upgrade (geometry before
// and after); the repair upgrades it, leaving the tail behind.
TEST_F(RepairTest, V1FileIsUpgraded) {
  Geometry g = Preset("tiny");
  for (StreamSpec& s : g.streams) s.dtype = Dtype::kBF16;
  Sequence q = MakeSequence(g, Dtype::kBF16, 10, 3);
  WriterOptions o = Options(4);
  o.format_major = 1;
  WriteSequence(Path(), q, o, {10});
  Bytes garbage(50, 0x42);
  PokeBytes(Path(), FileSize(Path()), garbage.data(), garbage.size());
  Status st;
  RepairReport dry = DryRun(false, &st);
  ASSERT_OK(st);
  EXPECT_EQ(dry.check.major, 1);
  EXPECT_TRUE(dry.upgrade);
  EXPECT_EQ(dry.geometry_before.streams[0].dtype, Dtype::kBF16);
  EXPECT_EQ(dry.geometry_after.streams[0].dtype, WriterOptions().upgrade_dtype);
  RepairReport rep = Run(false, false, &st);
  ASSERT_OK(st);
  EXPECT_TRUE(rep.recovery.upgraded_from_v1);
  EXPECT_EQ(rep.tokens, 10u);
  EXPECT_EQ(rep.geometry_after.streams[0].dtype, WriterOptions().upgrade_dtype);
  // The upgrade rewrites the file whole: the torn tail is not carried over.
  VerifyReport after;
  ASSERT_OK(VerifyFile(Path(), {}, &after));
  EXPECT_EQ(after.major, 2);
  EXPECT_TRUE(after.findings.empty());
  EXPECT_EQ(after.tokens, 10u);
}

// on_stage sees each stage in order; an error from it ends the repair
// there, the file as it was.
TEST_F(RepairTest, StageErrorStopsTheRepair) {
  ASSERT_NO_FATAL_FAILURE(Write());
  Bytes garbage(100, 0x42);
  PokeBytes(Path(), FileSize(Path()), garbage.data(), garbage.size());
  const Bytes torn = ReadFileBytes(Path());
  for (RepairStage stop_at : {RepairStage::kChecked, RepairStage::kWriting}) {
    std::vector<RepairStage> seen;
    RepairOptions o;
    o.on_stage = [&](RepairStage stage, const RepairReport& report) {
      seen.push_back(stage);
      EXPECT_EQ(report.check.torn_tail_bytes, 100u);
      return stage == stop_at ? Status::Failed(Path() + ": interrupted by SIGINT") : Status::OK();
    };
    RepairReport rep;
    Status st = Repair(Path(), o, &rep);
    EXPECT_EQ(st.message(), Path() + ": interrupted by SIGINT");
    EXPECT_EQ(seen.back(), stop_at);
    EXPECT_EQ(seen.size(), stop_at == RepairStage::kChecked ? 1u : 2u);
    EXPECT_FALSE(rep.repaired);
    EXPECT_EQ(ReadFileBytes(Path()), torn);
  }
}

TEST(VerifyFindingKindTest, Names) {
  EXPECT_STREQ(VerifyFindingKindName(VerifyFindingKind::kUnreadable), "unreadable");
  EXPECT_STREQ(VerifyFindingKindName(VerifyFindingKind::kCommitSlot), "commit slot");
  EXPECT_STREQ(VerifyFindingKindName(VerifyFindingKind::kDamagedChunk), "damaged chunk");
  EXPECT_STREQ(VerifyFindingKindName(VerifyFindingKind::kTornTail), "torn tail");
  EXPECT_STREQ(VerifyFindingKindName(VerifyFindingKind::kDamageBeforeEnd), "damage before the end");
  EXPECT_STREQ(VerifyFindingKindName(VerifyFindingKind::kCommittedDataMissing), "committed data missing");
  EXPECT_STREQ(VerifyFindingKindName(static_cast<VerifyFindingKind>(200)), "unknown");
}

}  // namespace
}  // namespace kvfile
