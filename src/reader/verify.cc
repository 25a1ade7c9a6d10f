// SPDX-License-Identifier: Apache-2.0
// VerifyFile: the scan of open, then every chunk read whole and checked.
#include "kvfile/verify.h"

#include "reader/file_scan.h"
#include "io/page_buffer.h"
#include "reader/parallel_chunks.h"

namespace kvfile {

// Beyond a few workers the disk, not the checksums, is the limit.
constexpr size_t kMaxVerifyThreads = 16;

const char* VerifyFindingKindName(VerifyFindingKind kind) {
  switch (kind) {
    case VerifyFindingKind::kUnreadable: return "unreadable";
    case VerifyFindingKind::kCommitSlot: return "commit slot";
    case VerifyFindingKind::kDamagedChunk: return "damaged chunk";
    case VerifyFindingKind::kTornTail: return "torn tail";
    case VerifyFindingKind::kDamageBeforeEnd: return "damage before the end";
    case VerifyFindingKind::kCommittedDataMissing: return "committed data missing";
  }
  return "unknown";
}

bool VerifyReport::HasErrors() const {
  for (const VerifyFinding& f : findings)
    if (f.error) return true;
  return false;
}

bool VerifyReport::HasWarnings() const {
  for (const VerifyFinding& f : findings)
    if (!f.error) return true;
  return false;
}

Status VerifyFile(const std::string& path, const VerifyOptions& options, VerifyReport* report) {
  *report = VerifyReport{};
  FileSystem* fs = options.fs ? options.fs : FileSystem::Default();
  std::unique_ptr<File> file;
  KVFILE_RETURN_IF_ERROR(fs->Open(path, OpenMode::kRead, &file));
  KVFILE_RETURN_IF_ERROR(file->Size(&report->bytes));
  internal::ScanResult scan;
  internal::DamageLocation where;
  Status st = internal::ScanSettledFile(*file, &scan, &where);
  if (!st.ok()) {
    if (!st.IsDataError()) return st.WithContext(path);
    report->findings.push_back({true, where.chunk, where.offset, st.message(), VerifyFindingKind::kUnreadable});
    return Status::OK();
  }
  report->opened = true;
  report->major = scan.header.major;
  report->minor = scan.header.minor;
  report->tokens = scan.tokens.size();
  report->chunks = scan.chunks.size();
  report->valid_end = scan.tail.valid_end;
  report->torn_tail_bytes = scan.tail.torn_tail_bytes;
  for (int i = 0; i < 2; ++i)
    if (!scan.slot_errors[i].empty())
      report->findings.push_back({true, -1, static_cast<int64_t>(format::kCommitSlotOffset[i]),
                                  scan.slot_errors[i] + " (the other slot is in use; `kvfile repair` rewrites it)",
                                  VerifyFindingKind::kCommitSlot});
  if (!options.quick) {
    unsigned threads = internal::WorkerCount(options.threads, scan.chunks.size(), kMaxVerifyThreads);
    std::vector<std::unique_ptr<File>> files;
    files.push_back(std::move(file));
    KVFILE_RETURN_IF_ERROR(
        internal::OpenWorkerFiles(*fs, path, *files[0], threads - 1, "while it was verified", &files));
    // One result per chunk, filled by whichever worker takes it; findings
    // are then reported in chunk order.
    std::vector<Status> results(scan.chunks.size());
    std::vector<internal::LayoutCache> layouts(threads, internal::LayoutCache(&scan.header.geometry));
    std::vector<internal::PageBuffer> bufs(threads);
    (void)internal::ForEachChunk(0, scan.chunks.size(), threads, [&](unsigned w, size_t i) {
      results[i] = internal::ReadAndCheckChunk(*files[w], scan.header.geometry, layouts[w], scan.chunks[i],
                                               scan.SectionChecksums(i), &bufs[w]);
      return Status::OK();  // every chunk is checked, whatever the others gave
    });
    for (size_t i = 0; i < results.size(); ++i) {
      const Status& cst = results[i];
      if (cst.ok()) continue;
      const auto& c = scan.chunks[i];
      if (!cst.IsDataError()) return cst.WithContext(path);
      // A file rewound or cut under verify is no damage of it.
      Status changed = internal::ExplainReadFailure(*files[0], scan, c.info.offset + c.info.bytes, path, cst);
      if (!changed.IsDataError()) return changed;
      report->findings.push_back({true, static_cast<int64_t>(i), static_cast<int64_t>(c.info.offset),
                                  internal::ChunkWhere(i, c.info.offset) + ": " + cst.message(),
                                  VerifyFindingKind::kDamagedChunk});
    }
  }
  if (scan.tail.committed_data_missing) {
    report->committed_data_missing = true;
    report->findings.push_back(
        {true, static_cast<int64_t>(scan.chunks.size()), static_cast<int64_t>(report->bytes),
         "file truncated: committed data missing: the file ends at offset " + std::to_string(report->bytes) +
             " but the commit record vouches for " + std::to_string(scan.commit.end) + " bytes; " +
             std::to_string(scan.tail.committed_chunks_missing) + " committed chunks from chunk " +
             std::to_string(scan.chunks.size()) + " at offset " + std::to_string(scan.tail.valid_end) +
             " on, " + std::to_string(scan.tail.committed_tokens_missing) + " committed tokens and " +
             std::to_string(scan.tail.committed_bytes_missing) + " bytes are missing (" + scan.tail.torn_reason +
             "); readers get the " + std::to_string(scan.tokens.size()) +
             " tokens before it, `kvfile repair --force` cuts the file to them",
         VerifyFindingKind::kCommittedDataMissing});
  } else if (scan.tail.torn_tail_bytes > 0) {
    int64_t at = static_cast<int64_t>(scan.tail.valid_end);
    int64_t chunk = static_cast<int64_t>(scan.chunks.size());
    if (scan.tail.valid_data_follows) {
      report->findings.push_back(
          {true, chunk, at,
           scan.tail.torn_reason + "; a valid chunk follows at offset " +
               std::to_string(scan.tail.valid_data_offset) +
               " (damage before the end; a crash in sync mode none with writes reaching the disk "
               "out of order also leaves this, and then nothing acknowledged is lost)",
           VerifyFindingKind::kDamageBeforeEnd});
    } else {
      report->findings.push_back({false, chunk, at,
                                  "torn tail: " + std::to_string(scan.tail.torn_tail_bytes) +
                                      " bytes after the last valid chunk (" + scan.tail.torn_reason + ")",
                                  VerifyFindingKind::kTornTail});
    }
  }
  return Status::OK();
}

}  // namespace kvfile
