// SPDX-License-Identifier: Apache-2.0
// kvfile convert: .kv -> .kv (re-encode, re-chunk, compact), .safetensors ->
// .kv (import), .kv -> .safetensors (export), and directory trees of .kv
// files.
//
// The output is written under a temporary name next to OUT, synced, and
// renamed into place only when complete (then the directory is synced): OUT
// is either its old self (or absent) or the whole conversion. IN is opened
// read-only. An existing OUT is replaced only with --force.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <future>
#include <optional>
#include <set>
#include <thread>

#include "kvfile/safetensors.h"
#include "kvfile/replace.h"
#include "bench_support.h"
#include "cli_common.h"
#include "damage_advice.h"
#include "kvfile/convert.h"
#include "kvfile/formats/llama.h"
#include "natural_sort.h"
#include "pack_member.h"
#include "progress.h"
#include "signals.h"
#include "kvfile/reader.h"
#include "kvfile/verify.h"
#include "kvfile/writer.h"

namespace kvfile::cli {

namespace {

namespace fs = std::filesystem;

// A u64 as 8 little-endian bytes (safetensors' byte order).
void PutU64Le(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
using safetensors::DType;
using safetensors::KvStream;
using safetensors::KvTensors;
using safetensors::SafetensorsFile;
using safetensors::SafetensorsWriter;
using safetensors::TensorInfo;

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

// What to do with each stream, resolved from the flags.
struct Plan {
  uint16_t major = 2;  // the format of a .kv output
  std::optional<Dtype> dtype;
  std::set<std::string> keep_raw;
  bool codes = false;
  std::optional<uint32_t> chunk_tokens;
  bool salvage = false;
  std::optional<uint32_t> head_size;  // llama.cpp import
  std::optional<std::string> model;   // llama.cpp import
  std::optional<bool> rotated;        // llama.cpp import (the export's is in `llama`)
  bool unrotate = false;              // llama.cpp import
  LlamaOptions llama;                 // llama.cpp export
};

// Whether `path` is a llama.cpp state file, by its magic.
bool IsLlamaStateFile(const std::string& path) {
  Format f;
  return DetectFormat(path, false, nullptr, &f).ok() && f == Format::kLlamaState;
}

// The library's options for a conversion by a format driver (kvfile/convert.h):
// a signal stops it between batches, and its progress is drawn as bars.
ConvertOptions LibraryOptions(ProgressReports* bars) {
  ConvertOptions o;
  o.interrupted = [] { return PendingSignal() != 0; };
  o.progress = bars->Callback();
  return o;
}

enum class Kind { kKv, kSafetensors, kDirectory, kLlama, kOther };

// An input is a llama.cpp state file by its magic, whatever its name (a
// slot.kv too); an output by its name first (--force replaces a file that
// holds such a state under a .kv name).
Kind KindOf(const std::string& path, bool input = true) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return Kind::kDirectory;
  if (input && IsLlamaStateFile(path)) return Kind::kLlama;
  std::string ext = fs::path(path).extension().string();
  if (ext == ".kv") return Kind::kKv;
  if (ext == ".safetensors") return Kind::kSafetensors;
  if (IsLlamaStateFile(path)) return Kind::kLlama;
  return Kind::kOther;
}

Dtype ParseDtype(const std::string& s) {
  if (s == "e5m2") return Dtype::kE5M2;
  if (s == "bf16") return Dtype::kBF16;
  if (s == "f16") return Dtype::kF16;
  if (s == "f32") return Dtype::kF32;
  if (s == "nvfp4") return Dtype::kNvfp4;
  return Dtype::kE4M3;
}

// The stored dtype of a stream whose values are stored as `have` (a raw
// stream, or an fp8 or nvfp4 stream's codes):
// - --keep-raw: a raw --dtype, else a raw stream's own dtype, else bf16;
// - --dtype e4m3/e5m2/nvfp4: quantized streams take it, raw streams stay as they are;
// - --dtype bf16/f16/f32: every stream takes it;
// - no --dtype: unchanged.
Dtype TargetDtype(const std::string& name, Dtype have, const Plan& p) {
  bool raw_dtype = p.dtype && !IsQuantized(*p.dtype);
  if (p.keep_raw.count(name)) return raw_dtype ? *p.dtype : IsQuantized(have) ? Dtype::kBF16 : have;
  if (!p.dtype) return have;
  if (IsQuantized(*p.dtype)) return IsQuantized(have) ? *p.dtype : have;
  return *p.dtype;
}

std::string StreamList(const Geometry& g) {
  std::string s;
  for (const StreamSpec& spec : g.streams)
    s += (s.empty() ? "" : ", ") + spec.name + " " + DtypeName(spec.dtype);
  return s;
}

Status CheckKeepRaw(const Plan& p, const std::vector<std::string>& names, const std::string& path) {
  for (const std::string& k : p.keep_raw)
    if (std::find(names.begin(), names.end(), k) == names.end()) {
      std::string all;
      for (const std::string& n : names) all += (all.empty() ? "" : ", ") + n;
      return Status::InvalidArgument(path + ": --keep-raw: no stream '" + k + "' (streams: " + all + ")");
    }
  return Status::OK();
}

uint64_t FileSize(const std::string& path) {
  std::error_code ec;
  uint64_t n = fs::file_size(path, ec);
  return ec ? 0 : n;
}

// A .kv input is converted only if `kvfile verify` passes it: damage is
// never converted silently. With --salvage, *tokens is the verified prefix
// (the tokens of the chunks before the first damaged one) and *warning says
// how many committed tokens that drops. Otherwise *tokens is r's count.
Status CheckInput(const std::string& in, const Reader& r, const Plan& p, uint64_t* tokens, std::string* warning) {
  *tokens = r.token_count();
  VerifyReport rep;
  VerifyOptions vo;
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
  if (!p.salvage && r.tail().committed_data_missing) {
    std::string cut = ShortTruncation(in, "--salvage converts");
    if (!cut.empty()) return Status::Corruption(cut);
  }
  if (!p.salvage)
    return Status::Corruption(in + ": " + first->message + "; not converted (kvfile verify fails on it; --salvage "
                              "converts the " + std::to_string(*tokens) + " tokens before the damage)");
  uint64_t committed = r.tail().committed_tokens_missing;
  for (const ChunkInfo& c : r.chunks())
    if (c.committed) committed += c.live_tokens;
  *warning = in + ": --salvage: converted the verified prefix of " + std::to_string(*tokens) + " tokens; " +
             std::to_string(committed - std::min(committed, *tokens)) + " committed tokens were dropped (" +
             first->message + ")";
  return Status::OK();
}

// ---- .kv -> .kv ------------------------------------------------------------------------

Status KvToKv(const std::string& in, const std::string& tmp, const Plan& p, std::string* summary,
              std::string* warning) {
  std::unique_ptr<Reader> r;
  KVFILE_RETURN_IF_ERROR(Reader::Open(in, {}, &r));
  uint64_t total = 0;
  KVFILE_RETURN_IF_ERROR(CheckInput(in, *r, p, &total, warning));
  const Geometry& gi = r->geometry();
  std::vector<std::string> names;
  for (const StreamSpec& s : gi.streams) names.push_back(s.name);
  KVFILE_RETURN_IF_ERROR(CheckKeepRaw(p, names, in));
  Geometry go = gi;
  for (StreamSpec& s : go.streams) {
    if (p.major == 1) {
      // v1 stores raw rows only: fp8 streams are decoded (bf16 unless a raw
      // --dtype is given), raw streams keep their dtype.
      s.dtype = p.dtype ? *p.dtype : IsQuantized(s.dtype) ? Dtype::kBF16 : s.dtype;
    } else if (r->major_version() == 1 && !p.keep_raw.count(s.name) && (!p.dtype || IsQuantized(*p.dtype))) {
      // v1 -> v2 quantizes, as the upgrade does (e4m3 unless --dtype).
      s.dtype = p.dtype.value_or(Dtype::kE4M3);
    } else {
      s.dtype = TargetDtype(s.name, s.dtype, p);
    }
  }
  WriterOptions wo;
  wo.format_major = p.major;
  wo.chunk_tokens = p.chunk_tokens ? *p.chunk_tokens : BoundedChunkTokens(go, r->nominal_chunk_tokens(), in);
  wo.threads = 0;
  std::unique_ptr<Writer> w;
  KVFILE_RETURN_IF_ERROR(Writer::Create(tmp, go, r->identity(), wo, &w));
  size_t S = gi.streams.size();
  uint64_t per_token = 0;
  for (const StreamSpec& s : gi.streams) per_token += s.ElementsPerToken() * 5;  // f32 or codes + scales
  uint64_t block = safetensors::BlockTokens(per_token * gi.layers, kConvertBufferBudget);
  std::vector<std::vector<uint8_t>> data(gi.layers * S);
  std::vector<std::vector<float>> scales(gi.layers * S);
  auto ids = r->tokens();
  Progress progress("convert " + in, total);
  for (uint64_t t0 = 0; t0 < total; t0 += block) {
    uint64_t n = std::min(block, total - t0);
    progress.Add(n);
    AppendBatch batch;
    batch.tokens = ids.subspan(t0, n);
    for (uint32_t l = 0; l < gi.layers; ++l) {
      for (uint32_t s = 0; s < S; ++s) {
        if (!gi.InLayer(l, s)) {
          batch.blocks.push_back({});  // the stream is not in this layer
          continue;
        }
        const StreamSpec& si = gi.streams[s];
        Dtype to = go.streams[s].dtype;
        size_t i = l * S + s;
        uint64_t rows = n * si.rows_per_token;
        uint64_t elems = rows * si.row_width;
        if (IsNvfp4(si.dtype) && si.dtype == to) {
          // nvfp4 to nvfp4: codes, block scales (after them) and row scales copied exactly.
          data[i].resize(elems / 2 + elems / 16);
          scales[i].resize(n);
          KVFILE_RETURN_IF_ERROR(
              r->ReadCodes(l, s, t0, t0 + n, data[i].data(), data[i].data() + elems / 2, scales[i].data()));
          batch.blocks.push_back({to, data[i].data(), scales[i].data(), data[i].data() + elems / 2});
        } else if (IsFp8(si.dtype) && si.dtype == to) {
          // Same fp8 dtype: the codes and scales are copied exactly.
          data[i].resize(elems);
          scales[i].resize(rows);
          KVFILE_RETURN_IF_ERROR(r->ReadCodes(l, s, t0, t0 + n, data[i].data(), scales[i].data()));
          batch.blocks.push_back({to, data[i].data(), scales[i].data()});
        } else {
          // Decoded (fp8 and nvfp4 targets: to f32, then quantized by the writer).
          Dtype read_as = IsQuantized(to) ? Dtype::kF32 : to;
          data[i].resize(elems * ElementSize(read_as));
          KVFILE_RETURN_IF_ERROR(r->ReadRows(l, s, t0, t0 + n, read_as, data[i].data()));
          batch.blocks.push_back({read_as, data[i].data(), nullptr});
        }
      }
    }
    Status st = w->Append(batch);
    if (!st.ok()) return st.WithContext(in);
    KVFILE_RETURN_IF_ERROR(CheckInterrupt(in));
  }
  KVFILE_RETURN_IF_ERROR(w->Close());
  *summary = std::to_string(total) + " tokens; " + StreamList(go) + "; " + std::to_string(wo.chunk_tokens) +
             " tokens per chunk; " + std::to_string(FileSize(tmp)) + " bytes";
  return Status::OK();
}

// ---- .safetensors -> .kv -------------------------------------------------------------------

Status Import(const std::string& in, const std::string& tmp, const Plan& p, std::string* summary) {
  std::unique_ptr<SafetensorsFile> f;
  KVFILE_RETURN_IF_ERROR(SafetensorsFile::Open(in, nullptr, &f));
  KvTensors kv;
  Status st = safetensors::DescribeKv(f->header(), &kv);
  if (!st.ok()) return st.WithContext(in);
  std::vector<std::string> names;
  for (const KvStream& s : kv.streams) names.push_back(s.name);
  KVFILE_RETURN_IF_ERROR(CheckKeepRaw(p, names, in));
  std::vector<uint32_t> ids;
  KVFILE_RETURN_IF_ERROR(safetensors::ReadTokenIds(*f, kv, &ids));
  Geometry g;
  g.layers = kv.layers;
  std::vector<size_t> stream_of;
  for (size_t i = 0; i < kv.streams.size(); ++i) {
    const KvStream& s = kv.streams[i];
    // Codes are an fp8 stream as stored; values are a raw stream as stored
    // with --codes, else decoded values to quantize (e4m3 by default).
    Dtype have = s.source_dtype();
    Dtype to;
    if (p.major == 1) {
      if (s.is_codes())
        return Status::InvalidArgument(in + ": stream '" + s.name +
                                       "' holds fp8 codes; a v1 output stores raw rows (import it as v2, "
                                       "then convert that with --format v1)");
      to = p.dtype.value_or(have);
    } else if (s.is_codes() || p.codes) to = TargetDtype(s.name, have, p);
    else if (p.keep_raw.count(s.name)) to = p.dtype && !IsQuantized(*p.dtype) ? *p.dtype : Dtype::kBF16;
    else to = p.dtype.value_or(Dtype::kE4M3);
    g.streams.push_back({s.name, s.rows_per_token, s.row_width, to, s.layers});
    stream_of.push_back(i);
  }
  st = g.Validate();
  if (!st.ok()) return st.WithContext(in);
  ModelIdentity id{kv.model_id.value_or(""), kv.fingerprint.value_or(0)};
  WriterOptions wo;
  wo.format_major = p.major;
  wo.chunk_tokens = p.chunk_tokens ? *p.chunk_tokens : BoundedChunkTokens(g, 256, in);
  wo.threads = 0;  // quantize on every core (the bytes do not depend on it)
  std::unique_ptr<Writer> w;
  KVFILE_RETURN_IF_ERROR(Writer::Create(tmp, g, id, wo, &w));
  uint64_t per_token = 0;
  for (const StreamSpec& s : g.streams) per_token += s.ElementsPerToken() * 12;
  const uint64_t block = safetensors::BlockTokens(per_token * g.layers, kConvertBufferBudget);
  Progress progress("import " + in, kv.tokens);
  KVFILE_RETURN_IF_ERROR(safetensors::AppendAll(*f, kv, ids, stream_of, *w, block, [&in, &progress, block] {
    progress.Add(block);
    return CheckInterrupt(in);
  }));
  progress.Finish();
  KVFILE_RETURN_IF_ERROR(w->Close());
  *summary = std::to_string(kv.tokens) + " tokens; " + StreamList(g) + "; " + std::to_string(wo.chunk_tokens) +
             " tokens per chunk; " + std::to_string(FileSize(tmp)) + " bytes";
  return Status::OK();
}

// ---- .kv -> .safetensors --------------------------------------------------------------------

Status Export(const std::string& in, const std::string& tmp, const Plan& p, std::string* summary,
              std::string* warning) {
  std::unique_ptr<Reader> r;
  KVFILE_RETURN_IF_ERROR(Reader::Open(in, {}, &r));
  const Geometry& g = r->geometry();
  uint64_t T = 0;
  KVFILE_RETURN_IF_ERROR(CheckInput(in, *r, p, &T, warning));
  {
    std::string w;
    KVFILE_RETURN_IF_ERROR(llama::CheckPlainRows(in, *r, &w));
    if (!w.empty()) *warning = warning->empty() ? w : *warning + "; " + w;
  }
  Dtype out_dtype = p.dtype.value_or(Dtype::kBF16);
  // One entry per tensor to write: which stream, and what of it.
  enum class Part { kValues, kCodes, kBlockScales, kScales };
  struct Item {
    uint32_t stream;
    Part part;
    Dtype dtype;  // kvfile dtype of the tensor's elements (values/codes)
  };
  std::vector<TensorInfo> tensors;
  std::vector<Item> items;
  tensors.push_back({"tokens", DType::kI64, {T}, 0, 0, 0});
  for (uint32_t s = 0; s < g.streams.size(); ++s) {
    const StreamSpec& spec = g.streams[s];
    if (spec.name == "tokens" || spec.name.ends_with(".codes") || spec.name.ends_with(".scales") ||
        spec.name.ends_with(".block_scales"))
      return Status::InvalidArgument(in + ": stream '" + spec.name +
                                     "' cannot be exported: the name is reserved by the safetensors convention");
    // A stream's tensors hold the layers it is in (its layer set, in the metadata).
    const uint64_t nl = g.StreamLayers(s);
    std::vector<uint64_t> shape = {nl, T, spec.rows_per_token, spec.row_width};
    if (p.codes && IsNvfp4(spec.dtype)) {
      // Per token: packed codes (U8), E4M3 block scales, one F32 row scale.
      const uint64_t n = spec.ElementsPerToken();
      tensors.push_back({spec.name + ".codes", DType::kU8, {nl, T, n / 2}, 0, 0, 0});
      items.push_back({s, Part::kCodes, spec.dtype});
      tensors.push_back({spec.name + ".block_scales", DType::kF8E4M3, {nl, T, n / 16}, 0, 0, 0});
      items.push_back({s, Part::kBlockScales, spec.dtype});
      tensors.push_back({spec.name + ".scales", DType::kF32, {nl, T}, 0, 0, 0});
      items.push_back({s, Part::kScales, spec.dtype});
    } else if (p.codes && IsFp8(spec.dtype)) {
      tensors.push_back({spec.name + ".codes", safetensors::DTypeOf(spec.dtype), shape, 0, 0, 0});
      items.push_back({s, Part::kCodes, spec.dtype});
      tensors.push_back({spec.name + ".scales", DType::kF32, {nl, T, spec.rows_per_token}, 0, 0, 0});
      items.push_back({s, Part::kScales, Dtype::kF32});
    } else {
      Dtype d = p.codes ? spec.dtype : out_dtype;
      tensors.push_back({spec.name, safetensors::DTypeOf(d), shape, 0, 0, 0});
      items.push_back({s, Part::kValues, d});
    }
  }
  std::map<std::string, std::string> metadata = {{"kvfile.model", r->identity().model_id},
                                                 {"kvfile.fingerprint", safetensors::FingerprintHex(r->identity().fingerprint)}};
  // An nvfp4 stream's codes are per token: its rows x width travel here.
  for (const StreamSpec& spec : g.streams)
    if (p.codes && IsNvfp4(spec.dtype))
      metadata["kvfile.shape." + spec.name] = std::to_string(spec.rows_per_token) + "x" + std::to_string(spec.row_width);
  // Streams absent from some layers (safetensors.h): which layers, and of how many.
  if (g.HasLayerSets()) metadata["kvfile.layer_count"] = std::to_string(g.layers);
  for (const StreamSpec& spec : g.streams)
    if (!spec.layers.empty()) metadata["kvfile.layers." + spec.name] = FormatLayerList(spec.layers);
  // The index of layer l in stream s's tensors.
  auto tensor_layer = [&g](uint32_t l, uint32_t s) -> uint64_t {
    const std::vector<uint32_t>& ls = g.streams[s].layers;
    return ls.empty() ? l : static_cast<uint64_t>(std::lower_bound(ls.begin(), ls.end(), l) - ls.begin());
  };
  std::unique_ptr<SafetensorsWriter> w;
  KVFILE_RETURN_IF_ERROR(SafetensorsWriter::Create(tmp, std::move(tensors), metadata, nullptr, &w));
  {
    std::vector<uint8_t> buf;
    auto ids = r->tokens();
    for (uint64_t t0 = 0; t0 < T; t0 += 65536) {
      uint64_t n = std::min<uint64_t>(65536, T - t0);
      buf.resize(n * 8);
      for (uint64_t i = 0; i < n; ++i) PutU64Le(&buf[i * 8], ids[t0 + i]);
      KVFILE_RETURN_IF_ERROR(w->Write(0, t0 * 8, buf.data(), buf.size()));
      KVFILE_RETURN_IF_ERROR(CheckInterrupt(in));
    }
  }
  std::vector<uint8_t> data;
  std::vector<float> scales;
  Progress progress("export " + in, T * g.layers * items.size());
  if (!p.codes) {
    // Decoded values, every tensor of one dtype: one pass over the file per
    // block of tokens (ReadMany reads each chunk's sections once, checks and
    // decodes them), then each (layer, stream) block is one contiguous run
    // of its tensor. Small buffers, mapped with huge pages and reused:
    // measured on /dev/shm, first touches of fresh 4 KiB pages cost more
    // than the decode (a 128 MiB std::vector took seconds to fault in).
    const size_t S = g.streams.size();
    const uint64_t elem = ElementSize(out_dtype);
    uint64_t per_token = 0;
    for (const StreamSpec& spec : g.streams) per_token += spec.ElementsPerToken() * elem;
    const uint64_t block = safetensors::BlockTokens(per_token * g.layers, uint64_t{32} << 20);
    // Two buffers: a block is written (by a second thread) while the next
    // one is read and decoded (by every core), so the decode and the copy
    // into the destination overlap.
    const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
    const uint64_t buf_bytes = std::min(block, T) * per_token * g.layers;
    bench::BigBuffer bufs[2] = {bench::BigBuffer(buf_bytes), bench::BigBuffer(buf_bytes)};
    if (!bufs[0].ok() || !bufs[1].ok()) return Status::IOError(in + ": out of memory for the export buffer");
    std::vector<RowsTarget> targets[2];
    for (int k = 0; k < 2; ++k) {
      uint64_t at = 0;
      for (uint32_t l = 0; l < g.layers; ++l)
        for (uint32_t s = 0; s < S; ++s) {
          if (!g.InLayer(l, s)) continue;
          targets[k].push_back({l, s, bufs[k].data() + at * std::min(block, T)});
          at += g.streams[s].ElementsPerToken() * elem;
        }
    }
    auto write_block = [&](const std::vector<RowsTarget>& tg, uint64_t t0, uint64_t n) -> Status {
      for (const RowsTarget& t : tg) {
        uint64_t row = g.streams[t.stream].ElementsPerToken() * elem;
        KVFILE_RETURN_IF_ERROR(w->Write(t.stream + 1, (tensor_layer(t.layer, t.stream) * T + t0) * row, t.dst, n * row));
      }
      return Status::OK();
    };
    std::future<Status> pending;
    auto finish_pending = [&]() -> Status { return pending.valid() ? pending.get() : Status::OK(); };
    int k = 0;
    for (uint64_t t0 = 0; t0 < T; t0 += block, k ^= 1) {
      Status st = CheckInterrupt(in);
      uint64_t n = std::min(block, T - t0);
      if (st.ok()) st = r->ReadMany(targets[k], t0, t0 + n, out_dtype, threads);
      Status written = finish_pending();  // the other buffer is free again
      KVFILE_RETURN_IF_ERROR(written);
      KVFILE_RETURN_IF_ERROR(st);
      pending = std::async(std::launch::async, write_block, std::cref(targets[k]), t0, n);
      progress.Add(n * g.layers * S);
    }
    KVFILE_RETURN_IF_ERROR(finish_pending());
    items.clear();  // done
  }
  for (size_t k = 0; k < items.size(); ++k) {
    const Item& it = items[k];
    const StreamSpec& spec = g.streams[it.stream];
    uint64_t elem = it.part == Part::kScales ? 0 : ElementSize(it.dtype);
    uint64_t per_token = spec.ElementsPerToken() * std::max<uint64_t>(elem, 1) + spec.rows_per_token * 4;
    uint64_t block = safetensors::BlockTokens(per_token, uint64_t{64} << 20);
    for (uint32_t l = 0; l < g.layers; ++l) {
      if (!g.InLayer(l, it.stream)) continue;
      const uint64_t tl = tensor_layer(l, it.stream);
      for (uint64_t t0 = 0; t0 < T; t0 += block) {
        KVFILE_RETURN_IF_ERROR(CheckInterrupt(in));
        uint64_t n = std::min(block, T - t0);
        uint64_t rows = n * spec.rows_per_token;
        uint64_t first_row = (tl * T + t0) * spec.rows_per_token;
        progress.Add(n);
        if (IsNvfp4(spec.dtype) && it.part != Part::kValues) {
          const uint64_t width = spec.ElementsPerToken(), first_token = tl * T + t0;
          data.resize(n * (width / 2 + width / 16));
          uint8_t* blocks = data.data() + n * width / 2;
          scales.resize(n);
          KVFILE_RETURN_IF_ERROR(r->ReadCodes(l, it.stream, t0, t0 + n, data.data(), blocks, scales.data()));
          if (it.part == Part::kCodes)
            KVFILE_RETURN_IF_ERROR(w->Write(k + 1, first_token * width / 2, data.data(), n * width / 2));
          else if (it.part == Part::kBlockScales)
            KVFILE_RETURN_IF_ERROR(w->Write(k + 1, first_token * width / 16, blocks, n * width / 16));
          else
            KVFILE_RETURN_IF_ERROR(w->Write(k + 1, first_token * 4, scales.data(), n * 4));
        } else if (it.part == Part::kValues) {
          data.resize(rows * spec.row_width * elem);
          KVFILE_RETURN_IF_ERROR(r->ReadRows(l, it.stream, t0, t0 + n, it.dtype, data.data()));
          KVFILE_RETURN_IF_ERROR(w->Write(k + 1, first_row * spec.row_width * elem, data.data(), data.size()));
        } else {
          data.resize(rows * spec.row_width);
          scales.resize(rows);
          KVFILE_RETURN_IF_ERROR(r->ReadCodes(l, it.stream, t0, t0 + n, data.data(), scales.data()));
          if (it.part == Part::kCodes)
            KVFILE_RETURN_IF_ERROR(w->Write(k + 1, first_row * spec.row_width, data.data(), data.size()));
          else
            KVFILE_RETURN_IF_ERROR(w->Write(k + 1, first_row * 4, scales.data(), rows * 4));
        }
      }
    }
  }
  std::string list;
  for (const TensorInfo& t : w->tensors())
    list += (list.empty() ? "" : ", ") + t.name + " " + safetensors::DTypeName(t.dtype);
  KVFILE_RETURN_IF_ERROR(w->Close());
  *summary = std::to_string(T) + " tokens; " + list + "; " + std::to_string(FileSize(tmp)) + " bytes";
  return Status::OK();
}

// ---- .kv -> llama.cpp state file (kvfile/formats/llama.h) ------------------------------------------

Status ExportToLlama(const std::string& in, const std::string& tmp, const Plan& p, std::string* summary,
                     std::string* warning) {
  std::unique_ptr<Reader> r;
  KVFILE_RETURN_IF_ERROR(Reader::Open(in, {}, &r));
  uint64_t T = 0;
  KVFILE_RETURN_IF_ERROR(CheckInput(in, *r, p, &T, warning));
  std::string w;
  ProgressReports bars;
  ConvertOptions o = LibraryOptions(&bars);
  o.llama = p.llama;
  KVFILE_RETURN_IF_ERROR(llama::Export(in, *r, T, tmp, o, summary, &w));
  if (!w.empty()) *warning = warning->empty() ? w : *warning + "; " + w;
  return Status::OK();
}

// ---- One conversion, written atomically ----------------------------------------------------

struct Outcome {
  Status status;
  std::string line{};   // stdout line on success
  std::string warning{};  // stderr line on success (--salvage), or ""
};

Status ExistsError(const std::string& out) {
  return Status::InvalidArgument(out + ": file exists; use --force to replace it");
}

Outcome ConvertOne(const std::string& in, const std::string& out, Kind in_kind, Kind out_kind, const Plan& p,
                   bool force) {
  // OUT is written under a temporary name and replaces the destination
  // only when complete (kvfile/replace.h); on failure it is removed.
  std::unique_ptr<PendingReplace> replace;
  Status st = PendingReplace::Begin(out, nullptr, &replace);
  if (!st.ok()) return {st, ""};
  if (replace->original().exists && !force) return {ExistsError(out), ""};
  const std::string& tmp = replace->temp_path();
  std::string summary, warning;
  if (in_kind == Kind::kKv && out_kind == Kind::kKv) st = KvToKv(in, tmp, p, &summary, &warning);
  else if (in_kind == Kind::kSafetensors) st = Import(in, tmp, p, &summary);
  else if (in_kind == Kind::kLlama) {
    ProgressReports bars;
    ConvertOptions o = LibraryOptions(&bars);
    o.dtype = p.dtype;
    o.keep_raw = p.keep_raw;
    o.chunk_tokens = p.chunk_tokens;
    o.kv_major = p.major;
    o.llama.head_size = p.head_size;
    o.llama.model = p.model;
    o.llama.rotated = p.rotated;
    o.llama.unrotate = p.unrotate;
    ConvertReport rep;
    st = llama::Import(in, o, tmp, &rep);
    summary = rep.summary;
  }
  else if (out_kind == Kind::kLlama) st = ExportToLlama(in, tmp, p, &summary, &warning);
  else st = Export(in, tmp, p, &summary, &warning);
  if (!st.ok() && PendingSignal()) st = CheckInterrupt(out);  // a signal ended it: OUT is as it was
  if (st.ok()) st = replace->Commit();
  if (!st.ok()) return {st, ""};
  return {st, in + " -> " + out + ": " + summary, warning};
}

int Report(const std::vector<Outcome>& outcomes) {
  int code = kExitOk;
  for (const Outcome& o : outcomes) {
    if (o.status.ok()) {
      std::printf("%s\n", o.line.c_str());
      if (!o.warning.empty()) {
        std::fflush(stdout);
        PrintLine("warning", o.warning);
      }
      continue;
    }
    int c = ReportError(o.status);
    if (c == kExitUsage || code == kExitOk) code = c;
  }
  return code;
}

// ---- Directories ----------------------------------------------------------------------------

int ConvertTree(const ConvertArgs& a, const Plan& p) {
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
    if (p.dtype && IsQuantized(*p.dtype))
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
  std::atomic<size_t> next{0};
  // After a signal no further file is started; the ones in flight stop at
  // their next batch, and the signal is reported once, after the others.
  auto work = [&] {
    for (size_t i; !PendingSignal() && (i = next.fetch_add(1)) < files.size();) {
      try {
        outcomes[i] = ConvertOne(files[i], outs[i], KindOf(files[i]), to, p, a.force);
      } catch (const std::bad_alloc&) {
        outcomes[i] = {Status::Failed(files[i] + ": out of memory"), "", ""};
      }
      if (PendingSignal() && !outcomes[i].status.ok()) outcomes[i] = {};  // reported below, once
    }
  };
  unsigned jobs = std::max(1u, std::min<unsigned>(a.jobs, static_cast<unsigned>(files.size())));
  std::vector<std::thread> pool;
  for (unsigned j = 1; j < jobs; ++j) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
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
  ProgressReports bars;
  ConvertOptions o = LibraryOptions(&bars);
  o.to = to;
  o.force = a.force;
  o.mooncake.group_size = a.group_size;
  o.coli.vocab = a.vocab;
  o.coli.v1 = a.format == "coli-v1";
  o.coli.indexer_layers = a.indexer_layers;
  ConvertReport rep;
  Status st = Convert(a.in, a.out, o, &rep);
  bars.Finish();
  if (!st.ok() && PendingSignal()) st = CheckInterrupt(a.out);  // a signal: OUT stays as it was
  if (!st.ok()) return ReportError(st);
  std::printf("%s -> %s: %s\n", a.in.c_str(), a.out.c_str(), rep.summary.c_str());
  std::fflush(stdout);
  for (const std::string& n : rep.notes) PrintLine("note", n);
  for (const std::string& w : rep.warnings) PrintLine("warning", w);
  return kExitOk;
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
  Plan p;
  p.major = a.format == "v1" ? 1 : 2;
  bool to_llama = a.format.starts_with("llama-");
  if (a.dtype && (*a.dtype == "q8_0" || a.dtype->find('=') != std::string::npos) && !to_llama)
    return UsageError("--dtype " + *a.dtype + " applies to --format llama-seq|llama-session");
  if (to_llama && a.dtype) {
    if (Status st = llama::CheckExportType(*a.dtype); !st.ok()) return ReportError(st);
  } else if (a.dtype) {
    p.dtype = ParseDtype(*a.dtype);
  }
  p.head_size = a.head_size;
  p.model = a.model;
  if (a.rotated) p.rotated = *a.rotated == "yes";
  p.unrotate = a.unrotate;
  p.llama.session = a.format == "llama-session";
  p.llama.type = a.dtype;
  p.llama.v_trans = a.v_trans;
  p.llama.arch = a.arch;
  p.llama.rotated = p.rotated;
  p.llama.n_stream = a.n_stream;
  if (!to_llama && (a.v_trans || a.arch || a.n_stream))
    return UsageError("--v-trans, --arch and --n-stream apply to --format llama-seq|llama-session");
  if (to_llama && a.unrotate)
    return UsageError("--unrotate applies to a llama.cpp state IN (an export rotates or un-rotates rows as the "
                      "context's cache type needs, see --rotated)");
  if (p.major == 1 && p.dtype && IsQuantized(*p.dtype))
    return UsageError("--format v1 stores raw rows: --dtype must be bf16, f16 or f32");
  if (p.major == 1 && !a.keep_raw.empty()) return UsageError("--keep-raw applies to v2 output (v1 is all raw)");
  p.keep_raw.insert(a.keep_raw.begin(), a.keep_raw.end());
  p.codes = a.codes;
  p.chunk_tokens = a.chunk_tokens;
  p.salvage = a.salvage;
  std::error_code ec;
  // PACK:MEMBER: a .kv IN, materialised (and checked) first (pack_member.h).
  PackMemberInputs members;
  std::string in = a.in, pack_path, member;
  const bool from_pack = SplitPackMember(a.in, &pack_path, &member);
  if (from_pack) {
    Status st = members.Resolve(a.in, &in);
    if (!st.ok()) return ReportError(st);
  }
  auto convert_one = [&](Kind in_kind, Kind out_kind) {
    Outcome o = ConvertOne(in, a.out, in_kind, out_kind, p, a.force);
    o.status = members.Name(o.status);
    o.line = members.Name(o.line);
    o.warning = members.Name(o.warning);
    return Report({o});
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
  // Mooncake record directories and colibri .coli_kv sessions (the drivers of kvfile/convert.h).
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
    return ConvertTree(a, p);
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
    return convert_one(in_kind, out_kind);
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
    if (p.dtype && IsQuantized(*p.dtype))
      return UsageError("--dtype " + *a.dtype + ": export decodes to bf16, f16 or f32; use --codes for codes");
  }
  return convert_one(in_kind, out_kind);
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
            // k=TYPE,v=TYPE is checked with the other llama.cpp export flags (CheckLlamaDtype).
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
