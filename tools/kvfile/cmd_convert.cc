// SPDX-License-Identifier: Apache-2.0
// kvfile convert: the flags, the directory walk, progress and exit codes
// around kvfile::Convert (kvfile/convert.h), which does the conversion
// itself: .kv -> .kv, .safetensors <-> .kv, and the foreign formats.
//
// Which flag applies to which conversion is one table (kRules), checked in
// order at each step RunConvert takes as it finds out what IN and OUT are;
// Options() maps the flags to ConvertOptions. Convert refuses the same
// combinations of its options in its own words: the table comes first so
// that a refusal names the flags.
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

// kMooncake and kColi: a Mooncake record directory, a colibri session; only
// the step that looks for those (kLocal below) says so, KindOf does not.
enum class Kind { kKv, kSafetensors, kDirectory, kLlama, kMooncake, kColi, kOther };

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
  switch (k) {
    case Kind::kSafetensors: return Format::kSafetensors;
    case Kind::kLlama: return Format::kLlamaState;
    case Kind::kMooncake: return Format::kMooncake;
    case Kind::kColi: return Format::kColi;
    default: return Format::kKv;
  }
}

bool EndsWith(const std::string& s, const char* suffix) { return fs::path(s).extension() == suffix; }

// ---- Which flag applies to which conversion --------------------------------------------------

// How far RunConvert has looked at IN and OUT when the rules are checked
// (each rule names the steps that check it).
enum Step : unsigned {
  kFlags = 1,      // the flags alone, before IN is looked at
  kLocal = 2,      // a local IN: whether IN or OUT is a Mooncake directory or a .coli_kv session (--format for OUT)
  kDirectory = 4,  // IN is a directory (no Mooncake one), before it is walked
  kTree = 8,       // ... walked: what each file becomes (out) and whether any is a .kv file
  kExport = 16,    // IN is a file, OUT a llama.cpp file (--format llama-seq|llama-session)
  kFile = 32,      // IN is a file, OUT another
};

// The conversion as far as the step has found it out.
struct Plan {
  Step step = kFlags;
  std::string format;     // --format; for a .coli_kv OUT without one (kLocal on): coli-v2
  bool to_llama = false;  // --format llama-seq|llama-session
  Kind in = Kind::kOther, out = Kind::kOther;  // kLocal: by a Mooncake manifest, else by name; after: KindOf
  bool out_object = false;  // OUT is s3://
  bool same_file = false;   // kExport, kFile: IN and OUT are one file
  bool kv_inputs = false;   // kTree: a .kv file among the inputs
  bool no_inputs = false;   // kTree: nothing to convert
  bool Foreign() const {
    return in == Kind::kMooncake || in == Kind::kColi || out == Kind::kMooncake || out == Kind::kColi;
  }
};

// One refusal: at the steps `steps`, when the flags `given` are given (no
// `given`: whatever they are, a rule on IN and OUT) and the conversion is
// not one they apply to, `text` (or `words`, naming a path or a value).
struct Rule {
  unsigned steps;
  bool (*given)(const ConvertArgs&);
  bool (*applies)(const Plan&);
  const char* text;
  std::string (*words)(const ConvertArgs&, const Plan&) = nullptr;
};

bool Quantized(const ConvertArgs& a) { return a.dtype && IsQuantized(ParseDtype(*a.dtype)); }
bool ToKv(const Plan& p) { return p.out == Kind::kKv; }

constexpr const char* kCodesWords = "--codes applies to .safetensors input or output";
constexpr const char* kVocabWords = "--vocab applies to --format coli-v2 or coli-v1";

