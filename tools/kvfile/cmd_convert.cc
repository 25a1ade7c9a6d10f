// SPDX-License-Identifier: Apache-2.0
// kvfile convert: the flags, the directory walk, progress and exit codes
// around kvfile::Convert (kvfile/convert.h), which does the conversion
// itself: .kv -> .kv, .safetensors <-> .kv, and the foreign formats.
//
// OUT is either its old self (or absent) or the whole conversion (the
// library writes it under a temporary name and renames it into place). IN
// is opened read-only. An existing OUT is replaced only with --force.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>

#include "cli_common.h"
#include "kvfile/convert.h"
#include "kvfile/formats/llama.h"
#include "kvfile/file.h"
#include "kvfile/parallel.h"
#include "natural_sort.h"
#include "pack_member.h"
#include "progress.h"
#include "signals.h"

namespace kvfile::cli {

namespace {

namespace fs = std::filesystem;

struct ConvertArgs {
  std::string in;
  std::string out;
  std::optional<std::string> dtype;
  std::vector<std::string> keep_raw;
  bool codes = false;
  std::optional<uint32_t> chunk_tokens;
  bool force = false;
  bool salvage = false;
  unsigned jobs = 1;
  std::string format = "v2";
  std::optional<std::string> to;  // directories: "kv" or "safetensors"
  std::optional<uint32_t> group_size;  // --format mooncake (the Mooncake and colibri drivers)
  std::optional<uint32_t> vocab;       // --format coli-v2|coli-v1 (the Mooncake and colibri drivers)
  std::optional<std::string> indexer_layers;  // a .coli_kv IN (the Mooncake and colibri drivers)
  std::optional<uint32_t> head_size;  // llama.cpp import
  std::optional<std::string> model;   // llama.cpp import
  std::optional<uint32_t> v_trans;    // llama.cpp export
  std::optional<std::string> arch;    // llama.cpp session export
  std::optional<std::string> rotated;  // llama.cpp import and export: yes|no
  bool unrotate = false;               // llama.cpp import
  std::optional<uint32_t> n_stream;    // llama.cpp export
};

enum class Kind { kKv, kSafetensors, kDirectory, kLlama, kOther };

// What a path holds, as kvfile::DetectFormat says (an input by its content
// first, then its name: a llama.cpp state file named slot.kv is one; an
// output by its name).
Kind KindOf(const std::string& path, bool input = true) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return Kind::kDirectory;
  Format f;
  if (!DetectFormat(path, !input, nullptr, &f).ok()) return Kind::kOther;
  switch (f) {
    case Format::kKv: return Kind::kKv;
    case Format::kSafetensors: return Kind::kSafetensors;
    case Format::kLlamaState: return Kind::kLlama;
    default: return Kind::kOther;
  }
}

Dtype ParseDtype(const std::string& s) {
  Dtype d{};  // --dtype's validator admits only dtype names here; else 0, which Geometry refuses
  (void)kvfile::ParseDtype(s, &d);
  return d;
}

// The format Convert writes for an output of kind `k` (a .kv unless it says otherwise).
Format FormatOf(Kind k) {
  return k == Kind::kSafetensors ? Format::kSafetensors : k == Kind::kLlama ? Format::kLlamaState : Format::kKv;
}

// ---- One conversion ------------------------------------------------------------------------

struct Outcome {
  Status status;
  std::string line{};   // stdout line on success
  std::string warning{};  // stderr line on success (--salvage), or ""
  std::vector<std::string> notes{};  // stderr lines on success (kvfile: note: ...)
};

Status ExistsError(const std::string& out) {
  return Status::InvalidArgument(out + ": file exists; use --force to replace it");
}

// IN -> OUT through kvfile::Convert, with a progress bar on stderr and the
// signal handlers' stop request polled between batches.
Outcome ConvertOne(const std::string& in, const std::string& out, Format to, const ConvertOptions& options) {
  ConvertOptions o = options;
  ProgressReports bars;
  o.progress = bars.Callback();
  o.interrupted = [] { return PendingSignal() != 0; };
  o.to = to;
  ConvertReport report;
  Status st = Convert(in, out, o, &report);
  bars.Finish();
  if (!st.ok() && PendingSignal()) st = CheckInterrupt(out);  // a signal ended it: OUT is as it was
  if (!st.ok()) return {st, ""};
  std::string warning;
  for (const std::string& w : report.warnings) warning += (warning.empty() ? "" : "; ") + w;
  return {st, in + " -> " + out + ": " + report.summary, warning, report.notes};
}

int Report(const std::vector<Outcome>& outcomes) {
  int code = kExitOk;
  for (const Outcome& o : outcomes) {
    if (o.status.ok()) {
      std::printf("%s\n", o.line.c_str());
      std::fflush(stdout);
      for (const std::string& n : o.notes) PrintLine("note", n);
      if (!o.warning.empty()) PrintLine("warning", o.warning);
      continue;
    }
    int c = ReportError(o.status);
    if (c == kExitUsage || code == kExitOk) code = c;
  }
  return code;
}

// ---- Directories ----------------------------------------------------------------------------

int ConvertTree(const ConvertArgs& a, const ConvertOptions& options) {
  std::error_code ec;
  fs::path in_root = fs::path(a.in);
  fs::path out_root = fs::path(a.out);
  if (fs::exists(out_root, ec) && !fs::is_directory(out_root, ec))
    return UsageError(a.out + ": IN is a directory, so OUT must be one too");
  auto dir_prefix = [&ec](const fs::path& dir) {
    std::string s = fs::weakly_canonical(dir, ec).lexically_normal().string();
    if (s.empty() || s.back() != '/') s += '/';
    return s;
  };
  if (dir_prefix(out_root).starts_with(dir_prefix(in_root)))
    return UsageError(a.out + ": OUT must not be IN or inside it");
  // What each file becomes: --to, else OUT's suffix (.safetensors), else
  // .kv (a tree of only .safetensors files is imported).
  std::vector<std::string> kv_files, st_files;
  std::vector<WalkEntry> walked;
  Status walk = WalkDirectory(a.in, {".kv", ".safetensors"}, &walked);
  if (!walk.ok()) return ReportError(walk);
  for (WalkEntry& w : walked) {
    // An unreadable subdirectory is refused as an unreadable file is.
    if (!w.error.ok()) return ReportError(w.error);
    (w.path.ends_with(".kv") ? kv_files : st_files).push_back(std::move(w.path));
  }
  Kind to = Kind::kKv;
  if (a.to) to = *a.to == "safetensors" ? Kind::kSafetensors : Kind::kKv;
  else if (out_root.extension() == ".safetensors") to = Kind::kSafetensors;
  std::vector<std::string> files = kv_files;
  if (to == Kind::kKv) files.insert(files.end(), st_files.begin(), st_files.end());
  if (files.empty())
    return UsageError(a.in + (to == Kind::kKv ? ": no .kv or .safetensors files in this directory"
                                              : ": no .kv files in this directory to export"));
  if (to == Kind::kSafetensors) {
    if (!a.keep_raw.empty()) return UsageError("--keep-raw applies to .kv output");
    if (a.chunk_tokens) return UsageError("--chunk-tokens applies to .kv output");
    if (a.codes && a.dtype)
      return UsageError("--codes exports fp8 streams as stored and raw streams as stored; drop --dtype");
    if (options.dtype && IsQuantized(*options.dtype))
      return UsageError("--dtype " + *a.dtype + ": export decodes to bf16, f16 or f32; use --codes for codes");
  } else if (a.codes && !kv_files.empty()) {
    return UsageError("--codes applies to .safetensors input or output, not to .kv -> .kv");
  }
  NaturalSort(&files);
  const std::string out_ext = to == Kind::kKv ? ".kv" : ".safetensors";
  std::vector<std::string> outs;
  std::set<std::string> seen;
  for (const std::string& f : files) {
    fs::path rel = fs::path(f).lexically_relative(in_root);
    rel.replace_extension(out_ext);
    outs.push_back((out_root / rel).string());
    if (!seen.insert(outs.back()).second)
      return UsageError(outs.back() + ": two inputs would be converted to this file");
  }
  // Refuse before writing anything if an output exists.
  if (!a.force)
    for (const std::string& o : outs)
      if (fs::exists(o, ec)) return ReportError(ExistsError(o));
  // Create the tree, and make the new directory entries durable.
  std::set<std::string> dirs;
  for (const std::string& o : outs) dirs.insert(fs::path(o).parent_path().string());
  dirs.insert(out_root.string());
  for (const std::string& d : dirs) {
    std::vector<fs::path> created;
    for (fs::path q = d; !q.empty() && !fs::exists(q, ec); q = q.parent_path()) created.push_back(q);
    fs::create_directories(d, ec);
    if (ec) return ReportError(Status::IOError(d + ": " + ec.message()));
    for (const fs::path& c : created) {
      std::string parent = c.has_parent_path() ? c.parent_path().string() : ".";
      Status st = FileSystem::Default()->SyncDir(parent);
      if (!st.ok()) return ReportError(st);
    }
  }
  std::vector<Outcome> outcomes(files.size());
  // After a signal no further file is started; the ones in flight stop at
  // their next batch, and the signal is reported once, after the others.
  unsigned jobs = std::max(1u, std::min<unsigned>(a.jobs, static_cast<unsigned>(files.size())));
  ParallelFor(
      0, files.size(), jobs,
      [&](unsigned, size_t i) {
        try {
          outcomes[i] = ConvertOne(files[i], outs[i], FormatOf(to), options);
        } catch (const std::bad_alloc&) {
          outcomes[i] = {Status::Failed(files[i] + ": out of memory"), "", ""};
        }
        if (PendingSignal() && !outcomes[i].status.ok()) outcomes[i] = {};  // reported below, once
      },
      [] { return PendingSignal(); });
  std::vector<Outcome> done;
  for (const Outcome& o : outcomes)
    if (!o.status.ok() || !o.line.empty()) done.push_back(o);
  int code = Report(done);
  size_t ok = std::count_if(done.begin(), done.end(), [](const Outcome& o) { return o.status.ok(); });
  std::printf("converted %zu of %zu files from %s to %s\n", ok, files.size(), a.in.c_str(), a.out.c_str());
  if (PendingSignal()) {
    std::fflush(stdout);
    return ReportError(CheckInterrupt(a.out));
  }
  return code;
}

// ---- Mooncake record directories and colibri sessions (the library's drivers) ---------------

struct SeedConvertArgs {
  std::string in;
  std::string out;
  std::string format;                  // --format (v2 when not given)
  std::optional<uint32_t> group_size;  // --group-size
  std::optional<uint32_t> vocab;       // --vocab
  bool force = false;
  bool other_flags = false;  // --dtype, --keep-raw, --codes, --chunk-tokens, --salvage or --jobs given
  std::optional<std::string> indexer_layers;  // --indexer-layers (a .coli_kv IN)
};

bool EndsWith(const std::string& s, const char* suffix) { return fs::path(s).extension() == suffix; }

// One conversion by kvfile::Convert; prints its line and notes.
int ConvertByLibrary(const SeedConvertArgs& a, Format to) {
  ConvertOptions o;
  o.force = a.force;
  o.mooncake.group_size = a.group_size;
  o.coli.vocab = a.vocab;
  o.coli.v1 = a.format == "coli-v1";
  o.coli.indexer_layers = a.indexer_layers;
  return Report({ConvertOne(a.in, a.out, to, o)});
}

// True when IN or OUT is a Mooncake directory or a .coli_kv file (or the
// flags ask for one); the conversion is then done and *exit_code set.
bool ConvertSeedFormat(const SeedConvertArgs& given, int* exit_code) {
  // A .coli_kv OUT says the format itself, unless --format names another.
  SeedConvertArgs a = given;
  if (a.format == "v2" && EndsWith(a.out, ".coli_kv")) a.format = "coli-v2";
  std::error_code ec;
  bool in_dir = fs::is_directory(a.in, ec);
  bool mooncake_out = a.format == "mooncake";
  bool coli_out = a.format == "coli-v2" || a.format == "coli-v1";
  Format detected = Format::kKv;
  bool known = DetectFormat(a.in, false, nullptr, &detected).ok();
  bool mooncake_in = in_dir && known && detected == Format::kMooncake;
  bool coli_in = !in_dir && EndsWith(a.in, ".coli_kv");
  if (!mooncake_out && !coli_out && !mooncake_in && !coli_in) {
    if (a.group_size) *exit_code = UsageError("--group-size applies to --format mooncake");
    else if (a.vocab) *exit_code = UsageError("--vocab applies to --format coli-v2 or coli-v1");
    else if (a.indexer_layers) *exit_code = UsageError("--indexer-layers applies to a .coli_kv IN");
    else if (EndsWith(a.out, ".coli_kv"))
      *exit_code =
          UsageError(a.out + ": a .coli_kv OUT is written by --format coli-v2 or coli-v1, not --format " + a.format);
    else return false;
    return true;
  }
  SetCurrentPath(a.out);
  if (a.other_flags) {
    *exit_code = UsageError("--dtype, --keep-raw, --codes, --chunk-tokens, --salvage and --jobs do not apply to "
                            "Mooncake or .coli_kv conversions");
    return true;
  }
  if (a.group_size && !mooncake_out) {
    *exit_code = UsageError("--group-size applies to --format mooncake");
    return true;
  }
  if (a.indexer_layers && !coli_in) {
    *exit_code = UsageError("--indexer-layers applies to a .coli_kv IN");
    return true;
  }
  if (a.vocab && !coli_out) {
    *exit_code = UsageError("--vocab applies to --format coli-v2 or coli-v1");
    return true;
  }
  if ((mooncake_out || coli_out) && (mooncake_in || coli_in || in_dir || !EndsWith(a.in, ".kv"))) {
    *exit_code = UsageError(a.in + ": --format " + a.format + " converts a .kv file");
    return true;
  }
  if ((mooncake_in || coli_in) && !EndsWith(a.out, ".kv")) {
    *exit_code = UsageError(a.out + ": a " + std::string(mooncake_in ? "Mooncake directory" : ".coli_kv file") +
                            " is converted to a .kv file (OUT must end in .kv)");
    return true;
  }
  if (a.indexer_layers) {
    std::vector<uint32_t> layers;
    if (Status st = ParseLayerList(*a.indexer_layers, &layers); !st.ok()) {
      *exit_code = UsageError("--indexer-layers: " + st.message());
      return true;
    }
  }
  *exit_code = ConvertByLibrary(a, mooncake_out ? Format::kMooncake : coli_out ? Format::kColi : Format::kKv);
  return true;
}

int RunConvert(const ConvertArgs& a) {
  InstallSignalHandlers();
  SetCurrentPath(a.out);
  if (Status st = RefusePackMemberTarget(a.out); !st.ok()) return ReportError(st);
  ConvertOptions o;  // what the flags ask for
  o.kv_major = a.format == "v1" ? 1 : 2;
  bool to_llama = a.format.starts_with("llama-");
  if (a.dtype && (*a.dtype == "q8_0" || a.dtype->find('=') != std::string::npos) && !to_llama)
    return UsageError("--dtype " + *a.dtype + " applies to --format llama-seq|llama-session");
  if (to_llama && a.dtype) {
    if (Status st = llama::CheckExportType(*a.dtype); !st.ok()) return ReportError(st);
  } else if (a.dtype) {
    o.dtype = ParseDtype(*a.dtype);
  }
  o.llama.head_size = a.head_size;
  o.llama.model = a.model;
  if (a.rotated) o.llama.rotated = *a.rotated == "yes";
  o.llama.unrotate = a.unrotate;
  o.llama.session = a.format == "llama-session";
  o.llama.type = a.dtype;
  o.llama.v_trans = a.v_trans;
  o.llama.arch = a.arch;
  o.llama.n_stream = a.n_stream;
  if (!to_llama && (a.v_trans || a.arch || a.n_stream))
    return UsageError("--v-trans, --arch and --n-stream apply to --format llama-seq|llama-session");
  if (to_llama && a.unrotate)
    return UsageError("--unrotate applies to a llama.cpp state IN (an export rotates or un-rotates rows as the "
                      "context's cache type needs, see --rotated)");
  if (o.kv_major == 1 && o.dtype && IsQuantized(*o.dtype))
    return UsageError("--format v1 stores raw rows: --dtype must be bf16, f16 or f32");
  if (o.kv_major == 1 && !a.keep_raw.empty()) return UsageError("--keep-raw applies to v2 output (v1 is all raw)");
  o.keep_raw.insert(a.keep_raw.begin(), a.keep_raw.end());
  o.codes = a.codes;
  o.chunk_tokens = a.chunk_tokens;
  o.salvage = a.salvage;
  o.force = a.force;
  std::error_code ec;
  // PACK:MEMBER: a .kv IN, materialised (and checked) first (pack_member.h).
  PackMemberInputs members;
  std::string in = a.in, pack_path, member;
  const bool from_pack = SplitPackMember(a.in, &pack_path, &member);
  if (from_pack) {
    Status st = members.Resolve(a.in, &in);
    if (!st.ok()) return ReportError(st);
  }
  auto convert_one = [&](Kind out_kind) {
    Outcome done = ConvertOne(in, a.out, FormatOf(out_kind), o);
    done.status = members.Name(done.status);
    done.line = members.Name(done.line);
    done.warning = members.Name(done.warning);
    return Report({done});
  };
  // An s3:// IN is an object (the store says whether it exists when it is read).
  const bool local_in = !from_pack && !a.in.starts_with("s3://");
  if (local_in && !fs::exists(a.in, ec)) return ReportError(Status::NotFound(a.in + ": No such file or directory"));
  if (local_in && !fs::is_directory(a.in, ec) && !fs::is_regular_file(a.in, ec)) {
    // A FIFO, device or socket: the file layer's one refusal ("not a
    // regular file (a FIFO)"), before its name decides anything.
    std::unique_ptr<File> f;
    Status st = FileSystem::Default()->Open(a.in, OpenMode::kRead, &f);
    if (!st.ok()) return ReportError(st);
  }
  // Mooncake record directories and colibri .coli_kv sessions (ConvertSeedFormat above).
  {
    SeedConvertArgs sa{a.in, a.out, a.format, a.group_size, a.vocab, a.force,
                       a.dtype || !a.keep_raw.empty() || a.codes || a.chunk_tokens || a.salvage || a.jobs != 1,
                       a.indexer_layers};
    int code = 0;
    if (local_in && ConvertSeedFormat(sa, &code)) return code;
  }
  Kind in_kind = from_pack ? Kind::kKv : KindOf(a.in);
  if (in_kind == Kind::kDirectory) {
    if (to_llama) return UsageError(a.in + ": --format " + a.format + " converts one .kv file, not a directory");
    if (a.out.starts_with("s3://"))
      return UsageError(a.out + ": a directory is converted into a local directory; an object store takes one file per convert");
    return ConvertTree(a, o);
  }
  if (a.to) return UsageError("--to applies to a directory IN (a file's OUT suffix says the format)");
  Kind out_kind = to_llama ? Kind::kLlama : KindOf(a.out, false);
  if (to_llama) {
    if (in_kind != Kind::kKv)
      return UsageError(a.in + ": --format " + a.format + " writes a llama.cpp file from a .kv IN");
    if (!a.keep_raw.empty() || a.chunk_tokens || a.codes)
      return UsageError("--keep-raw, --chunk-tokens and --codes apply to .kv or .safetensors output");
    if (fs::exists(a.out, ec) && fs::equivalent(in, a.out, ec))
      return UsageError(a.out + ": IN and OUT are the same file");
    return convert_one(out_kind);
  }
  if (out_kind == Kind::kLlama)
    return UsageError(a.out + ": is a llama.cpp state file; OUT is a .kv or .safetensors file unless --format "
                      "llama-seq|llama-session");
  if (in_kind == Kind::kLlama) {
    if (out_kind != Kind::kKv) return UsageError(a.out + ": a llama.cpp state file is imported into a .kv OUT");
    if (a.codes) return UsageError("--codes applies to .safetensors input or output");
  } else if (a.head_size || a.model || a.unrotate) {
    return UsageError("--head-size, --model and --unrotate apply to a llama.cpp state IN");
  } else if (a.rotated) {
    return UsageError("--rotated applies to a llama.cpp state IN or --format llama-seq|llama-session");
  }
  auto kind_error = [](const std::string& path) {
    return UsageError(path + ": cannot tell the format: the name must end in .kv or .safetensors");
  };
  if (in_kind == Kind::kOther) return kind_error(a.in);
  if (out_kind == Kind::kDirectory) return UsageError(a.out + ": is a directory (IN is a file)");
  if (out_kind == Kind::kOther)
    return UsageError(a.out + ": cannot tell the format: the name must end in .kv, .safetensors or .coli_kv, or "
                      "give --format llama-seq|llama-session|mooncake|coli-v2");
  if (in_kind == Kind::kSafetensors && out_kind == Kind::kSafetensors)
    return UsageError("convert reads or writes a .kv file; both IN and OUT are .safetensors");
  if (fs::exists(a.out, ec) && fs::equivalent(in, a.out, ec))
    return UsageError(a.out + ": IN and OUT are the same file");
  if (in_kind == Kind::kKv && out_kind == Kind::kKv && a.codes)
    return UsageError("--codes applies to .safetensors input or output");
  if (out_kind == Kind::kSafetensors) {
    if (!a.keep_raw.empty()) return UsageError("--keep-raw applies to .kv output");
    if (a.chunk_tokens) return UsageError("--chunk-tokens applies to .kv output");
    if (a.codes && a.dtype)
      return UsageError("--codes exports fp8 streams as stored and raw streams as stored; drop --dtype");
    if (o.dtype && IsQuantized(*o.dtype))
      return UsageError("--dtype " + *a.dtype + ": export decodes to bf16, f16 or f32; use --codes for codes");
  }
  return convert_one(out_kind);
}

}  // namespace

