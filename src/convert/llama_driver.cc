// SPDX-License-Identifier: Apache-2.0
// The llama.cpp driver of kvfile::Convert (driver.h): state files ('ggsq'
// sequence state, 'ggsn' session; found by their magic) -> .kv and .kv
// (streams k and v) -> state files, and the pieces of kvfile/formats/llama.h.
// The file layout and the provenance kept in the .kv model id are in
// kvfile/formats/llama_state.h (llama_state.cc).
#include "kvfile/formats/llama.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include "convert/driver.h"
#include "kvfile/formats/safetensors.h"
#include "kvfile/writer.h"

namespace kvfile::llama {

namespace {

FileSystem* FileSystemOf(const ConvertOptions& o) { return o.fs ? o.fs : FileSystem::Default(); }

uint64_t FileSizeOf(const std::string& path) {
  std::error_code ec;
  uint64_t n = std::filesystem::file_size(path, ec);
  return ec ? 0 : n;
}

// The lossless raw dtype for values of a cache type (q8_0 values are an f16
// scale times an int8, exact in f32).
Dtype LosslessDtype(CacheType t) {
  switch (t) {
    case CacheType::kF16: return Dtype::kF16;
    case CacheType::kBF16: return Dtype::kBF16;
    default: return Dtype::kF32;
  }
}

// "4 layers", or "4 layers in 2 caches (2+2)".
std::string LayersText(uint32_t layers, const std::vector<uint32_t>& caches) {
  std::string t = std::to_string(layers) + " layers";
  if (caches.size() < 2) return t;
  t += " in " + std::to_string(caches.size()) + " caches (";
  for (size_t i = 0; i < caches.size(); ++i) t += (i ? "+" : "") + std::to_string(caches[i]);
  return t + ")";
}

}  // namespace

Status PlanImport(const std::string& in, const StateLayout& s, const ConvertOptions& o, Geometry* g,
                  ModelIdentity* id) {
  KVFILE_RETURN_IF_ERROR(convert::CheckKeepRaw(o, {"k", "v"}, in));
  const LlamaOptions& lo = o.llama;
  std::optional<uint32_t> given = lo.head_size;
  if (lo.model) {
    // The model's GGUF says it (llama_state.h, ReadModelHeads).
    std::unique_ptr<File> mf;
    KVFILE_RETURN_IF_ERROR(FileSystemOf(o)->Open(*lo.model, OpenMode::kRead, &mf));
    ModelHeads mh;
    KVFILE_RETURN_IF_ERROR(ReadModelHeads(*mf, *lo.model, &mh));
    if (mh.k_head != mh.v_head)
      return Status::Unsupported(*lo.model + ": K heads of " + std::to_string(mh.k_head) + " and V heads of " +
                                 std::to_string(mh.v_head) + " values: kvfile imports one head size");
    if (lo.head_size && *lo.head_size != mh.k_head)
      return Status::InvalidArgument(in + ": --head-size " + std::to_string(*lo.head_size) + " contradicts --model " +
                                     *lo.model + " (" + mh.arch + ", heads of " + std::to_string(mh.k_head) + ")");
    given = mh.k_head;
  }
  if (!given)
    return Status::InvalidArgument(in + ": a llama.cpp state file does not record the head size of its " +
                                   std::to_string(s.k_width) + " K and " + std::to_string(s.v_width) +
                                   " V values per token: give --model MODEL.gguf, or --head-size (the model's "
                                   "values per KV head, its GGUF's attention.key_length, or embedding_length / "
                                   "head_count)");
  uint32_t head = *given;
  if (head == 0 || s.k_width % head || s.v_width % head)
    return Status::InvalidArgument(in + ": " + (lo.head_size ? "--head-size " : "the model's head size ") +
                                   std::to_string(head) + " does not divide the " +
                                   std::to_string(s.k_width) + " K and " + std::to_string(s.v_width) +
                                   " V values per token; give --head-size");
  // Rotation (llama_state.h): only quantized rows with heads of a multiple
  // of 64 can be rotated; whether they were, only the user can say.
  CacheType kt = s.k[0].type, vt = s.v[0].type;
  bool can_rotate = RotatesRows(kt, head) || RotatesRows(vt, head);
  std::string cache = std::string(CacheTypeName(kt)) + "/" + CacheTypeName(vt) + " cache";
  if ((lo.rotated || lo.unrotate) && !can_rotate) {
    std::string flag = lo.unrotate ? "--unrotate" : std::string("--rotated ") + (*lo.rotated ? "yes" : "no");
    return Status::InvalidArgument(
        in + ": " + flag + ": llama.cpp rotates only quantized (q8_0) rows with head sizes that are multiples of "
        "64, and this is a " + cache + " with --head-size " + std::to_string(head) + ": its rows are never rotated");
  }
  if (lo.unrotate && lo.rotated == false)
    return Status::InvalidArgument(in + ": --unrotate with --rotated no: the rows are not rotated");
  Rotation rotation = !can_rotate   ? Rotation::kNo
                      : lo.unrotate ? Rotation::kNo
                      : lo.rotated  ? (*lo.rotated ? Rotation::kYes : Rotation::kNo)
                                    : Rotation::kUnknown;
  *g = Geometry();
  g->layers = s.layers;
  for (int part = 0; part < 2; ++part) {
    std::string name = part ? "v" : "k";
    uint32_t width = part ? s.v_width : s.k_width;
    Dtype to;
    if (o.keep_raw.count(name))
      to = o.dtype && !IsFp8(*o.dtype) ? *o.dtype : LosslessDtype(part ? s.v[0].type : s.k[0].type);
    else
      to = o.dtype.value_or(Dtype::kE4M3);
    if (o.kv_major == 1 && IsFp8(to))
      return Status::InvalidArgument(in + ": --format v1 stores raw rows: use --dtype bf16, f16 or f32");
    g->streams.push_back({name, width / head, head, to});
  }
  Status st = g->Validate();
  if (!st.ok()) return st.WithContext(in);
  Provenance p;
  p.kind = s.kind;
  p.version = s.version;
  p.arch = s.arch;
  p.k_type = s.k[0].type;
  p.v_type = s.v[0].type;
  p.v_trans = s.v_trans;
  p.n_stream = s.n_stream;
  p.stream = s.stream;
  p.seq_id = s.seq_id;
  p.first_pos = s.first_pos;
  p.server_tokens = s.server_tokens;
  if (s.cache_layers.size() > 1) p.cache_layers = s.cache_layers;
  p.rotated = rotation;
  *id = ModelIdentity{FormatModelId(p), 0};
  return Status::OK();
}

Status AppendCells(const std::string& in, File& f, const StateLayout& s, uint32_t unrotate_head, uint64_t c0,
                   uint64_t c1, const ConvertOptions& o, Writer& w) {
  const bool unrotate[2] = {unrotate_head != 0 && RotatesRows(s.k[0].type, unrotate_head),
                            unrotate_head != 0 && RotatesRows(s.v[0].type, unrotate_head)};
  uint64_t per_token = (uint64_t{s.k_width} + s.v_width) * (4 + 4) * s.layers;  // f32 values + the read buffer
  uint64_t block = safetensors::BlockTokens(per_token, convert::kBufferBudget);
  std::vector<std::vector<float>> data(2 * s.layers);
  std::vector<std::vector<uint8_t>> bytes(2 * s.layers);
  const std::string label = "convert " + in;
  for (uint64_t t0 = c0; t0 < c1; t0 += block) {
    uint64_t n = std::min<uint64_t>(block, c1 - t0);
    AppendBatch batch;
    batch.tokens = std::span<const uint32_t>(s.tokens).subspan(t0, n);
    batch.continued = t0 + n < c1;  // the cells are one append
    for (uint32_t l = 0; l < s.layers; ++l) {
      for (int part = 0; part < 2; ++part) {
        CacheType type = part ? s.v[l].type : s.k[l].type;
        if (type != CacheType::kQ8_0 && IsRowMajor(s, part == 1) && !unrotate[part]) {
          // f32/f16/bf16 rows go to the writer as stored (little-endian, as
          // the writer takes them on the little-endian hosts kvfile runs on).
          std::vector<uint8_t>& b = bytes[2 * l + part];
          b.resize(n * RowBytes(type, part ? s.v_width : s.k_width));
          KVFILE_RETURN_IF_ERROR(ReadCellBytes(f, s, part == 1, l, static_cast<uint32_t>(t0),
                                                      static_cast<uint32_t>(t0 + n), b.data()));
          batch.blocks.push_back({LosslessDtype(type), b.data(), nullptr});
          continue;
        }
        std::vector<float>& d = data[2 * l + part];
        d.resize(n * (part ? s.v_width : s.k_width));
        KVFILE_RETURN_IF_ERROR(ReadCells(f, s, part == 1, l, static_cast<uint32_t>(t0),
                                                static_cast<uint32_t>(t0 + n), d.data()));
        if (unrotate[part]) {
          uint64_t width = part ? s.v_width : s.k_width;
          for (uint64_t i = 0; i < n; ++i)
            Hadamard(d.data() + i * width, width, RotationBlock(part == 1, unrotate_head));
        }
        batch.blocks.push_back({Dtype::kF32, d.data(), nullptr});
      }
    }
    Status st = w.Append(batch);
    if (!st.ok()) return st.WithContext(in);
    convert::Progress(o, label, t0 + n - c0, c1 - c0);
    KVFILE_RETURN_IF_ERROR(convert::CheckInterrupted(o, in));
  }
  return Status::OK();
}

namespace {

// --dtype of a llama.cpp export into k and v (either left as it is if the
// spec does not name it).
Status ParseLlamaTypes(const std::string& spec, CacheType* k, CacheType* v) {
  auto bad = [&spec](const std::string& why) {
    return Status::InvalidArgument("--dtype " + spec + ": " + why +
                                   " (a llama.cpp cache is f16, bf16, f32 or q8_0: --dtype TYPE, or "
                                   "k=TYPE,v=TYPE for each stream)");
  };
  if (spec.find('=') == std::string::npos) {
    std::optional<CacheType> t = CacheTypeFromName(spec);
    if (!t) return bad("not a llama.cpp cache type");
    *k = *v = *t;
    return Status::OK();
  }
  bool seen[2] = {false, false};
  std::string_view rest = spec;
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    size_t eq = item.find('=');
    std::string_view key = item.substr(0, eq);
    if (eq == std::string_view::npos || (key != "k" && key != "v"))
      return bad("'" + std::string(item) + "' is not k=TYPE or v=TYPE");
    int i = key == "v";
    if (seen[i]) return bad("stream " + std::string(key) + " given twice");
    seen[i] = true;
    std::optional<CacheType> t = CacheTypeFromName(item.substr(eq + 1));
    if (!t) return bad("'" + std::string(item.substr(eq + 1)) + "' is not a llama.cpp cache type");
    *(i ? v : k) = *t;
  }
  return Status::OK();
}

}  // namespace

