// SPDX-License-Identifier: Apache-2.0
// Small .kv files for the damage sweeps (truncation, bit flips, structured
// damage), and the one check they all share: what a reader returns from a
// damaged copy, compared byte for byte with what it returns from the
// original.
//
// The fixtures are written by the library itself, with a fixed salt and
// deterministic rows, into a FaultFs, so that every run sweeps the same
// bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvfile/file.h"
#include "kvfile/geometry.h"
#include "kvfile/status.h"
#include "kvfile/verify.h"

namespace kvfile::testing {

// The bytes a read of (layer, stream) returns, per token: for fp8 streams
// ReadCodes' codes and scales, for nvfp4 streams its codes and, as
// `scales`, the row scales then the block scales, for raw streams ReadRows
// in the stored dtype (bit-exact, no conversion).
struct StreamData {
  uint64_t value_bytes_per_token = 0;  // codes or raw rows
  uint64_t scale_bytes_per_token = 0;  // 0 for raw streams
  std::vector<uint8_t> values;         // all tokens
  std::vector<uint8_t> scales;
};

struct ChunkSpan {
  uint64_t begin = 0, end = 0;  // file offsets
  uint64_t tokens_after = 0;    // tokens of the chain up to and including this chunk
  // What a reader returns when this chunk is the last whole one and none is
  // committed: in a file with append ends (2.1), the tokens up to the last
  // append end in the chunks so far, and the end of the chunk holding it
  // (12288 if none); in other files, tokens_after and `end`.
  uint64_t uncommitted_tokens = 0;
  uint64_t uncommitted_end = 0;
  // Where each section (layer-major) spans, as file offsets [begin, end).
  std::vector<std::pair<uint64_t, uint64_t>> sections;
};

struct SweepFixture {
  std::string name;
  uint16_t major = 2;
  Geometry geometry;
  // true: closed in SyncMode::kClose, so every chunk is committed; false:
  // written in SyncMode::kNone, so the commit slots still hold the empty
  // state of creation and every chunk lies past the commit record.
  bool committed = true;
  uint64_t salt = 0;
  std::vector<uint8_t> bytes;
  std::vector<uint32_t> tokens;
  std::vector<ChunkSpan> chunks;
  std::vector<StreamData> streams;  // index layer * stream_count + stream
};

// The path every fixture has inside the FaultFs of a case.
inline constexpr const char* kSweepPath = "/sweep/f.kv";

// Options for one fixture. Rows are a deterministic function of `seed`.
struct FixtureSpec {
  std::string name;
  uint16_t major = 2;
  Geometry geometry;
  uint32_t chunk_tokens = 4;
  uint32_t tokens = 6;
  bool committed = true;
  uint64_t salt = 0x5A175A175A175A17ull;
  uint64_t seed = 1;
};

// Writes the file and reads it back through a Reader to fill the expected
// data. Fails the calling test (non-OK status) if anything goes wrong.
Status BuildFixture(const FixtureSpec& spec, SweepFixture* out);

// A preset's geometry shrunk to a few KiB per chunk: at most 2 layers, 2
// rows per token and 32 elements per row, keeping names, stream kinds and
// dtypes. v1 replaces fp8 dtypes by raw ones (f32, f16, bf16 in turn).
Geometry ShrunkPreset(const std::string& preset, uint16_t major);

// The fixtures of the sweeps, built once per process: one chunk, several
// chunks, a chunk whose sections cross an internal 4 KiB block boundary,
// and every preset shrunk, each as v1 and v2; `committed` picks the closed
// or the never-committed variant. With `twin`, the same files (same
// geometry, same chunk sizes) written with another salt and other rows:
// what a chunk or header spliced in from another file looks like.
const std::vector<SweepFixture>& SweepFixtures(bool committed, bool twin = false);

// The fixtures the quick sweeps (label unit, also run under sanitizers)
// cover: one chunk (v1 and v2), the mixed-kind preset dsa-mixed (v2) and the
// nvfp4 file (2.2).
// The full sweeps (label long) cover the others.
bool InQuickSet(const SweepFixture& f);

// 1 in how many cases the bit-flip and structured-damage sweeps check:
// KVFILE_SWEEP_SAMPLE (default 1, every case). The sanitizer pass of CI sets
// it, so that every test runs there in a time CI can afford; the sampled
// bit flips still touch every byte of every fixture (byte b, bit (k - b) mod
// 8 for a sample of k <= 8).
unsigned SweepSample();

// What a reader made of a (damaged) copy of a fixture.
struct ReadCheck {
  Status open;                 // Reader::Open
  uint64_t tokens = 0;         // tokens the reader returned (0 if open failed)
  size_t failed_reads = 0;     // reads that returned an error
  std::vector<bool> read_ok;   // per (layer, stream) of the reader's geometry
  // The reader opened the file with another geometry than the fixture's:
  // only a header forged with its checksum recomputed can do that.
  bool geometry_differs = false;
  std::string corrupt;         // non-empty: a read returned data that is not the original's
};

// Opens `path` on `fs` and reads every (layer, stream) over all tokens into
// buffers sized by the reader's geometry and pre-filled with a sentinel.
// Records in `corrupt` any violation of "correct": the token ids must be a
// prefix of the fixture's, a successful read must return exactly the
// fixture's bytes for those tokens (when the geometry is the fixture's), a
// failed read must leave its destination untouched (all sentinel), and the
// rows read must fit in the file's size.
ReadCheck ReadAndCompare(FileSystem& fs, const std::string& path, const SweepFixture& f);

// Both looks at a (damaged) image of fixture `f`, stored as kSweepPath in a
// fresh FaultFs: VerifyFile's status and report, and ReadAndCompare.
struct ImageCheck {
  Status verify_status;
  VerifyReport report;
  ReadCheck read;
};
ImageCheck CheckImage(const std::vector<uint8_t>& image, const SweepFixture& f);

// Small deterministic PRNG (splitmix64): fixed seeds, identical runs everywhere.
class SplitMix {
 public:
  explicit SplitMix(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n), n > 0.
  uint64_t Below(uint64_t n) { return Next() % n; }

 private:
  uint64_t state_;
};

}  // namespace kvfile::testing
