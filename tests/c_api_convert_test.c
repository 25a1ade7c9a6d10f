// SPDX-License-Identifier: Apache-2.0
/* Tests of kvfile_convert (kvfile/c.h), compiled as C99 with warnings as
 * errors: .kv -> safetensors -> .kv with codes exact, the dtype policy
 * (every_stream, keep_raw), a damaged .kv refused unless salvage, and an
 * existing output without force refused and left byte-identical; and
 * the foreign formats both ways on the fixtures (a llama.cpp state file
 * and a colibri session back byte for byte, a Mooncake directory), and
 * the variants: a llama.cpp session, COLIKV1, a .kv of format 1; and
 * kvfile_append_safetensors.
 * Usage: c_api_convert_test DIR FIXTURES (a scratch directory, emptied by
 * the caller, and tests/fixtures). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* kvfile_writer_append and kvfile_reader_read_codes: deprecated, still what
 * this test writes and reads fp8 codes with (the parts API: c_api_test.c). */
#define KVFILE_NO_DEPRECATION_WARNINGS
#include "kvfile/c.h"
#include "support/c_check.h"

static char dir[512], fixtures[512];

enum { kTokens = 12, kLayers = 2, kStreams = 2, kPerToken = 2 * 16 };

/* A tiny file (2 layers, k and v of 2 x 16) of 12 tokens in 3 chunks of 4,
 * every stream in `dtype`. */
static void write_tiny(const char* path, kvfile_dtype dtype) {
  static float rows[kTokens * kPerToken];
  kvfile_geometry g;
  kvfile_writer_options o;
  kvfile_writer* w = NULL;
  kvfile_rows blocks[kLayers * kStreams];
  uint32_t ids[kTokens];
  int i;
  for (i = 0; i < kTokens * kPerToken; ++i) rows[i] = (float)((i * 37) % 19) / 7.0f - 1.0f;
  for (i = 0; i < kTokens; ++i) ids[i] = (uint32_t)(100 + i);
  CHECK(kvfile_preset("tiny", KVFILE_E4M3, &g) == KVFILE_OK);
  g.streams[0].dtype = dtype;
  g.streams[1].dtype = dtype;
  memset(&o, 0, sizeof o);
  o.chunk_tokens = 4;
  CHECK(kvfile_writer_create(path, &g, "test/tiny", 7, &o, &w) == KVFILE_OK);
  for (i = 0; i < kLayers * kStreams; ++i) {
    blocks[i].dtype = KVFILE_F32;
    blocks[i].data = rows;
    blocks[i].scales = NULL;
  }
  CHECK(kvfile_writer_append(w, ids, kTokens, blocks, kLayers * kStreams) == KVFILE_OK);
  CHECK(kvfile_writer_close(w) == KVFILE_OK);
}

static kvfile_dtype stream_dtype(const char* path, uint32_t stream) {
  kvfile_reader* r = NULL;
  kvfile_info info;
  kvfile_dtype d = (kvfile_dtype)0;
  if (kvfile_reader_open(path, &r) != KVFILE_OK) return d;
  if (kvfile_reader_info(r, &info) == KVFILE_OK) d = info.geometry.streams[stream].dtype;
  kvfile_reader_close(r);
  return d;
}

