// SPDX-License-Identifier: Apache-2.0
// kvfile dump: a .kv file's header, commit record, chunk table, token ids
// and rows, field by field, as text or one JSON document; the header and
// commit record of several files. Read-only.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "cli_common.h"
#include "damage_advice.h"
#include "json_output.h"
#include "kvfile/reader.h"
#include "pack_member.h"

namespace kvfile::cli {

namespace {

using nlohmann::ordered_json;

struct DumpArgs {
  std::vector<std::string> paths;
  std::string path;  // the one FILE of a dump of more than the header
  bool header = false;
  bool chunks = false;
  bool tokens = false;
  bool rows = false;
  std::optional<uint32_t> layer;
  std::optional<std::string> stream;
  std::optional<std::string> token;
  bool codes = false;
  bool json = false;
};

unsigned long long U(uint64_t v) { return static_cast<unsigned long long>(v); }

// "T", "T:T2" (T2 excluded) or "T:" (to the end).
bool ParseTokenRange(const std::string& s, uint64_t count, uint64_t* begin, uint64_t* end) {
  auto num = [](std::string_view v, uint64_t* out) {
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), *out);
    return ec == std::errc() && p == v.data() + v.size() && !v.empty();
  };
  size_t colon = s.find(':');
  if (colon == std::string::npos) {
    if (!num(s, begin)) return false;
    *end = *begin + 1;
    return true;
  }
  if (!num(std::string_view(s).substr(0, colon), begin)) return false;
  std::string_view rest = std::string_view(s).substr(colon + 1);
  if (rest.empty()) {
    *end = count;
    return true;
  }
  return num(rest, end);
}

ordered_json HeaderJson(const Reader& r) {
  const Geometry& g = r.geometry();
  ordered_json j;
  j["version"] = std::to_string(r.major_version()) + "." + std::to_string(r.minor_version());
  j["required_flags"] = Hex16(r.required_flags());
  j["optional_flags"] = Hex16(r.optional_flags());
  j["salt"] = Hex16(r.salt());
  j["fingerprint"] = Hex16(r.identity().fingerprint);
  j["model"] = r.identity().model_id;
  j["layers"] = g.layers;
  j["chunk_tokens"] = r.nominal_chunk_tokens();
  j["streams"] = ordered_json::array();
  for (size_t i = 0; i < g.streams.size(); ++i) {
    const StreamSpec& s = g.streams[i];
    j["streams"].push_back({{"index", i},
                            {"name", s.name},
                            {"rows_per_token", s.rows_per_token},
                            {"row_width", s.row_width},
                            {"dtype", DtypeName(s.dtype)}});
    if (!s.layers.empty()) j["streams"].back()["layers"] = s.layers;  // its layer set (FORMAT.md 3.2)
  }
  j["token_count"] = r.token_count();
  j["committed_data_missing"] = r.tail().committed_data_missing;
  if (r.tail().committed_data_missing) j["missing"] = MissingCommittedData(r.tail());
  return j;
}

// An open file always has a commit record in force (Reader::Open refuses a
// file whose two slots are both damaged).
ordered_json CommitJson(const Reader& r) {
  ordered_json j;
  const CommitInfo& c = r.commit();
  j["active_slot"] = r.active_commit_slot();
  j["sequence"] = c.sequence;
  j["epoch"] = c.epoch;
  j["committed_tokens"] = c.tokens;
  j["committed_end"] = c.end;
  j["committed_chunks"] = c.chunks;
  j["slots"] = ordered_json::array();
  for (int i = 0; i < 2; ++i) {
    const CommitSlotState& s = r.commit_slots()[i];
    ordered_json e;
    e["slot"] = i;
    e["valid"] = s.valid;
    e["sequence"] = s.valid ? ordered_json(s.sequence) : ordered_json(nullptr);
    e["error"] = s.valid ? ordered_json(nullptr) : ordered_json(s.error);
    j["slots"].push_back(e);
  }
  return j;
}

ordered_json ChunkJson(size_t i, const ChunkInfo& c) {
  return {{"index", i},
          {"offset", c.offset},
          {"first_token", c.first_token},
          {"live_tokens", c.live_tokens},
          {"stored_tokens", c.stored_tokens},
          {"bytes", c.bytes},
          {"epoch", c.epoch},
          {"committed", c.committed},
          {"head_checksum", Hex16(c.head_checksum)}};
}

