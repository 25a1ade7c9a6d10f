// SPDX-License-Identifier: Apache-2.0
// kvfile convert: llama.cpp state file -> .kv (import) and .kv -> llama.cpp
// state file (export). The file layout and the provenance kept in the .kv
// model id are in src/llama_state.h.
#include "convert_llama.h"

#include <algorithm>
#include <filesystem>

#include "cli_common.h"
#include "kvfile/llama_state.h"
#include "progress.h"
#include "signals.h"
#include "kvfile/safetensors.h"
#include "kvfile/writer.h"

namespace kvfile::cli {

namespace {

uint64_t FileSizeOf(const std::string& path) {
  std::error_code ec;
  uint64_t n = std::filesystem::file_size(path, ec);
  return ec ? 0 : n;
}

// The lossless raw dtype for values of a cache type (q8_0 values are an f16
// scale times an int8, exact in f32).
Dtype LosslessDtype(llama::CacheType t) {
  switch (t) {
    case llama::CacheType::kF16: return Dtype::kF16;
    case llama::CacheType::kBF16: return Dtype::kBF16;
    default: return Dtype::kF32;
  }
}

}  // namespace

bool IsLlamaStateFile(const std::string& path) {
  std::unique_ptr<File> f;
  if (!FileSystem::Default()->Open(path, OpenMode::kRead, &f).ok()) return false;
  uint64_t size = 0;
  uint8_t magic[4];
  if (!f->Size(&size).ok() || size < 4 || !f->ReadAt(0, magic, 4).ok()) return false;
  return llama::HasStateMagic(magic);
}

Status PlanLlamaImport(const std::string& in, const llama::StateLayout& s, const LlamaImport& o, Geometry* g,
                       ModelIdentity* id) {
  for (const std::string& k : o.keep_raw)
    if (k != "k" && k != "v") return Status::InvalidArgument(in + ": --keep-raw: no stream '" + k + "' (streams: k, v)");
  uint32_t head = o.head_size.value_or(128);
  if (head == 0 || s.k_width % head || s.v_width % head) {
    std::string why = o.head_size ? "--head-size " + std::to_string(head) + " does not divide"
                                  : "the default head size 128 does not divide";
    return Status::InvalidArgument(in + ": " + why + " the " + std::to_string(s.k_width) + " K and " +
                                   std::to_string(s.v_width) + " V values per token; give --head-size");
  }
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
    if (o.major == 1 && IsFp8(to))
      return Status::InvalidArgument(in + ": --format v1 stores raw rows: use --dtype bf16, f16 or f32");
    g->streams.push_back({name, width / head, head, to});
  }
  Status st = g->Validate();
  if (!st.ok()) return st.WithContext(in);
  llama::Provenance p;
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
  *id = ModelIdentity{llama::FormatModelId(p), 0};
  return Status::OK();
}

Status AppendLlamaCells(const std::string& in, File& f, const llama::StateLayout& s, uint64_t c0, uint64_t c1,
                        Writer& w) {
  uint64_t per_token = (uint64_t{s.k_width} + s.v_width) * (4 + 4) * s.layers;  // f32 values + the read buffer
  uint64_t block = safetensors::BlockTokens(per_token, kConvertBufferBudget);
  std::vector<std::vector<float>> data(2 * s.layers);
  std::vector<std::vector<uint8_t>> bytes(2 * s.layers);
  Progress progress("convert " + in, c1 - c0);
  for (uint64_t t0 = c0; t0 < c1; t0 += block) {
    uint64_t n = std::min<uint64_t>(block, c1 - t0);
    progress.Add(n);
    AppendBatch batch;
    batch.tokens = std::span<const uint32_t>(s.tokens).subspan(t0, n);
    batch.continued = t0 + n < c1;  // the cells are one append
    for (uint32_t l = 0; l < s.layers; ++l) {
      for (int part = 0; part < 2; ++part) {
        llama::CacheType type = part ? s.v[l].type : s.k[l].type;
        if (type != llama::CacheType::kQ8_0 && llama::IsRowMajor(s, part == 1)) {
          // f32/f16/bf16 rows go to the writer as stored (little-endian, as
          // the writer takes them on the little-endian hosts kvfile runs on).
          std::vector<uint8_t>& b = bytes[2 * l + part];
          b.resize(n * llama::RowBytes(type, part ? s.v_width : s.k_width));
          KVFILE_RETURN_IF_ERROR(llama::ReadCellBytes(f, s, part == 1, l, static_cast<uint32_t>(t0),
                                                      static_cast<uint32_t>(t0 + n), b.data()));
          batch.blocks.push_back({LosslessDtype(type), b.data(), nullptr});
          continue;
        }
        std::vector<float>& d = data[2 * l + part];
        d.resize(n * (part ? s.v_width : s.k_width));
        KVFILE_RETURN_IF_ERROR(llama::ReadCells(f, s, part == 1, l, static_cast<uint32_t>(t0),
                                                static_cast<uint32_t>(t0 + n), d.data()));
        batch.blocks.push_back({Dtype::kF32, d.data(), nullptr});
      }
    }
    Status st = w.Append(batch);
    if (!st.ok()) return st.WithContext(in);
    KVFILE_RETURN_IF_ERROR(CheckInterrupt(in));
  }
  return Status::OK();
}