void RegisterConvert(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ConvertArgs>();
  CLI::App* cmd = app.add_subcommand(
      "convert",
      "Convert between .kv files (re-encode, re-chunk, compact) and to or from .safetensors.\n"
      "  .kv -> .kv: fp8/nvfp4 streams re-encoded to an fp8 or nvfp4 --dtype (raw streams stay raw), or every stream\n"
      "      converted to a raw --dtype; --keep-raw streams stored raw; re-chunked with --chunk-tokens.\n"
      "  .safetensors -> .kv: one tensor per stream [layers, tokens, rows, width] (BF16/F16/F32),\n"
      "      quantized to --dtype (default e4m3), or <stream>.codes + <stream>.scales imported exactly;\n"
      "      a 'tokens' tensor (I32/I64/U32); __metadata__ kvfile.model, kvfile.fingerprint.\n"
      "      With --codes, value tensors are raw streams kept as stored.\n"
      "  .kv -> .safetensors: streams decoded to --dtype (bf16 default), or with --codes fp8 streams as\n"
      "      <stream>.codes + <stream>.scales and raw streams as stored; token ids as I64.\n"
      "  directory -> directory: every *.kv (and *.safetensors) under IN into the same tree under OUT\n"
      "      (--jobs at a time): to .safetensors with --to safetensors or an OUT named *.safetensors, else\n"
      "      to .kv (each .safetensors imported, each .kv re-encoded).\n"
      "A .kv IN that kvfile verify fails on is refused (exit 1, nothing written) unless --salvage.\n"
      "OUT is written under a temporary name and renamed into place when complete; an existing OUT\n"
      "is replaced only with --force. --format v1 writes the older raw layout (fp8 streams decoded to bf16\n"
      "or to a raw --dtype); a v1 input converted to v2 is quantized (e4m3 unless --dtype).\n"
      "  llama.cpp state file ('ggsq' sequence state, 'ggsn' session; found by its magic) -> .kv: streams\n"
      "      k and v ([KV heads] x --head-size), e4m3 unless --dtype/--keep-raw; provenance in the model id.\n"
      "  .kv (streams k, v) -> llama.cpp file: --format llama-seq|llama-session, --dtype f16, bf16, f32,\n"
      "      q8_0 or k=TYPE,v=TYPE (default: as imported, else f16), --v-trans, --arch, --n-stream,\n"
      "      --rotated (docs/llama.md).\n"
      "Example: kvfile convert session.kv session-e5m2.kv --dtype e5m2 --chunk-tokens 512\n"
      "         kvfile convert session.kv session.safetensors --codes");
  cmd->add_option("IN", args->in, "input: .kv, .safetensors, PACK:MEMBER (a member of a .kvpack), or a directory of .kv files")->required();
  cmd->add_option("OUT", args->out, "output: .kv, .safetensors, or a directory")->required();
  cmd->add_option("--dtype", args->dtype,
                  "target dtype: e4m3, e5m2, nvfp4, bf16, f16 or f32; for --format llama-seq|llama-session\n"
                  "also q8_0, or k=TYPE,v=TYPE (a type for each stream)")
      ->check(CLI::Validator(
          [](std::string& v) {
            // k=TYPE,v=TYPE is checked with the other llama.cpp export flags (llama::CheckExportType).
            for (const char* d : {"e4m3", "e5m2", "nvfp4", "bf16", "f16", "f32", "q8_0"})
              if (v == d) return std::string();
            if (v.find('=') != std::string::npos) return std::string();
            return v + " not in {e4m3,e5m2,nvfp4,bf16,f16,f32,q8_0,k=TYPE,v=TYPE}";
          },
          "{e4m3,e5m2,nvfp4,bf16,f16,f32,q8_0,k=TYPE,v=TYPE}", "dtype"));
  cmd->add_option("--keep-raw", args->keep_raw, "streams stored raw (bf16, or a raw --dtype); comma separated")
      ->delimiter(',');
  cmd->add_flag("--codes", args->codes, "export fp8 codes and scales; on import, keep value tensors as stored");
  cmd->add_option("--chunk-tokens", args->chunk_tokens,
                  "tokens per chunk of a .kv OUT (default: IN's, or 256; halved while a chunk exceeds "
                  "max(64 MiB, IN's size))")
      ->check(Count(1, 65536));
  cmd->add_flag("--force", args->force, "replace an existing OUT");
  cmd->add_flag("--salvage", args->salvage,
                "convert a .kv IN that kvfile verify fails on: only the tokens before the first damage\n"
                "(stderr says how many committed tokens are dropped); without it such an IN is refused");
  cmd->add_option("--jobs", args->jobs, "files converted in parallel (directories)")
      ->check(Count(1, 256))
      ->capture_default_str();
  cmd->add_option("--to", args->to, "directories: convert every file to kv or safetensors (default: by OUT's suffix)")
      ->check(CLI::IsMember({"kv", "safetensors"}));
  cmd->add_option("--format", args->format,
                  "format of the output: v1 or v2 (.kv); mooncake (a directory of Mooncake FP8 codec records\n"
                  "plus manifest.json); coli-v2 (a colibri COLIKV2 .coli_kv session, the default for a .coli_kv\n"
                  "OUT: colibri resumes it only when started with KV8=1, which is off by default; without it\n"
                  "colibri discards the session and overwrites the file at its next save); coli-v1 (a COLIKV1\n"
                  "session, f32 rows, for a colibri without KV8=1 or one that reads only v1); llama-seq or\n"
                  "llama-session (a llama.cpp state file, docs/llama.md). A .coli_kv IN, a Mooncake directory IN\n"
                  "or a llama.cpp state IN is imported into a .kv OUT (docs/formats.md)")
      ->check(CLI::IsMember({"v1", "v2", "mooncake", "coli-v2", "coli-v1", "llama-seq", "llama-session"}))
      ->capture_default_str();
  cmd->add_option("--group-size", args->group_size,
                  "--format mooncake: elements per scale group (default: each stream's row width, lossless)")
      ->check(Count(1, 0xFFFFFFFFu));
  cmd->add_option("--vocab", args->vocab,
                  "--format coli-v2|coli-v1: the model's vocabulary size for the header (default: from a model id\n"
                  "'coli_kv:vocab=N' that an import of a .coli_kv file gives)")
      ->check(Count(1, 0x7FFFFFFFu));
  cmd->add_option("--indexer-layers", args->indexer_layers,
                  "a .coli_kv IN whose indexer is in some layers only (h[4] < h[0]): which ones, ascending\n"
                  "(e.g. 0..20 or 0,4,8; the .kv file records them, and an export writes them back)");
  cmd->add_option("--head-size", args->head_size,
                  "llama.cpp import: values per KV head (required: the file does not record it)")
      ->check(Count(1, 65536));
  cmd->add_option("--model", args->model,
                  "llama.cpp import: the model's GGUF file, whose metadata gives the head size");
  cmd->add_option("--rotated", args->rotated,
                  "llama.cpp import: whether llama.cpp stored the quantized cache Hadamard-rotated (yes, its\n"
                  "default for head sizes that are multiples of 64; no: LLAMA_ATTN_ROT_DISABLE=1). Export:\n"
                  "whether the restoring context rotates (default: as llama.cpp does for the cache type)")
      ->check(CLI::IsMember({"yes", "no"}));
  cmd->add_flag("--unrotate", args->unrotate,
                "llama.cpp import: store a rotated quantized cache's rows un-rotated (plain keys and values)");
  cmd->add_option("--n-stream", args->n_stream,
                  "llama.cpp export: cache streams in the file (llama-server -np N: N; default: as imported, "
                  "else 1)")
      ->check(Count(1, 1024));
  cmd->add_option("--v-trans", args->v_trans,
                  "llama.cpp export: 1 writes V transposed (a context without flash attention), 0 not "
                  "(default: as imported, else 0)")
      ->check(CLI::IsMember({0, 1}));
  cmd->add_option("--arch", args->arch, "llama.cpp session export: the model architecture (default: as imported)");
  cmd->callback([args, exit_code] { *exit_code = RunConvert(*args); });
}

}  // namespace kvfile::cli