void PrintHeader(const Reader& r) {
  const Geometry& g = r.geometry();
  std::printf("  version           %u.%u\n", r.major_version(), r.minor_version());
  std::printf("  required flags    %s\n", Hex16(r.required_flags()).c_str());
  std::printf("  optional flags    %s\n", Hex16(r.optional_flags()).c_str());
  std::printf("  salt              %s\n", Hex16(r.salt()).c_str());
  std::printf("  fingerprint       %s\n", Hex16(r.identity().fingerprint).c_str());
  std::printf("  model id          %s\n", r.identity().model_id.c_str());
  std::printf("  layers            %u\n", g.layers);
  std::printf("  chunk tokens      %u\n", r.nominal_chunk_tokens());
  for (size_t i = 0; i < g.streams.size(); ++i) {
    const StreamSpec& s = g.streams[i];
    std::printf("  stream %-2zu         %s: %u rows x %u, %s%s\n", i, s.name.c_str(), s.rows_per_token, s.row_width,
                DtypeName(s.dtype), s.layers.empty() ? "" : (", in layers " + FormatLayerList(s.layers)).c_str());
  }
  for (int i = 0; i < 2; ++i) {
    const CommitSlotState& s = r.commit_slots()[i];
    if (s.valid)
      std::printf("  commit slot %d     valid, sequence %llu%s\n", i, U(s.sequence),
                  r.active_commit_slot() == i ? " (active)" : "");
    else
      std::printf("  commit slot %d     invalid: %s\n", i, s.error.c_str());
  }
  const CommitInfo& c = r.commit();
  std::printf("  sequence          %llu\n", U(c.sequence));
  std::printf("  epoch             %u\n", c.epoch);
  std::printf("  committed tokens  %llu\n", U(c.tokens));
  std::printf("  committed end     %llu\n", U(c.end));
  std::printf("  committed chunks  %llu\n", U(c.chunks));
  std::printf("  tokens            %llu\n", U(r.token_count()));
  if (r.tail().committed_data_missing) std::printf("  missing           %s\n", MissingCommittedData(r.tail()).c_str());
}

void PrintChunks(const Reader& r) {
  std::printf("  %5s %12s %12s %6s %6s %10s %6s %-9s %s\n", "chunk", "offset", "first_token", "live", "stored",
              "bytes", "epoch", "committed", "head_checksum");
  const auto& chunks = r.chunks();
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ChunkInfo& c = chunks[i];
    std::printf("  %5zu %12llu %12llu %6u %6u %10llu %6u %-9s %s\n", i, U(c.offset), U(c.first_token), c.live_tokens,
                c.stored_tokens, U(c.bytes), c.epoch, c.committed ? "yes" : "no", Hex16(c.head_checksum).c_str());
  }
}

void PrintTokens(const Reader& r) {
  auto t = r.tokens();
  for (size_t i = 0; i < t.size(); i += 16) {
    std::printf("  %8zu:", i);
    for (size_t k = i; k < std::min(t.size(), i + 16); ++k) std::printf(" %u", t[k]);
    std::printf("\n");
  }
}

struct RowSelection {
  uint32_t layer = 0;
  uint32_t stream = 0;
  uint64_t begin = 0, end = 0;
};

Status ResolveRows(const DumpArgs& a, const Reader& r, RowSelection* sel) {
  const Geometry& g = r.geometry();
  if (!a.layer || !a.stream) return Status::InvalidArgument("--rows needs --layer and --stream");
  if (*a.layer >= g.layers)
    return Status::InvalidArgument(a.path + ": layer " + std::to_string(*a.layer) + " out of range (" +
                                   std::to_string(g.layers) + " layers)");
  sel->layer = *a.layer;
  if (auto idx = g.FindStream(*a.stream)) {
    sel->stream = *idx;
  } else {
    uint64_t v = 0;
    auto [p, ec] = std::from_chars(a.stream->data(), a.stream->data() + a.stream->size(), v);
    std::string names;
    for (const StreamSpec& s : g.streams) names += (names.empty() ? "" : ", ") + s.name;
    if (ec != std::errc() || p != a.stream->data() + a.stream->size() || v >= g.streams.size())
      return Status::InvalidArgument(a.path + ": no stream '" + *a.stream + "' (streams: " + names + ")");
    sel->stream = static_cast<uint32_t>(v);
  }
  uint64_t count = r.token_count();
  sel->begin = 0;
  sel->end = count;
  if (a.token && !ParseTokenRange(*a.token, count, &sel->begin, &sel->end))
    return Status::InvalidArgument("--token '" + *a.token + "': expected T, T:T2 (T2 excluded) or T:");
  if (sel->begin >= sel->end || sel->end > count)
    return Status::InvalidArgument(a.path + ": token range [" + std::to_string(sel->begin) + ", " +
                                   std::to_string(sel->end) + ") is empty or outside [0, " + std::to_string(count) +
                                   ")");
  return Status::OK();
}

