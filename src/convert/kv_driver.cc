// SPDX-License-Identifier: Apache-2.0
// The .kv driver: a checked .kv -> .kv (re-encode to the dtype policy,
// re-chunk, compact, format 1 <-> 2). Every other driver imports into or
// exports from a .kv, so this one has no import.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <vector>

#include "convert/driver.h"
#include "format/kv_format.h"
#include "kvfile/reader.h"
#include "kvfile/formats/safetensors.h"
#include "kvfile/writer.h"

namespace kvfile::convert {

namespace {

bool SniffKv(std::span<const uint8_t> head, const std::string&, bool dir) {
  return !dir && head.size() >= sizeof format::kFileMagic &&
         std::memcmp(head.data(), format::kFileMagic, sizeof format::kFileMagic) == 0;
}

// The output's dtype of each stream: a format 1 output decodes quantized
// streams (bf16 unless a raw dtype is given); a format 1 input into format 2
// is quantized as the upgrade does (e4m3 unless a dtype is given); else the
// dtype policy (TargetDtype).
Geometry OutputGeometry(const Reader& r, const ConvertOptions& o) {
  Geometry g = r.geometry();
  for (StreamSpec& s : g.streams) {
    if (o.kv_major == 1) s.dtype = o.dtype ? *o.dtype : IsQuantized(s.dtype) ? Dtype::kBF16 : s.dtype;
    else if (r.major_version() == 1 && !o.keep_raw.count(s.name) && (!o.dtype || IsQuantized(*o.dtype)))
      s.dtype = o.dtype.value_or(Dtype::kE4M3);
    else s.dtype = TargetDtype(s.name, s.dtype, o);
  }
  return g;
}

Status Transcode(Reader& r, const std::string& in, uint64_t total, const ConvertOptions& o,
                 const std::string& out_path, ConvertReport* report) {
  const Geometry& gi = r.geometry();
  std::vector<std::string> names;
  for (const StreamSpec& s : gi.streams) names.push_back(s.name);
  KVFILE_RETURN_IF_ERROR(CheckKeepRaw(o, names, in));
  const Geometry go = OutputGeometry(r, o);
  WriterOptions wo;
  wo.fs = o.fs;
  wo.format_major = o.kv_major;
  wo.chunk_tokens = ChunkTokens(o, go, r.nominal_chunk_tokens(), in);
  wo.threads = 0;
  std::unique_ptr<Writer> w;
  KVFILE_RETURN_IF_ERROR(Writer::Create(out_path, go, r.identity(), wo, &w));
  const size_t S = gi.streams.size();
  uint64_t per_token = 0;
  for (const StreamSpec& s : gi.streams) per_token += s.ElementsPerToken() * 5;  // f32 or codes + scales
  const uint64_t block = safetensors::BlockTokens(per_token * gi.layers, kBufferBudget);
  std::vector<std::vector<uint8_t>> data(gi.layers * S);
  std::vector<std::vector<float>> scales(gi.layers * S);
  auto ids = r.tokens();
  const std::string label = "convert " + in;
  for (uint64_t t0 = 0; t0 < total; t0 += block) {
    uint64_t n = std::min(block, total - t0);
    Progress(o, label, t0 + n, total);
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
        if (IsQuantized(si.dtype) && si.dtype == to) {
          // The same quantized dtype: its stored parts (kDtypeTable) copied exactly.
          const CodecRows cr = CodecRowsOf(to, si.rows_per_token, si.row_width);
          const uint64_t crows = n * cr.per_token;
          const uint64_t code_bytes = PartBytes(to, DtypePart::kCodes, crows, cr.width);
          const uint64_t block_bytes = PartBytes(to, DtypePart::kBlockScales, crows, cr.width);
          data[i].resize(code_bytes + block_bytes);
          scales[i].resize(crows);
          uint8_t* blocks = block_bytes ? data[i].data() + code_bytes : nullptr;
          KVFILE_RETURN_IF_ERROR(r.ReadParts(l, s, t0, t0 + n, {data[i].data(), blocks, scales[i].data()}));
          batch.blocks.push_back({to, data[i].data(), scales[i].data(), blocks});
        } else {
          // Decoded (fp8 and nvfp4 targets: to f32, then quantized by the writer).
          Dtype read_as = IsQuantized(to) ? Dtype::kF32 : to;
          data[i].resize(elems * ElementSize(read_as));
          KVFILE_RETURN_IF_ERROR(r.ReadRows(l, s, t0, t0 + n, read_as, data[i].data()));
          batch.blocks.push_back({read_as, data[i].data(), nullptr});
        }
      }
    }
    Status st = w->Append(batch);
    if (!st.ok()) return st.WithContext(in);
    KVFILE_RETURN_IF_ERROR(CheckInterrupted(o, in));
  }
  KVFILE_RETURN_IF_ERROR(w->Close());
  std::error_code ec;
  const uint64_t bytes = std::filesystem::file_size(out_path, ec);
  report->tokens = total;
  report->summary = std::to_string(total) + " tokens; " + StreamList(go) + "; " + std::to_string(wo.chunk_tokens) +
                    " tokens per chunk; " + std::to_string(ec ? 0 : bytes) + " bytes";
  return Status::OK();
}

}  // namespace

const Driver kKvDriver = {Format::kKv, false, ".kv", SniffKv, nullptr, Transcode};

}  // namespace kvfile::convert

namespace kvfile::safetensors {

// Declared with the safetensors format (kvfile/formats/safetensors.h), kept
// here in the core: the .kv driver sizes its batches by it in every build.
uint64_t BlockTokens(uint64_t bytes_per_token, uint64_t budget) {
  if (bytes_per_token == 0) return 65536;
  return std::clamp<uint64_t>(budget / bytes_per_token, 1, 65536);
}

}  // namespace kvfile::safetensors
