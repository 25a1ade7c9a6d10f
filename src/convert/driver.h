// SPDX-License-Identifier: Apache-2.0
// The shape every format's converter has (kvfile/convert.h): one Driver per
// Format, listed in one table (drivers.cc). Convert() (convert.cc) owns the
// transaction, verify-before-convert, detection and the options' checks;
// a driver only reads its format into a .kv or writes a checked .kv out.
// A new format is one driver file, one table row, its tests and a section
// of docs/formats.md.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvfile/convert.h"
#include "kvfile/geometry.h"
#include "kvfile/status.h"

namespace kvfile {
class Reader;
}

namespace kvfile::convert {

struct Driver {
  Format format;
  bool directory;      // the format is a directory (Mooncake)
  const char* suffix;  // ".safetensors", ".coli_kv", ... (nullptr: none)
  // Content: `head` = the first bytes of a file (up to 64), or empty with
  // `dir` set for a directory.
  bool (*sniff)(std::span<const uint8_t> head, const std::string& path, bool dir);
  // IN (this format) -> a complete, durable .kv at kv_path (a temporary name
  // the core commits). nullptr: none.
  Status (*import_kv)(const std::string& in, const ConvertOptions& o, const std::string& kv_path, ConvertReport* r);
  // The first `tokens` tokens of a checked .kv -> this format at out_path (a
  // temporary file, or a temporary directory when `directory`, that the core
  // commits). nullptr: none.
  Status (*export_kv)(Reader& in, const std::string& in_name, uint64_t tokens, const ConvertOptions& o,
                      const std::string& out_path, ConvertReport* r);
};

// The table row of a format (every Format has one).
const Driver& DriverFor(Format f);
std::span<const Driver> Drivers();

// The rows of the other drivers (each in its driver file).
extern const Driver kKvDriver;
extern const Driver kSafetensorsDriver;
extern const Driver kLlamaDriver;
extern const Driver kMooncakeDriver;
extern const Driver kColiDriver;

// The formats found by their first bytes (sniff.cc, in every build; a
// Mooncake directory is found by its manifest, in its driver).
bool SniffSafetensors(std::span<const uint8_t> head, const std::string& path, bool dir);
bool SniffLlama(std::span<const uint8_t> head, const std::string& path, bool dir);
bool SniffColi(std::span<const uint8_t> head, const std::string& path, bool dir);

// Refuses (rotated) or warns about (rotation unknown) exporting the k and v
// rows of a .kv imported from a llama.cpp quantized cache to a consumer that
// takes them for plain keys and values (the safetensors export). Defined
// with the llama.cpp driver (llama_driver.cc).
Status CheckPlainRows(const std::string& in, const Reader& r, std::string* warning);

// A directory output (Driver::directory), with the Mooncake driver: Begin
// refuses an OUT that exists without `force` ("OUT: exists; use --force to
// replace it") or that is no directory that format's export wrote, removes
// stale temporary directories of OUT and names a fresh one in *tmp_dir (not
// created yet); Commit puts the complete *tmp_dir in OUT's place whole
// (swapped with an old OUT, which is then removed) and syncs the parent.
Status BeginDirectoryOutput(const Driver& d, const std::string& out, bool force, std::string* tmp_dir);
Status CommitDirectoryOutput(const Driver& d, const std::string& tmp_dir, const std::string& out);

// ---- The core's rules, for the drivers (convert.cc) ----

// OK, or kFailed "PATH: interrupted" once o.interrupted() says so: a driver
// calls it between batches and returns what it gives.
Status CheckInterrupted(const ConvertOptions& o, const std::string& path);

// The stored dtype of a stream whose values are stored as `have` (a raw
// stream, or a quantized stream's codes), by the dtype policy of docs/cli.md:
// - keep_raw: a raw o.dtype, else a raw stream's own dtype, else bf16;
// - o.dtype e4m3/e5m2/nvfp4: quantized streams take it, raw streams stay
//   (take it too with o.every_stream);
// - o.dtype bf16/f16/f32: every stream takes it;
// - no o.dtype: unchanged.
Dtype TargetDtype(const std::string& stream, Dtype have, const ConvertOptions& o);

// kInvalidArgument "PATH: --keep-raw: no stream 'x' (streams: ...)" when
// o.keep_raw names a stream not in `names`.
Status CheckKeepRaw(const ConvertOptions& o, const std::vector<std::string>& names, const std::string& path);
// The same for a list of stream names (AppendSafetensors' keep_raw).
Status CheckKeepRaw(const std::vector<std::string>& keep_raw, const std::vector<std::string>& names,
                    const std::string& path);

// The one chunk-size rule of a .kv output: o.chunk_tokens, else `wanted`
// (the input's chunk size, or 256) fitted by FitChunkTokens to the input's
// size (kvfile/writer.h).
uint32_t ChunkTokens(const ConvertOptions& o, const Geometry& g, uint32_t wanted, const std::string& in);

// Bytes of buffers one batch of an import or transcode may hold.
inline constexpr uint64_t kBufferBudget = uint64_t{128} << 20;

// Reports progress through o.progress, if set.
void Progress(const ConvertOptions& o, const std::string& label, uint64_t done, uint64_t total);

// "k bf16, v e4m3": a .kv geometry's streams for the summary line.
std::string StreamList(const Geometry& g);

}  // namespace kvfile::convert