Status CheckExportType(const std::string& spec) {
  CacheType k = CacheType::kF16, v = k;
  return ParseLlamaTypes(spec, &k, &v);
}

Status CheckPlainRows(const std::string& in, const Reader& r, std::string* warning) {
  std::optional<Provenance> prov = ParseModelId(r.identity().model_id);
  if (!prov) return Status::OK();
  const Geometry& g = r.geometry();
  for (bool v : {false, true}) {
    std::optional<uint32_t> i = g.FindStream(v ? "v" : "k");
    if (!i) continue;
    CacheType t = v ? prov->v_type : prov->k_type;
    Rotation rot = StreamRotation(*prov, v, g.streams[*i].row_width);
    std::string what = std::string(v ? "v" : "k") + " rows (imported from a llama.cpp " + CacheTypeName(t) +
                       " cache with heads of " + std::to_string(g.streams[*i].row_width) + ", rotated=" +
                       RotationName(rot) + ")";
    if (rot == Rotation::kYes)
      return Status::InvalidArgument(in + ": the " + what + " are Hadamard-rotated, not plain " +
                                     (v ? "values" : "keys") +
                                     ": import the llama.cpp file again with --unrotate, or export with --format "
                                     "llama-seq|llama-session (which un-rotates them for a float cache)");
    if (rot == Rotation::kUnknown && warning->empty())
      *warning = in + ": the " + what + " may be Hadamard-rotated (llama.cpp does so unless "
                 "LLAMA_ATTN_ROT_DISABLE=1): import with --rotated yes --unrotate, or --rotated no, to say which";
  }
  return Status::OK();
}