std::string HexBytes(const uint8_t* p, size_t n, size_t elem, bool spaced) {
  std::string s;
  char buf[8];
  for (size_t i = 0; i < n; ++i) {
    if (spaced && i > 0) s += ' ';
    // Elements are little-endian; print each as one number.
    for (size_t b = elem; b-- > 0;) {
      std::snprintf(buf, sizeof buf, "%02x", p[i * elem + b]);
      s += buf;
    }
  }
  return s;
}

// DumpRows of an nvfp4 stream with --codes: per token (one nvfp4 row), its
// row scale, block scale codes and packed codes, as stored.
Status DumpNvfp4Codes(Reader& r, const RowSelection& sel, ordered_json* json) {
  const StreamSpec& spec = r.geometry().streams[sel.stream];
  const uint64_t width = spec.ElementsPerToken();
  const uint64_t block = std::max<uint64_t>(1, (uint64_t{16} << 20) / width);
  std::vector<uint8_t> codes, blocks;
  std::vector<float> scales;
  for (uint64_t t0 = sel.begin; t0 < sel.end; t0 += block) {
    uint64_t n = std::min(block, sel.end - t0);
    codes.resize(n * width / 2);
    blocks.resize(n * width / 16);
    scales.resize(n);
    KVFILE_RETURN_IF_ERROR(r.ReadCodes(sel.layer, sel.stream, t0, t0 + n, codes.data(), blocks.data(), scales.data()));
    for (uint64_t t = 0; t < n; ++t) {
      const uint8_t* c = &codes[t * width / 2];
      const uint8_t* b = &blocks[t * width / 16];
      if (json) {
        ordered_json e;
        e["token"] = t0 + t;
        e["scale"] = scales[t];
        e["block_scales"] = HexBytes(b, width / 16, 1, false);
        e["codes"] = HexBytes(c, width / 2, 1, false);
        (*json)["rows"].push_back(std::move(e));
        continue;
      }
      std::printf("  token %llu: scale %g block scales %s codes %s\n", U(t0 + t), static_cast<double>(scales[t]),
                  HexBytes(b, width / 16, 1, true).c_str(), HexBytes(c, width / 2, 1, true).c_str());
    }
  }
  return Status::OK();
}

