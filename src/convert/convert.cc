// SPDX-License-Identifier: Apache-2.0
// Convert (kvfile/convert.h): detection, the options' checks, the
// transaction, verify-before-convert with salvage; and the rules the drivers
// share (driver.h).
#include "kvfile/convert.h"

#include <algorithm>
#include <filesystem>
#include <memory>

#include "convert/driver.h"
#include "kvfile/file.h"
#include "kvfile/reader.h"
#include "kvfile/replace.h"
#include "kvfile/verify.h"
#include "kvfile/writer.h"

namespace kvfile {

namespace {

constexpr const char* kFormatNames[kFormatCount] = {"kv", "safetensors", "llama", "mooncake", "coli"};

}  // namespace

const char* FormatName(Format f) {
  auto i = static_cast<size_t>(f);
  return i < kFormatCount ? kFormatNames[i] : "invalid";
}

Status ParseFormat(std::string_view name, Format* f) {
  for (int i = 0; i < kFormatCount; ++i)
    if (name == kFormatNames[i]) {
      *f = static_cast<Format>(i);
      return Status::OK();
    }
  return Status::InvalidArgument("unknown format '" + std::string(name) +
                                 "' (kv, safetensors, llama, mooncake or coli)");
}

namespace {

bool EndsWith(const std::string& s, const char* suffix) {
  return suffix && s.size() > std::string_view(suffix).size() && s.ends_with(suffix);
}

std::optional<Format> ByName(const std::string& path) {
  for (const convert::Driver& d : convert::Drivers())
    if (EndsWith(path, d.suffix)) return d.format;
  return std::nullopt;
}

// The format of an existing file or directory by its content, if any driver
// recognises it.
Status ByContent(const std::string& path, FileSystem* fs, std::optional<Format>* f) {
  *f = std::nullopt;
  std::error_code ec;
  if (!path.starts_with("s3://") && std::filesystem::is_directory(path, ec)) {
    for (const convert::Driver& d : convert::Drivers())
      if (d.directory && d.sniff && d.sniff({}, path, true)) *f = d.format;
    return Status::OK();
  }
  std::unique_ptr<File> file;
  KVFILE_RETURN_IF_ERROR(fs->Open(path, OpenMode::kRead, &file));
  uint64_t size = 0;
  KVFILE_RETURN_IF_ERROR(file->Size(&size));
  uint8_t head[64];
  const size_t n = static_cast<size_t>(std::min<uint64_t>(size, sizeof head));
  if (n > 0) KVFILE_RETURN_IF_ERROR(file->ReadAt(0, head, n));
  for (const convert::Driver& d : convert::Drivers())
    if (!d.directory && d.sniff && d.sniff({head, n}, path, false)) {
      *f = d.format;
      break;
    }
  return Status::OK();
}

}  // namespace

Status DetectFormat(const std::string& path, bool is_output, FileSystem* fs, Format* f) {
  if (!fs) fs = FileSystem::Default();
  if (is_output) {
    // By name; a name that says nothing: what an existing file holds.
    if (std::optional<Format> by_name = ByName(path)) {
      *f = *by_name;
      return Status::OK();
    }
    bool exists = false;
    if (fs->Exists(path, &exists).ok() && exists) {
      std::optional<Format> by_content;
      if (ByContent(path, fs, &by_content).ok() && by_content) {
        *f = *by_content;
        return Status::OK();
      }
    }
    return Status::InvalidArgument(path + ": cannot tell the format: the name must end in .kv, .safetensors or "
                                   ".coli_kv, or give --format llama-seq|llama-session|mooncake|coli-v2");
  }
  std::optional<Format> found;
  KVFILE_RETURN_IF_ERROR(ByContent(path, fs, &found));
  if (!found) found = ByName(path);
  if (!found) {
    std::error_code ec;
    if (!path.starts_with("s3://") && std::filesystem::is_directory(path, ec))
      return Status::InvalidArgument(path + ": is a directory of no format kvfile converts");
    return Status::InvalidArgument(path + ": cannot tell the format: the name must end in .kv or .safetensors");
  }
  *f = *found;
  return Status::OK();
}

// ---- The rules the drivers share -------------------------------------------------------

namespace convert {

Status CheckInterrupted(const ConvertOptions& o, const std::string& path) {
  if (o.interrupted && o.interrupted()) return Status::Failed(path + ": interrupted");
  return Status::OK();
}

Dtype TargetDtype(const std::string& stream, Dtype have, const ConvertOptions& o) {
  bool raw_dtype = o.dtype && !IsQuantized(*o.dtype);
  if (o.keep_raw.count(stream)) return raw_dtype ? *o.dtype : IsQuantized(have) ? Dtype::kBF16 : have;
  if (!o.dtype) return have;
  if (IsQuantized(*o.dtype)) return IsQuantized(have) || o.every_stream ? *o.dtype : have;
  return *o.dtype;
}

Status CheckKeepRaw(const ConvertOptions& o, const std::vector<std::string>& names, const std::string& path) {
  return CheckKeepRaw(std::vector<std::string>(o.keep_raw.begin(), o.keep_raw.end()), names, path);
}

Status CheckKeepRaw(const std::vector<std::string>& keep_raw, const std::vector<std::string>& names,
                    const std::string& path) {
  for (const std::string& k : keep_raw)
    if (std::find(names.begin(), names.end(), k) == names.end()) {
      std::string all;
      for (const std::string& n : names) all += (all.empty() ? "" : ", ") + n;
      return Status::InvalidArgument(path + ": --keep-raw: no stream '" + k + "' (streams: " + all + ")");
    }
  return Status::OK();
}

uint32_t ChunkTokens(const ConvertOptions& o, const Geometry& g, uint32_t wanted, const std::string& in) {
  if (o.chunk_tokens) return *o.chunk_tokens;
  std::error_code ec;
  uint64_t input_bytes = std::filesystem::file_size(in, ec);
  return FitChunkTokens(g, wanted, ec ? 0 : input_bytes);
}

void Progress(const ConvertOptions& o, const std::string& label, uint64_t done, uint64_t total) {
  if (o.progress) o.progress(label, done, total);
}

std::string StreamList(const Geometry& g) {
  std::string s;
  for (const StreamSpec& spec : g.streams) s += (s.empty() ? "" : ", ") + spec.name + " " + DtypeName(spec.dtype);
  return s;
}

}  // namespace convert

// ---- Convert ----------------------------------------------------------------------------

namespace {

using convert::Driver;
using convert::DriverFor;

// "PATH: file truncated: committed data missing: ..." for a .kv cut inside
// its committed data (the line `kvfile verify` prints), naming what
// --salvage keeps.
std::string TruncatedLine(const std::string& path, const Reader& r) {
  const TailInfo& t = r.tail();
  return path + ": file truncated: committed data missing: the file ends at offset " + std::to_string(t.file_size) +
         " (chunk " + std::to_string(r.chunks().size()) + " at offset " + std::to_string(t.valid_end) + "); " +
         std::to_string(t.committed_tokens_missing) + " committed tokens gone; --salvage converts the " +
         std::to_string(r.token_count()) + " before it";
}

// A .kv IN is converted only if verify passes it: damage is never converted
// silently. With salvage, *tokens is the verified prefix (the tokens of the
// chunks before the first damaged one) and a warning says how many committed
// tokens that drops. Otherwise *tokens is r's count.
Status CheckInput(const std::string& in, const Reader& r, const ConvertOptions& o, uint64_t* tokens,
                  ConvertReport* report) {
  *tokens = r.token_count();
  VerifyReport rep;
  VerifyOptions vo;
  vo.fs = o.fs;
  vo.threads = 4;
  KVFILE_RETURN_IF_ERROR(VerifyFile(in, vo, &rep));
  const VerifyFinding* first = nullptr;
  for (const VerifyFinding& f : rep.findings) {
    if (!f.error) continue;
    if (!first) first = &f;
    if (f.chunk >= 0 && static_cast<uint64_t>(f.chunk) < r.chunks().size())
      *tokens = std::min<uint64_t>(*tokens, r.chunks()[static_cast<size_t>(f.chunk)].first_token);
  }
  if (!first) return Status::OK();
  if (!o.salvage && r.tail().committed_data_missing) return Status::Corruption(TruncatedLine(in, r));
  if (!o.salvage)
    return Status::Corruption(in + ": " + first->message + "; not converted (kvfile verify fails on it; --salvage "
                              "converts the " + std::to_string(*tokens) + " tokens before the damage)");
  uint64_t committed = r.tail().committed_tokens_missing;
  for (const ChunkInfo& c : r.chunks())
    if (c.committed) committed += c.live_tokens;
  report->warnings.push_back(in + ": --salvage: converted the verified prefix of " + std::to_string(*tokens) +
                             " tokens; " + std::to_string(committed - std::min(committed, *tokens)) +
                             " committed tokens were dropped (" + first->message + ")");
  return Status::OK();
}

// What the options allow for this pair of formats (the CLI refuses the same
// combinations of its flags, in its words, before it calls Convert).
Status CheckOptions(const std::string& in, const std::string& out, Format from, Format to, const ConvertOptions& o) {
  if (o.kv_major != 1 && o.kv_major != 2)
    return Status::InvalidArgument("kv_major " + std::to_string(o.kv_major) + ": a .kv output is format 1 or 2");
  if (o.kv_major == 1 && o.dtype && IsQuantized(*o.dtype))
    return Status::InvalidArgument("a format 1 .kv stores raw rows: the dtype must be bf16, f16 or f32");
  if (o.kv_major == 1 && !o.keep_raw.empty())
    return Status::InvalidArgument("keep_raw applies to a format 2 .kv output (format 1 is all raw)");
  if (from == to && from != Format::kKv)
    return Status::InvalidArgument(out + ": IN and OUT are both " + FormatName(from) + "; convert reads or writes "
                                   "a .kv file");
  if (o.codes && from != Format::kSafetensors && to != Format::kSafetensors)
    return Status::InvalidArgument("codes applies to a safetensors input or output");
  if (to != Format::kKv && (!o.keep_raw.empty() || o.chunk_tokens))
    return Status::InvalidArgument("keep_raw and chunk_tokens apply to a .kv output");
  if (to == Format::kSafetensors && o.codes && o.dtype)
    return Status::InvalidArgument("codes exports quantized and raw streams as stored; no dtype applies");
  if (to == Format::kSafetensors && o.dtype && IsQuantized(*o.dtype))
    return Status::InvalidArgument(std::string("dtype ") + DtypeName(*o.dtype) +
                                   ": an export decodes to bf16, f16 or f32; codes exports codes");
  // A foreign format's options where neither IN nor OUT is in that format
  // would be ignored: refused, as the command refuses its flags there.
  const bool llama_in = from == Format::kLlamaState, llama_out = to == Format::kLlamaState;
  if (!llama_in && (o.llama.head_size || o.llama.model || o.llama.unrotate))
    return Status::InvalidArgument("head_size, model and unrotate apply to a llama input");
  if (!llama_in && !llama_out && o.llama.rotated)
    return Status::InvalidArgument("rotated applies to a llama input or output");
  if (!llama_out && (o.llama.session || o.llama.type || o.llama.v_trans || o.llama.arch || o.llama.n_stream))
    return Status::InvalidArgument("session, type, v_trans, arch and n_stream apply to a llama output");
  if (to != Format::kMooncake && o.mooncake.group_size)
    return Status::InvalidArgument("group_size applies to a mooncake output");
  if (to != Format::kColi && (o.coli.vocab || o.coli.v1))
    return Status::InvalidArgument("vocab and v1 apply to a coli output");
  if (from != Format::kColi && o.coli.indexer_layers)
    return Status::InvalidArgument("indexer_layers applies to a coli input");
  std::error_code ec;
  if (!in.starts_with("s3://") && std::filesystem::exists(out, ec) && std::filesystem::equivalent(in, out, ec))
    return Status::InvalidArgument(out + ": IN and OUT are the same file");
  return Status::OK();
}

// Removes a file or directory when it goes out of scope (a conversion's
// intermediate .kv, a directory output that was not committed).
class RemoveOnExit {
 public:
  explicit RemoveOnExit(std::string path) : path_(std::move(path)) {}
  ~RemoveOnExit() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  void Keep() { path_.clear(); }

