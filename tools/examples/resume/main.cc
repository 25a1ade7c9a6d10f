// SPDX-License-Identifier: Apache-2.0
// resume_example: the loop of an inference engine that keeps each
// session's KV cache in a .kv file, on the llama-3.1-8b geometry with
// synthetic KV (synthetic_kv.h).
//
//   resume_example SESSION --prompt-tokens N [--diverge-at M] [--expect-reuse R]
//
// Given a prompt (N token ids, the same as any earlier prompt up to
// position M), it finds how much of the session file the prompt can reuse
// (the longest common prefix), loads that prefix's KV layer by layer as an
// engine would before attention, checks every loaded value against what
// the synthetic model gives (exactly: the codec's round trip of the same
// rows), rewinds the file where the prompt diverges, and appends the KV of
// the remaining tokens. It prints how many tokens were reused and how long
// loading took, then reopens the file and checks it now holds exactly the
// prompt. With --expect-reuse (for tests), a reuse other than R is an
// error. Exit status 0 on success, 1 on any error or mismatch.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvfile/codec.h"
#include "kvfile/presets.h"
#include "kvfile/reader.h"
#include "kvfile/writer.h"
#include "synthetic_kv.h"

namespace {

using kvfile::Status;

struct Args {
  std::string session;
  uint64_t prompt_tokens = 0;
  uint64_t diverge_at = UINT64_MAX;  // never: the prompt of every earlier run
  std::optional<uint64_t> expect_reuse;
};

bool ParseArgs(int argc, char** argv, Args* args) {
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    bool has_value = i + 1 < argc;
    if (a == "--prompt-tokens" && has_value) {
      args->prompt_tokens = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--diverge-at" && has_value) {
      args->diverge_at = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--expect-reuse" && has_value) {
      args->expect_reuse = std::strtoull(argv[++i], nullptr, 10);
    } else if (!a.starts_with("--") && args->session.empty()) {
      args->session = a;
    } else {
      return false;
    }
  }
  return !args->session.empty() && args->prompt_tokens > 0;
}

// What the engine's attention expects back for rows it stored: the rows
// quantized and decoded by the codec, in bf16.
void ExpectedBf16(const kvfile::StreamSpec& s, const std::vector<uint16_t>& rows, std::vector<uint16_t>* out) {
  const kvfile::Dtype kind = s.dtype;  // the stream's fp8 dtype is the codec's kind
  size_t row_count = rows.size() / s.row_width;
  std::vector<uint8_t> codes(rows.size());
  std::vector<float> scales(row_count);
  size_t bad_row = 0;
  kvfile::codec::QuantizeRows(kind, kvfile::Dtype::kBF16, rows.data(), row_count, s.row_width, codes.data(),
                              scales.data(), &bad_row);
  out->resize(rows.size());
  kvfile::codec::DequantizeRows(kind, codes.data(), scales.data(), row_count, s.row_width, kvfile::Dtype::kBF16,
                                out->data());
}

// Loads KV of tokens [0, prefix) layer by layer into `kv` (what the engine
// would place in its attention cache) and returns the time the reads took
// (the buffers are allocated before the clock starts, as an engine's cache
// would be).
Status LoadPrefix(kvfile::Reader& r, uint64_t prefix, std::vector<std::vector<uint16_t>>* kv, double* seconds) {
  const kvfile::Geometry& g = r.geometry();
  kv->assign(g.layers * g.streams.size(), {});
  for (uint32_t layer = 0; layer < g.layers; ++layer)
    for (uint32_t s = 0; s < g.streams.size(); ++s)
      (*kv)[layer * g.streams.size() + s].resize(prefix * g.streams[s].ElementsPerToken());
  auto start = std::chrono::steady_clock::now();
  for (uint32_t layer = 0; layer < g.layers; ++layer) {
    for (uint32_t s = 0; s < g.streams.size(); ++s) {
      uint16_t* dst = (*kv)[layer * g.streams.size() + s].data();
      KVFILE_RETURN_IF_ERROR(r.ReadRows(layer, s, 0, prefix, kvfile::Dtype::kBF16, dst));
    }
  }
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return Status::OK();
}

// Checks the loaded KV of every token against the synthetic model's rows
// for the same ids and positions.
Status CheckPrefix(const kvfile::Geometry& g, std::span<const uint32_t> ids,
                   const std::vector<std::vector<uint16_t>>& kv) {
  std::vector<uint16_t> rows, expected;
  for (uint32_t layer = 0; layer < g.layers; ++layer) {
    for (uint32_t s = 0; s < g.streams.size(); ++s) {
      rows.resize(ids.size() * g.streams[s].ElementsPerToken());
      resume::SyntheticRows(g, layer, s, ids, 0, rows.data());
      ExpectedBf16(g.streams[s], rows, &expected);
      const std::vector<uint16_t>& got = kv[layer * g.streams.size() + s];
      for (size_t e = 0; e < expected.size(); ++e) {
        if (got[e] != expected[e])
          return Status::Mismatch("layer " + std::to_string(layer) + " stream '" + g.streams[s].name + "' token " +
                                  std::to_string(e / g.streams[s].ElementsPerToken()) +
                                  ": the loaded KV is not the one computed for that token");
      }
    }
  }
  return Status::OK();
}