// Prints (or collects as JSON) the selected rows, a block of tokens at a time.
Status DumpRows(const DumpArgs& a, Reader& r, const RowSelection& sel, ordered_json* json) {
  const StreamSpec& spec = r.geometry().streams[sel.stream];
  bool fp8 = IsFp8(spec.dtype);
  uint64_t per_token = spec.ElementsPerToken();
  uint64_t block = std::max<uint64_t>(1, (uint64_t{16} << 20) / (per_token * 4));
  std::vector<float> values;
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  if (json) {
    (*json)["layer"] = sel.layer;
    (*json)["stream"] = spec.name;
    (*json)["dtype"] = DtypeName(spec.dtype);
    (*json)["begin"] = sel.begin;
    (*json)["end"] = sel.end;
    (*json)["rows"] = ordered_json::array();
  } else {
    std::printf("rows of layer %u, stream '%s' (%s, %u rows x %u), tokens [%llu, %llu)%s:\n", sel.layer, spec.name.c_str(),
                DtypeName(spec.dtype), spec.rows_per_token, spec.row_width, U(sel.begin), U(sel.end),
                a.codes ? (IsQuantized(spec.dtype) ? ", codes and scales" : ", stored bits") : "");
  }
  if (a.codes && IsNvfp4(spec.dtype)) return DumpNvfp4Codes(r, sel, json);
  size_t esize = ElementSize(spec.dtype);
  for (uint64_t t0 = sel.begin; t0 < sel.end; t0 += block) {
    uint64_t n = std::min(block, sel.end - t0);
    uint64_t rows = n * spec.rows_per_token;
    if (a.codes && fp8) {
      codes.resize(rows * spec.row_width);
      scales.resize(rows);
      KVFILE_RETURN_IF_ERROR(r.ReadCodes(sel.layer, sel.stream, t0, t0 + n, codes.data(), scales.data()));
    } else if (a.codes) {
      // A raw stream's stored elements, bit for bit.
      codes.resize(rows * spec.row_width * esize);
      KVFILE_RETURN_IF_ERROR(r.ReadRows(sel.layer, sel.stream, t0, t0 + n, spec.dtype, codes.data()));
    } else {
      values.resize(rows * spec.row_width);
      KVFILE_RETURN_IF_ERROR(r.ReadRows(sel.layer, sel.stream, t0, t0 + n, Dtype::kF32, values.data()));
    }
    for (uint64_t row = 0; row < rows; ++row) {
      uint64_t token = t0 + row / spec.rows_per_token;
      uint32_t ri = static_cast<uint32_t>(row % spec.rows_per_token);
      if (json) {
        ordered_json e;
        e["token"] = token;
        e["row"] = ri;
        if (a.codes && fp8) {
          e["scale"] = scales[row];
          e["codes"] = HexBytes(&codes[row * spec.row_width], spec.row_width, 1, false);
        } else if (a.codes) {
          e["bits"] = HexBytes(&codes[row * spec.row_width * esize], spec.row_width, esize, false);
        } else {
          e["values"] = ordered_json::array();
          for (uint32_t k = 0; k < spec.row_width; ++k) e["values"].push_back(values[row * spec.row_width + k]);
        }
        (*json)["rows"].push_back(std::move(e));
        continue;
      }
      std::printf("  token %llu row %u:", U(token), ri);
      if (a.codes && fp8) {
        std::printf(" scale %g codes %s\n", static_cast<double>(scales[row]),
                    HexBytes(&codes[row * spec.row_width], spec.row_width, 1, true).c_str());
      } else if (a.codes) {
        std::printf(" bits %s\n", HexBytes(&codes[row * spec.row_width * esize], spec.row_width, esize, true).c_str());
      } else {
        for (uint32_t k = 0; k < spec.row_width; ++k)
          std::printf(" %g", static_cast<double>(values[row * spec.row_width + k]));
        std::printf("\n");
      }
    }
  }
  return Status::OK();
}

// --header of several FILEs, in the order given: each file's header and
// commit record under a "file: PATH" line (a failed one as "error: ..."
// there), or with --json an array of the documents a single FILE's dump
// prints. The first failure is the one stderr line; the exit status is the
// worst.
int RunDumpHeaders(const DumpArgs& a) {
  PackMemberInputs members;
  ordered_json all = ordered_json::array();
  int code = kExitOk;
  bool reported = false;
  for (size_t i = 0; i < a.paths.size(); ++i) {
    const std::string& path = a.paths[i];
    SetCurrentPath(path);
    std::unique_ptr<Reader> r;
    std::string opened;
    Status st = members.Resolve(path, &opened);
    if (st.ok()) st = members.Name(Reader::Open(opened, {}, &r));
    // A file cut inside its committed data: its header is shown, and the
    // cut is the failure (exit 1).
    Status cut = st.ok() ? members.Name(CutInsideCommittedData(opened, path)) : Status::OK();
    if (!cut.ok()) {
      code = std::max(code, reported ? kExitData : ReportError(cut));
      reported = true;
    }
    if (a.json) {
      ordered_json j;
      j["path"] = path;
      if (st.ok()) {
        j["header"] = HeaderJson(*r);
        j["commit"] = CommitJson(*r);
      } else {
        j["ok"] = false;
        j["error"] = st.message();
      }
      all.push_back(std::move(j));
    } else {
      std::printf("%sfile: %s\n", i > 0 ? "\n" : "", EscapeLine(path).c_str());
      if (st.ok()) {
        std::printf("header:\n");
        PrintHeader(*r);
      } else {
        std::printf("error: %s\n", EscapeLine(st.message()).c_str());
      }
    }
    if (!st.ok()) {
      std::fflush(stdout);
      int c = st.IsDataError() ? kExitData : kExitUsage;
      if (!reported) c = ReportError(st);
      reported = true;
      code = std::max(code, c);
    }
  }
  if (a.json) PrintJson(all);
  return code;
}