static void test_kv_safetensors_both_ways(void) {
  kvfile_convert_options o;
  kvfile_convert_result res;
  static uint8_t a_codes[kTokens * kPerToken], b_codes[kTokens * kPerToken];
  static float a_scales[kTokens * 2], b_scales[kTokens * 2];
  kvfile_reader *a = NULL, *b = NULL;
  write_tiny(in_dir(dir, "a.kv"), KVFILE_E4M3);
  memset(&o, 0, sizeof o);
  o.codes = 1;
  CHECK(kvfile_convert(in_dir(dir, "a.kv"), in_dir(dir, "a.safetensors"), &o, &res) == KVFILE_OK);
  CHECK(res.from == KVFILE_FORMAT_KV && res.to == KVFILE_FORMAT_SAFETENSORS && res.tokens == kTokens);
  CHECK(res.warnings == 0 && strcmp(res.warning, "") == 0);
  {
    const char* want = "12 tokens; tokens I64, k.codes F8_E4M3, k.scales F32, v.codes F8_E4M3, v.scales F32; ";
    CHECK(strncmp(res.summary, want, strlen(want)) == 0);
  }
  /* Back, with options NULL: codes imported as stored. */
  CHECK(kvfile_convert(in_dir(dir, "a.safetensors"), in_dir(dir, "b.kv"), NULL, &res) == KVFILE_OK);
  CHECK(res.from == KVFILE_FORMAT_SAFETENSORS && res.to == KVFILE_FORMAT_KV && res.tokens == kTokens);
  CHECK(kvfile_reader_open(in_dir(dir, "a.kv"), &a) == KVFILE_OK);
  CHECK(kvfile_reader_open(in_dir(dir, "b.kv"), &b) == KVFILE_OK);
  CHECK(kvfile_reader_read_codes(a, 1, 1, 0, kTokens, a_codes, sizeof a_codes, a_scales, kTokens * 2) == KVFILE_OK);
  CHECK(kvfile_reader_read_codes(b, 1, 1, 0, kTokens, b_codes, sizeof b_codes, b_scales, kTokens * 2) == KVFILE_OK);
  CHECK(memcmp(a_codes, b_codes, sizeof a_codes) == 0 && memcmp(a_scales, b_scales, sizeof a_scales) == 0);
  kvfile_reader_close(a);
  kvfile_reader_close(b);
}

static void test_dtype_policy(void) {
  kvfile_convert_options o;
  write_tiny(in_dir(dir, "raw.kv"), KVFILE_BF16);
  memset(&o, 0, sizeof o);
  o.dtype = KVFILE_E5M2; /* kvfile convert --dtype e5m2: raw streams stay raw */
  CHECK(kvfile_convert(in_dir(dir, "raw.kv"), in_dir(dir, "policy.kv"), &o, NULL) == KVFILE_OK);
  CHECK(stream_dtype(in_dir(dir, "policy.kv"), 0) == KVFILE_BF16);
  o.every_stream = 1;
  o.keep_raw = "v";
  CHECK(kvfile_convert(in_dir(dir, "raw.kv"), in_dir(dir, "every.kv"), &o, NULL) == KVFILE_OK);
  CHECK(stream_dtype(in_dir(dir, "every.kv"), 0) == KVFILE_E5M2);
  CHECK(stream_dtype(in_dir(dir, "every.kv"), 1) == KVFILE_BF16);
  o.keep_raw = "x";
  CHECK(kvfile_convert(in_dir(dir, "raw.kv"), in_dir(dir, "x.kv"), &o, NULL) == KVFILE_INVALID_ARGUMENT);
  CHECK_CONTAINS(kvfile_last_error(), "raw.kv: --keep-raw: no stream 'x' (streams: k, v)");
  CHECK(slurp(in_dir(dir, "x.kv"), NULL, 0) == -1);
  o.keep_raw = NULL;
  o.dtype = (kvfile_dtype)9;
  CHECK(kvfile_convert(in_dir(dir, "raw.kv"), in_dir(dir, "x.kv"), &o, NULL) == KVFILE_INVALID_ARGUMENT);
  CHECK(strcmp(kvfile_last_error(), "kvfile_convert: options->dtype 9 is no kvfile_dtype") == 0);
}

static void test_salvage(void) {
  static uint8_t data[1 << 16];
  kvfile_convert_options o;
  kvfile_convert_result res;
  kvfile_reader* r = NULL;
  kvfile_info info;
  long n;
  FILE* f;
  write_tiny(in_dir(dir, "d.kv"), KVFILE_E4M3);
  n = slurp(in_dir(dir, "d.kv"), data, sizeof data);
  CHECK(n > 0);
  /* The last payload byte of the last chunk (chunk 2: tokens 8..11). */
  CHECK(kvfile_reader_open(in_dir(dir, "d.kv"), &r) == KVFILE_OK);
  CHECK(kvfile_reader_info(r, &info) == KVFILE_OK && info.chunks == 3);
  kvfile_reader_close(r);
  data[n - 200] ^= 0x10;
  f = fopen(in_dir(dir, "d.kv"), "wb");
  fwrite(data, 1, (size_t)n, f);
  fclose(f);
  memset(&o, 0, sizeof o);
  CHECK(kvfile_convert(in_dir(dir, "d.kv"), in_dir(dir, "d.safetensors"), &o, &res) == KVFILE_CORRUPTION);
  CHECK_CONTAINS(kvfile_last_error(), "; not converted (kvfile verify fails on it; --salvage converts the 8 tokens "
                                      "before the damage)");
  CHECK(slurp(in_dir(dir, "d.safetensors"), NULL, 0) == -1);
  o.salvage = 1;
  CHECK(kvfile_convert(in_dir(dir, "d.kv"), in_dir(dir, "d.safetensors"), &o, &res) == KVFILE_OK);
  CHECK(res.tokens == 8 && res.warnings == 1);
  CHECK_CONTAINS(res.warning, "d.kv: --salvage: converted the verified prefix of 8 tokens; 4 committed tokens were "
                              "dropped (");
}

