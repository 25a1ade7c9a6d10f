// SPDX-License-Identifier: Apache-2.0
// The sweep fixtures and the read-back comparison (see sweep_fixtures.h).
#include "support/sweep_fixtures.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "format/chunk_layout.h"
#include "kvfile/presets.h"
#include "kvfile/reader.h"
#include "kvfile/writer.h"
#include "support/testing_hooks.h"
#include "support/fault_fs.h"

namespace kvfile::testing {

namespace {

constexpr uint8_t kSentinel = 0xA5;

// Rows of varied magnitude (so that scales differ row to row), all finite.
std::vector<float> MakeRows(SplitMix& rng, uint64_t n) {
  std::vector<float> v(n);
  for (float& x : v) {
    double unit = static_cast<double>(rng.Next() >> 11) / static_cast<double>(uint64_t{1} << 53);
    int exponent = static_cast<int>(rng.Below(12)) - 6;
    x = static_cast<float>((unit * 2.0 - 1.0) * std::ldexp(1.0, exponent));
  }
  return v;
}

// What a read of one stream's stored data returns per token: codes (or raw
// rows), and scales (fp8: one per row; nvfp4: per token its row scale, then
// its block scales, so that the bytes of a prefix of the tokens are a prefix
// of the bytes).
uint64_t ValueBytesPerToken(const StreamSpec& s) { return CodeBytes(s.dtype, s.ElementsPerToken()); }
uint64_t ScaleBytesPerToken(const StreamSpec& s) {
  return IsNvfp4(s.dtype) ? 4 + s.ElementsPerToken() / 16 : IsFp8(s.dtype) ? uint64_t{s.rows_per_token} * 4 : 0;
}
Status ReadStored(Reader& r, uint32_t l, uint32_t s, uint64_t n, uint8_t* values, uint8_t* scales) {
  const StreamSpec& spec = r.geometry().streams[s];
  if (IsNvfp4(spec.dtype)) {
    // Read apart, then laid out per token; the sentinel shows through where
    // a failed read left the destinations alone.
    const uint64_t blocks = spec.ElementsPerToken() / 16;
    std::vector<uint8_t> block_scales(n * blocks, kSentinel), row_scales(n * 4, kSentinel);
    Status st = r.ReadCodes(l, s, 0, n, values, block_scales.data(), reinterpret_cast<float*>(row_scales.data()));
    for (uint64_t t = 0; t < n; ++t) {
      std::memcpy(scales + t * (4 + blocks), &row_scales[t * 4], 4);
      std::memcpy(scales + t * (4 + blocks) + 4, &block_scales[t * blocks], blocks);
    }
    return st;
  }
  if (IsFp8(spec.dtype)) return r.ReadCodes(l, s, 0, n, values, reinterpret_cast<float*>(scales));
  return r.ReadRows(l, s, 0, n, spec.dtype, values);
}

}  // namespace

Geometry ShrunkPreset(const std::string& preset, uint16_t major) {
  Geometry g;
  if (!GetPreset(preset, Dtype::kE4M3, &g).ok()) return g;
  static constexpr Dtype kRawInTurn[] = {Dtype::kF32, Dtype::kF16, Dtype::kBF16};
  g.layers = std::min<uint32_t>(g.layers, 2);
  for (size_t i = 0; i < g.streams.size(); ++i) {
    StreamSpec& s = g.streams[i];
    // A layer set keeps its layers below the new count (glm-5.2's indexer:
    // layer 0 of 2); v1 has none.
    std::erase_if(s.layers, [&g](uint32_t l) { return l >= g.layers; });
    if (major == 1 || s.layers.size() == g.layers) s.layers.clear();
    s.rows_per_token = std::min<uint32_t>(s.rows_per_token, 2);
    s.row_width = std::min<uint32_t>(s.row_width, 32);
    if (major == 1 && IsFp8(s.dtype)) s.dtype = kRawInTurn[i % 3];
  }
  return g;
}

Status BuildFixture(const FixtureSpec& spec, SweepFixture* out) {
  SweepFixture f;
  f.name = spec.name;
  f.major = spec.major;
  f.geometry = spec.geometry;
  f.committed = spec.committed;
  f.salt = spec.salt;
  const Geometry& g = spec.geometry;
  const size_t stream_count = g.streams.size();

  FaultFs fs;
  WriterOptions opt;
  opt.fs = &fs;
  hooks::SetWriterSalt(spec.salt);
  opt.chunk_tokens = spec.chunk_tokens;
  opt.format_major = spec.major;
  opt.sync = spec.committed ? SyncMode::kClose : SyncMode::kNone;
  std::unique_ptr<Writer> w;
  Status created = hooks::CreateWriter(kSweepPath, g, {"sweep/" + spec.name, spec.seed}, opt, &w);
  hooks::SetWriterSalt(0);
  KVFILE_RETURN_IF_ERROR(created);
  SplitMix rng(spec.seed);
  std::vector<uint64_t> append_ends;  // token counts after each append
  // Appended in pieces of 1..3 tokens, so that chunks fill across appends.
  for (uint32_t done = 0; done < spec.tokens;) {
    uint32_t n = std::min<uint32_t>(spec.tokens - done, 1 + static_cast<uint32_t>(rng.Below(3)));
    std::vector<uint32_t> ids(n);
    for (uint32_t& id : ids) id = static_cast<uint32_t>(rng.Next());
    std::vector<std::vector<float>> rows;
    AppendBatch b;
    b.tokens = ids;
    for (uint32_t l = 0; l < g.layers; ++l)
      for (uint32_t s = 0; s < stream_count; ++s)
        rows.push_back(g.InLayer(l, s) ? MakeRows(rng, uint64_t{n} * g.streams[s].ElementsPerToken())
                                       : std::vector<float>{});
    // No rows (a RowBlock without data) where a stream is absent from a layer.
    for (const auto& r : rows) b.blocks.push_back(r.empty() ? RowBlock{} : RowBlock{Dtype::kF32, r.data(), nullptr});
    KVFILE_RETURN_IF_ERROR(w->Append(b));
    f.tokens.insert(f.tokens.end(), ids.begin(), ids.end());
    done += n;
    append_ends.push_back(done);
  }
  KVFILE_RETURN_IF_ERROR(w->Close());
  w.reset();
  f.bytes = fs.Image().at(kSweepPath);

  // The expected data is what a reader returns from the pristine file.
  std::unique_ptr<Reader> r;
  ReaderOptions ro;
  ro.fs = &fs;
  KVFILE_RETURN_IF_ERROR(Reader::Open(kSweepPath, ro, &r));
  if (r->token_count() != f.tokens.size() ||
      !std::equal(f.tokens.begin(), f.tokens.end(), r->tokens().begin()))
    return Status::Corruption(spec.name + ": pristine fixture reads back other tokens");
  if (r->tail().torn_tail_bytes != 0) return Status::Corruption(spec.name + ": pristine fixture has a tail");
  for (const ChunkInfo& c : r->chunks()) {
    if (c.committed != spec.committed) return Status::Corruption(spec.name + ": unexpected commit state");
    format::ChunkLayout layout;
    KVFILE_RETURN_IF_ERROR(format::ComputeChunkLayout(g, c.stored_tokens, &layout));
    ChunkSpan span{c.offset, c.offset + c.bytes, c.first_token + c.live_tokens, 0, format::kDataOffset, {}};
    if (spec.major == 1) {
      span.uncommitted_tokens = span.tokens_after;
      span.uncommitted_end = span.end;
    } else {
      for (uint64_t e : append_ends)
        if (e <= span.tokens_after) span.uncommitted_tokens = e;
      // The end of the first chunk that holds that many tokens.
      if (span.uncommitted_tokens > 0) {
        span.uncommitted_end = span.end;
        for (const ChunkSpan& before : f.chunks)
          if (before.tokens_after >= span.uncommitted_tokens) {
            span.uncommitted_end = before.end;
            break;
          }
      }
    }
    for (const format::SectionLayout& sec : layout.sections)
      span.sections.emplace_back(c.offset + sec.offset, c.offset + sec.end);
    f.chunks.push_back(std::move(span));
  }
  uint64_t n = f.tokens.size();
  for (uint32_t l = 0; l < g.layers; ++l) {
    for (uint32_t s = 0; s < stream_count; ++s) {
      const StreamSpec& spec_s = g.streams[s];
      StreamData d;
      if (!g.InLayer(l, s)) {  // absent: nothing stored
        f.streams.push_back(std::move(d));
        continue;
      }
      d.value_bytes_per_token = ValueBytesPerToken(spec_s);
      d.values.resize(n * d.value_bytes_per_token);
      d.scale_bytes_per_token = ScaleBytesPerToken(spec_s);
      d.scales.resize(n * d.scale_bytes_per_token);
      KVFILE_RETURN_IF_ERROR(ReadStored(*r, l, s, n, d.values.data(), d.scales.data()));
      f.streams.push_back(std::move(d));
    }
  }
  *out = std::move(f);
  return Status::OK();
}

const std::vector<SweepFixture>& SweepFixtures(bool committed, bool twin) {
  static std::vector<SweepFixture> built[2][2];
  std::vector<SweepFixture>& list = built[committed ? 1 : 0][twin ? 1 : 0];
  if (!list.empty()) return list;
  for (uint16_t major : {uint16_t{2}, uint16_t{1}}) {
    std::string v = "v" + std::to_string(major) + "-";
    Dtype fp8_or_raw = major == 2 ? Dtype::kE4M3 : Dtype::kF16;
    std::vector<FixtureSpec> specs;
    // One chunk, partly filled.
    specs.push_back({v + "one-chunk", major, ShrunkPreset("tiny", major), 4, 3});
    // Several chunks of 2 tokens, the last one short.
    specs.push_back({v + "several-chunks", major, ShrunkPreset("tiny", major), 2, 5});
    // 12 tokens of 544 payload bytes (v2; 1024 in v1): a chunk of 8 KiB
    // (12 KiB in v1) whose sections cross the block boundaries inside it,
    // then a second, shorter one.
    Geometry wide;
    wide.layers = 1;
    wide.streams = {{"k", 4, 64, fp8_or_raw}, {"v", 4, 64, major == 2 ? Dtype::kE5M2 : Dtype::kBF16}};
    specs.push_back({v + "block-crossing", major, wide, 12, 20});
    for (const std::string& preset : PresetNames())
      if (preset != "tiny") specs.push_back({v + preset, major, ShrunkPreset(preset, major), 4, 6});
    if (major == 2) {
      // nvfp4 (2.2) beside fp8: two chunks, the second short.
      Geometry nv;
      nv.layers = 2;
      nv.streams = {{"k", 2, 16, Dtype::kNvfp4}, {"v", 1, 32, Dtype::kE4M3}};
      specs.push_back({v + "nvfp4", major, nv, 4, 6});
    }
    for (FixtureSpec& s : specs) {
      s.committed = committed;
      s.name += committed ? "-closed" : "-unsynced";
      s.seed = 1000 * major + list.size();
      if (twin) {
        s.name += "-twin";
        s.salt = ~s.salt;
        s.seed += 500;
      }
      SweepFixture f;
      Status st = BuildFixture(s, &f);
      if (!st.ok()) {
        list.clear();
        throw std::runtime_error("building fixture " + s.name + ": " + st.ToString());
      }
      list.push_back(std::move(f));
    }
  }
  return list;
}

bool InQuickSet(const SweepFixture& f) {
  return f.name.starts_with("v2-one-chunk") || f.name.starts_with("v1-one-chunk") ||
         f.name.starts_with("v2-dsa-mixed") || f.name.starts_with("v2-nvfp4") ||
         f.name.starts_with("v2-glm-5.2");  // layer sets (2.3): the indexer in layer 0 of 2
}

unsigned SweepSample() {
  const char* v = std::getenv("KVFILE_SWEEP_SAMPLE");
  if (v == nullptr) return 1;
  char* end = nullptr;
  unsigned long n = std::strtoul(v, &end, 10);
  if (end == v || *end != '\0' || n == 0 || n > 1000000)
    throw std::invalid_argument(std::string("KVFILE_SWEEP_SAMPLE must be a count from 1 to 1000000, not '") + v + "'");
  return static_cast<unsigned>(n);
}

ReadCheck ReadAndCompare(FileSystem& fs, const std::string& path, const SweepFixture& f) {
  ReadCheck out;
  std::unique_ptr<Reader> r;
  ReaderOptions ro;
  ro.fs = &fs;
  out.open = Reader::Open(path, ro, &r);
  if (!out.open.ok()) return out;
  out.tokens = r->token_count();
  if (out.tokens > f.tokens.size() || !std::equal(r->tokens().begin(), r->tokens().end(), f.tokens.begin())) {
    out.corrupt = "the reader returned " + std::to_string(out.tokens) +
                  " token ids that are not a prefix of the original's";
    return out;
  }
  // Buffers are sized by the reader's geometry: a header forged with its
  // checksum recomputed can carry another geometry that the chunks still fit.
  const Geometry& g = r->geometry();
  out.geometry_differs = !(g == f.geometry);
  const size_t stream_count = g.streams.size();
  const uint64_t n = out.tokens;
  std::vector<uint8_t> values, scales;
  for (uint32_t l = 0; l < g.layers; ++l) {
    for (uint32_t s = 0; s < stream_count; ++s) {
      if (!g.InLayer(l, s)) continue;  // no section, no read: read_ok follows the sections
      const StreamSpec& spec = g.streams[s];
      const uint64_t value_bytes = n * ValueBytesPerToken(spec);
      const uint64_t scale_bytes = n * ScaleBytesPerToken(spec);
      std::string where = "layer " + std::to_string(l) + " stream '" + spec.name + "'";
      // Every row the reader vouches for is backed by bytes of the file.
      if (value_bytes + scale_bytes > r->tail().file_size) {
        out.corrupt = where + ": the reader holds more rows than the file has bytes";
        return out;
      }
      values.assign(value_bytes, kSentinel);
      scales.assign(scale_bytes, kSentinel);
      Status st = ReadStored(*r, l, s, n, values.data(), scales.data());
      out.read_ok.push_back(st.ok());
      if (!st.ok()) {
        ++out.failed_reads;
        bool untouched = std::all_of(values.begin(), values.end(), [](uint8_t b) { return b == kSentinel; }) &&
                         std::all_of(scales.begin(), scales.end(), [](uint8_t b) { return b == kSentinel; });
        if (!untouched) out.corrupt = where + ": a failed read wrote to its destination";
        if (st.message().empty()) out.corrupt = where + ": a failed read has no message";
        continue;
      }
      if (out.geometry_differs) continue;  // nothing of the original's to compare with
      const StreamData& d = f.streams[l * stream_count + s];
      if (value_bytes > 0 && std::memcmp(values.data(), d.values.data(), value_bytes) != 0)
        out.corrupt = where + ": a successful read returned values that differ from the original";
      if (scale_bytes > 0 && std::memcmp(scales.data(), d.scales.data(), scale_bytes) != 0)
        out.corrupt = where + ": a successful read returned scales that differ from the original";
    }
  }
  return out;
}

ImageCheck CheckImage(const std::vector<uint8_t>& image, const SweepFixture& f) {
  ImageCheck out;
  FaultFs fs({{kSweepPath, image}});
  VerifyOptions vo;
  vo.fs = &fs;
  out.verify_status = VerifyFile(kSweepPath, vo, &out.report);
  out.read = ReadAndCompare(fs, kSweepPath, f);
  return out;
}

}  // namespace kvfile::testing
