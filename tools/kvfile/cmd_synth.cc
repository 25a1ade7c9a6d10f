// SPDX-License-Identifier: Apache-2.0
// kvfile synth: write a deterministic synthetic session, or check one.
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "kvfile/replace.h"
#include "cli_common.h"
#include "kvfile/codec.h"
#include "kvfile/presets.h"
#include "kvfile/reader.h"
#include "kvfile/writer.h"
#include "pack_member.h"
#include "progress.h"
#include "signals.h"
#include "synth_data.h"

namespace kvfile::cli {

namespace {

struct SynthArgs {
  std::string path;
  std::string preset = "llama-3.1-8b";
  uint64_t tokens = 1024;
  uint64_t seed = 1;
  uint64_t prefix_tokens = 0;  // tokens [0, prefix_tokens) are those of seed prefix_seed
  uint64_t prefix_seed = 0;
  std::string dtype = "e4m3";
  uint32_t chunk_tokens = 256;
  bool check = false;
  bool force = false;
};

// Generates the bf16 rows of tokens [first, first + n) for every (layer,
// stream) into blocks[layer * S + stream], on two threads.
void GenerateAll(const Geometry& g, uint64_t seed, uint64_t first, uint64_t n,
                 std::vector<std::vector<uint16_t>>& blocks) {
  size_t S = g.streams.size();
  // Sized here, so that an allocation failure is thrown on this thread.
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t s = 0; s < S; ++s) blocks[l * S + s].resize(g.InLayer(l, s) ? n * g.streams[s].ElementsPerToken() : 0);
  auto work = [&](uint32_t parity) {
    for (uint32_t l = parity; l < g.layers; l += 2)
      for (uint32_t s = 0; s < S; ++s)
        if (g.InLayer(l, s)) synth::GenerateRows(g, seed, l, s, first, n, blocks[l * S + s].data());
  };
  std::thread other(work, 1u);
  work(0u);
  other.join();
}

int RunSynth(const SynthArgs& a) {
  InstallSignalHandlers();
  SetCurrentPath(a.path);
  Dtype quantized{};
  Status st = ParseDtype(a.dtype, &quantized);
  if (!st.ok()) return UsageError(st.message());
  Geometry g;
  st = RefusePackMemberTarget(a.path);
  if (st.ok()) st = GetPreset(a.preset, quantized, &g);
  if (!st.ok()) return ReportError(st);
  // The session is written under a temporary name and replaces FILE only
  // when complete: a failure leaves FILE as it was (or absent).
  std::unique_ptr<PendingReplace> replace;
  st = PendingReplace::Begin(a.path, nullptr, &replace);
  if (!st.ok()) return ReportError(st);
  if (replace->original().exists && !a.force)
    return ReportError(Status::InvalidArgument(a.path + ": file exists; use --force to replace it"));
  WriterOptions opt;
  opt.threads = 0;  // quantize on every core (the bytes do not depend on it)
  opt.chunk_tokens = a.chunk_tokens;
  // With a shared prefix the fingerprint is the prefix's seed, so that
  // sessions of other seeds with the same prefix are of one model.
  ModelIdentity id{"synthetic/" + a.preset, a.prefix_tokens ? a.prefix_seed : a.seed};
  std::unique_ptr<Writer> w;
  st = Writer::Create(replace->temp_path(), g, id, opt, &w);
  if (!st.ok()) return ReportError(st.WithContext(a.path));
  size_t S = g.streams.size();
  std::vector<std::vector<uint16_t>> blocks(g.layers * S);
  std::vector<uint32_t> tokens;
  Progress progress("synth " + a.path, a.tokens);
  for (uint64_t first = 0, n = 0; first < a.tokens; first += n) {
    n = std::min<uint64_t>(a.chunk_tokens, a.tokens - first);
    if (first < a.prefix_tokens) n = std::min(n, a.prefix_tokens - first);  // a batch is all prefix or none
    const uint64_t seed = first < a.prefix_tokens ? a.prefix_seed : a.seed;
    GenerateAll(g, seed, first, n, blocks);
    tokens.resize(n);
    synth::GenerateTokens(seed, first, n, tokens.data());
    AppendBatch batch;
    batch.tokens = tokens;
    // No rows (no block data) where a stream is absent from a layer.
    for (auto& b : blocks) batch.blocks.push_back({Dtype::kBF16, b.empty() ? nullptr : b.data(), nullptr});
    st = w->Append(batch);
    if (!st.ok()) return ReportError(st.WithContext(a.path));
    progress.Add(n);
    st = CheckInterrupt(a.path);
    if (!st.ok()) return ReportError(st);
  }
  st = w->Close();
  progress.Finish();
  if (!st.ok()) return ReportError(st.WithContext(a.path));
  st = replace->Commit();
  if (!st.ok()) return ReportError(st);
  std::printf("wrote %s: %llu tokens of %s (%s), seed %llu\n", a.path.c_str(),
              static_cast<unsigned long long>(a.tokens), a.preset.c_str(), a.dtype.c_str(),
              static_cast<unsigned long long>(a.seed));
  return kExitOk;
}

// Mismatch unless `g` is the geometry of the preset that synth named in the
// model id ("synthetic/PRESET"): its layers and streams (names, rows,
// widths; any dtype, as convert may change those). A file that lost a
// stream (a Mooncake round trip drops raw ones) matches in every stream it
// still has, so comparing the data alone would call it whole.
Status CheckPresetGeometry(const std::string& path, const ModelIdentity& id, const Geometry& g) {
  const std::string prefix = "synthetic/";
  std::string preset = id.model_id.starts_with(prefix) ? id.model_id.substr(prefix.size()) : "";
  Geometry want;
  if (preset.empty() || !GetPreset(preset, Dtype::kE4M3, &want).ok())
    return Status::Mismatch(path + ": model '" + id.model_id +
                            "' names no synth preset (synth writes 'synthetic/PRESET'), so there is nothing to check against");
  std::string streams;
  for (StreamSpec& s : want.streams) {
    std::optional<uint32_t> k = g.FindStream(s.name);
    if (k) s.dtype = g.streams[*k].dtype;
    streams += (streams.empty() ? "" : ", ") + s.name;
  }
  Status st = CheckExpected(id, g, id, want);
  if (!st.ok())
    return Status::Mismatch(path + ": not the geometry of preset " + preset + ": " + st.message() + " (" +
                            std::to_string(want.layers) + " layers; streams " + streams + ")");
  return Status::OK();
}

// Regenerates the data of an existing synthetic file and compares every
// stored code and scale (raw streams: every stored element) with it.
int RunCheck(const SynthArgs& a) {
  SetCurrentPath(a.path);
  // PACK:MEMBER: the member, materialised and checked first (pack_member.h).
  PackMemberInputs members;
  std::string opened;
  Status st = members.Resolve(a.path, &opened);
  if (!st.ok()) return ReportError(st);
  std::unique_ptr<Reader> r;
  st = Reader::Open(opened, {}, &r);
  if (!st.ok()) return ReportError(members.Name(st));
  const Geometry& g = r->geometry();
  st = CheckPresetGeometry(a.path, r->identity(), g);
  if (!st.ok()) return ReportError(st);
  uint64_t seed = r->identity().fingerprint;  // synth stores its seed here
  uint64_t total = r->token_count();
  std::vector<uint32_t> want_tokens(total);
  synth::GenerateTokens(seed, 0, total, want_tokens.data());
  auto have_tokens = r->tokens();
  for (uint64_t t = 0; t < total; ++t)
    if (have_tokens[t] != want_tokens[t])
      return ReportError(Status::Corruption(a.path + ": token " + std::to_string(t) + " id differs"));
  size_t S = g.streams.size();
  const uint64_t step = 1024;
  std::vector<std::vector<uint16_t>> blocks(g.layers * S);
  std::vector<uint8_t> want_codes, have_codes;
  std::vector<float> want_scales, have_scales;
  std::vector<uint16_t> have_raw, want_raw;
  Progress progress("check " + a.path, total);
  for (uint64_t first = 0; first < total; first += step) {
    uint64_t n = std::min(step, total - first);
    progress.Add(n);
    GenerateAll(g, seed, first, n, blocks);
    for (uint32_t l = 0; l < g.layers; ++l) {
      for (uint32_t s = 0; s < S; ++s) {
        if (!g.InLayer(l, s)) continue;
        const StreamSpec& spec = g.streams[s];
        uint64_t rows = n * spec.rows_per_token;
        uint64_t elems = rows * spec.row_width;
        const auto& in = blocks[l * S + s];
        std::string where = a.path + ": layer " + std::to_string(l) + " stream '" + spec.name +
                            "' tokens [" + std::to_string(first) + ", " + std::to_string(first + n) + ")";
        if (IsNvfp4(spec.dtype)) {
          // One nvfp4 row per token: codes, then block scales, in one buffer.
          const uint64_t width = spec.ElementsPerToken();
          want_codes.resize(n * (width / 2 + width / 16));
          have_codes.resize(want_codes.size());
          want_scales.resize(n);
          have_scales.resize(n);
          size_t bad;
          codec::QuantizeNvfp4Rows(Dtype::kBF16, in.data(), n, width, want_codes.data(),
                                   want_codes.data() + n * width / 2, want_scales.data(), &bad);
          st = r->ReadCodes(l, s, first, first + n, have_codes.data(), have_codes.data() + n * width / 2,
                            have_scales.data());
          if (!st.ok()) return ReportError(members.Name(st));
          if (want_codes != have_codes)
            return ReportError(Status::Corruption(where + ": stored codes differ from the regenerated data"));
          if (std::memcmp(want_scales.data(), have_scales.data(), n * 4) != 0)
            return ReportError(Status::Corruption(where + ": stored scales differ from the regenerated data"));
        } else if (IsFp8(spec.dtype)) {
          want_codes.resize(elems);
          want_scales.resize(rows);
          have_codes.resize(elems);
          have_scales.resize(rows);
          size_t bad;
          codec::QuantizeRows(spec.dtype, Dtype::kBF16, in.data(), rows, spec.row_width,
                              want_codes.data(), want_scales.data(), &bad);
          st = r->ReadCodes(l, s, first, first + n, have_codes.data(), have_scales.data());
          if (!st.ok()) return ReportError(members.Name(st));
          if (std::memcmp(want_codes.data(), have_codes.data(), elems) != 0)
            return ReportError(Status::Corruption(where + ": stored codes differ from the regenerated data"));
          if (std::memcmp(want_scales.data(), have_scales.data(), rows * 4) != 0)
            return ReportError(Status::Corruption(where + ": stored scales differ from the regenerated data"));
        } else {
          want_raw.resize(elems * ElementSize(spec.dtype) / 2);
          have_raw.resize(want_raw.size());
          codec::ConvertRaw(Dtype::kBF16, in.data(), elems, spec.dtype, want_raw.data());
          st = r->ReadRows(l, s, first, first + n, spec.dtype, have_raw.data());
          if (!st.ok()) return ReportError(members.Name(st));
          if (want_raw != have_raw)
            return ReportError(Status::Corruption(where + ": stored rows differ from the regenerated data"));
        }
      }
    }
  }
  progress.Finish();
  std::printf("%s: ok, all %llu tokens match the synthetic data of seed %llu\n", a.path.c_str(),
              static_cast<unsigned long long>(total), static_cast<unsigned long long>(seed));
  return kExitOk;
}

}  // namespace