static void test_existing_output_untouched(void) {
  static uint8_t got[64];
  kvfile_convert_options o;
  FILE* f = fopen(in_dir(dir, "o.safetensors"), "wb");
  fputs("precious", f);
  fclose(f);
  memset(&o, 0, sizeof o);
  CHECK(kvfile_convert(in_dir(dir, "a.kv"), in_dir(dir, "o.safetensors"), &o, NULL) == KVFILE_INVALID_ARGUMENT);
  CHECK_CONTAINS(kvfile_last_error(), "o.safetensors: file exists; use --force to replace it");
  CHECK(slurp(in_dir(dir, "o.safetensors"), got, sizeof got) == 8 && memcmp(got, "precious", 8) == 0);
  o.force = 1;
  CHECK(kvfile_convert(in_dir(dir, "a.kv"), in_dir(dir, "o.safetensors"), &o, NULL) == KVFILE_OK);
  CHECK(slurp(in_dir(dir, "o.safetensors"), got, sizeof got) == -1 || memcmp(got, "precious", 8) != 0);
  CHECK(kvfile_convert(NULL, "x", NULL, NULL) == KVFILE_INVALID_ARGUMENT);
  CHECK(strcmp(kvfile_last_error(), "kvfile_convert: in is NULL") == 0);
}

static void test_foreign_formats_both_ways(void) {
  static uint8_t want[1 << 16], got[1 << 16];
  kvfile_convert_options o;
  kvfile_convert_result res;
  long n, m;
  /* llama.cpp: the state file, imported raw, exported back: llama.cpp's bytes. */
  memset(&o, 0, sizeof o);
  o.keep_raw = "k,v";
  o.llama_head_size = 64;
  CHECK(kvfile_convert(in_dir(fixtures, "llama/seq-f16-fa1.bin"), in_dir(dir, "slot.kv"), &o, &res) == KVFILE_OK);
  CHECK(res.from == KVFILE_FORMAT_LLAMA && res.to == KVFILE_FORMAT_KV && res.tokens == 24);
  memset(&o, 0, sizeof o);
  o.to = KVFILE_FORMAT_LLAMA;
  CHECK(kvfile_convert(in_dir(dir, "slot.kv"), in_dir(dir, "slot.bin"), &o, &res) == KVFILE_OK);
  CHECK(res.to == KVFILE_FORMAT_LLAMA);
  n = slurp(in_dir(fixtures, "llama/seq-f16-fa1.bin"), want, sizeof want);
  m = slurp(in_dir(dir, "slot.bin"), got, sizeof got);
  CHECK(n > 0 && m == n && memcmp(want, got, (size_t)n) == 0);
  /* colibri: the session (7 uncommitted bytes at its end) and back. */
  CHECK(kvfile_convert(in_dir(fixtures, "seeds/coli_v2.coli_kv"), in_dir(dir, "coli.kv"), NULL, &res) == KVFILE_OK);
  CHECK(res.from == KVFILE_FORMAT_COLI && res.tokens == 3);
  CHECK(kvfile_convert(in_dir(dir, "coli.kv"), in_dir(dir, "back.coli_kv"), NULL, &res) == KVFILE_OK);
  CHECK(res.to == KVFILE_FORMAT_COLI);
  n = slurp(in_dir(fixtures, "seeds/coli_v2.coli_kv"), want, sizeof want);
  m = slurp(in_dir(dir, "back.coli_kv"), got, sizeof got);
  CHECK(n == 215 && m == 208 && memcmp(want, got, 208) == 0);
  /* Mooncake: a record directory and back, codes as stored. */
  memset(&o, 0, sizeof o);
  o.to = KVFILE_FORMAT_MOONCAKE;
  CHECK(kvfile_convert(in_dir(dir, "coli.kv"), in_dir(dir, "mc"), &o, &res) == KVFILE_OK);
  CHECK(res.to == KVFILE_FORMAT_MOONCAKE && res.tokens == 3);
  CHECK(kvfile_convert(in_dir(dir, "mc"), in_dir(dir, "mc.kv"), NULL, &res) == KVFILE_OK);
  CHECK(res.from == KVFILE_FORMAT_MOONCAKE && res.to == KVFILE_FORMAT_KV && res.tokens == 3);
  {
    kvfile_reader *a = NULL, *b = NULL;
    static uint8_t ca[3 * 4], cb[3 * 4];
    static float sa[3], sb[3];
    CHECK(kvfile_reader_open(in_dir(dir, "coli.kv"), &a) == KVFILE_OK);
    CHECK(kvfile_reader_open(in_dir(dir, "mc.kv"), &b) == KVFILE_OK);
    CHECK(kvfile_reader_read_codes(a, 1, 0, 0, 3, ca, sizeof ca, sa, 3) == KVFILE_OK);
    CHECK(kvfile_reader_read_codes(b, 1, 0, 0, 3, cb, sizeof cb, sb, 3) == KVFILE_OK);
    CHECK(memcmp(ca, cb, sizeof ca) == 0 && memcmp(sa, sb, sizeof sa) == 0);
    kvfile_reader_close(a);
    kvfile_reader_close(b);
  }
}