Status Export(const std::string& in, Reader& r, uint64_t tokens, const std::string& out_path,
              const ConvertOptions& co, std::string* summary, std::string* warning, const Placement* at) {
  const LlamaOptions& o = co.llama;
  const Geometry& g = r.geometry();
  std::optional<uint32_t> ks = g.FindStream("k"), vs = g.FindStream("v");
  if (!ks || !vs || g.streams.size() != 2)
    return Status::InvalidArgument(in + ": a llama.cpp state file holds streams k and v; this file's are not "
                                   "exactly those two");
  if (tokens == 0) return Status::InvalidArgument(in + ": no tokens to export (llama.cpp state holds at least one)");
  if (tokens > 0x7FFFFFFF) return Status::InvalidArgument(in + ": more tokens than a llama.cpp state file holds");
  std::optional<Provenance> prov = ParseModelId(r.identity().model_id);
  WriteSpec spec;
  spec.kind = o.session ? FileKind::kSession : FileKind::kSequence;
  spec.arch = o.arch ? *o.arch : prov ? prov->arch : "";
  if (prov) {
    spec.n_stream = prov->n_stream;
    spec.stream = prov->stream;
    spec.seq_id = prov->seq_id;
    spec.first_pos = prov->first_pos;
    spec.v_trans = prov->v_trans;
    spec.server_tokens = prov->server_tokens;
    spec.k_type = prov->k_type;  // the imported types unless --dtype
    spec.v_type = prov->v_type;
    spec.cache_layers = prov->cache_layers;
  }
  if (o.v_trans) spec.v_trans = *o.v_trans == 1;
  if (o.n_stream) {
    spec.n_stream = *o.n_stream;
    if (spec.stream >= spec.n_stream) spec.stream = 0;
  }
  if (at) {
    spec.n_stream = at->n_stream;
    spec.stream = at->stream;
    spec.seq_id = at->seq_id;
  }
  if (o.type) KVFILE_RETURN_IF_ERROR(ParseLlamaTypes(*o.type, &spec.k_type, &spec.v_type));
  spec.layers = g.layers;
  spec.k_width = static_cast<uint32_t>(g.streams[*ks].ElementsPerToken());
  spec.v_width = static_cast<uint32_t>(g.streams[*vs].ElementsPerToken());
  if (int64_t{spec.first_pos} + static_cast<int64_t>(tokens) > 0x7FFFFFFF)
    return Status::InvalidArgument(in + ": positions past 2^31");
  Status st = CheckWriteSpec(spec);
  if (!st.ok()) return st.WithContext(in);
  // Rotation: rows go out as the new context expects them (rotated where
  // llama.cpp rotates, unless --rotated says otherwise), through the
  // Hadamard transform, its own inverse, where they are known to differ.
  bool transform[2] = {false, false};
  std::string rotation_note;
  const StreamSpec& kspec = g.streams[*ks];
  const StreamSpec& vspec = g.streams[*vs];
  if (o.rotated == true && !RotatesRows(spec.k_type, kspec.row_width) &&
      !RotatesRows(spec.v_type, vspec.row_width))
    return Status::InvalidArgument(in + ": --rotated yes: llama.cpp rotates only quantized (q8_0) rows with head "
                                   "sizes that are multiples of 64, and k is " + CacheTypeName(spec.k_type) +
                                   " with heads of " + std::to_string(kspec.row_width) + ", v " +
                                   CacheTypeName(spec.v_type) + " with heads of " +
                                   std::to_string(vspec.row_width));
  for (int part = 0; part < 2; ++part) {
    const StreamSpec& ss = part ? vspec : kspec;
    CacheType to = part ? spec.v_type : spec.k_type;
    // What the restoring context stores: rotated rows where llama.cpp
    // rotates, unless --rotated no (LLAMA_ATTN_ROT_DISABLE=1).
    bool target = RotatesRows(to, ss.row_width) && o.rotated != false;
    // Rows of files not from llama.cpp are plain keys and values.
    Rotation have = prov ? StreamRotation(*prov, part == 1, ss.row_width) : Rotation::kNo;
    if (have == Rotation::kUnknown) {
      bool maybe = RotatesRows(part ? prov->v_type : prov->k_type, ss.row_width);
      if (maybe != target && warning->empty())
        *warning = in + ": imported from a " + CacheTypeName(prov->k_type) + "/" +
                   CacheTypeName(prov->v_type) + " cache (rotated=unknown), exported as " +
                   CacheTypeName(spec.k_type) + "/" + CacheTypeName(spec.v_type) +
                   ": llama.cpp Hadamard-rotates K and V of quantized caches with head sizes that are multiples of 64 "
                   "(unless LLAMA_ATTN_ROT_DISABLE=1), so the rows may not match what the new context expects; "
                   "import with --rotated yes|no to say";
      continue;
    }
    transform[part] = (have == Rotation::kYes) != target;
    if (transform[part])
      rotation_note += std::string("; ") + (part ? "v" : "k") + " rows " + (target ? "rotated" : "un-rotated");
  }
  std::unique_ptr<File> out;
  KVFILE_RETURN_IF_ERROR(FileSystemOf(co)->Open(out_path, OpenMode::kCreateExclusive, &out));
  uint64_t total = StateFileSize(spec, tokens);
  KVFILE_RETURN_IF_ERROR(out->Truncate(total));
  StateWriter sw(out.get(), spec, tokens);
  auto ids = r.tokens().subspan(0, tokens);
  KVFILE_RETURN_IF_ERROR(sw.Header(std::vector<uint32_t>(ids.begin(), ids.end())));
  uint64_t per_token = std::max(spec.k_width, spec.v_width) * uint64_t{4 + 4};
  uint64_t block = safetensors::BlockTokens(per_token, uint64_t{64} << 20);
  std::vector<float> vals;
  std::vector<uint8_t> raw;
  const std::string label = "convert " + in;
  const uint64_t work = tokens * 2 * g.layers;
  uint64_t done = 0;
  for (int part = 0; part < 2; ++part) {
    uint32_t s = part ? *vs : *ks;
    uint64_t width = g.streams[s].ElementsPerToken();
    CacheType type = part ? spec.v_type : spec.k_type;
    std::optional<Dtype> raw_dtype;  // the type as a kvfile dtype, when rows can be read in it directly
    if (type == CacheType::kF16) raw_dtype = Dtype::kF16;
    if (type == CacheType::kBF16) raw_dtype = Dtype::kBF16;
    if (type == CacheType::kF32) raw_dtype = Dtype::kF32;
    for (uint32_t l = 0; l < g.layers; ++l) {
      for (uint64_t t0 = 0; t0 < tokens; t0 += block) {
        uint64_t n = std::min(block, tokens - t0);
        if (raw_dtype && !(part == 1 && spec.v_trans) && !transform[part]) {
          raw.resize(n * width * ElementSize(*raw_dtype));
          KVFILE_RETURN_IF_ERROR(r.ReadRows(l, s, t0, t0 + n, *raw_dtype, raw.data()));
          KVFILE_RETURN_IF_ERROR(sw.RawRows(part == 1, l, t0, n, raw.data()));  // errors name out_path
          convert::Progress(co, label, done += n, work);
          KVFILE_RETURN_IF_ERROR(convert::CheckInterrupted(co, in));
          continue;
        }
        vals.resize(n * width);
        KVFILE_RETURN_IF_ERROR(r.ReadRows(l, s, t0, t0 + n, Dtype::kF32, vals.data()));
        if (transform[part])
          for (uint64_t i = 0; i < n; ++i)
            Hadamard(vals.data() + i * width, width, RotationBlock(part == 1, g.streams[s].row_width));
        KVFILE_RETURN_IF_ERROR(sw.Rows(part == 1, l, t0, n, vals.data()));
        convert::Progress(co, label, done += n, work);
        KVFILE_RETURN_IF_ERROR(convert::CheckInterrupted(co, in));
      }
    }
  }
  KVFILE_RETURN_IF_ERROR(out->Sync());
  *summary = std::to_string(tokens) + " tokens; " + LayersText(g.layers, spec.cache_layers) + "; llama.cpp " +
             (o.session ? "session" : "sequence state") + ", " +
             (spec.k_type == spec.v_type
                  ? std::string(CacheTypeName(spec.k_type))
                  : std::string("k ") + CacheTypeName(spec.k_type) + ", v " + CacheTypeName(spec.v_type)) +
             " cache" + (spec.v_trans ? " (V transposed)" : "") +
             (spec.n_stream > 1 ? "; stream " + std::to_string(spec.stream) + " of " + std::to_string(spec.n_stream)
                                : "") +
             rotation_note + "; " + std::to_string(total) + " bytes";
  return Status::OK();
}

