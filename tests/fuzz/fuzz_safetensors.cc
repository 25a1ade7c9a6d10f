// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the safetensors importer on an arbitrary file, the way
// `kvfile convert x.safetensors y.kv` runs it: header parsing, the kvfile
// convention (DescribeKv), token ids, the value scan, then every token
// appended to a new .kv file in memory, which must read back whole with the
// file's token ids. A file whose values pass CheckValues must import.
#include <algorithm>

#include "fuzz/fuzz_support.h"
#include "kvfile/formats/safetensors.h"
#include "kvfile/writer.h"
#include "support/testing_hooks.h"

namespace {

// The staging buffers of the new file stay within this; a header may
// declare a huge geometry with no token at all.
constexpr uint64_t kChunkBudgetBytes = uint64_t{4} << 20;
// Small chunks, so that a small input still spans several of them.
constexpr uint64_t kMaxChunkTokens = 16;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvfile;
  namespace st = kvfile::safetensors;
  if (size > fuzz::kMaxInputBytes) return -1;
  auto fs = fuzz::FsHolding("in.safetensors", data, size);
  std::unique_ptr<st::SafetensorsFile> file;
  if (!st::SafetensorsFile::Open("in.safetensors", fs.get(), &file).ok()) return 0;
  st::KvTensors kv;
  if (!st::DescribeKv(file->header(), &kv).ok()) return 0;
  std::vector<uint32_t> ids;
  if (!st::ReadTokenIds(*file, kv, &ids).ok()) return 0;
  if (ids.size() != kv.tokens) fuzz::Fail("ReadTokenIds returned the wrong number of ids");
  const bool values_valid = st::CheckValues(*file, kv).ok();

  // Codes stay in their own fp8 dtype; values are quantized to e4m3 (the
  // import's default).
  Geometry g;
  g.layers = kv.layers;
  std::vector<size_t> stream_of;
  uint64_t token_bytes = 0;
  for (size_t i = 0; i < kv.streams.size(); ++i) {
    const st::KvStream& s = kv.streams[i];
    Dtype dtype = s.is_codes() ? s.source_dtype() : Dtype::kE4M3;
    g.streams.push_back({s.name, s.rows_per_token, s.row_width, dtype});
    stream_of.push_back(i);
    token_bytes += s.rows_per_token * (uint64_t{s.row_width} + 4);
  }
  if (!g.Validate().ok()) return 0;
  token_bytes *= g.layers;
  if (token_bytes > kChunkBudgetBytes) return 0;
  WriterOptions options;
  options.fs = fs.get();
  kvfile::hooks::SetWriterSalt(1);
  options.chunk_tokens = static_cast<uint32_t>(std::clamp<uint64_t>(kChunkBudgetBytes / token_bytes, 1, kMaxChunkTokens));
  ModelIdentity identity{kv.model_id.value_or(""), kv.fingerprint.value_or(0)};
  std::unique_ptr<Writer> writer;
  if (!kvfile::hooks::CreateWriter("out.kv", g, identity, options, &writer).ok()) return 0;
  Status s = st::AppendAll(*file, kv, ids, stream_of, *writer, st::BlockTokens(token_bytes * 3, kChunkBudgetBytes));
  if (values_valid && !s.ok()) fuzz::Fail("values CheckValues accepted do not import: " + s.ToString());
  if (!s.ok()) return 0;
  s = writer->Close();
  if (!s.ok()) fuzz::Fail("closing a memory file failed: " + s.ToString());
  writer.reset();

  std::unique_ptr<Reader> reader;
  s = fuzz::OpenReader(fs.get(), "out.kv", &reader);
  if (!s.ok()) fuzz::Fail("the imported file does not open: " + s.ToString());
  if (!std::ranges::equal(ids, reader->tokens())) fuzz::Fail("the imported file has other token ids");
  s = fuzz::ReadEverything(*reader);
  if (!s.ok()) fuzz::Fail("the imported file does not read back: " + s.ToString());
  return 0;
}