/* The rest of the formats both ways: a llama.cpp session file (V transposed,
 * as imported) byte for byte, a colibri COLIKV1 export (the fixture of the
 * v2 session's rows in v1's layout), and a .kv of format 1 and back (bf16)
 * with every value as it was; the C-only choice fields refuse a value out of
 * their enum. */
static void test_remaining_variants_both_ways(void) {
  static uint8_t want[1 << 16], got[1 << 16];
  static float a_rows[kTokens * kPerToken], b_rows[kTokens * kPerToken];
  kvfile_convert_options o;
  kvfile_convert_result res;
  kvfile_reader *a = NULL, *b = NULL;
  kvfile_info info;
  long n, m;
  uint32_t layer, stream;
  memset(&o, 0, sizeof o);
  o.keep_raw = "k,v";
  o.llama_head_size = 64;
  CHECK(kvfile_convert(in_dir(fixtures, "llama/session-f16-fa0.bin"), in_dir(dir, "sess.kv"), &o, &res) ==
        KVFILE_OK);
  CHECK(res.from == KVFILE_FORMAT_LLAMA && res.tokens == 24);
  CHECK_CONTAINS(res.summary, "session of f16/f16 cache (V transposed)");
  memset(&o, 0, sizeof o);
  o.to = KVFILE_FORMAT_LLAMA;
  o.llama_session = 1;
  o.llama_type = "f16";
  CHECK(kvfile_convert(in_dir(dir, "sess.kv"), in_dir(dir, "sess.bin"), &o, &res) == KVFILE_OK);
  CHECK(strcmp(res.summary, "24 tokens; 2 layers; llama.cpp session, f16 cache (V transposed); 25045 bytes") == 0);
  n = slurp(in_dir(fixtures, "llama/session-f16-fa0.bin"), want, sizeof want);
  m = slurp(in_dir(dir, "sess.bin"), got, sizeof got);
  CHECK(n == 25045 && m == n && memcmp(want, got, (size_t)n) == 0);
  /* The same cache as a sequence state with V not transposed: another file. */
  o.llama_session = 0;
  o.llama_v_trans = KVFILE_CHOICE_NO;
  o.force = 1;
  CHECK(kvfile_convert(in_dir(dir, "sess.kv"), in_dir(dir, "sess.bin"), &o, &res) == KVFILE_OK);
  CHECK(strcmp(res.summary, "24 tokens; 2 layers; llama.cpp sequence state, f16 cache; 25036 bytes") == 0);
  o.llama_v_trans = 7;
  CHECK(kvfile_convert(in_dir(dir, "sess.kv"), in_dir(dir, "sess.bin"), &o, &res) == KVFILE_INVALID_ARGUMENT);
  CHECK(strcmp(kvfile_last_error(), "kvfile_convert: options->llama_v_trans 7 is no kvfile_choice") == 0);
  CHECK(slurp(in_dir(dir, "sess.bin"), got, sizeof got) == 25036);
  /* colibri version 1. */
  CHECK(kvfile_convert(in_dir(fixtures, "seeds/coli_v2.coli_kv"), in_dir(dir, "c2.kv"), NULL, &res) == KVFILE_OK);
  memset(&o, 0, sizeof o);
  o.coli_v1 = 1;
  CHECK(kvfile_convert(in_dir(dir, "c2.kv"), in_dir(dir, "c1.coli_kv"), &o, &res) == KVFILE_OK);
  CHECK(res.to == KVFILE_FORMAT_COLI && strcmp(res.summary, "COLIKV1, 3 tokens") == 0);
  n = slurp(in_dir(fixtures, "seeds/coli_v2_as_v1.coli_kv"), want, sizeof want);
  m = slurp(in_dir(dir, "c1.coli_kv"), got, sizeof got);
  CHECK(n > 0 && m == n && memcmp(want, got, (size_t)n) == 0);
  /* .kv format 1 (raw rows) and back to format 2. */
  /* raw.kv: the bf16 file of test_dtype_policy. */
  memset(&o, 0, sizeof o);
  o.kv_major = 1;
  CHECK(kvfile_convert(in_dir(dir, "raw.kv"), in_dir(dir, "fmt1.kv"), &o, &res) == KVFILE_OK);
  CHECK(kvfile_reader_open(in_dir(dir, "fmt1.kv"), &b) == KVFILE_OK);
  CHECK(kvfile_reader_info(b, &info) == KVFILE_OK && info.major_version == 1 && info.tokens == kTokens);
  kvfile_reader_close(b);
  /* Format 2's default for a format 1 file is the upgrade's, e4m3; bf16 keeps every value. */
  CHECK(kvfile_convert(in_dir(dir, "fmt1.kv"), in_dir(dir, "fmt1q.kv"), NULL, &res) == KVFILE_OK);
  CHECK(stream_dtype(in_dir(dir, "fmt1q.kv"), 0) == KVFILE_E4M3);
  memset(&o, 0, sizeof o);
  o.dtype = KVFILE_BF16;
  CHECK(kvfile_convert(in_dir(dir, "fmt1.kv"), in_dir(dir, "fmt1back.kv"), &o, &res) == KVFILE_OK);
  CHECK(kvfile_reader_open(in_dir(dir, "raw.kv"), &a) == KVFILE_OK);
  CHECK(kvfile_reader_open(in_dir(dir, "fmt1back.kv"), &b) == KVFILE_OK);
  CHECK(kvfile_reader_info(b, &info) == KVFILE_OK && info.major_version == 2 && info.tokens == kTokens);
  for (layer = 0; layer < kLayers; ++layer)
    for (stream = 0; stream < kStreams; ++stream) {
      CHECK(kvfile_reader_read_rows(a, layer, stream, 0, kTokens, KVFILE_F32, a_rows, sizeof a_rows) == KVFILE_OK);
      CHECK(kvfile_reader_read_rows(b, layer, stream, 0, kTokens, KVFILE_F32, b_rows, sizeof b_rows) == KVFILE_OK);
      CHECK(memcmp(a_rows, b_rows, sizeof a_rows) == 0);
    }
  kvfile_reader_close(a);
  kvfile_reader_close(b);
}