void RegisterSynth(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<SynthArgs>();
  CLI::App* cmd = app.add_subcommand(
      "synth",
      "Write a deterministic synthetic KV session shaped like a real cache, or check one.\n"
      "Example: kvfile synth session.kv --preset llama-3.1-8b --tokens 32768\n"
      "         kvfile synth --check session.kv");
  cmd->add_option("FILE", args->path, "the .kv file to write (or to check)")->required();
  cmd->add_option("--preset", args->preset, "geometry preset")
      ->check(CLI::IsMember(PresetNames()))
      ->capture_default_str();
  cmd->add_option("--tokens", args->tokens, "number of tokens")->check(Count(1, uint64_t{1} << 32))->capture_default_str();
  cmd->add_option("--seed", args->seed, "generator seed (stored as the model fingerprint)")
      ->check(Count(0, UINT64_MAX))
      ->capture_default_str();
  cmd->add_option("--prefix-tokens", args->prefix_tokens,
                  "the first N tokens (ids and rows) are those of seed --prefix-seed, and so is the fingerprint:\n"
                  "sessions of different seeds share that prefix (packs, prefix lookup); --check does not\n"
                  "know of it")
      ->check(Count(0, uint64_t{1} << 32));
  cmd->add_option("--prefix-seed", args->prefix_seed, "the seed of the --prefix-tokens (default 0)")
      ->check(Count(0, UINT64_MAX));
  cmd->add_option("--dtype", args->dtype, "quantized storage dtype (nvfp4: the 4-bit tier, format 2.2)")
      ->check(CLI::IsMember({"e4m3", "e5m2", "nvfp4"}))
      ->capture_default_str();
  cmd->add_option("--chunk-tokens", args->chunk_tokens, "tokens per chunk")->check(Count(1, 65536))->capture_default_str();
  cmd->add_flag("--check", args->check, "regenerate the data and compare every stored code and scale");
  cmd->add_flag("--force", args->force, "replace FILE if it exists");
  cmd->callback([args, exit_code, cmd] {
    if (args->check) {
      // --check reads the preset, seed and token count from FILE: a flag
      // that chooses them, or --force, would be silently ignored.
      for (const CLI::Option* o : cmd->get_options())
        if (o->count() > 0 && o->get_name() != "FILE" && o->get_name() != "--check" && o->get_name() != "--help") {
          *exit_code = UsageError(o->get_name() + " does not apply to synth --check (it reads the preset, seed and "
                                  "tokens from FILE)");
          return;
        }
    }
    *exit_code = args->check ? RunCheck(*args) : RunSynth(*args);
  });
}

}  // namespace kvfile::cli
