// SPDX-License-Identifier: Apache-2.0
// llama_roundtrip: the llama.cpp side of kvfile's llama.cpp round-trip proof
// (docs/llama.md). Built against llama.h by make_fixtures.sh, not by the
// project's CMake.
//
//   llama_roundtrip MODEL save    OUT TYPE FA N [session]
//       decodes tokens 1..N, saves sequence 0 (or the whole context as a
//       session file) to OUT.
//   llama_roundtrip MODEL restore IN  TYPE FA G [session] [LOGITS]
//       in a fresh context restores IN, decodes one more token (id 7) after
//       the restored ones, writes that token's logits (raw f32) to LOGITS if
//       given, then G greedy steps; prints "n=<tokens> greedy=<ids...>".
//   llama_roundtrip MODEL straight N TYPE FA G [LOGITS]
//       the uninterrupted run: decodes 1..N and 7 in one context, same output.
//
// TYPE is the cache type of K and V (f32, f16, bf16, q8_0), or K/V with
// two types (q8_0/f16: llama.cpp's -ctk q8_0 alone); FA 1 turns flash
// attention on, 0 off. In the environment, RT_NSEQ=N makes a context of N
// sequences with a cache stream each (llama-server -np N, kv_unified off),
// and RT_SEQ=S saves or restores sequence S (default 0).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llama.h"

namespace {

constexpr llama_token kNextToken = 7;

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "llama_roundtrip: %s\n", msg.c_str());
  std::exit(1);
}

ggml_type TypeOf(const std::string& s) {
  if (s == "f32") return GGML_TYPE_F32;
  if (s == "f16") return GGML_TYPE_F16;
  if (s == "bf16") return GGML_TYPE_BF16;
  if (s == "q8_0") return GGML_TYPE_Q8_0;
  Die("unknown cache type " + s);
}

int EnvInt(const char* name, int dflt) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : dflt;
}

llama_context* NewContext(llama_model* model, const std::string& type, bool fa) {
  llama_context_params p = llama_context_default_params();
  int n_seq = EnvInt("RT_NSEQ", 1);
  p.n_ctx = 256 * n_seq;
  p.n_batch = 256;
  p.n_ubatch = 256;
  p.n_seq_max = n_seq;
  p.kv_unified = n_seq == 1;
  p.n_threads = 1;
  p.n_threads_batch = 1;
  size_t slash = type.find('/');
  p.type_k = TypeOf(type.substr(0, slash));
  p.type_v = TypeOf(slash == std::string::npos ? type : type.substr(slash + 1));
  p.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
  llama_context* ctx = llama_init_from_model(model, p);
  if (!ctx) Die("cannot create a context with a " + type + " cache, flash attention " + (fa ? "on" : "off"));
  return ctx;
}

// Decodes `tokens` into sequence RT_SEQ after the `past` tokens it holds.
void Decode(llama_context* ctx, std::vector<llama_token> tokens, int past) {
  llama_batch b = llama_batch_init(static_cast<int32_t>(tokens.size()), 0, 1);
  for (size_t i = 0; i < tokens.size(); ++i) {
    b.token[i] = tokens[i];
    b.pos[i] = past + static_cast<int>(i);
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = EnvInt("RT_SEQ", 0);
    b.logits[i] = i + 1 == tokens.size();
  }
  b.n_tokens = static_cast<int32_t>(tokens.size());
  if (llama_decode(ctx, b) != 0) Die("llama_decode failed");
  llama_batch_free(b);
}

// Decodes kNextToken, writes its logits, then greedy steps; prints the result.
void Continue(llama_context* ctx, const llama_model* model, size_t n, int greedy, const char* logits_path) {
  int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  Decode(ctx, {kNextToken}, static_cast<int>(n));
  const float* logits = llama_get_logits_ith(ctx, -1);
  if (logits_path) {
    FILE* f = std::fopen(logits_path, "wb");
    if (!f || std::fwrite(logits, sizeof(float), n_vocab, f) != static_cast<size_t>(n_vocab) || std::fclose(f) != 0)
      Die(std::string("cannot write ") + logits_path);
  }
  std::printf("n=%zu greedy=", n);
  for (int g = 0; g < greedy; ++g) {
    logits = llama_get_logits_ith(ctx, -1);
    llama_token best = 0;
    for (int i = 1; i < n_vocab; ++i)
      if (logits[i] > logits[best]) best = i;
    std::printf("%s%d", g ? "," : "", best);
    Decode(ctx, {best}, static_cast<int>(n) + 1 + g);
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 7) Die("usage: see the comment at the top of roundtrip.cc");
  std::string model_path = argv[1], mode = argv[2];
  llama_log_set([](ggml_log_level level, const char* text, void*) {
    if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
  }, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  llama_model* model = llama_model_load_from_file(model_path.c_str(), mp);
  if (!model) Die("cannot load " + model_path);
  if (mode == "save") {
    std::string out = argv[3], type = argv[4];
    bool fa = std::atoi(argv[5]) != 0;
    int n = std::atoi(argv[6]);
    bool session = argc > 7 && std::strcmp(argv[7], "session") == 0;
    llama_context* ctx = NewContext(model, type, fa);
    std::vector<llama_token> toks;
    for (int i = 1; i <= n; ++i) toks.push_back(i);
    Decode(ctx, toks, 0);
    bool ok = session ? llama_state_save_file(ctx, out.c_str(), toks.data(), toks.size())
                      : llama_state_seq_save_file(ctx, out.c_str(), EnvInt("RT_SEQ", 0), toks.data(), toks.size()) > 0;
    if (!ok) Die("cannot save " + out);
    llama_free(ctx);
  } else if (mode == "restore") {
    std::string in = argv[3], type = argv[4];
    bool fa = std::atoi(argv[5]) != 0;
    int greedy = std::atoi(argv[6]);
    bool session = argc > 7 && std::strcmp(argv[7], "session") == 0;
    const char* logits_path = argc > 8 ? argv[8] : nullptr;
    llama_context* ctx = NewContext(model, type, fa);
    std::vector<llama_token> toks(256);
    size_t n = 0;
    bool ok = session ? llama_state_load_file(ctx, in.c_str(), toks.data(), toks.size(), &n)
                      : llama_state_seq_load_file(ctx, in.c_str(), EnvInt("RT_SEQ", 0), toks.data(), toks.size(), &n) > 0;
    if (!ok) Die("cannot restore " + in);
    Continue(ctx, model, n, greedy, logits_path);
    llama_free(ctx);
  } else if (mode == "straight") {
    int n = std::atoi(argv[3]);
    std::string type = argv[4];
    bool fa = std::atoi(argv[5]) != 0;
    int greedy = std::atoi(argv[6]);
    const char* logits_path = argc > 7 ? argv[7] : nullptr;
    llama_context* ctx = NewContext(model, type, fa);
    std::vector<llama_token> toks;
    for (int i = 1; i <= n; ++i) toks.push_back(i);
    Decode(ctx, toks, 0);
    Continue(ctx, model, toks.size(), greedy, logits_path);
    llama_free(ctx);
  } else {
    Die("unknown mode " + mode);
  }
  llama_model_free(model);
  return 0;
}
