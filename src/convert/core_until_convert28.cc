// SPDX-License-Identifier: Apache-2.0
// TEMPORARY (branch foreign28 only): the core of kvfile/convert.h and
// driver.h as far as the llama.cpp, Mooncake and colibri drivers and the
// CLI's thin calls into them need it (detection, the table of these three
// drivers, the transaction, verify-before-convert), standing in for
// convert28's convert.cc and drivers.cc. Delete this file when merging with
// convert28; nothing else refers to it.
#include <filesystem>
#include <memory>

#include "convert/driver.h"
#include "kvfile/file.h"
#include "kvfile/reader.h"
#include "kvfile/replace.h"
#include "kvfile/verify.h"
#include "kvfile/writer.h"

namespace kvfile::convert {

Status CheckInterrupted(const ConvertOptions& o, const std::string& path) {
  if (o.interrupted && o.interrupted()) return Status::Failed(path + ": interrupted");
  return Status::OK();
}

Status CheckKeepRaw(const ConvertOptions& o, const std::vector<std::string>& names, const std::string& path) {
  for (const std::string& k : o.keep_raw) {
    bool found = false;
    std::string list;
    for (const std::string& n : names) {
      found = found || n == k;
      list += (list.empty() ? "" : ", ") + n;
    }
    if (!found) return Status::InvalidArgument(path + ": --keep-raw: no stream '" + k + "' (streams: " + list + ")");
  }
  return Status::OK();
}

uint32_t ChunkTokens(const ConvertOptions& o, const Geometry& g, uint32_t wanted, const std::string& in) {
  if (o.chunk_tokens) return *o.chunk_tokens;
  std::error_code ec;
  uint64_t bytes = std::filesystem::file_size(in, ec);
  return FitChunkTokens(g, wanted, ec ? 0 : bytes);
}

void Progress(const ConvertOptions& o, const std::string& label, uint64_t done, uint64_t total) {
  if (o.progress) o.progress(label, done, total);
}

namespace {
const Driver kKvRow = {Format::kKv, false, ".kv", nullptr, nullptr, nullptr};
const Driver kSafetensorsRow = {Format::kSafetensors, false, ".safetensors", nullptr, nullptr, nullptr};
}  // namespace

std::span<const Driver> Drivers() {
  static const Driver table[] = {kKvRow, kSafetensorsRow, kLlamaDriver, kMooncakeDriver, kColiDriver};
  return table;
}

const Driver& DriverFor(Format f) { return Drivers()[static_cast<size_t>(f)]; }

}  // namespace kvfile::convert

namespace kvfile {

const char* FormatName(Format f) {
  static const char* names[] = {"kv", "safetensors", "llama", "mooncake", "coli"};
  return names[static_cast<size_t>(f)];
}

Status DetectFormat(const std::string& path, bool is_output, FileSystem* fs, Format* f) {
  std::error_code ec;
  bool dir = std::filesystem::is_directory(path, ec);
  std::vector<uint8_t> head;
  if (!is_output && !dir) {
    std::unique_ptr<File> file;
    KVFILE_RETURN_IF_ERROR((fs ? fs : FileSystem::Default())->Open(path, OpenMode::kRead, &file));
    uint64_t size = 0;
    KVFILE_RETURN_IF_ERROR(file->Size(&size));
    head.resize(std::min<uint64_t>(size, 64));
    KVFILE_RETURN_IF_ERROR(file->ReadAt(0, head.data(), head.size()));
  }
  for (const convert::Driver& d : convert::Drivers())
    if (!is_output && d.sniff && d.sniff(head, path, dir)) return *f = d.format, Status::OK();
  std::string ext = std::filesystem::path(path).extension().string();
  for (const convert::Driver& d : convert::Drivers())
    if (d.suffix && ext == d.suffix) return *f = d.format, Status::OK();
  return Status::InvalidArgument(path + ": cannot tell the format");
}

Status Convert(const std::string& in, const std::string& out, const ConvertOptions& o, ConvertReport* report) {
  auto interrupted = [&](Status st) {
    if (!st.ok() && o.interrupted && o.interrupted()) return Status::Failed(out + ": interrupted");
    return st;
  };
  ConvertReport local;
  ConvertReport* r = report ? report : &local;
  *r = ConvertReport();
  r->out_name = out;
  KVFILE_RETURN_IF_ERROR(DetectFormat(in, false, o.fs, &r->from));
  if (o.to) r->to = *o.to;
  else KVFILE_RETURN_IF_ERROR(DetectFormat(out, true, o.fs, &r->to));
  const convert::Driver& from = convert::DriverFor(r->from);
  const convert::Driver& to = convert::DriverFor(r->to);
  if (r->to == Format::kKv && from.import_kv) {
    std::unique_ptr<PendingReplace> replace;
    KVFILE_RETURN_IF_ERROR(PendingReplace::Begin(out, o.fs, &replace));
    if (replace->original().exists && !o.force)
      return Status::InvalidArgument(out + ": file exists; use --force to replace it");
    KVFILE_RETURN_IF_ERROR(interrupted(from.import_kv(in, o, replace->temp_path(), r)));
    return replace->Commit();
  }
  if (r->from != Format::kKv || !to.export_kv)
    return Status::Unsupported(in + " -> " + out + ": not converted by this build");
  std::unique_ptr<PendingReplace> replace;
  std::string tmp_dir;
  if (to.directory) {
    KVFILE_RETURN_IF_ERROR(convert::BeginDirectoryOutput(to, out, o.force, &tmp_dir));
  } else {
    KVFILE_RETURN_IF_ERROR(PendingReplace::Begin(out, o.fs, &replace));
    if (replace->original().exists && !o.force)
      return Status::InvalidArgument(out + ": file exists; use --force to replace it");
  }
  VerifyReport rep;
  VerifyOptions vo;
  vo.threads = 4;
  KVFILE_RETURN_IF_ERROR(VerifyFile(in, vo, &rep));
  for (const VerifyFinding& f : rep.findings)
    if (f.error) return Status::Corruption(in + ": " + f.message + "; not converted (kvfile verify fails on it)");
  std::unique_ptr<Reader> reader;
  ReaderOptions ro;
  ro.fs = o.fs;
  KVFILE_RETURN_IF_ERROR(Reader::Open(in, ro, &reader));
  Status st = interrupted(
      to.export_kv(*reader, in, reader->token_count(), o, to.directory ? tmp_dir : replace->temp_path(), r));
  if (st.ok()) st = to.directory ? convert::CommitDirectoryOutput(to, tmp_dir, out) : replace->Commit();
  if (!st.ok() && to.directory) {
    std::error_code ec;
    std::filesystem::remove_all(tmp_dir, ec);
  }
  return st;
}

}  // namespace kvfile