// Appends the KV of ids[first, end) (positions first...), computed now.
Status AppendNew(kvfile::Writer& w, std::span<const uint32_t> ids, uint64_t first) {
  const kvfile::Geometry& g = w.geometry();
  std::span<const uint32_t> fresh = ids.subspan(first);
  std::vector<std::vector<uint16_t>> rows(g.layers * g.streams.size());
  kvfile::AppendBatch batch;
  batch.tokens = fresh;
  for (uint32_t layer = 0; layer < g.layers; ++layer) {
    for (uint32_t s = 0; s < g.streams.size(); ++s) {
      std::vector<uint16_t>& block = rows[layer * g.streams.size() + s];
      block.resize(fresh.size() * g.streams[s].ElementsPerToken());
      resume::SyntheticRows(g, layer, s, fresh, first, block.data());
      batch.blocks.push_back({kvfile::Dtype::kBF16, block.data(), nullptr});
    }
  }
  KVFILE_RETURN_IF_ERROR(w.Append(batch));
  return w.Close();
}

Status Run(const Args& args) {
  kvfile::Geometry g;
  KVFILE_RETURN_IF_ERROR(kvfile::GetPreset("llama-3.1-8b", kvfile::Dtype::kE4M3, &g));
  const kvfile::ModelIdentity model{"synthetic/resume-example", 8};
  std::vector<uint32_t> prompt(args.prompt_tokens);
  resume::PromptTokens(prompt.size(), args.diverge_at, prompt.data());

  // Reuse: what the session file shares with the prompt, loaded and checked.
  uint64_t reused = 0;
  double load_seconds = 0;
  bool exists = false;
  KVFILE_RETURN_IF_ERROR(kvfile::FileSystem::Default()->Exists(args.session, &exists));
  if (exists) {
    kvfile::ReaderOptions ro;
    ro.expect_identity = model;
    ro.expect_geometry = g;
    std::unique_ptr<kvfile::Reader> r;
    KVFILE_RETURN_IF_ERROR(kvfile::Reader::Open(args.session, ro, &r));
    reused = r->LongestCommonPrefix(prompt);
    std::vector<std::vector<uint16_t>> kv;
    KVFILE_RETURN_IF_ERROR(LoadPrefix(*r, reused, &kv, &load_seconds));
    KVFILE_RETURN_IF_ERROR(CheckPrefix(g, std::span<const uint32_t>(prompt).first(reused), kv));
  }

  // Compute the rest: cut what the prompt does not share, append the new KV.
  std::unique_ptr<kvfile::Writer> w;
  uint64_t dropped = 0;
  if (exists) {
    KVFILE_RETURN_IF_ERROR(kvfile::Writer::Open(args.session, kvfile::WriterOptions{}, &w));
    dropped = w->token_count() - reused;
    if (dropped > 0) KVFILE_RETURN_IF_ERROR(w->Rewind(reused));
  } else {
    KVFILE_RETURN_IF_ERROR(kvfile::Writer::Create(args.session, g, model, kvfile::WriterOptions{}, &w));
  }
  KVFILE_RETURN_IF_ERROR(AppendNew(*w, prompt, reused));

  uint64_t elements_per_token = 0;
  for (const kvfile::StreamSpec& s : g.streams) elements_per_token += s.ElementsPerToken();
  double loaded_bytes = static_cast<double>(reused * g.layers * elements_per_token * 2);  // bf16
  std::string loaded = "nothing to load";
  if (reused > 0) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "loaded layer by layer in %.2f ms (%.2f GB/s of bf16 KV)", load_seconds * 1e3,
                  loaded_bytes / load_seconds / 1e9);
    loaded = buf;
  }
  std::printf("%s: reused %llu of %llu tokens (%s); dropped %llu, appended %llu tokens\n", args.session.c_str(),
              static_cast<unsigned long long>(reused), static_cast<unsigned long long>(prompt.size()),
              loaded.c_str(), static_cast<unsigned long long>(dropped),
              static_cast<unsigned long long>(prompt.size() - reused));

  // What the next request will find: the prompt's tokens, all of them.
  std::unique_ptr<kvfile::Reader> after;
  KVFILE_RETURN_IF_ERROR(kvfile::Reader::Open(args.session, kvfile::ReaderOptions{}, &after));
  if (!std::ranges::equal(after->tokens(), prompt))
    return Status::Mismatch("after the append the file holds " + std::to_string(after->token_count()) +
                            " tokens that are not the prompt's " + std::to_string(prompt.size()));
  if (args.expect_reuse && reused != *args.expect_reuse)
    return Status::Mismatch("reused " + std::to_string(reused) + " tokens, expected " +
                            std::to_string(*args.expect_reuse));
  return Status::OK();
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!ParseArgs(argc, argv, &args)) {
    std::fprintf(stderr, "usage: resume_example SESSION --prompt-tokens N [--diverge-at M] [--expect-reuse R]\n");
    return 2;
  }
  Status st = Run(args);
  if (!st.ok()) {
    std::fprintf(stderr, "resume_example: error: %s: %s\n", args.session.c_str(), st.ToString().c_str());
    return 1;
  }
  return 0;
}