Status ImportLlama(const std::string& in, const std::string& tmp, const LlamaImport& o, std::string* summary) {
  std::unique_ptr<File> f;
  KVFILE_RETURN_IF_ERROR(FileSystem::Default()->Open(in, OpenMode::kRead, &f));
  llama::StateLayout s;
  KVFILE_RETURN_IF_ERROR(llama::ParseState(*f, in, &s));
  Geometry g;
  ModelIdentity id;
  KVFILE_RETURN_IF_ERROR(PlanLlamaImport(in, s, o, &g, &id));
  WriterOptions wo;
  wo.threads = 0;  // quantize on every core (the bytes do not depend on it)
  wo.format_major = o.major;
  wo.chunk_tokens = o.chunk_tokens ? *o.chunk_tokens : BoundedChunkTokens(g, 256, in);
  std::unique_ptr<Writer> w;
  KVFILE_RETURN_IF_ERROR(Writer::Create(tmp, g, id, wo, &w));
  KVFILE_RETURN_IF_ERROR(AppendLlamaCells(in, *f, s, 0, s.cells, *w));
  KVFILE_RETURN_IF_ERROR(w->Close());
  *summary = std::to_string(s.cells) + " tokens; " + std::to_string(s.layers) + " layers; " +
             (s.kind == llama::FileKind::kSequence ? "sequence state" : "session") + " of " +
             llama::CacheTypeName(s.k[0].type) + "/" + llama::CacheTypeName(s.v[0].type) + " cache" +
             (s.v_trans ? " (V transposed)" : "") + (s.server_tokens ? " (llama-server token record)" : "") +
             "; k " + std::to_string(g.streams[0].rows_per_token) + " x " +
             std::to_string(g.streams[0].row_width) + " " + DtypeName(g.streams[0].dtype) + ", v " +
             std::to_string(g.streams[1].rows_per_token) + " x " + std::to_string(g.streams[1].row_width) + " " +
             DtypeName(g.streams[1].dtype) + "; " + std::to_string(FileSizeOf(tmp)) + " bytes";
  return Status::OK();
}