int RunDump(DumpArgs a) {
  if (!a.rows && (a.layer || a.stream || a.token || a.codes))
    return UsageError("--layer, --stream, --token and --codes select rows: add --rows");
  if (a.paths.size() > 1) {
    if (!a.header || a.chunks || a.tokens || a.rows)
      return UsageError("dump: " + std::to_string(a.paths.size()) +
                        " FILEs: several FILEs take --header alone (chunks, tokens and rows: one FILE at a time)");
    return RunDumpHeaders(a);
  }
  a.path = a.paths.at(0);
  SetCurrentPath(a.path);
  if (!a.header && !a.chunks && !a.tokens && !a.rows) a.header = a.chunks = true;
  std::unique_ptr<Reader> r;
  PackMemberInputs members;
  std::string opened;
  Status st = members.Resolve(a.path, &opened);
  if (st.ok()) st = Reader::Open(opened, {}, &r);
  auto fail = [&](const Status& failed) {
    return a.json ? ReportErrorAsJson(a.path, members.Name(failed)) : ReportError(members.Name(failed));
  };
  if (!st.ok()) return fail(st);
  // A file cut inside its committed data: what it still holds is shown,
  // then the cut is the one error line (exit 1).
  auto cut_inside_committed_data = [&] {
    std::fflush(stdout);
    Status cut = members.Name(CutInsideCommittedData(opened, a.path));
    return cut.ok() ? kExitOk : ReportError(cut);
  };
  RowSelection sel;
  if (a.rows) {
    st = ResolveRows(a, *r, &sel);
    if (!st.ok()) return fail(st);
  }
  if (a.json) {
    ordered_json j;
    j["path"] = a.path;
    if (a.header) {
      j["header"] = HeaderJson(*r);
      j["commit"] = CommitJson(*r);
    }
    if (a.chunks) {
      j["chunks"] = ordered_json::array();
      for (size_t i = 0; i < r->chunks().size(); ++i) j["chunks"].push_back(ChunkJson(i, r->chunks()[i]));
    }
    if (a.tokens) j["tokens"] = std::vector<uint32_t>(r->tokens().begin(), r->tokens().end());
    if (a.rows) {
      ordered_json rows;
      st = DumpRows(a, *r, sel, &rows);
      if (!st.ok()) return fail(st);
      j["rows"] = std::move(rows);
    }
    PrintJson(j);
    return cut_inside_committed_data();
  }
  bool first = true;
  auto section = [&](const char* title) {
    std::printf("%s%s:\n", first ? "" : "\n", title);
    first = false;
  };
  if (a.header) {
    section("header");
    PrintHeader(*r);
  }
  if (a.chunks) {
    section("chunks");
    PrintChunks(*r);
  }
  if (a.tokens) {
    section("tokens");
    PrintTokens(*r);
  }
  if (a.rows) {
    if (!first) std::printf("\n");
    st = DumpRows(a, *r, sel, nullptr);
    if (!st.ok()) {
      std::fflush(stdout);
      return ReportError(members.Name(st));
    }
  }
  return cut_inside_committed_data();
}

}  // namespace

void RegisterDump(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<DumpArgs>();
  CLI::App* cmd = app.add_subcommand(
      "dump",
      "Show a .kv file field by field: header and commit record, chunk table, token ids, rows.\n"
      "With no part selected: --header and --chunks. With several FILEs: --header alone, one block\n"
      "each (with --json, an array of their documents). Read-only.\n"
      "Example: kvfile dump session.kv --rows --layer 0 --stream k --token 0:4\n"
      "         kvfile dump session.kv --header --tokens --json\n"
      "         kvfile dump --header a.kv b.kv");
  cmd->add_option("FILE", args->paths, "the .kv file (several with --header alone; PACK:MEMBER a member of a .kvpack)")
      ->required();
  cmd->add_flag("--header", args->header, "the header, field by field, and the active commit record");
  cmd->add_flag("--chunks", args->chunks, "the chunk table");
  cmd->add_flag("--tokens", args->tokens, "the token ids");
  cmd->add_flag("--rows", args->rows, "rows of one layer and stream, decoded to f32 (one line per row)");
  cmd->add_option("--layer", args->layer, "with --rows: the layer")->check(Count(0, UINT32_MAX));
  cmd->add_option("--stream", args->stream, "with --rows: the stream, by name or index");
  cmd->add_option("--token", args->token, "with --rows: token T, tokens T:T2 (T2 excluded) or T: (default: all)");
  cmd->add_flag("--codes", args->codes,
                "with --rows: fp8 codes in hex and each row's scale (raw streams: the stored bits)");
  cmd->add_flag("--json", args->json, "print one JSON document with the selected parts");
  cmd->callback([args, exit_code] { *exit_code = RunDump(*args); });
}

}  // namespace kvfile::cli
