// VerifyFile: the scan of open, then every chunk read whole and checked.
#include "kvfile/verify.h"

#include "file_scan.h"

namespace kvfile {

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
  Status st = internal::ScanFile(*file, &scan, &where);
  if (!st.ok()) {
    if (!st.IsDataError()) return st.WithContext(path);
    report->findings.push_back({true, where.chunk, where.offset, st.message()});
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
                                  scan.slot_errors[i] + " (the other slot is in use; `kvfile repair` rewrites it)"});
  if (!options.quick) {
    internal::LayoutCache layouts(&scan.header.geometry);
    std::vector<uint8_t> buf;
    for (size_t i = 0; i < scan.chunks.size(); ++i) {
      const auto& c = scan.chunks[i];
      const format::ChunkLayout* layout = nullptr;
      st = internal::ReadAndCheckChunk(*file, scan.header.geometry, layouts, c, &buf);
      if (st.ok()) st = layouts.Get(c.info.stored_tokens, &layout);
      if (st.ok()) st = internal::CheckChunkValues(scan.header.geometry, *layout, c.info, buf.data());
      if (!st.ok()) {
        if (!st.IsDataError()) return st.WithContext(path);
        report->findings.push_back({true, static_cast<int64_t>(i), static_cast<int64_t>(c.info.offset),
                                    internal::ChunkWhere(i, c.info.offset) + ": " + st.message()});
      }
    }
  }
  if (scan.tail.torn_tail_bytes > 0) {
    int64_t at = static_cast<int64_t>(scan.tail.valid_end);
    int64_t chunk = static_cast<int64_t>(scan.chunks.size());
    if (scan.tail.valid_data_follows) {
      report->findings.push_back(
          {true, chunk, at,
           scan.tail.torn_reason + "; a valid chunk follows at offset " +
               std::to_string(scan.tail.valid_data_offset) +
               " (damage before the end; a crash in sync mode none with writes reaching the disk "
               "out of order also leaves this, and then nothing acknowledged is lost)"});
    } else {
      report->findings.push_back({false, chunk, at,
                                  "torn tail: " + std::to_string(scan.tail.torn_tail_bytes) +
                                      " bytes after the last valid chunk (" + scan.tail.torn_reason + ")"});
    }
  }
  return Status::OK();
}

}  // namespace kvfile