Status ExportLlama(const std::string& in, Reader& r, uint64_t tokens, const std::string& tmp, const LlamaExport& o,
                   std::string* summary, std::string* warning, const LlamaPlacement* at) {
  const Geometry& g = r.geometry();
  std::optional<uint32_t> ks = g.FindStream("k"), vs = g.FindStream("v");
  if (!ks || !vs || g.streams.size() != 2)
    return Status::InvalidArgument(in + ": a llama.cpp state file holds streams k and v; this file's are not "
                                   "exactly those two");
  if (tokens == 0) return Status::InvalidArgument(in + ": no tokens to export (llama.cpp state holds at least one)");
  if (tokens > 0x7FFFFFFF) return Status::InvalidArgument(in + ": more tokens than a llama.cpp state file holds");
  std::optional<llama::Provenance> prov = llama::ParseModelId(r.identity().model_id);
  llama::WriteSpec spec;
  spec.kind = o.session ? llama::FileKind::kSession : llama::FileKind::kSequence;
  spec.arch = o.arch ? *o.arch : prov ? prov->arch : "";
  if (prov) {
    spec.n_stream = prov->n_stream;
    spec.stream = prov->stream;
    spec.seq_id = prov->seq_id;
    spec.first_pos = prov->first_pos;
    spec.v_trans = prov->v_trans;
    spec.server_tokens = prov->server_tokens;
  }
  if (o.v_trans) spec.v_trans = *o.v_trans == 1;
  if (at) {
    spec.n_stream = at->n_stream;
    spec.stream = at->stream;
    spec.seq_id = at->seq_id;
  }
  llama::CacheType type = llama::CacheTypeFromName(o.type.value_or("f16")).value_or(llama::CacheType::kF16);
  spec.k_type = spec.v_type = type;
  spec.layers = g.layers;
  spec.k_width = static_cast<uint32_t>(g.streams[*ks].ElementsPerToken());
  spec.v_width = static_cast<uint32_t>(g.streams[*vs].ElementsPerToken());
  if (int64_t{spec.first_pos} + static_cast<int64_t>(tokens) > 0x7FFFFFFF)
    return Status::InvalidArgument(in + ": positions past 2^31");
  Status st = llama::CheckWriteSpec(spec);
  if (!st.ok()) return st.WithContext(in);
  if (prov && (llama::IsQuantized(prov->k_type) != llama::IsQuantized(type) ||
               llama::IsQuantized(prov->v_type) != llama::IsQuantized(type)))
    *warning = in + ": imported from a " + llama::CacheTypeName(prov->k_type) + "/" +
               llama::CacheTypeName(prov->v_type) + " cache, exported as " + llama::CacheTypeName(type) +
               ": llama.cpp Hadamard-rotates K and V of quantized caches with head sizes that are multiples of 64 "
               "(unless LLAMA_ATTN_ROT_DISABLE=1), so the rows may not match what the new context expects";
  std::unique_ptr<File> out;
  KVFILE_RETURN_IF_ERROR(FileSystem::Default()->Open(tmp, OpenMode::kCreateExclusive, &out));
  uint64_t total = llama::StateFileSize(spec, tokens);
  KVFILE_RETURN_IF_ERROR(out->Truncate(total));
  llama::StateWriter sw(out.get(), spec, tokens);
  auto ids = r.tokens().subspan(0, tokens);
  KVFILE_RETURN_IF_ERROR(sw.Header(std::vector<uint32_t>(ids.begin(), ids.end())));
  uint64_t per_token = std::max(spec.k_width, spec.v_width) * uint64_t{4 + 4};
  uint64_t block = safetensors::BlockTokens(per_token, uint64_t{64} << 20);
  std::vector<float> vals;
  std::vector<uint8_t> raw;
  std::optional<Dtype> raw_dtype;  // the type as a kvfile dtype, when rows can be read in it directly
  if (type == llama::CacheType::kF16) raw_dtype = Dtype::kF16;
  if (type == llama::CacheType::kBF16) raw_dtype = Dtype::kBF16;
  if (type == llama::CacheType::kF32) raw_dtype = Dtype::kF32;
  Progress progress("convert " + in, tokens * 2 * g.layers);
  for (int part = 0; part < 2; ++part) {
    uint32_t s = part ? *vs : *ks;
    uint64_t width = g.streams[s].ElementsPerToken();
    for (uint32_t l = 0; l < g.layers; ++l) {
      for (uint64_t t0 = 0; t0 < tokens; t0 += block) {
        uint64_t n = std::min(block, tokens - t0);
        progress.Add(n);
        if (raw_dtype && !(part == 1 && spec.v_trans)) {
          raw.resize(n * width * ElementSize(*raw_dtype));
          KVFILE_RETURN_IF_ERROR(r.ReadRows(l, s, t0, t0 + n, *raw_dtype, raw.data()));
          KVFILE_RETURN_IF_ERROR(sw.RawRows(part == 1, l, t0, n, raw.data()));  // errors name tmp
          KVFILE_RETURN_IF_ERROR(CheckInterrupt(in));
          continue;
        }
        vals.resize(n * width);
        KVFILE_RETURN_IF_ERROR(r.ReadRows(l, s, t0, t0 + n, Dtype::kF32, vals.data()));
        KVFILE_RETURN_IF_ERROR(sw.Rows(part == 1, l, t0, n, vals.data()));
        KVFILE_RETURN_IF_ERROR(CheckInterrupt(in));
      }
    }
  }
  KVFILE_RETURN_IF_ERROR(out->Sync());
  *summary = std::to_string(tokens) + " tokens; " + std::to_string(g.layers) + " layers; llama.cpp " +
             (o.session ? "session" : "sequence state") + ", " + llama::CacheTypeName(type) + " cache" +
             (spec.v_trans ? " (V transposed)" : "") + "; " + std::to_string(total) + " bytes";
  return Status::OK();
}

}  // namespace kvfile::cli
