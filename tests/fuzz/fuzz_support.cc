// SPDX-License-Identifier: Apache-2.0
// The helpers the fuzz targets share (see fuzz_support.h).
#include "fuzz/fuzz_support.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "format/kv_format.h"

namespace kvfile::fuzz {

namespace {

// What a failed read must leave in the caller's buffer: this byte, everywhere.
constexpr uint8_t kUntouched = 0xA5;

// Runs `read` into `buffer` (prefilled with kUntouched); on failure checks
// that the buffer was left as it was.
template <typename Read>
Status ReadChecked(const char* what, std::vector<uint8_t>* buffer, size_t bytes, Read read) {
  buffer->assign(bytes, kUntouched);
  Status st = read(buffer->data());
  if (!st.ok() && std::any_of(buffer->begin(), buffer->end(), [](uint8_t b) { return b != kUntouched; }))
    Fail(std::string("a failed ") + what + " wrote to the destination: " + st.ToString());
  return st;
}

}  // namespace

std::unique_ptr<testing::FaultFs> FsHolding(const std::string& path, const uint8_t* data, size_t size) {
  testing::DiskImage image;
  image[path].assign(data, data + size);
  return std::make_unique<testing::FaultFs>(image);
}

Status OpenReader(FileSystem* fs, const std::string& path, std::unique_ptr<Reader>* out) {
  ReaderOptions options;
  options.fs = fs;
  return Reader::Open(path, options, out);
}

Status ReadEverything(Reader& reader) {
  const Geometry& g = reader.geometry();
  const uint64_t n = reader.token_count();
  if (reader.tokens().size() != n) Fail("tokens() does not hold token_count() ids");
  if (reader.LongestCommonPrefix(reader.tokens()) != n) Fail("a file does not share its whole sequence with itself");
  const bool v1 = reader.major_version() == format::kMajorV1;
  Status first;
  auto keep_first = [&first](const Status& st) {
    if (first.ok() && !st.ok()) first = st;
  };
  std::vector<uint8_t> rows, codes, scales;
  for (uint32_t layer = 0; layer < g.layers; ++layer) {
    for (uint32_t s = 0; s < g.streams.size(); ++s) {
      const StreamSpec& spec = g.streams[s];
      if (!g.InLayer(layer, s)) continue;  // a stream in some layers only: nothing stored here
      const uint64_t per_token = spec.ElementsPerToken();
      keep_first(ReadChecked("ReadRows", &rows, n * per_token * 4, [&](uint8_t* dst) {
        return reader.ReadRows(layer, s, 0, n, Dtype::kF32, dst);
      }));
      if (IsFp8(spec.dtype) || v1) {
        std::vector<uint8_t>* scales_buffer = &scales;
        keep_first(ReadChecked("ReadCodes", &codes, n * per_token, [&](uint8_t* dst) {
          return ReadChecked("ReadCodes (scales)", scales_buffer, n * spec.rows_per_token * 4, [&](uint8_t* sc) {
            return reader.ReadCodes(layer, s, 0, n, dst, reinterpret_cast<float*>(sc));
          });
        }));
      } else if (IsNvfp4(spec.dtype)) {
        // Codes, then block scales, in one buffer; one row scale per token.
        std::vector<uint8_t>* scales_buffer = &scales;
        keep_first(ReadChecked("ReadCodes (nvfp4)", &codes, n * (per_token / 2 + per_token / 16), [&](uint8_t* dst) {
          return ReadChecked("ReadCodes (nvfp4 scales)", scales_buffer, n * 4, [&](uint8_t* sc) {
            return reader.ReadCodes(layer, s, 0, n, dst, dst + n * per_token / 2, reinterpret_cast<float*>(sc));
          });
        }));
      }
      const uint64_t begin = n / 3, end = n - n / 3;
      const Dtype half = (layer + s) % 2 == 0 ? Dtype::kBF16 : Dtype::kF16;
      keep_first(ReadChecked("ReadRows", &rows, (end - begin) * per_token * 2, [&](uint8_t* dst) {
        return reader.ReadRows(layer, s, begin, end, half, dst);
      }));
    }
  }
  return first;
}

void Fail(const std::string& what) {
  std::fprintf(stderr, "kvfile fuzz invariant broken: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace kvfile::fuzz
