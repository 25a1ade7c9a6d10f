// SPDX-License-Identifier: Apache-2.0
// The safetensors driver: a file that follows the kvfile naming convention
// (kvfile_naming.h) -> .kv, and a checked .kv -> such a file (values
// decoded to one dtype, or codes and scales as stored). The file format
// itself is safetensors.cc.
#include <algorithm>
#include <filesystem>
#include <future>
#include <thread>

#include "convert/driver.h"
#include "convert/kvfile_naming.h"
#include "io/page_buffer.h"
#include "kvfile/reader.h"
#include "kvfile/formats/safetensors.h"
#include "kvfile/writer.h"

namespace kvfile::convert {

namespace {

using safetensors::DType;
using safetensors::KvStream;
using safetensors::KvTensors;
using safetensors::SafetensorsFile;
using safetensors::SafetensorsWriter;
using safetensors::TensorInfo;

uint64_t FileSize(const std::string& path) {
  std::error_code ec;
  uint64_t n = std::filesystem::file_size(path, ec);
  return ec ? 0 : n;
}

// ---- import ----

Status Import(const std::string& in, const ConvertOptions& o, const std::string& kv_path, ConvertReport* r) {
  std::unique_ptr<SafetensorsFile> f;
  KVFILE_RETURN_IF_ERROR(SafetensorsFile::Open(in, o.fs, &f));
  KvTensors kv;
  Status st = safetensors::DescribeKv(f->header(), &kv);
  if (!st.ok()) return st.WithContext(in);
  std::vector<std::string> names;
  for (const KvStream& s : kv.streams) names.push_back(s.name);
  KVFILE_RETURN_IF_ERROR(CheckKeepRaw(o, names, in));
  std::vector<uint32_t> ids;
  KVFILE_RETURN_IF_ERROR(safetensors::ReadTokenIds(*f, kv, &ids));
  Geometry g;
  g.layers = kv.layers;
  std::vector<size_t> stream_of;
  for (size_t i = 0; i < kv.streams.size(); ++i) {
    const KvStream& s = kv.streams[i];
    // Codes are a quantized stream as stored; values are a raw stream as
    // stored with `codes`, else decoded values to quantize (e4m3 by default).
    Dtype have = s.source_dtype();
    Dtype to;
    if (o.kv_major == 1) {
      if (s.is_codes())
        return Status::InvalidArgument(in + ": stream '" + s.name +
                                       "' holds fp8 codes; a v1 output stores raw rows (import it as v2, "
                                       "then convert that with --format v1)");
      to = o.dtype.value_or(have);
    } else if (s.is_codes() || o.codes) to = TargetDtype(s.name, have, o);
    else if (o.keep_raw.count(s.name)) to = o.dtype && !IsQuantized(*o.dtype) ? *o.dtype : Dtype::kBF16;
    else to = o.dtype.value_or(Dtype::kE4M3);
    g.streams.push_back({s.name, s.rows_per_token, s.row_width, to, s.layers});
    stream_of.push_back(i);
  }
  st = g.Validate();
  if (!st.ok()) return st.WithContext(in);
  ModelIdentity id{kv.model_id.value_or(""), kv.fingerprint.value_or(0)};
  WriterOptions wo;
  wo.fs = o.fs;
  wo.format_major = o.kv_major;
  wo.chunk_tokens = ChunkTokens(o, g, 256, in);
  wo.threads = 0;  // quantize on every core (the bytes do not depend on it)
  std::unique_ptr<Writer> w;
  KVFILE_RETURN_IF_ERROR(Writer::Create(kv_path, g, id, wo, &w));
  uint64_t per_token = 0;
  for (const StreamSpec& s : g.streams) per_token += s.ElementsPerToken() * 12;
  const uint64_t block = safetensors::BlockTokens(per_token * g.layers, kBufferBudget);
  const std::string label = "import " + in;
  uint64_t done = 0;
  KVFILE_RETURN_IF_ERROR(safetensors::AppendAll(*f, kv, ids, stream_of, *w, block, [&] {
    done = std::min(done + block, kv.tokens);
    Progress(o, label, done, kv.tokens);
    return CheckInterrupted(o, in);
  }));
  Progress(o, label, kv.tokens, kv.tokens);
  KVFILE_RETURN_IF_ERROR(w->Close());
  r->tokens = kv.tokens;
  r->summary = std::to_string(kv.tokens) + " tokens; " + StreamList(g) + "; " + std::to_string(wo.chunk_tokens) +
               " tokens per chunk; " + std::to_string(FileSize(kv_path)) + " bytes";
  return Status::OK();
}

// ---- export ----

// A u64 as 8 little-endian bytes (safetensors' byte order).
void PutU64Le(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

// Every stream decoded to `dtype`: one pass over the file per block of
// tokens (ReadMany reads each chunk's sections once, checks and decodes
// them), then each (layer, stream) block is one contiguous run of its
// tensor. Two buffers: a block is written (by a second thread) while the
// next one is read and decoded (by every core), so the decode and the copy
// into the destination overlap. Page buffers, reused: first touches of
// fresh 4 KiB pages cost more than the decode (io/page_buffer.h).
Status WriteValues(Reader& r, const std::string& in, uint64_t T, Dtype dtype, const ConvertOptions& o,
                   SafetensorsWriter& w, const std::string& label, uint64_t total) {
  const Geometry& g = r.geometry();
  const size_t S = g.streams.size();
  const uint64_t elem = ElementSize(dtype);
  uint64_t per_token = 0;
  for (const StreamSpec& spec : g.streams) per_token += spec.ElementsPerToken() * elem;
  const uint64_t block = safetensors::BlockTokens(per_token * g.layers, uint64_t{32} << 20);
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  const uint64_t buf_bytes = std::min(block, T) * per_token * g.layers;
  internal::PageBuffer bufs[2];
  if (!bufs[0].Resize(buf_bytes) || !bufs[1].Resize(buf_bytes))
    return Status::IOError(in + ": out of memory for the export buffer");
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
      uint64_t first = safetensors::naming::TensorLayer(g, t.layer, t.stream) * T + t0;
      KVFILE_RETURN_IF_ERROR(w.Write(t.stream + 1, first * row, t.dst, n * row));
    }
    return Status::OK();
  };
  std::future<Status> pending;
  auto finish_pending = [&]() -> Status { return pending.valid() ? pending.get() : Status::OK(); };
  int k = 0;
  for (uint64_t t0 = 0; t0 < T; t0 += block, k ^= 1) {
    Status st = CheckInterrupted(o, in);
    uint64_t n = std::min(block, T - t0);
    if (st.ok()) st = r.ReadMany(targets[k], t0, t0 + n, dtype, threads);
    Status written = finish_pending();  // the other buffer is free again
    KVFILE_RETURN_IF_ERROR(written);
    KVFILE_RETURN_IF_ERROR(st);
    pending = std::async(std::launch::async, write_block, std::cref(targets[k]), t0, n);
    Progress(o, label, (t0 + n) * g.layers * S, total);
  }
  return finish_pending();
}

// Each tensor of `items` in turn (values, or the parts of a stream as
// stored). A quantized stream's parts are consecutive items (PlanExport):
// they are read together once per block and each written to its tensor.
Status WriteParts(Reader& r, const std::string& in, uint64_t T, const std::vector<safetensors::naming::ExportTensor>& items,
                  const ConvertOptions& o, SafetensorsWriter& w, const std::string& label, uint64_t total) {
  const Geometry& g = r.geometry();
  std::vector<uint8_t> data;
  std::vector<float> scales;
  uint64_t done = 0;
  for (size_t k = 0, next = 0; k < items.size(); k = next) {
    const safetensors::naming::ExportTensor& it = items[k];
    for (next = k + 1; it.part && next < items.size() && items[next].part && items[next].stream == it.stream;) ++next;
    const StreamSpec& spec = g.streams[it.stream];
    uint64_t elem = it.part ? 0 : ElementSize(it.dtype);
    uint64_t per_token = spec.ElementsPerToken() * std::max<uint64_t>(elem, 1) + spec.rows_per_token * 4;
    uint64_t block = safetensors::BlockTokens(per_token, uint64_t{64} << 20);
    for (uint32_t l = 0; l < g.layers; ++l) {
      if (!g.InLayer(l, it.stream)) continue;
      const uint64_t tl = safetensors::naming::TensorLayer(g, l, it.stream);
      for (uint64_t t0 = 0; t0 < T; t0 += block) {
        KVFILE_RETURN_IF_ERROR(CheckInterrupted(o, in));
        uint64_t n = std::min(block, T - t0);
        done += n * (next - k);
        Progress(o, label, done, total);
        if (!it.part) {
          const uint64_t bytes = n * spec.ElementsPerToken() * elem;
          data.resize(bytes);
          KVFILE_RETURN_IF_ERROR(r.ReadRows(l, it.stream, t0, t0 + n, it.dtype, data.data()));
          KVFILE_RETURN_IF_ERROR(w.Write(k + 1, (tl * T + t0) * spec.ElementsPerToken() * elem, data.data(), bytes));
          continue;
        }
        // The stored dtype's parts (kDtypeTable), each at its offset in its tensor.
        const Dtype d = spec.dtype;
        const CodecRows cr = CodecRowsOf(d, spec.rows_per_token, spec.row_width);
        const uint64_t crows = n * cr.per_token, first = (tl * T + t0) * cr.per_token;
        const uint64_t code_bytes = PartBytes(d, DtypePart::kCodes, crows, cr.width);
        data.resize(code_bytes + PartBytes(d, DtypePart::kBlockScales, crows, cr.width));
        scales.resize(crows);
        uint8_t* blocks = data.data() + code_bytes;
        KVFILE_RETURN_IF_ERROR(r.ReadParts(l, it.stream, t0, t0 + n, {data.data(), blocks, scales.data()}));
        for (size_t j = k; j < next; ++j) {
          const DtypePart p = *items[j].part;
          const void* src = p == DtypePart::kCodes         ? static_cast<const void*>(data.data())
                            : p == DtypePart::kBlockScales ? static_cast<const void*>(blocks)
                                                           : static_cast<const void*>(scales.data());
          KVFILE_RETURN_IF_ERROR(
              w.Write(j + 1, PartBytes(d, p, first, cr.width), src, PartBytes(d, p, crows, cr.width)));
        }
      }
    }
  }
  return Status::OK();
}

Status Export(Reader& r, const std::string& in, uint64_t T, const ConvertOptions& o, const std::string& out_path,
              ConvertReport* report) {
  {
    std::string w;
    KVFILE_RETURN_IF_ERROR(CheckPlainRows(in, r, &w));
    if (!w.empty()) report->warnings.push_back(w);
  }
  const Geometry& g = r.geometry();
  const Dtype values = o.dtype.value_or(Dtype::kBF16);
  safetensors::naming::ExportLayout layout;
  KVFILE_RETURN_IF_ERROR(safetensors::naming::PlanExport(in, g, r.identity(), T, o.codes, values, &layout));
  std::unique_ptr<SafetensorsWriter> w;
  KVFILE_RETURN_IF_ERROR(SafetensorsWriter::Create(out_path, std::move(layout.tensors), layout.metadata, o.fs, &w));
  {
    std::vector<uint8_t> buf;
    auto ids = r.tokens();
    for (uint64_t t0 = 0; t0 < T; t0 += 65536) {
      uint64_t n = std::min<uint64_t>(65536, T - t0);
      buf.resize(n * 8);
      for (uint64_t i = 0; i < n; ++i) PutU64Le(&buf[i * 8], ids[t0 + i]);
      KVFILE_RETURN_IF_ERROR(w->Write(0, t0 * 8, buf.data(), buf.size()));
      KVFILE_RETURN_IF_ERROR(CheckInterrupted(o, in));
    }
  }
  const std::string label = "export " + in;
  const uint64_t total = T * g.layers * layout.items.size();
  if (o.codes) KVFILE_RETURN_IF_ERROR(WriteParts(r, in, T, layout.items, o, *w, label, total));
  else KVFILE_RETURN_IF_ERROR(WriteValues(r, in, T, values, o, *w, label, total));
  std::string list;
  for (const TensorInfo& t : w->tensors())
    list += (list.empty() ? "" : ", ") + t.name + " " + safetensors::DTypeName(t.dtype);
  KVFILE_RETURN_IF_ERROR(w->Close());
  report->summary = std::to_string(T) + " tokens; " + list + "; " + std::to_string(FileSize(out_path)) + " bytes";
  return Status::OK();
}

}  // namespace

const Driver kSafetensorsDriver = {Format::kSafetensors, false, ".safetensors", SniffSafetensors, Import, Export};

}  // namespace kvfile::convert
