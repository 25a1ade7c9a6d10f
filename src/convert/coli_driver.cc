// SPDX-License-Identifier: Apache-2.0
// The colibri driver of kvfile::Convert (driver.h): .coli_kv sessions
// (COLIKV1, COLIKV2) -> .kv and .kv -> COLIKV2 (or COLIKV1 with
// o.coli.v1). The layout and the record checks are in kvfile/formats/coli_kv.h
// (coli_kv.cc); this file maps the options and says what was done.
#include <memory>
#include <vector>

#include "convert/driver.h"
#include "kvfile/formats/coli_kv.h"

namespace kvfile::convert {

namespace {

// IN (a session) -> a new .kv at kv_path.
Status ImportKv(const std::string& in, const ConvertOptions& o, const std::string& kv_path, ConvertReport* r) {
  if (o.dtype || !o.keep_raw.empty() || o.kv_major != 2)
    return Status::InvalidArgument(in + ": a colibri session is imported as its e4m3 latent and rope rows into a "
                                   "format 2 .kv file: a dtype, raw streams or format 1 do not apply");
  coli::ImportOptions io;
  io.fs = o.fs;
  io.chunk_tokens = o.chunk_tokens;
  if (o.coli.indexer_layers) {
    std::vector<uint32_t> layers;
    Status st = ParseLayerList(*o.coli.indexer_layers, &layers);
    if (!st.ok()) return Status::InvalidArgument("--indexer-layers: " + st.message());
    io.indexer_layers = std::move(layers);
  }
  const std::string label = "import " + in;
  io.on_batch = [&](uint64_t done, uint64_t total) {
    Progress(o, label, done, total);
    return CheckInterrupted(o, in);
  };
  coli::ImportResult res;
  KVFILE_RETURN_IF_ERROR(coli::Import(in, kv_path, io, &res));
  const coli::Header& h = res.header;
  r->tokens = h.records;
  r->summary = "COLIKV" + std::to_string(h.version) + ", " + std::to_string(h.records) + " tokens, " +
               std::to_string(h.layers) + " layers (latent " + std::to_string(h.kv_lora) + ", rope " +
               std::to_string(h.qk_rope) + (h.indexer_layers ? ", indexer " + std::to_string(h.index_hd) : "") +
               (h.indexer_layer_list.empty() ? "" : " in layers " + FormatLayerList(h.indexer_layer_list)) +
               "), vocab " + std::to_string(h.vocab);
  std::string parts;
  if (h.version == 1) parts = "COLIKV1 f32 latent and rope rows quantized to e4m3 (kvfile's row rule)";
  if (res.ignored_bytes > 0)
    parts += (parts.empty() ? "" : "; ") + std::to_string(res.ignored_bytes) +
             " bytes past the record count ignored (an uncommitted append, as colibri ignores it)";
  if (!parts.empty()) r->notes.push_back(in + ": " + parts);
  return Status::OK();
}

// The first `tokens` tokens of a checked .kv -> a session at out_path.
Status ExportKv(Reader& in, const std::string& in_name, uint64_t tokens, const ConvertOptions& o,
                const std::string& out_path, ConvertReport* r) {
  coli::ExportOptions eo;
  eo.vocab = o.coli.vocab;
  eo.version = o.coli.v1 ? 1 : 2;
  eo.fs = o.fs;
  const std::string label = "export " + in_name;
  eo.on_batch = [&](uint64_t done, uint64_t total) {
    Progress(o, label, done, total);
    return CheckInterrupted(o, in_name);
  };
  KVFILE_RETURN_IF_ERROR(coli::Export(in, in_name, tokens, out_path, eo));
  r->tokens = tokens;
  r->summary = "COLIKV" + std::to_string(eo.version) + ", " + std::to_string(tokens) + " tokens";
  return Status::OK();
}

}  // namespace

extern const Driver kColiDriver = {Format::kColi, false, ".coli_kv", SniffColi, ImportKv, ExportKv};

}  // namespace kvfile::convert