 private:
  std::string path_;
};

// A .kv IN (checked first) -> `to` at dest.
Status FromKv(const std::string& in, Format to, const ConvertOptions& o, const std::string& dest, ConvertReport* r) {
  std::unique_ptr<Reader> reader;
  ReaderOptions ro;
  ro.fs = o.fs;
  KVFILE_RETURN_IF_ERROR(Reader::Open(in, ro, &reader));
  uint64_t tokens = 0;
  KVFILE_RETURN_IF_ERROR(CheckInput(in, *reader, o, &tokens, r));
  r->tokens = tokens;
  return DriverFor(to).export_kv(*reader, in, tokens, o, dest, r);
}

// IN -> OUT's format at dest (a temporary file or directory).
Status Run(const std::string& in, Format from, Format to, const ConvertOptions& o, const std::string& dest,
           ConvertReport* r) {
  if (from == Format::kKv) return FromKv(in, to, o, dest, r);
  const Driver& din = DriverFor(from);
  if (to == Format::kKv) return din.import_kv(in, o, dest, r);
  // Foreign -> foreign: through a .kv beside dest, removed after.
  const std::string kv = TempPathFor(dest, ".kvtmp-convert.kv");
  RemoveOnExit remove(kv);
  ConvertOptions import = o;
  import.kv_major = 2;
  import.chunk_tokens.reset();
  ConvertReport first;
  first.out_name = r->out_name;
  KVFILE_RETURN_IF_ERROR(din.import_kv(in, import, kv, &first));
  r->warnings = std::move(first.warnings);
  r->notes = std::move(first.notes);
  ConvertOptions out = o;
  out.salvage = false;
  return FromKv(kv, to, out, dest, r);
}

}  // namespace

Status Convert(const std::string& in, const std::string& out, const ConvertOptions& o, ConvertReport* report) {
  ConvertReport local;
  ConvertReport* r = report ? report : &local;
  *r = ConvertReport{};
  r->out_name = out;
  FileSystem* fs = o.fs ? o.fs : FileSystem::Default();
  Format from, to;
  KVFILE_RETURN_IF_ERROR(DetectFormat(in, false, fs, &from));
  if (o.to) {
    to = *o.to;
  } else if (Status st = DetectFormat(out, true, fs, &to); !st.ok()) {
    // An existing OUT is refused as such first (without force), whatever
    // it holds: the caller learns that it exists, not what its name lacks.
    bool exists = false;
    if (!o.force && fs->Exists(out, &exists).ok() && exists)
      return Status::InvalidArgument(out + ": file exists; use --force to replace it");
    return st;
  }
  r->from = from;
  r->to = to;
  KVFILE_RETURN_IF_ERROR(CheckOptions(in, out, from, to, o));
  const Driver& din = DriverFor(from);
  const Driver& dout = DriverFor(to);
  if (from != Format::kKv && !din.import_kv)
    return Status::Unsupported(in + ": this build does not read " + FormatName(from) + " files");
  if (!dout.export_kv)
    return Status::Unsupported(out + ": this build does not write " + FormatName(to) + " files");
  auto interrupted = [&](Status st) {
    if (!st.ok() && o.interrupted && o.interrupted()) return Status::Failed(out + ": interrupted");
    return st;
  };
  if (dout.directory && out.starts_with("s3://"))
    return Status::InvalidArgument(out + ": a " + FormatName(to) + " output is a directory, written to a local "
                                   "path; an object store takes one file per convert");
  if (dout.directory) {
    // A temporary directory, put in OUT's place whole when complete.
    std::string tmp;
    KVFILE_RETURN_IF_ERROR(convert::BeginDirectoryOutput(dout, out, o.force, &tmp));
    RemoveOnExit remove(tmp);
    KVFILE_RETURN_IF_ERROR(interrupted(Run(in, from, to, o, tmp, r)));
    KVFILE_RETURN_IF_ERROR(convert::CommitDirectoryOutput(dout, tmp, out));
    remove.Keep();
    return Status::OK();
  }
  // A temporary file, renamed over OUT when complete (kvfile/replace.h);
  // removed on failure.
  std::unique_ptr<PendingReplace> replace;
  KVFILE_RETURN_IF_ERROR(PendingReplace::Begin(out, o.fs, &replace));
  if (replace->original().exists && !o.force)
    return Status::InvalidArgument(out + ": file exists; use --force to replace it");
  KVFILE_RETURN_IF_ERROR(interrupted(Run(in, from, to, o, replace->temp_path(), r)));
  return replace->Commit();
}

}  // namespace kvfile