static int test_info(const char* path, kvfile_info* info) {
  kvfile_reader* r = NULL;
  int ok;
  if (kvfile_reader_open(path, &r) != KVFILE_OK) return 0;
  ok = kvfile_reader_info(r, info) == KVFILE_OK;
  kvfile_reader_close(r);
  return ok;
}

/* kvfile_append_safetensors: a new file, then the same tokens again; a
 * model mismatch refused with the file as it was; the options (dtype,
 * keep_raw, model) for a new file; bad options and NULLs refused. */
static void test_append_safetensors(void) {
  kvfile_append_options o;
  kvfile_append_result res;
  kvfile_info info;
  static uint8_t before[1 << 16], after[1 << 16];
  long n;
  write_tiny(in_dir(dir, "ap-src.kv"), KVFILE_E4M3);
  CHECK(kvfile_convert(in_dir(dir, "ap-src.kv"), in_dir(dir, "ap.safetensors"), NULL, NULL) == KVFILE_OK);
  CHECK(kvfile_append_safetensors(in_dir(dir, "ap.kv"), in_dir(dir, "ap.safetensors"), NULL, &res) == KVFILE_OK);
  CHECK(res.created == 1 && res.upgraded == 0 && res.tokens_before == 0 && res.tokens_appended == kTokens);
  CHECK(strcmp(res.note, "") == 0);
  CHECK(kvfile_append_safetensors(in_dir(dir, "ap.kv"), in_dir(dir, "ap.safetensors"), NULL, &res) == KVFILE_OK);
  CHECK(res.created == 0 && res.tokens_before == kTokens && res.tokens_appended == kTokens);
  CHECK(test_info(in_dir(dir, "ap.kv"), &info) && info.tokens == 2 * kTokens);
  CHECK(strcmp(info.model_id, "test/tiny") == 0 && info.geometry.streams[0].dtype == KVFILE_E4M3);
  {
    kvfile_reader* r = NULL;
    uint32_t ids[2 * kTokens];
    size_t got = 0;
    int i;
    CHECK(kvfile_reader_open(in_dir(dir, "ap.kv"), &r) == KVFILE_OK);
    CHECK(kvfile_reader_tokens(r, ids, 2 * kTokens, &got) == KVFILE_OK && got == 2 * kTokens);
    for (i = 0; i < 2 * kTokens; ++i) CHECK(ids[i] == (uint32_t)(100 + i % kTokens));
    kvfile_reader_close(r);
  }

  /* Another model: refused before anything is written. */
  n = slurp(in_dir(dir, "ap.kv"), before, sizeof before);
  CHECK(n > 0 && (size_t)n < sizeof before);
  memset(&o, 0, sizeof o);
  o.model = "someone/else";
  CHECK(kvfile_append_safetensors(in_dir(dir, "ap.kv"), in_dir(dir, "ap.safetensors"), &o, &res) == KVFILE_MISMATCH);
  CHECK_CONTAINS(kvfile_last_error(), "ap.kv: model id: file has 'test/tiny', expected 'someone/else'");
  CHECK(slurp(in_dir(dir, "ap.kv"), after, sizeof after) == n && memcmp(before, after, (size_t)n) == 0);

  /* A new file's dtypes, raw streams and model from the options. */
  o.dtype = KVFILE_E5M2;
  o.keep_raw = "v";
  o.chunk_tokens = 5;
  o.sync = KVFILE_SYNC_CHUNK;
  CHECK(kvfile_append_safetensors(in_dir(dir, "ap2.kv"), in_dir(dir, "ap.safetensors"), &o, &res) == KVFILE_OK);
  CHECK(test_info(in_dir(dir, "ap2.kv"), &info) && info.tokens == kTokens && info.nominal_chunk_tokens == 5);
  CHECK(strcmp(info.model_id, "someone/else") == 0);
  CHECK(info.geometry.streams[0].dtype == KVFILE_E5M2 && info.geometry.streams[1].dtype == KVFILE_BF16);

  /* Options that are no value of their type, and NULLs. */
  memset(&o, 0, sizeof o);
  o.dtype = 99;
  CHECK(kvfile_append_safetensors(in_dir(dir, "ap3.kv"), in_dir(dir, "ap.safetensors"), &o, &res) ==
        KVFILE_INVALID_ARGUMENT);
  CHECK(strcmp(kvfile_last_error(), "kvfile_append_safetensors: options->dtype 99 is no kvfile_dtype") == 0);
  o.dtype = 0;
  o.sync = 7;
  CHECK(kvfile_append_safetensors(in_dir(dir, "ap3.kv"), in_dir(dir, "ap.safetensors"), &o, &res) ==
        KVFILE_INVALID_ARGUMENT);
  CHECK(strcmp(kvfile_last_error(), "kvfile_append_safetensors: options->sync 7 is no kvfile_sync_mode") == 0);
  CHECK(slurp(in_dir(dir, "ap3.kv"), after, sizeof after) == -1);
  CHECK(kvfile_append_safetensors(NULL, "x", NULL, NULL) == KVFILE_INVALID_ARGUMENT);
  CHECK(strcmp(kvfile_last_error(), "kvfile_append_safetensors: file is NULL") == 0);
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: c_api_convert_test DIR FIXTURES\n");
    return 2;
  }
  snprintf(dir, sizeof dir, "%s", argv[1]);
  snprintf(fixtures, sizeof fixtures, "%s", argv[2]);
  test_kv_safetensors_both_ways();
  test_dtype_policy();
  test_salvage();
  test_existing_output_untouched();
  test_foreign_formats_both_ways();
  test_remaining_variants_both_ways();
  test_append_safetensors();
  return check_summary("c_api_convert_test");
}