// In the order they are checked: of two flags out of place, the first row's
// is named.
const Rule kRules[] = {
    // -- The flags alone.
    {kFlags, [](auto& a) { return a.dtype && (*a.dtype == "q8_0" || a.dtype->find('=') != std::string::npos); },
     [](auto& p) { return p.to_llama; }, nullptr,
     [](auto& a, auto&) { return "--dtype " + *a.dtype + " applies to --format llama-seq|llama-session"; }},
    {kFlags, [](auto& a) { return a.v_trans || a.arch || a.n_stream; }, [](auto& p) { return p.to_llama; },
     "--v-trans, --arch and --n-stream apply to --format llama-seq|llama-session"},
    {kFlags, [](auto& a) { return a.unrotate; }, [](auto& p) { return !p.to_llama; },
     "--unrotate applies to a llama.cpp state IN (an export rotates or un-rotates rows as the context's cache type "
     "needs, see --rotated)"},
    {kFlags, Quantized, [](auto& p) { return p.format != "v1"; },
     "--format v1 stores raw rows: --dtype must be bf16, f16 or f32"},
    {kFlags, [](auto& a) { return !a.keep_raw.empty(); }, [](auto& p) { return p.format != "v1"; },
     "--keep-raw applies to v2 output (v1 is all raw)"},
    // -- Mooncake directories and .coli_kv sessions, and their flags elsewhere.
    {kLocal,
     [](auto& a) { return a.dtype || !a.keep_raw.empty() || a.codes || a.chunk_tokens || a.salvage || a.jobs != 1; },
     [](auto& p) { return !p.Foreign(); },
     "--dtype, --keep-raw, --codes, --chunk-tokens, --salvage and --jobs do not apply to Mooncake or .coli_kv "
     "conversions"},
    {kLocal, [](auto& a) { return a.group_size.has_value(); }, [](auto& p) { return p.out == Kind::kMooncake; },
     "--group-size applies to --format mooncake"},
    // --vocab twice: named before --indexer-layers where no Mooncake or
    // colibri conversion is asked for, after it in one.
    {kLocal, [](auto& a) { return a.vocab.has_value(); }, [](auto& p) { return p.Foreign(); }, kVocabWords},
    {kLocal, [](auto& a) { return a.indexer_layers.has_value(); }, [](auto& p) { return p.in == Kind::kColi; },
     "--indexer-layers applies to a .coli_kv IN"},
    {kLocal, [](auto& a) { return a.vocab.has_value(); }, [](auto& p) { return p.out == Kind::kColi; }, kVocabWords},
    {kLocal, [](auto& a) { return EndsWith(a.out, ".coli_kv"); }, [](auto& p) { return p.Foreign(); }, nullptr,
     [](auto& a, auto& p) {
       return a.out + ": a .coli_kv OUT is written by --format coli-v2 or coli-v1, not --format " + p.format;
     }},
    {kLocal, nullptr, [](auto& p) { return (p.out != Kind::kMooncake && p.out != Kind::kColi) || p.in == Kind::kKv; },
     nullptr, [](auto& a, auto& p) { return a.in + ": --format " + p.format + " converts a .kv file"; }},
    {kLocal, nullptr, [](auto& p) { return (p.in != Kind::kMooncake && p.in != Kind::kColi) || ToKv(p); }, nullptr,
     [](auto& a, auto& p) {
       return a.out + ": a " + (p.in == Kind::kMooncake ? "Mooncake directory" : ".coli_kv file") +
              " is converted to a .kv file (OUT must end in .kv)";
     }},
    // -- A directory IN.
    {kDirectory, [](auto& a) { return a.format.starts_with("llama-"); },
     [](auto& p) { return p.in != Kind::kDirectory; }, nullptr,
     [](auto& a, auto&) { return a.in + ": --format " + a.format + " converts one .kv file, not a directory"; }},
    {kDirectory, nullptr, [](auto& p) { return !p.out_object; }, nullptr, [](auto& a, auto&) {
       return a.out + ": a directory is converted into a local directory; an object store takes one file per convert";
     }},
    {kTree, nullptr, [](auto& p) { return !p.no_inputs; }, nullptr, [](auto& a, auto& p) {
       return a.in + (ToKv(p) ? ": no .kv or .safetensors files in this directory"
                              : ": no .kv files in this directory to export");
     }},
    // -- A file IN.
    {kExport | kFile, [](auto& a) { return a.to.has_value(); }, [](auto& p) { return p.in == Kind::kDirectory; },
     "--to applies to a directory IN (a file's OUT suffix says the format)"},
    {kExport, nullptr, [](auto& p) { return p.in == Kind::kKv; }, nullptr,
     [](auto& a, auto&) { return a.in + ": --format " + a.format + " writes a llama.cpp file from a .kv IN"; }},
    {kExport, [](auto& a) { return !a.keep_raw.empty() || a.chunk_tokens || a.codes; },
     [](auto& p) { return p.out != Kind::kLlama; },
     "--keep-raw, --chunk-tokens and --codes apply to .kv or .safetensors output"},
    {kFile, nullptr, [](auto& p) { return p.out != Kind::kLlama; }, nullptr, [](auto& a, auto&) {
       return a.out + ": is a llama.cpp state file; OUT is a .kv or .safetensors file unless --format "
                      "llama-seq|llama-session";
     }},
    {kFile, nullptr, [](auto& p) { return p.in != Kind::kLlama || ToKv(p); }, nullptr,
     [](auto& a, auto&) { return a.out + ": a llama.cpp state file is imported into a .kv OUT"; }},
    {kFile, [](auto& a) { return a.codes; }, [](auto& p) { return p.in != Kind::kLlama; }, kCodesWords},
    {kFile, [](auto& a) { return a.head_size || a.model || a.unrotate; }, [](auto& p) { return p.in == Kind::kLlama; },
     "--head-size, --model and --unrotate apply to a llama.cpp state IN"},
    {kExport | kFile, [](auto& a) { return a.rotated.has_value(); },
     [](auto& p) { return p.in == Kind::kLlama || p.to_llama; },
     "--rotated applies to a llama.cpp state IN or --format llama-seq|llama-session"},
    {kFile, nullptr, [](auto& p) { return p.in != Kind::kOther; }, nullptr,
     [](auto& a, auto&) { return a.in + ": cannot tell the format: the name must end in .kv or .safetensors"; }},
    {kFile, nullptr, [](auto& p) { return p.out != Kind::kDirectory; }, nullptr,
     [](auto& a, auto&) { return a.out + ": is a directory (IN is a file)"; }},
    {kFile, nullptr, [](auto& p) { return p.out != Kind::kOther; }, nullptr, [](auto& a, auto&) {
       return a.out + ": cannot tell the format: the name must end in .kv, .safetensors or .coli_kv, or give --format "
                      "llama-seq|llama-session|mooncake|coli-v2";
     }},
    {kFile, nullptr, [](auto& p) { return p.in != Kind::kSafetensors || p.out != Kind::kSafetensors; },
     "convert reads or writes a .kv file; both IN and OUT are .safetensors"},
    {kExport | kFile, nullptr, [](auto& p) { return !p.same_file; }, nullptr,
     [](auto& a, auto&) { return a.out + ": IN and OUT are the same file"; }},
    {kFile, [](auto& a) { return a.codes; }, [](auto& p) { return p.in != Kind::kKv || !ToKv(p); }, kCodesWords},
    // -- What a file or a tree becomes.
    {kFile | kTree, [](auto& a) { return !a.keep_raw.empty(); }, ToKv, "--keep-raw applies to .kv output"},
    {kFile | kTree, [](auto& a) { return a.chunk_tokens.has_value(); }, ToKv, "--chunk-tokens applies to .kv output"},
    {kFile | kTree, [](auto& a) { return a.codes && a.dtype; }, ToKv,
     "--codes exports fp8 streams as stored and raw streams as stored; drop --dtype"},
    {kFile | kTree, Quantized, ToKv, nullptr, [](auto& a, auto&) {
       return "--dtype " + *a.dtype + ": export decodes to bf16, f16 or f32; use --codes for codes";
     }},
    {kTree, [](auto& a) { return a.codes; }, [](auto& p) { return !ToKv(p) || !p.kv_inputs; },
     "--codes applies to .safetensors input or output, not to .kv -> .kv"},
};

