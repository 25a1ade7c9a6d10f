// SPDX-License-Identifier: Apache-2.0
// Appending the tokens of a safetensors file (the kvfile convention of
// kvfile/formats/safetensors.h, docs/formats.md) to a .kv file, creating
// it with the input's geometry if it does not exist: the library call that
// `kvfile append`, the C API (kvfile_append) and the Python module
// (kvfile.append) make. Stable tier.
//
// AppendSafetensors(FILE, INPUT) is one transaction. Everything is checked
// before the first byte is appended: INPUT's structure and token ids, its
// model and geometry against an existing FILE, and every value (finite;
// codes and scales valid). A refusal leaves FILE exactly as it was (or
// absent). The tokens go in as one append (kvfile/writer.h,
// AppendBatch::continued): a stop part way (on_stage, on_progress) or a
// failure drops all of them, and FILE keeps what it had; only an I/O error
// in the commit itself, after the whole append is on disk, may leave it in
// (whole: the writer never cuts bytes a commit record it tried to write
// could vouch for; FORMAT.md 5.4). Never part of it. A FILE that does not
// exist is written under a temporary name and renamed into place when
// complete and durable, so a failure leaves no FILE. A v1 FILE is upgraded to v2 by the
// writable open first (upgrade_dtype, keep_raw); the report says so.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kvfile/dtype.h"
#include "kvfile/export.h"
#include "kvfile/geometry.h"
#include "kvfile/status.h"
#include "kvfile/writer.h"

namespace kvfile {

class FileSystem;
struct AppendReport;

// The points at which AppendOptions::on_stage is called.
enum class AppendStage : uint8_t {
  // Planned and checked (report: created, the existing FILE's format and
  // geometry, input_tokens); FILE is about to be opened for writing (an
  // existing FILE is recovered by that open, a v1 FILE upgraded: it reads
  // the whole file through `fs`). Nothing written yet.
  kOpening = 0,
  // Open (report: upgraded_from_v1, geometry, tokens_before); the tokens
  // are about to be appended.
  kAppending = 1,
  // Appended: nothing can take the append back any more, so the status
  // on_stage returns here is not looked at. FILE is about to be synced and
  // closed (a new FILE then renamed into place).
  kSyncing = 2,
};

struct AppendOptions {
  // The model id of a new FILE, and the one an existing FILE must have.
  // Unset: INPUT's kvfile.model metadata; an INPUT that names no model (no
  // kvfile.model or kvfile.fingerprint) matches an existing FILE of its
  // geometry, and the report's notes say so.
  std::optional<std::string> model;
  // kvfile::safetensors::AppendPlanOptions (kvfile/formats/safetensors_append.h):
  // the quantized dtype (e4m3, e5m2, nvfp4; unset: codes keep theirs, values
  // take an existing stream's dtype or e4m3), a v1 FILE's upgrade dtype
  // (fp8; unset: dtype if fp8, else e4m3), and the streams kept raw (by that
  // upgrade; in a new FILE stored bf16).
  std::optional<Dtype> dtype;
  std::optional<Dtype> upgrade_dtype;
  std::vector<std::string> keep_raw;
  // Tokens per chunk of a new FILE. Unset: 256, fitted by FitChunkTokens
  // (kvfile/writer.h) to INPUT's size.
  std::optional<uint32_t> chunk_tokens;
  // Bytes of buffers one block of the append may hold (INPUT's values, their
  // f32 copy and the codes): INPUT is appended in blocks of as many tokens
  // as fit, at least one.
  uint64_t block_bytes = uint64_t{256} << 20;
  // When the append is made durable. A new FILE is synced before its rename
  // whatever this says (kNone counts as kClose for it).
  SyncMode sync = SyncMode::kClose;
  // Quantizing workers (WriterOptions::threads; 0: one per core). The bytes
  // do not depend on it.
  unsigned threads = 0;
  // FILE's reads and writes (a v1 FILE's upgrade included); nullptr:
  // FileSystem::Default(). INPUT is read through the default.
  FileSystem* fs = nullptr;
  // Called at each stage with the report so far. A non-OK status ends the
  // append there with that status, nothing of it kept (a caller stops at a
  // signal this way, or switches its progress display).
  std::function<Status(AppendStage stage, const AppendReport& report)> on_stage;
  // Called after each block of tokens is appended but the last, and once
  // more just before the last, with the tokens appended so far (of
  // report.input_tokens; an INPUT of one block: once, with 0). A non-OK
  // status ends the append with it, nothing of it kept.
  std::function<Status(uint64_t done)> on_progress;
};

struct KVFILE_EXPORT AppendReport {
  bool created = false;  // FILE did not exist: it is (or would have been) new
  // An existing FILE as found: its format version and geometry.
  uint16_t major_before = 0, minor_before = 0;
  Geometry geometry_before;
  // Once FILE is open for writing:
  bool upgraded_from_v1 = false;  // the open upgraded a v1 FILE to v2
  Geometry geometry;              // FILE's geometry now (after an upgrade)
  uint64_t tokens_before = 0;     // FILE's tokens before the append
  uint64_t input_tokens = 0;      // INPUT's tokens: all appended on success
  // Remarks that are no error, each one line (an INPUT that names no model).
  std::vector<std::string> notes;
};

// Appends INPUT's tokens to FILE as the comment at the top says. A model
// or geometry mismatch is kMismatch; INPUT's damage kCorruption; a bad
// value or option kInvalidArgument; a FILE created meanwhile by another
// process kBusy; each with one readable line. report may be nullptr.
KVFILE_EXPORT Status AppendSafetensors(const std::string& file, const std::string& input,
                                       const AppendOptions& options, AppendReport* report);

}  // namespace kvfile