Status Import(const std::string& in, const ConvertOptions& o, const std::string& kv_path, ConvertReport* r) {
  std::unique_ptr<File> f;
  KVFILE_RETURN_IF_ERROR(FileSystemOf(o)->Open(in, OpenMode::kRead, &f));
  StateLayout s;
  KVFILE_RETURN_IF_ERROR(ParseState(*f, in, &s));
  Geometry g;
  ModelIdentity id;
  KVFILE_RETURN_IF_ERROR(PlanImport(in, s, o, &g, &id));
  const uint32_t head = g.streams[0].row_width;
  WriterOptions wo;
  wo.threads = 0;  // quantize on every core (the bytes do not depend on it)
  wo.format_major = o.kv_major;
  wo.chunk_tokens = convert::ChunkTokens(o, g, 256, in);
  std::unique_ptr<Writer> w;
  KVFILE_RETURN_IF_ERROR(Writer::Create(kv_path, g, id, wo, &w));
  KVFILE_RETURN_IF_ERROR(AppendCells(in, *f, s, o.llama.unrotate ? head : 0, 0, s.cells, o, *w));
  KVFILE_RETURN_IF_ERROR(w->Close());
  CacheType kt = s.k[0].type, vt = s.v[0].type;
  bool can_rotate = RotatesRows(kt, head) || RotatesRows(vt, head);
  std::optional<Provenance> p = ParseModelId(id.model_id);
  Rotation rotation = p ? p->rotated : Rotation::kUnknown;
  r->tokens = s.cells;
  r->summary = std::to_string(s.cells) + " tokens; " + LayersText(s.layers, s.cache_layers) + "; " +
             (s.kind == FileKind::kSequence ? "sequence state" : "session") + " of " +
             CacheTypeName(kt) + "/" + CacheTypeName(vt) + " cache" +
             (s.v_trans ? " (V transposed)" : "") + (s.server_tokens ? " (llama-server token record)" : "") +
             (can_rotate ? std::string("; rotated ") + (o.llama.unrotate ? "yes, stored un-rotated"
                                                                          : RotationName(rotation))
                         : "") +
             "; k " + std::to_string(g.streams[0].rows_per_token) + " x " +
             std::to_string(head) + " " + DtypeName(g.streams[0].dtype) + ", v " +
             std::to_string(g.streams[1].rows_per_token) + " x " + std::to_string(head) + " " +
             DtypeName(g.streams[1].dtype) + "; " + std::to_string(FileSizeOf(kv_path)) + " bytes";
  return Status::OK();
}

namespace {

// The first `tokens` tokens of a checked .kv -> a state file at out_path.
Status ExportKv(Reader& in, const std::string& in_name, uint64_t tokens, const ConvertOptions& o,
                const std::string& out_path, ConvertReport* r) {
  std::string warning;
  KVFILE_RETURN_IF_ERROR(Export(in_name, in, tokens, out_path, o, &r->summary, &warning));
  if (!warning.empty()) r->warnings.push_back(std::move(warning));
  r->tokens = tokens;
  return Status::OK();
}

}  // namespace

}  // namespace kvfile::llama

namespace kvfile::convert {

Status CheckPlainRows(const std::string& in, const Reader& r, std::string* warning) {
  return llama::CheckPlainRows(in, r, warning);
}

// A state file has no suffix of its own (llama.cpp writes whatever name it
// is given): found by its magic, written by an explicit Format.
extern const Driver kLlamaDriver = {Format::kLlamaState, false, nullptr, SniffLlama, llama::Import,
                                    llama::ExportKv};

}  // namespace kvfile::convert