// The usage error (exit 2) of the first rule of p.step that the flags
// break; 0 when none does.
int Refuse(const ConvertArgs& a, const Plan& p) {
  for (const Rule& r : kRules)
    if ((r.steps & p.step) && (!r.given || r.given(a)) && !r.applies(p))
      return UsageError(r.words ? r.words(a, p) : r.text);
  return 0;
}

// What the flags ask of kvfile::Convert for the conversion `p`. A format's
// options go only to a conversion that reads or writes that format: the
// rules have refused what is given for another, and the few flags that no
// rule refuses and that the conversion does not read were never passed on
// (--head-size and --model on an export; the llama.cpp flags on a Mooncake
// or colibri conversion, and --format v1 on an import of one, which writes
// format 2).
ConvertOptions Options(const ConvertArgs& a, const Plan& p) {
  ConvertOptions o;
  o.kv_major = a.format == "v1" && !p.Foreign() ? 1 : 2;
  if (a.dtype && p.out != Kind::kLlama) o.dtype = ParseDtype(*a.dtype);
  o.keep_raw.insert(a.keep_raw.begin(), a.keep_raw.end());
  o.codes = a.codes;
  o.chunk_tokens = a.chunk_tokens;
  o.salvage = a.salvage;
  o.force = a.force;
  if (p.in == Kind::kLlama) {
    o.llama.head_size = a.head_size;
    o.llama.model = a.model;
    o.llama.unrotate = a.unrotate;
  }
  if (a.rotated && (p.in == Kind::kLlama || p.out == Kind::kLlama)) o.llama.rotated = *a.rotated == "yes";
  if (p.out == Kind::kLlama) {
    o.llama.session = a.format == "llama-session";
    o.llama.type = a.dtype;
    o.llama.v_trans = a.v_trans;
    o.llama.arch = a.arch;
    o.llama.n_stream = a.n_stream;
  }
  if (p.out == Kind::kMooncake) o.mooncake.group_size = a.group_size;
  if (p.out == Kind::kColi) {
    o.coli.vocab = a.vocab;
    o.coli.v1 = p.format == "coli-v1";
  }
  if (p.in == Kind::kColi) o.coli.indexer_layers = a.indexer_layers;
  return o;
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

int ConvertTree(const ConvertArgs& a, Plan p) {
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
  p.out = Kind::kKv;
  if (a.to) p.out = *a.to == "safetensors" ? Kind::kSafetensors : Kind::kKv;
  else if (out_root.extension() == ".safetensors") p.out = Kind::kSafetensors;
  std::vector<std::string> files = kv_files;
  if (p.out == Kind::kKv) files.insert(files.end(), st_files.begin(), st_files.end());
  p.step = kTree;
  p.kv_inputs = !kv_files.empty();
  p.no_inputs = files.empty();
  if (int code = Refuse(a, p)) return code;
  NaturalSort(&files);
  const std::string out_ext = p.out == Kind::kKv ? ".kv" : ".safetensors";
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
          // Each file by what it holds: a llama.cpp state named *.kv takes
          // the llama.cpp import flags, the others do not.
          Plan file = p;
          file.in = KindOf(files[i]);
          outcomes[i] = ConvertOne(files[i], outs[i], FormatOf(p.out), Options(a, file));
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

// ---- The command ------------------------------------------------------------------------------

int RunConvert(const ConvertArgs& a) {
  InstallSignalHandlers();
  SetCurrentPath(a.out);
  if (Status st = RefusePackMemberTarget(a.out); !st.ok()) return ReportError(st);
  Plan p;
  p.format = a.format;
  p.to_llama = a.format.starts_with("llama-");
  p.out_object = a.out.starts_with("s3://");
  if (p.to_llama && a.dtype)
    if (Status st = llama::CheckExportType(*a.dtype); !st.ok()) return ReportError(st);
  if (int code = Refuse(a, p)) return code;
  std::error_code ec;
  // PACK:MEMBER: a .kv IN, materialised (and checked) first (pack_member.h).
  PackMemberInputs members;
  std::string in = a.in, pack_path, member;
  const bool from_pack = SplitPackMember(a.in, &pack_path, &member);
  if (from_pack) {
    Status st = members.Resolve(a.in, &in);
    if (!st.ok()) return ReportError(st);
  }
  auto convert_one = [&] {
    Outcome done = ConvertOne(in, a.out, FormatOf(p.out), Options(a, p));
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
  if (local_in) {
    // Mooncake record directories and colibri .coli_kv sessions: IN by its
    // manifest or name, OUT by --format (a .coli_kv OUT says coli-v2 unless
    // --format names another); the other kinds by name only, as yet.
    if (a.format == "v2" && EndsWith(a.out, ".coli_kv")) p.format = "coli-v2";
    const bool in_dir = fs::is_directory(a.in, ec);
    Format detected = Format::kKv;
    const bool known = DetectFormat(a.in, false, nullptr, &detected).ok();
    p.in = in_dir && known && detected == Format::kMooncake ? Kind::kMooncake
           : !in_dir && EndsWith(a.in, ".coli_kv")          ? Kind::kColi
           : in_dir                                         ? Kind::kDirectory
           : EndsWith(a.in, ".kv")                          ? Kind::kKv
                                                            : Kind::kOther;
    p.out = p.format == "mooncake"                        ? Kind::kMooncake
            : p.format == "coli-v2" || p.format == "coli-v1" ? Kind::kColi
            : EndsWith(a.out, ".kv")                         ? Kind::kKv
                                                             : Kind::kOther;
    p.step = kLocal;
    if (int code = Refuse(a, p)) return code;
    if (p.Foreign()) {
      std::vector<uint32_t> layers;  // --indexer-layers' syntax, before IN is read
      if (a.indexer_layers)
        if (Status st = ParseLayerList(*a.indexer_layers, &layers); !st.ok())
          return UsageError("--indexer-layers: " + st.message());
      return convert_one();
    }
  }
  p.in = from_pack ? Kind::kKv : KindOf(a.in);
  if (p.in == Kind::kDirectory) {
    p.step = kDirectory;
    if (int code = Refuse(a, p)) return code;
    return ConvertTree(a, p);
  }
  p.step = p.to_llama ? kExport : kFile;
  p.out = p.to_llama ? Kind::kLlama : KindOf(a.out, false);
  p.same_file = fs::exists(a.out, ec) && fs::equivalent(in, a.out, ec);
  if (int code = Refuse(a, p)) return code;
  return convert_one();
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
