// SPDX-License-Identifier: Apache-2.0
/* Tests of the C API (kvfile/c.h), compiled as C99 with warnings as
 * errors: every function, on good input and on each kind of bad input
 * (wrong path, bad argument, buffer too small, damaged file), checking
 * values, status codes and messages.
 * Usage: c_api_test DIR (a scratch directory, emptied by the caller). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The deprecated entry points are tested too (they still work). */
#define KVFILE_NO_DEPRECATION_WARNINGS
#include "kvfile/c.h"
#include "support/c_check.h"

/* The tiny preset: 2 layers, streams k and v of 2 rows x 16. */
enum { kLayers = 2, kStreams = 2, kRows = 2, kWidth = 16, kPerToken = kRows * kWidth };
enum { kTokens = 10, kChunkTokens = 4 };

static char dir[512];

/* Element i of (layer, stream) for token t; magnitudes in [0.5, 1). */
static float value(int layer, int stream, int t, int i) {
  float v = 0.5f + (float)((layer * 7 + stream * 3 + t * 5 + i) % 32) / 64.0f;
  return (i % 2 == 0) ? v : -v;
}

/* x rounded to nearest even into bf16 (x finite), as decoding to bf16 does. */
static uint16_t bf16_of(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static uint32_t token_id(int t) { return (uint32_t)(1000 + 37 * t); }

/* Rows of tokens [first, first + n) for every (layer, stream), as f32. */
static float rows_f32[kLayers * kStreams][kTokens * kPerToken];

static void fill_rows(void) {
  for (int l = 0; l < kLayers; ++l)
    for (int s = 0; s < kStreams; ++s)
      for (int t = 0; t < kTokens; ++t)
        for (int i = 0; i < kPerToken; ++i) rows_f32[l * kStreams + s][t * kPerToken + i] = value(l, s, t, i);
}

static void blocks_for(int first, kvfile_rows* blocks) {
  for (int b = 0; b < kLayers * kStreams; ++b) {
    blocks[b].dtype = KVFILE_F32;
    blocks[b].data = &rows_f32[b][first * kPerToken];
    blocks[b].scales = NULL;
  }
}

static void test_status_names_and_sizes(void) {
  CHECK(strcmp(kvfile_status_name(KVFILE_OK), "ok") == 0);
  CHECK(strcmp(kvfile_status_name(KVFILE_CORRUPTION), "corruption") == 0);
  CHECK(strcmp(kvfile_status_name(KVFILE_BUFFER_TOO_SMALL), "buffer too small") == 0);
  CHECK(strcmp(kvfile_status_name((kvfile_status)55), "unknown") == 0);
  CHECK(kvfile_dtype_size(KVFILE_E4M3) == 1);
  CHECK(kvfile_dtype_size(KVFILE_BF16) == 2);
  CHECK(kvfile_dtype_size(KVFILE_F16) == 2);
  CHECK(kvfile_dtype_size(KVFILE_F32) == 4);
  CHECK(kvfile_dtype_size((kvfile_dtype)0) == 0);
}

static void test_presets(void) {
  kvfile_geometry g;
  CHECK_STATUS(kvfile_preset("llama-3.1-8b", KVFILE_E5M2, &g), KVFILE_OK);
  CHECK(g.layers == 32 && g.stream_count == 2);
  CHECK(strcmp(g.streams[0].name, "k") == 0 && strcmp(g.streams[1].name, "v") == 0);
  CHECK(g.streams[1].rows_per_token == 8 && g.streams[1].row_width == 128 && g.streams[1].dtype == KVFILE_E5M2);
  CHECK_STATUS(kvfile_preset("dsa-mixed", KVFILE_E4M3, &g), KVFILE_OK);
  CHECK(g.stream_count == 3 && strcmp(g.streams[2].name, "indexer") == 0 && g.streams[2].dtype == KVFILE_BF16);

  CHECK_STATUS(kvfile_preset("gpt-17", KVFILE_E4M3, &g), KVFILE_INVALID_ARGUMENT);
  CHECK_CONTAINS(kvfile_last_error(), "unknown preset 'gpt-17'");
  CHECK_CONTAINS(kvfile_last_error(), "llama-3.1-8b");
  CHECK_STATUS(kvfile_preset("tiny", KVFILE_BF16, &g), KVFILE_INVALID_ARGUMENT);
  CHECK_CONTAINS(kvfile_last_error(), "e4m3, e5m2 or nvfp4, not bf16");
  CHECK_STATUS(kvfile_preset(NULL, KVFILE_E4M3, &g), KVFILE_INVALID_ARGUMENT);
  CHECK(strcmp(kvfile_last_error(), "kvfile_preset: name is NULL") == 0);
}

/* Creates the session: tokens [0, 7) as f32 rows, then [7, 10) as
 * pre-quantized codes + scales read back from the file's own tokens 0..2
 * (so their codes are known exactly). */
static void test_write(void) {
  const char* path = in_dir(dir, "s.kv");
  kvfile_geometry g;
  CHECK_STATUS(kvfile_preset("tiny", KVFILE_E4M3, &g), KVFILE_OK);
  kvfile_writer_options options;
  memset(&options, 0, sizeof options);
  options.chunk_tokens = kChunkTokens;

  kvfile_writer* w = (kvfile_writer*)1;
  CHECK_STATUS(kvfile_writer_create(in_dir(dir, "no/such/dir/x.kv"), &g, "m", 1, &options, &w), KVFILE_NOT_FOUND);
  CHECK(w == NULL);
  CHECK_CONTAINS(kvfile_last_error(), "no/such/dir");

  kvfile_geometry bad = g;
  bad.stream_count = KVFILE_MAX_STREAMS + 1;
  CHECK_STATUS(kvfile_writer_create(path, &bad, "m", 1, &options, &w), KVFILE_INVALID_ARGUMENT);
  CHECK_CONTAINS(kvfile_last_error(), "stream_count 17");
  bad = g;
  memset(bad.streams[1].name, 'x', sizeof bad.streams[1].name);
  CHECK_STATUS(kvfile_writer_create(path, &bad, "m", 1, &options, &w), KVFILE_INVALID_ARGUMENT);
  CHECK_CONTAINS(kvfile_last_error(), "not NUL-terminated");
  bad = g;
  bad.layers = 0;
  CHECK_STATUS(kvfile_writer_create(path, &bad, "m", 1, &options, &w), KVFILE_INVALID_ARGUMENT);
  CHECK(w == NULL);

  CHECK_STATUS(kvfile_writer_create(path, &g, "test/tiny", 0xfeedULL, &options, &w), KVFILE_OK);
  CHECK(w != NULL);

  kvfile_rows blocks[kLayers * kStreams];
  uint32_t ids[kTokens];
  for (int t = 0; t < kTokens; ++t) ids[t] = token_id(t);

  /* Wrong number of blocks, bad dtype, NaN: refused, nothing appended. */
  blocks_for(0, blocks);
  CHECK_STATUS(kvfile_writer_append(w, ids, 7, blocks, 3), KVFILE_INVALID_ARGUMENT);
  blocks[2].dtype = (kvfile_dtype)9;
  CHECK_STATUS(kvfile_writer_append(w, ids, 7, blocks, 4), KVFILE_INVALID_ARGUMENT);
  CHECK_CONTAINS(kvfile_last_error(), "block 2 has an invalid dtype 9");
  blocks_for(0, blocks);
  float saved = rows_f32[3][5 * kPerToken + 1];
  rows_f32[3][5 * kPerToken + 1] = NAN;
  CHECK_STATUS(kvfile_writer_append(w, ids, 7, blocks, 4), KVFILE_NON_FINITE);
  CHECK_CONTAINS(kvfile_last_error(), "token 5");
  rows_f32[3][5 * kPerToken + 1] = saved;
  uint64_t n = 99;
  CHECK_STATUS(kvfile_writer_token_count(w, &n), KVFILE_OK);
  CHECK(n == 0);

  CHECK_STATUS(kvfile_writer_append(w, ids, 7, blocks, 4), KVFILE_OK);
  CHECK_STATUS(kvfile_writer_sync(w), KVFILE_OK);
  CHECK_STATUS(kvfile_writer_close(w), KVFILE_OK);

  /* Reopen for writing; append tokens 7..9 as the codes of tokens 0..2. */
  CHECK_STATUS(kvfile_writer_open(in_dir(dir, "missing.kv"), NULL, &w), KVFILE_NOT_FOUND);
  CHECK(w == NULL);
  CHECK_STATUS(kvfile_writer_open(path, NULL, &w), KVFILE_OK);
  CHECK_STATUS(kvfile_writer_token_count(w, &n), KVFILE_OK);
  CHECK(n == 7);
  kvfile_writer* second = NULL;
  CHECK_STATUS(kvfile_writer_open(path, NULL, &second), KVFILE_BUSY);
  CHECK(second == NULL);

  kvfile_reader* r = NULL;
  CHECK_STATUS(kvfile_reader_open(path, &r), KVFILE_OK);
  static uint8_t codes[kLayers * kStreams][3 * kPerToken];
  static float scales[kLayers * kStreams][3 * kRows];
  for (int b = 0; b < kLayers * kStreams; ++b) {
    CHECK_STATUS(kvfile_reader_read_codes(r, (uint32_t)(b / kStreams), (uint32_t)(b % kStreams), 0, 3, codes[b],
                                          sizeof codes[b], scales[b], 3 * kRows),
                 KVFILE_OK);
    blocks[b].dtype = KVFILE_E4M3;
    blocks[b].data = codes[b];
    blocks[b].scales = scales[b];
  }
  kvfile_reader_close(r);
  /* Codes of another fp8 dtype than the stream's are refused. */
  blocks[0].dtype = KVFILE_E5M2;
  CHECK_STATUS(kvfile_writer_append(w, ids + 7, 3, blocks, 4), KVFILE_INVALID_ARGUMENT);
  blocks[0].dtype = KVFILE_E4M3;
  CHECK_STATUS(kvfile_writer_append(w, ids + 7, 3, blocks, 4), KVFILE_OK);

  uint32_t prompt[4] = {token_id(0), token_id(1), 5, token_id(3)};
  CHECK_STATUS(kvfile_writer_common_prefix(w, prompt, 4, &n), KVFILE_OK);
  CHECK(n == 2);
  CHECK_STATUS(kvfile_writer_common_prefix(w, NULL, 4, &n), KVFILE_INVALID_ARGUMENT);
  CHECK_STATUS(kvfile_writer_rewind(w, 11), KVFILE_INVALID_ARGUMENT);
  CHECK_CONTAINS(kvfile_last_error(), "cannot rewind to 11");
  /* Rewind to 7 and append the same three tokens again. */
  CHECK_STATUS(kvfile_writer_rewind(w, 7), KVFILE_OK);
  CHECK_STATUS(kvfile_writer_token_count(w, &n), KVFILE_OK);
  CHECK(n == 7);
  CHECK_STATUS(kvfile_writer_common_prefix(w, ids, kTokens, &n), KVFILE_OK);
  CHECK(n == 7);
  CHECK_STATUS(kvfile_writer_append(w, ids + 7, 3, blocks, 4), KVFILE_OK);
  CHECK_STATUS(kvfile_writer_token_count(w, &n), KVFILE_OK);
  CHECK(n == 10);
  CHECK_STATUS(kvfile_writer_close(w), KVFILE_OK);
  CHECK_STATUS(kvfile_writer_close(NULL), KVFILE_OK);

  /* Existing file, no overwrite. */
  CHECK_STATUS(kvfile_writer_create(path, &g, "m", 1, &options, &w), KVFILE_INVALID_ARGUMENT);
  CHECK_CONTAINS(kvfile_last_error(), "file exists");
  /* NULL arguments. */
  CHECK_STATUS(kvfile_writer_create(path, NULL, "m", 1, &options, &w), KVFILE_INVALID_ARGUMENT);
  CHECK(strcmp(kvfile_last_error(), "kvfile_writer_create: geometry is NULL") == 0);
  CHECK_STATUS(kvfile_writer_append(NULL, ids, 1, blocks, 4), KVFILE_INVALID_ARGUMENT);
  CHECK_STATUS(kvfile_writer_sync(NULL), KVFILE_INVALID_ARGUMENT);
  CHECK_STATUS(kvfile_writer_rewind(NULL, 0), KVFILE_INVALID_ARGUMENT);
  options.sync = (kvfile_sync_mode)7;
  CHECK_STATUS(kvfile_writer_open(path, &options, &w), KVFILE_INVALID_ARGUMENT);
  CHECK_CONTAINS(kvfile_last_error(), "invalid sync mode");
}

static void test_read(void) {
  const char* path = in_dir(dir, "s.kv");
  kvfile_reader* r = (kvfile_reader*)1;
  CHECK_STATUS(kvfile_reader_open(in_dir(dir, "missing.kv"), &r), KVFILE_NOT_FOUND);
  CHECK(r == NULL);
  CHECK_CONTAINS(kvfile_last_error(), "missing.kv");
  CHECK_STATUS(kvfile_reader_open(path, &r), KVFILE_OK);

  uint64_t n = 0;
  CHECK_STATUS(kvfile_reader_token_count(r, &n), KVFILE_OK);
  CHECK(n == kTokens);
  uint32_t ids[kTokens];
  size_t count = 0;
  CHECK_STATUS(kvfile_reader_tokens(r, ids, kTokens - 1, &count), KVFILE_BUFFER_TOO_SMALL);
  CHECK(count == kTokens);
  CHECK_CONTAINS(kvfile_last_error(), "holds 9, the result needs 10");
  CHECK_STATUS(kvfile_reader_tokens(r, ids, kTokens, &count), KVFILE_OK);
  for (int t = 0; t < kTokens; ++t) CHECK(ids[t] == token_id(t));

  uint32_t prompt[3] = {token_id(0), token_id(1), token_id(2)};
  CHECK_STATUS(kvfile_reader_common_prefix(r, prompt, 3, &n), KVFILE_OK);
  CHECK(n == 3);

  kvfile_info info;
  CHECK_STATUS(kvfile_reader_info(r, &info), KVFILE_OK);
  CHECK(info.major_version == 2 && info.minor_version == 1);
  CHECK(strcmp(info.model_id, "test/tiny") == 0 && info.fingerprint == 0xfeedULL);
  CHECK(info.geometry.layers == kLayers && info.geometry.stream_count == kStreams);
  CHECK(strcmp(info.geometry.streams[1].name, "v") == 0 && info.geometry.streams[1].dtype == KVFILE_E4M3);
  CHECK(info.tokens == kTokens && info.chunks == 3 && info.nominal_chunk_tokens == kChunkTokens);
  CHECK(info.bytes == 12288 + 3 * 4096 && info.torn_tail_bytes == 0);
  CHECK(info.damage_before_end == 0 && info.committed_data_missing == 0);
  CHECK(info.committed_tokens_missing == 0 && info.committed_bytes_missing == 0);

  /* Decoded rows, as bf16 and f32: within e4m3 rounding (3 mantissa bits:
   * 1/16) of what was written; tokens 7..9 hold tokens 0..2's codes, so
   * they decode to exactly the same values. */
  static float f32[kTokens * kPerToken];
  static uint16_t bf16[kTokens * kPerToken];
  for (int l = 0; l < kLayers; ++l) {
    for (int s = 0; s < kStreams; ++s) {
      CHECK_STATUS(kvfile_reader_read_rows(r, (uint32_t)l, (uint32_t)s, 0, kTokens, KVFILE_F32, f32, sizeof f32),
                   KVFILE_OK);
      CHECK_STATUS(kvfile_reader_read_rows(r, (uint32_t)l, (uint32_t)s, 0, kTokens, KVFILE_BF16, bf16, sizeof bf16),
                   KVFILE_OK);
      for (int t = 0; t < kTokens; ++t) {
        for (int i = 0; i < kPerToken; ++i) {
          float want = value(l, s, t < 7 ? t : t - 7, i);
          float got = f32[t * kPerToken + i];
          float diff = got > want ? got - want : want - got;
          CHECK(diff <= (want > 0 ? want : -want) / 16);
          CHECK(bf16[t * kPerToken + i] == bf16_of(got));
          if (t >= 7) CHECK(got == f32[(t - 7) * kPerToken + i]);
        }
      }
    }
  }

  /* Codes and scales: tokens 7..9 hold exactly the codes of tokens 0..2. */
  static uint8_t codes[kTokens * kPerToken];
  static float scales[kTokens * kRows];
  CHECK_STATUS(kvfile_reader_read_codes(r, 1, 0, 0, kTokens, codes, sizeof codes, scales, kTokens * kRows), KVFILE_OK);
  CHECK(memcmp(codes, codes + 7 * kPerToken, 3 * kPerToken) == 0);
  CHECK(memcmp(scales, scales + 7 * kRows, 3 * kRows * sizeof(float)) == 0);
  CHECK(scales[0] > 0);

  /* Bad requests. */
  uint8_t untouched[4] = {1, 2, 3, 4};
  CHECK_STATUS(kvfile_reader_read_rows(r, 0, 0, 0, 1, KVFILE_F32, f32, kPerToken * 4 - 1), KVFILE_BUFFER_TOO_SMALL);
  CHECK_CONTAINS(kvfile_last_error(), "dst_bytes holds 127, the result needs 128");
  CHECK_STATUS(kvfile_reader_read_codes(r, 0, 0, 0, 2, codes, sizeof codes, scales, 3), KVFILE_BUFFER_TOO_SMALL);
  CHECK_CONTAINS(kvfile_last_error(), "scale_count holds 3, the result needs 4");
  CHECK_STATUS(kvfile_reader_read_codes(r, 0, 0, 0, 2, untouched, 4, scales, 4), KVFILE_BUFFER_TOO_SMALL);
  CHECK(untouched[0] == 1 && untouched[3] == 4);
  CHECK_STATUS(kvfile_reader_read_rows(r, 2, 0, 0, 1, KVFILE_F32, f32, sizeof f32), KVFILE_INVALID_ARGUMENT);
  CHECK_CONTAINS(kvfile_last_error(), "layer 2 out of range (2 layers)");
  CHECK_STATUS(kvfile_reader_read_rows(r, 0, 0, 5, 11, KVFILE_F32, f32, sizeof f32), KVFILE_INVALID_ARGUMENT);
  CHECK_CONTAINS(kvfile_last_error(), "token range [5, 11)");
  CHECK_STATUS(kvfile_reader_read_rows(r, 0, 0, 0, 1, KVFILE_E4M3, f32, sizeof f32), KVFILE_INVALID_ARGUMENT);
  CHECK_STATUS(kvfile_reader_token_count(NULL, &n), KVFILE_INVALID_ARGUMENT);
  CHECK_STATUS(kvfile_reader_info(r, NULL), KVFILE_INVALID_ARGUMENT);
  CHECK(strcmp(kvfile_last_error(), "kvfile_reader_info: out is NULL") == 0);
  kvfile_reader_close(r);
  kvfile_reader_close(NULL);
}

/* Bulk reads (every (layer, stream) pair in one call, on 1, 3 and the
 * machine's threads) give exactly kvfile_reader_read_rows' and
 * kvfile_reader_read_codes' bytes, over ranges inside and across chunks. */
static void test_read_many(void) {
  kvfile_reader* r = NULL;
  CHECK_STATUS(kvfile_reader_open(in_dir(dir, "s.kv"), &r), KVFILE_OK);
  if (r == NULL) return;
  enum { kPairs = kLayers * kStreams };
  static float want[kTokens * kPerToken], got[kPairs][kTokens * kPerToken];
  static uint8_t want_codes[kTokens * kPerToken], codes[kPairs][kTokens * kPerToken];
  static float want_scales[kTokens * kRows], scales[kPairs][kTokens * kRows];
  static const uint64_t ranges[][2] = {{0, kTokens}, {1, 3}, {3, 9}, {5, 5}};
  static const unsigned threads[] = {1, 3, 0};
  static const kvfile_dtype dtypes[] = {KVFILE_F32, KVFILE_BF16, KVFILE_F16};
  for (size_t ri = 0; ri < sizeof ranges / sizeof ranges[0]; ++ri) {
    uint64_t b = ranges[ri][0], e = ranges[ri][1];
    for (size_t ti = 0; ti < 3; ++ti) {
      kvfile_dtype dt = dtypes[(ri + ti) % 3];
      size_t bytes = (size_t)(e - b) * kPerToken * kvfile_dtype_size(dt);
      kvfile_rows_target rt[kPairs];
      kvfile_codes_target ct[kPairs];
      memset(got, 0xAB, sizeof got);
      memset(codes, 0xAB, sizeof codes);
      for (int p = 0; p < kPairs; ++p) {
        rt[p].layer = ct[p].layer = (uint32_t)(p / kStreams);
        rt[p].stream = ct[p].stream = (uint32_t)(p % kStreams);
        rt[p].dst = got[p];
        rt[p].dst_bytes = bytes;
        ct[p].codes = codes[p];
        ct[p].codes_bytes = (size_t)(e - b) * kPerToken;
        ct[p].scales = scales[p];
        ct[p].scale_count = (size_t)(e - b) * kRows;
      }
      CHECK_STATUS(kvfile_reader_read_many(r, b, e, dt, rt, kPairs, threads[ti]), KVFILE_OK);
      CHECK_STATUS(kvfile_reader_read_codes_many(r, b, e, ct, kPairs, threads[ti]), KVFILE_OK);
      for (int p = 0; p < kPairs; ++p) {
        uint32_t l = (uint32_t)(p / kStreams), s = (uint32_t)(p % kStreams);
        CHECK_STATUS(kvfile_reader_read_rows(r, l, s, b, e, dt, want, sizeof want), KVFILE_OK);
        CHECK(memcmp(got[p], want, bytes) == 0);
        if (bytes < sizeof got[p]) CHECK(((const uint8_t*)got[p])[bytes] == 0xAB); /* nothing past the target */
        CHECK_STATUS(kvfile_reader_read_codes(r, l, s, b, e, want_codes, sizeof want_codes, want_scales,
                                              kTokens * kRows), KVFILE_OK);
        CHECK(memcmp(codes[p], want_codes, (size_t)(e - b) * kPerToken) == 0);
        CHECK(memcmp(scales[p], want_scales, (size_t)(e - b) * kRows * sizeof(float)) == 0);
      }
    }
  }
  /* Every target is checked before anything is read. */
  kvfile_rows_target rt[2] = {{0, 0, got[0], kTokens * kPerToken * 4}, {1, 1, got[1], kTokens * kPerToken * 4 - 1}};
  got[0][0] = 42.0f;
  CHECK_STATUS(kvfile_reader_read_many(r, 0, kTokens, KVFILE_F32, rt, 2, 0), KVFILE_BUFFER_TOO_SMALL);
  CHECK_CONTAINS(kvfile_last_error(), "targets[1].dst_bytes holds 1279, the result needs 1280");
  CHECK(got[0][0] == 42.0f);
  rt[1].dst_bytes = kTokens * kPerToken * 4;
  rt[1].layer = 2;
  CHECK_STATUS(kvfile_reader_read_many(r, 0, kTokens, KVFILE_F32, rt, 2, 0), KVFILE_INVALID_ARGUMENT);
  CHECK_CONTAINS(kvfile_last_error(), "layer 2 out of range (2 layers)");
  CHECK_STATUS(kvfile_reader_read_many(r, 0, kTokens, KVFILE_E4M3, rt, 1, 0), KVFILE_INVALID_ARGUMENT);
  CHECK_STATUS(kvfile_reader_read_many(r, 0, kTokens, KVFILE_F32, NULL, 1, 0), KVFILE_INVALID_ARGUMENT);
  CHECK(strcmp(kvfile_last_error(), "kvfile_reader_read_many: targets is NULL") == 0);
  kvfile_codes_target ct = {0, 1, codes[0], kTokens * kPerToken, NULL, kTokens * kRows};
  CHECK_STATUS(kvfile_reader_read_codes_many(r, 0, kTokens, &ct, 1, 0), KVFILE_INVALID_ARGUMENT);
  CHECK(strcmp(kvfile_last_error(), "kvfile_reader_read_codes_many: targets[0].scales is NULL") == 0);
  ct.scales = scales[0];
  ct.scale_count = kTokens * kRows - 1;
  CHECK_STATUS(kvfile_reader_read_codes_many(r, 0, kTokens, &ct, 1, 0), KVFILE_BUFFER_TOO_SMALL);
  CHECK_CONTAINS(kvfile_last_error(), "targets[0].scale_count holds 19, the result needs 20");
  kvfile_reader_close(r);
}

/* Copies the first n bytes of file `from` to a new file `to`. */
static void copy_prefix(const char* from, const char* to, long n) {
  FILE* in = fopen(from, "rb");
  FILE* out = fopen(to, "wb");
  CHECK(in != NULL && out != NULL);
  for (long i = 0; in != NULL && out != NULL && i < n; ++i) {
    int c = fgetc(in);
    CHECK(c != EOF);
    fputc(c, out);
  }
  if (in != NULL) fclose(in);
  if (out != NULL) fclose(out);
}

/* s.kv cut 100 bytes into its second chunk: the info says what is gone. */
static void test_cut_file(void) {
  const char* cut = in_dir(dir, "cut.kv");
  copy_prefix(in_dir(dir, "s.kv"), cut, 12288 + 4096 + 100);
  kvfile_reader* r = NULL;
  CHECK_STATUS(kvfile_reader_open(cut, &r), KVFILE_OK);
  if (r == NULL) return;
  kvfile_info info;
  CHECK_STATUS(kvfile_reader_info(r, &info), KVFILE_OK);
  CHECK(info.tokens == 4 && info.chunks == 1 && info.bytes == 12288 + 4096 + 100);
  CHECK(info.committed_data_missing == 1 && info.committed_tokens_missing == 6);
  CHECK(info.committed_bytes_missing == 3 * 4096 - 4096 - 100);
  kvfile_reader_close(r);
  kvfile_verify_result v;
  CHECK_STATUS(kvfile_verify(cut, 0, &v), KVFILE_OK);
  CHECK(v.ok == 0 && v.errors == 1);
  CHECK_CONTAINS(v.first_message, "committed data missing");
}

static void test_verify_and_damage(void) {
  const char* path = in_dir(dir, "s.kv");
  kvfile_verify_result v;
  CHECK_STATUS(kvfile_verify(path, 0, &v), KVFILE_OK);
  CHECK(v.ok == 1 && v.errors == 0 && v.warnings == 0);
  CHECK(v.major_version == 2 && v.tokens == kTokens && v.chunks == 3 && v.bytes == 12288 + 3 * 4096);
  CHECK(v.first_message[0] == '\0');
  CHECK_STATUS(kvfile_verify(in_dir(dir, "missing.kv"), 0, &v), KVFILE_NOT_FOUND);

  /* A torn tail: a warning, still ok. */
  FILE* f = fopen(path, "ab");
  CHECK(f != NULL);
  if (f == NULL) return;
  static const char junk[100] = {1};
  fwrite(junk, 1, sizeof junk, f);
  fclose(f);
  CHECK_STATUS(kvfile_verify(path, 0, &v), KVFILE_OK);
  CHECK(v.ok == 1 && v.errors == 0 && v.warnings == 1 && v.torn_tail_bytes == 100);
  CHECK_CONTAINS(v.first_message, "torn tail: 100 bytes");

  /* Flip the last byte of chunk 0: it lies in the last section (layer 1,
   * stream v, padding included), so only that section's reads fail. */
  f = fopen(path, "r+b");
  CHECK(f != NULL);
  if (f == NULL) return;
  fseek(f, 12288 + 4095, SEEK_SET);
  int c = fgetc(f);
  fseek(f, 12288 + 4095, SEEK_SET);
  fputc(c ^ 0x40, f);
  fclose(f);
  CHECK_STATUS(kvfile_verify(path, 0, &v), KVFILE_OK);
  CHECK(v.ok == 0 && v.errors == 1);
  CHECK_CONTAINS(v.first_message, "chunk 0");
  CHECK_CONTAINS(v.first_message, "checksum");
  /* Quick verification does not read payloads. */
  CHECK_STATUS(kvfile_verify(path, 1, &v), KVFILE_OK);
  CHECK(v.errors == 0);

  kvfile_reader* r = NULL;
  CHECK_STATUS(kvfile_reader_open(path, &r), KVFILE_OK);
  static float dst[kTokens * kPerToken];
  dst[0] = 123.0f;
  CHECK_STATUS(kvfile_reader_read_rows(r, 1, 1, 0, kTokens, KVFILE_F32, dst, sizeof dst), KVFILE_CORRUPTION);
  CHECK_CONTAINS(kvfile_last_error(), "checksum");
  CHECK_CONTAINS(kvfile_last_error(), "layer 1");
  CHECK(dst[0] == 123.0f); /* a failed read leaves the buffer untouched */
  CHECK_STATUS(kvfile_reader_read_rows(r, 0, 1, 0, kTokens, KVFILE_F32, dst, sizeof dst), KVFILE_OK);
  CHECK_STATUS(kvfile_reader_read_rows(r, 1, 1, 4, kTokens, KVFILE_F32, dst, sizeof dst), KVFILE_OK);
  /* A bulk read over the damaged section fails as a whole: every target
   * zero-filled, the message naming chunk 0, layer 1, stream 'v'. */
  static float other[kTokens * kPerToken];
  other[5] = 7.0f;
  dst[5] = 7.0f;
  kvfile_rows_target rt[2] = {{0, 0, other, sizeof other}, {1, 1, dst, sizeof dst}};
  CHECK_STATUS(kvfile_reader_read_many(r, 0, kTokens, KVFILE_F32, rt, 2, 2), KVFILE_CORRUPTION);
  CHECK_CONTAINS(kvfile_last_error(), "chunk 0");
  CHECK_CONTAINS(kvfile_last_error(), "layer 1 stream 'v'");
  CHECK(other[5] == 0.0f && dst[5] == 0.0f && other[kTokens * kPerToken - 1] == 0.0f);
  static uint8_t codes[kTokens * kPerToken];
  static float scales[kTokens * kRows];
  codes[0] = 9;
  scales[0] = 9.0f;
  kvfile_codes_target ct = {1, 1, codes, sizeof codes, scales, kTokens * kRows};
  CHECK_STATUS(kvfile_reader_read_codes_many(r, 0, kTokens, &ct, 1, 0), KVFILE_CORRUPTION);
  CHECK(codes[0] == 0 && scales[0] == 0.0f);
  /* The parts read fails as a whole too: the f32 target of an intact
   * stream, read in a pass before the codes, is zero-filled as well. */
  {
    kvfile_parts_target pt[2] = {{0, 0, {KVFILE_F32, other, sizeof other, NULL, 0, NULL, 0}},
                                 {1, 1, {KVFILE_E4M3, codes, sizeof codes, scales, kTokens * kRows, NULL, 0}}};
    other[5] = 7.0f;
    codes[0] = 9;
    CHECK_STATUS(kvfile_reader_read_parts_many(r, 0, kTokens, pt, 2, 2), KVFILE_CORRUPTION);
    CHECK_CONTAINS(kvfile_last_error(), "layer 1 stream 'v'");
    CHECK(other[5] == 0.0f && codes[0] == 0 && scales[0] == 0.0f);
    CHECK_STATUS(kvfile_reader_read_parts_many(r, 4, kTokens, pt, 2, 2), KVFILE_OK);
    CHECK(scales[0] > 0.0f);
  }
  /* Tokens past the damaged chunk read fine. */
  CHECK_STATUS(kvfile_reader_read_codes_many(r, 4, kTokens, &ct, 1, 0), KVFILE_OK);
  CHECK(scales[0] > 0.0f);
  kvfile_reader_close(r);

  /* Not a kvfile at all. */
  const char* junk_path = in_dir(dir, "junk.kv");
  f = fopen(junk_path, "wb");
  CHECK(f != NULL);
  if (f == NULL) return;
  fwrite("not a kv file", 1, 13, f);
  fclose(f);
  r = (kvfile_reader*)1;
  CHECK_STATUS(kvfile_reader_open(junk_path, &r), KVFILE_CORRUPTION);
  CHECK(r == NULL);
  CHECK(kvfile_last_error()[0] != '\0');
  CHECK_STATUS(kvfile_verify(junk_path, 0, &v), KVFILE_OK);
  CHECK(v.ok == 0 && v.errors == 1 && v.major_version == 0 && v.first_message[0] != '\0');
}

/* A geometry given field by field, f16 input, an e5m2 stream beside a raw
 * bf16 one: the raw stream keeps the exact values and has no codes. */
static void test_explicit_geometry(void) {
  const char* path = in_dir(dir, "explicit.kv");
  kvfile_geometry g;
  memset(&g, 0, sizeof g);
  g.layers = 1;
  g.stream_count = 2;
  strcpy(g.streams[0].name, "k");
  g.streams[0].rows_per_token = 1;
  g.streams[0].row_width = 4;
  g.streams[0].dtype = KVFILE_E5M2;
  strcpy(g.streams[1].name, "idx");
  g.streams[1].rows_per_token = 1;
  g.streams[1].row_width = 4;
  g.streams[1].dtype = KVFILE_BF16;
  kvfile_writer_options options;
  memset(&options, 0, sizeof options);
  options.sync = KVFILE_SYNC_CHUNK;
  kvfile_writer* w = NULL;
  CHECK_STATUS(kvfile_writer_create(path, &g, NULL, 0, &options, &w), KVFILE_OK);
  /* f16 bits of 1, -2, 0.5, 0.25 and of 4, 0, -1, 0.125: exact in bf16. */
  static const uint16_t f16[2][8] = {{0x3C00, 0xC000, 0x3800, 0x3400, 0x4400, 0x0000, 0xBC00, 0x3000},
                                     {0x3400, 0x3800, 0xC000, 0x3C00, 0x3000, 0xBC00, 0x0000, 0x4400}};
  static const float want[8] = {0.25f, 0.5f, -2.0f, 1.0f, 0.125f, -1.0f, 0.0f, 4.0f};
  const uint32_t ids[2] = {7, 8};
  kvfile_rows blocks[2];
  blocks[0].dtype = KVFILE_F16;
  blocks[0].data = f16[0];
  blocks[0].scales = NULL;
  blocks[1].dtype = KVFILE_F16;
  blocks[1].data = f16[1];
  blocks[1].scales = NULL;
  CHECK_STATUS(kvfile_writer_append(w, ids, 2, blocks, 2), KVFILE_OK);
  CHECK_STATUS(kvfile_writer_close(w), KVFILE_OK);

  kvfile_reader* r = NULL;
  CHECK_STATUS(kvfile_reader_open(path, &r), KVFILE_OK);
  kvfile_info info;
  CHECK_STATUS(kvfile_reader_info(r, &info), KVFILE_OK);
  CHECK(info.model_id[0] == '\0' && info.fingerprint == 0 && info.tokens == 2);
  CHECK(info.geometry.layers == 1 && info.geometry.stream_count == 2);
  CHECK(strcmp(info.geometry.streams[1].name, "idx") == 0 && info.geometry.streams[1].dtype == KVFILE_BF16);
  CHECK(info.geometry.streams[0].dtype == KVFILE_E5M2 && info.geometry.streams[0].row_width == 4);
  float got[8];
  CHECK_STATUS(kvfile_reader_read_rows(r, 0, 1, 0, 2, KVFILE_F32, got, sizeof got), KVFILE_OK);
  CHECK(memcmp(got, want, sizeof got) == 0);
  uint8_t codes[8];
  float scales[2];
  CHECK_STATUS(kvfile_reader_read_codes(r, 0, 1, 0, 2, codes, sizeof codes, scales, 2), KVFILE_INVALID_ARGUMENT);
  CHECK_CONTAINS(kvfile_last_error(), "stream 'idx' is stored raw (bf16)");
  /* The e5m2 stream: each x / scale lands on an e5m2 code and code * scale
   * rounds back to x here (spec/CODEC.md, sections 6 and 7), so reads are exact. */
  CHECK_STATUS(kvfile_reader_read_codes(r, 0, 0, 0, 2, codes, sizeof codes, scales, 2), KVFILE_OK);
  CHECK_STATUS(kvfile_reader_read_rows(r, 0, 0, 0, 2, KVFILE_F32, got, sizeof got), KVFILE_OK);
  CHECK(got[0] == 1.0f && got[1] == -2.0f && got[2] == 0.5f && got[3] == 0.25f);
  CHECK(got[4] == 4.0f && got[5] == 0.0f && got[6] == -1.0f && got[7] == 0.125f);
  kvfile_reader_close(r);
}

/* f32 value of an E4M3 code 0x00..0x7E (sign clear): spec/CODEC.md. */
static float e4m3_value(uint8_t b) {
  int e = (b >> 3) & 15, m = b & 7;
  return e == 0 ? ldexpf((float)m / 8.0f, -6) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
}

/* nvfp4 (format 2.2): a tiny-preset file whose streams are nvfp4 (one row
 * of 2 x 16 = 32 elements per token). Token 0 of layer 0, stream k is the
 * worked example of spec/CODEC.md 14.7, whose codes and scales are known;
 * every decoded read equals DEC(code) * (DEC_e4m3(block) * scale). */
static void test_nvfp4(void) {
  const char* path = in_dir(dir, "nv.kv");
  kvfile_geometry g;
  CHECK_STATUS(kvfile_preset("tiny", KVFILE_NVFP4, &g), KVFILE_OK);
  CHECK(g.streams[0].dtype == KVFILE_NVFP4 && g.streams[1].dtype == KVFILE_NVFP4);
  CHECK(kvfile_dtype_size(KVFILE_NVFP4) == 0);
  kvfile_writer_options options;
  memset(&options, 0, sizeof options);
  options.chunk_tokens = kChunkTokens;
  kvfile_writer* w = NULL;
  CHECK_STATUS(kvfile_writer_create(path, &g, "test/nv", 1, &options, &w), KVFILE_OK);
  static float rows[kLayers * kStreams][kTokens * kPerToken];
  memcpy(rows, rows_f32, sizeof rows);
  float* x = rows[0];
  for (int i = 0; i < kPerToken; ++i) x[i] = 0.0f;
  x[0] = 12.0f, x[1] = -6.0f, x[2] = 1.0f, x[3] = -0.0f, x[16] = 0.75f, x[17] = -0.375f, x[18] = 0.1f;
  kvfile_rows blocks[kLayers * kStreams];
  uint32_t ids[kTokens];
  for (int t = 0; t < kTokens; ++t) ids[t] = token_id(t);
  for (int b = 0; b < kLayers * kStreams; ++b) {
    blocks[b].dtype = KVFILE_F32;
    blocks[b].data = rows[b];
    blocks[b].scales = NULL;
  }
  CHECK_STATUS(kvfile_writer_append(w, ids, kTokens, blocks, kLayers * kStreams), KVFILE_OK);
  /* Codes cannot come through kvfile_rows (no block scales). */
  uint8_t some_codes[kPerToken] = {0};
  float some_scales[1] = {1.0f};
  blocks[0].dtype = KVFILE_NVFP4;
  blocks[0].data = some_codes;
  blocks[0].scales = some_scales;
  CHECK_STATUS(kvfile_writer_append(w, ids, 1, blocks, kLayers * kStreams), KVFILE_INVALID_ARGUMENT);
  CHECK_CONTAINS(kvfile_last_error(), "nvfp4 codes given without block scales");
  CHECK_STATUS(kvfile_writer_close(w), KVFILE_OK);

  kvfile_reader* r = NULL;
  CHECK_STATUS(kvfile_reader_open(path, &r), KVFILE_OK);
  kvfile_info info;
  CHECK_STATUS(kvfile_reader_info(r, &info), KVFILE_OK);
  CHECK(info.major_version == 2 && info.minor_version == 2);
  CHECK(info.geometry.streams[0].dtype == KVFILE_NVFP4);
  static uint8_t codes[kTokens * kPerToken / 2], block_scales[kTokens * kPerToken / 16];
  static float scales[kTokens], decoded[kTokens * kPerToken];
  CHECK_STATUS(kvfile_reader_read_nvfp4_codes(r, 0, 0, 0, kTokens, codes, sizeof codes, block_scales,
                                              sizeof block_scales - 1, scales, kTokens),
               KVFILE_BUFFER_TOO_SMALL);
  CHECK_STATUS(kvfile_reader_read_nvfp4_codes(r, 0, 0, 0, kTokens, codes, sizeof codes, block_scales,
                                              sizeof block_scales, scales, kTokens),
               KVFILE_OK);
  CHECK(codes[0] == 0xD7 && codes[1] == 0x81);
  CHECK(block_scales[0] == 0x7E && block_scales[1] == 0x5E);
  CHECK(scales[0] == 12.0f / 2688.0f);
  /* The fp8 codes read refuses an nvfp4 stream. */
  CHECK_STATUS(kvfile_reader_read_codes(r, 0, 0, 0, 1, codes, sizeof codes, scales, kTokens), KVFILE_INVALID_ARGUMENT);
  CHECK_CONTAINS(kvfile_last_error(), "is nvfp4");
  CHECK_STATUS(kvfile_reader_read_rows(r, 0, 0, 0, kTokens, KVFILE_F32, decoded, sizeof decoded), KVFILE_OK);
  int exact = 1;
  static const float kE2M1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int t = 0; t < kTokens; ++t)
    for (int i = 0; i < kPerToken; ++i) {
      uint8_t c = (uint8_t)((codes[(t * kPerToken + i) / 2] >> (4 * (i % 2))) & 15);
      float divisor = e4m3_value(block_scales[(t * kPerToken + i) / 16]) * scales[t];
      float want = (c & 8 ? -kE2M1[c & 7] : kE2M1[c & 7]) * divisor;
      if (memcmp(&want, &decoded[t * kPerToken + i], 4) != 0) exact = 0;
    }
  CHECK(exact);
  kvfile_reader_close(r);
}

/* Pre-quantized nvfp4 codes through kvfile_rows2 / kvfile_writer_append2:
 * the codes, block scales and row scales read from nv.kv (test_nvfp4) are
 * stored exactly, beside f32 rows of the other stream; block scales with
 * another dtype, a missing or invalid block scale fail the whole append. */
static void test_nvfp4_codes_append(void) {
  enum { kCodes = kTokens * kPerToken / 2, kBlocks = kTokens * kPerToken / 16 };
  static uint8_t codes[kLayers][kCodes], blocks[kLayers][kBlocks];
  static float scales[kLayers][kTokens];
  kvfile_reader* r = NULL;
  CHECK_STATUS(kvfile_reader_open(in_dir(dir, "nv.kv"), &r), KVFILE_OK);
  for (uint32_t l = 0; l < kLayers; ++l)
    CHECK_STATUS(kvfile_reader_read_nvfp4_codes(r, l, 0, 0, kTokens, codes[l], kCodes, blocks[l], kBlocks, scales[l],
                                                kTokens),
                 KVFILE_OK);
  kvfile_reader_close(r);
  kvfile_geometry g;
  CHECK_STATUS(kvfile_preset("tiny", KVFILE_NVFP4, &g), KVFILE_OK);
  const char* path = in_dir(dir, "nv2.kv");
  kvfile_writer* w = NULL;
  CHECK_STATUS(kvfile_writer_create(path, &g, "test/nv", 1, NULL, &w), KVFILE_OK);
  uint32_t ids[kTokens];
  for (int t = 0; t < kTokens; ++t) ids[t] = token_id(t);
  kvfile_rows2 rows[kLayers * kStreams];
  for (int l = 0; l < kLayers; ++l) {
    kvfile_rows2 k = {KVFILE_NVFP4, codes[l], scales[l], blocks[l]};
    kvfile_rows2 v = {KVFILE_F32, rows_f32[l * kStreams + 1], NULL, NULL};
    rows[l * kStreams] = k;
    rows[l * kStreams + 1] = v;
  }
  /* Refused, nothing appended: block scales on f32 rows; none for codes; an
   * invalid block scale (bit 7 set) in the last token of layer 1. */
  rows[1].block_scales = blocks[0];
  CHECK_STATUS(kvfile_writer_append2(w, ids, kTokens, rows, kLayers * kStreams), KVFILE_INVALID_ARGUMENT);
  CHECK_CONTAINS(kvfile_last_error(), "kvfile_writer_append2: block 1 has block_scales but is not KVFILE_NVFP4 codes");
  rows[1].block_scales = NULL;
  rows[2].block_scales = NULL;
  CHECK_STATUS(kvfile_writer_append2(w, ids, kTokens, rows, kLayers * kStreams), KVFILE_INVALID_ARGUMENT);
  CHECK_CONTAINS(kvfile_last_error(), "nvfp4 codes given without block scales");
  rows[2].block_scales = blocks[1];
  uint8_t saved = blocks[1][kBlocks - 1];
  blocks[1][kBlocks - 1] = 0x80;
  CHECK_STATUS(kvfile_writer_append2(w, ids, kTokens, rows, kLayers * kStreams), KVFILE_NON_FINITE);
  CHECK_CONTAINS(kvfile_last_error(), "layer 1");
  blocks[1][kBlocks - 1] = saved;
  uint64_t count = 99;
  CHECK_STATUS(kvfile_writer_token_count(w, &count), KVFILE_OK);
  CHECK(count == 0);
  CHECK_STATUS(kvfile_writer_append2(NULL, ids, kTokens, rows, kLayers * kStreams), KVFILE_INVALID_ARGUMENT);
  CHECK_CONTAINS(kvfile_last_error(), "kvfile_writer_append2: writer is NULL");
  /* Two appends of 4 and 6 tokens: the codes of the second start mid-array. */
  CHECK_STATUS(kvfile_writer_append2(w, ids, 4, rows, kLayers * kStreams), KVFILE_OK);
  for (int l = 0; l < kLayers; ++l) {
    kvfile_rows2 k = {KVFILE_NVFP4, codes[l] + 4 * kPerToken / 2, scales[l] + 4, blocks[l] + 4 * kPerToken / 16};
    kvfile_rows2 v = {KVFILE_F32, rows_f32[l * kStreams + 1] + 4 * kPerToken, NULL, NULL};
    rows[l * kStreams] = k;
    rows[l * kStreams + 1] = v;
  }
  CHECK_STATUS(kvfile_writer_append2(w, ids + 4, kTokens - 4, rows, kLayers * kStreams), KVFILE_OK);
  CHECK_STATUS(kvfile_writer_close(w), KVFILE_OK);
  /* Every stored byte is the given one; v as quantized from the same rows. */
  static uint8_t got_codes[kCodes], got_blocks[kBlocks], want_codes[kCodes], want_blocks[kBlocks];
  static float got_scales[kTokens], want_scales[kTokens];
  kvfile_reader* a = NULL;
  CHECK_STATUS(kvfile_reader_open(path, &a), KVFILE_OK);
  CHECK_STATUS(kvfile_reader_open(in_dir(dir, "nv.kv"), &r), KVFILE_OK);
  for (uint32_t l = 0; l < kLayers; ++l) {
    CHECK_STATUS(kvfile_reader_read_nvfp4_codes(a, l, 0, 0, kTokens, got_codes, kCodes, got_blocks, kBlocks,
                                                got_scales, kTokens),
                 KVFILE_OK);
    CHECK(memcmp(got_codes, codes[l], kCodes) == 0 && memcmp(got_blocks, blocks[l], kBlocks) == 0 &&
          memcmp(got_scales, scales[l], sizeof got_scales) == 0);
    CHECK_STATUS(kvfile_reader_read_nvfp4_codes(a, l, 1, 0, kTokens, got_codes, kCodes, got_blocks, kBlocks,
                                                got_scales, kTokens),
                 KVFILE_OK);
    CHECK_STATUS(kvfile_reader_read_nvfp4_codes(r, l, 1, 0, kTokens, want_codes, kCodes, want_blocks, kBlocks,
                                                want_scales, kTokens),
                 KVFILE_OK);
    CHECK(memcmp(got_codes, want_codes, kCodes) == 0 && memcmp(got_blocks, want_blocks, kBlocks) == 0 &&
          memcmp(got_scales, want_scales, sizeof got_scales) == 0);
  }
  kvfile_reader_close(r);
  kvfile_reader_close(a);
}

/* kvfile_parts (spec/FORMAT.md section 2's dtype table): a stream of every
 * dtype, 2 rows x 16, appended as f32 rows and read back part by part; the
 * stored parts appended into a second file as they are, which then holds the
 * same parts; the deprecated entry points give the same bytes; short
 * buffers, a wrong fp8 dtype and an invalid dtype are refused. */
enum { kPartStreams = 6, kPartElems = kTokens * kPerToken };
static const kvfile_dtype kPartDtypes[kPartStreams] = {KVFILE_E4M3, KVFILE_E5M2, KVFILE_BF16,
                                                       KVFILE_F16,  KVFILE_F32,  KVFILE_NVFP4};

/* Buffers for the parts of one stream over every token. */
typedef struct part_buffers {
  uint8_t data[kPartElems * 4];
  float scales[kTokens * kRows];
  uint8_t block_scales[kPartElems / 16];
} part_buffers;

/* The parts of dtype d in b, sized exactly for kTokens tokens. */
static kvfile_parts parts_in(kvfile_dtype d, part_buffers* b) {
  kvfile_parts p;
  memset(&p, 0, sizeof p);
  p.dtype = d;
  p.data = b->data;
  p.data_bytes = d == KVFILE_NVFP4 ? kPartElems / 2 : (size_t)kPartElems * kvfile_dtype_size(d);
  if (d == KVFILE_E4M3 || d == KVFILE_E5M2 || d == KVFILE_NVFP4) {
    p.scales = b->scales;
    p.scale_count = d == KVFILE_NVFP4 ? kTokens : kTokens * kRows;
  }
  if (d == KVFILE_NVFP4) {
    p.block_scales = b->block_scales;
    p.block_scales_bytes = kPartElems / 16;
  }
  return p;
}

static void parts_geometry(kvfile_geometry* g) {
  static const char* names[kPartStreams] = {"e4", "e5", "bf", "h", "f", "nv"};
  memset(g, 0, sizeof *g);
  g->layers = 1;
  g->stream_count = kPartStreams;
  for (int s = 0; s < kPartStreams; ++s) {
    strcpy(g->streams[s].name, names[s]);
    g->streams[s].rows_per_token = kRows;
    g->streams[s].row_width = kWidth;
    g->streams[s].dtype = kPartDtypes[s];
  }
}

static void test_parts_every_dtype(void) {
  static part_buffers stored[kPartStreams], again, before;
  kvfile_geometry g;
  parts_geometry(&g);
  uint32_t ids[kTokens];
  for (int t = 0; t < kTokens; ++t) ids[t] = token_id(t);
  kvfile_parts blocks[kPartStreams];
  for (int s = 0; s < kPartStreams; ++s) {
    memset(&blocks[s], 0, sizeof blocks[s]);
    blocks[s].dtype = KVFILE_F32;
    blocks[s].data = rows_f32[s % (kLayers * kStreams)];
    blocks[s].data_bytes = sizeof rows_f32[0];
  }
  kvfile_writer* w = NULL;
  CHECK_STATUS(kvfile_writer_create(in_dir(dir, "parts.kv"), &g, "test/parts", 1, NULL, &w), KVFILE_OK);
  blocks[2].data_bytes = sizeof rows_f32[0] - 1;  /* a short buffer: nothing appended */
  CHECK_STATUS(kvfile_writer_append_parts(w, ids, kTokens, blocks, kPartStreams), KVFILE_BUFFER_TOO_SMALL);
  CHECK(strcmp(kvfile_last_error(), "kvfile_writer_append_parts: block 2 data_bytes holds 1279, the result needs 1280") == 0);
  blocks[2].data_bytes = sizeof rows_f32[0];
  CHECK_STATUS(kvfile_writer_append_parts(w, ids, kTokens, blocks, kPartStreams), KVFILE_OK);
  CHECK_STATUS(kvfile_writer_close(w), KVFILE_OK);

  kvfile_reader* r = NULL;
  CHECK_STATUS(kvfile_reader_open(in_dir(dir, "parts.kv"), &r), KVFILE_OK);
  for (uint32_t s = 0; s < kPartStreams; ++s) {
    /* The stored parts; f32 rows decoded exactly as kvfile_reader_read_rows. */
    kvfile_parts p = parts_in(kPartDtypes[s], &stored[s]);
    CHECK_STATUS(kvfile_reader_read_parts(r, 0, s, 0, kTokens, &p), KVFILE_OK);
    static float want[kPartElems], got[kPartElems];
    CHECK_STATUS(kvfile_reader_read_rows(r, 0, s, 0, kTokens, KVFILE_F32, want, sizeof want), KVFILE_OK);
    kvfile_parts f = {KVFILE_F32, got, sizeof got, NULL, 0, NULL, 0};
    CHECK_STATUS(kvfile_reader_read_parts(r, 0, s, 0, kTokens, &f), KVFILE_OK);
    CHECK(memcmp(got, want, sizeof got) == 0);
    if (kPartDtypes[s] == KVFILE_F32) CHECK(memcmp(stored[s].data, rows_f32[s % 4], sizeof got) == 0);
  }
  /* The deprecated reads give the same bytes. */
  kvfile_parts e4 = parts_in(KVFILE_E4M3, &again);
  CHECK_STATUS(kvfile_reader_read_codes(r, 0, 0, 0, kTokens, again.data, e4.data_bytes, again.scales, e4.scale_count),
               KVFILE_OK);
  CHECK(memcmp(again.data, stored[0].data, e4.data_bytes) == 0 &&
        memcmp(again.scales, stored[0].scales, sizeof again.scales) == 0);
  kvfile_parts nv = parts_in(KVFILE_NVFP4, &again);
  CHECK_STATUS(kvfile_reader_read_nvfp4_codes(r, 0, 5, 0, kTokens, again.data, nv.data_bytes, again.block_scales,
                                              nv.block_scales_bytes, again.scales, nv.scale_count),
               KVFILE_OK);
  CHECK(memcmp(again.data, stored[5].data, nv.data_bytes) == 0 &&
        memcmp(again.block_scales, stored[5].block_scales, nv.block_scales_bytes) == 0 &&
        memcmp(again.scales, stored[5].scales, nv.scale_count * 4) == 0);
  /* The bulk read: every stream as its stored parts and as f32 rows, twelve
   * targets of six dtypes in one call, on 2 threads: the same bytes. */
  {
    static part_buffers many[kPartStreams];
    static float rows[kPartStreams][kPartElems], want[kPartElems];
    kvfile_parts_target pt[2 * kPartStreams];
    memset(many, 0xCD, sizeof many);
    for (uint32_t s = 0; s < kPartStreams; ++s) {
      pt[s].layer = 0;
      pt[s].stream = s;
      pt[s].parts = parts_in(kPartDtypes[s], &many[s]);
      pt[kPartStreams + s].layer = 0;
      pt[kPartStreams + s].stream = s;
      pt[kPartStreams + s].parts = (kvfile_parts){KVFILE_F32, rows[s], sizeof rows[s], NULL, 0, NULL, 0};
    }
    CHECK_STATUS(kvfile_reader_read_parts_many(r, 0, kTokens, pt, 2 * kPartStreams, 2), KVFILE_OK);
    for (uint32_t s = 0; s < kPartStreams; ++s) {
      const kvfile_parts p = pt[s].parts;
      CHECK(memcmp(many[s].data, stored[s].data, p.data_bytes) == 0);
      CHECK(p.scale_count == 0 || memcmp(many[s].scales, stored[s].scales, p.scale_count * 4) == 0);
      CHECK(p.block_scales_bytes == 0 ||
            memcmp(many[s].block_scales, stored[s].block_scales, p.block_scales_bytes) == 0);
      CHECK_STATUS(kvfile_reader_read_rows(r, 0, s, 0, kTokens, KVFILE_F32, want, sizeof want), KVFILE_OK);
      CHECK(memcmp(rows[s], want, sizeof want) == 0);
    }
    /* Refused before anything is read: a dtype not the stream's, a missing
     * part, a short part, a value that is no dtype. */
    memset(many, 0xCD, sizeof many);
    pt[0].parts.dtype = KVFILE_NVFP4;
    CHECK_STATUS(kvfile_reader_read_parts_many(r, 0, kTokens, pt, 2 * kPartStreams, 0), KVFILE_INVALID_ARGUMENT);
    CHECK(strcmp(kvfile_last_error(),
                 "kvfile_reader_read_parts_many: targets[0].parts.dtype: stream 'e4' is e4m3, not nvfp4") == 0);
    pt[0].parts = parts_in(KVFILE_E4M3, &many[0]);
    pt[5].parts.block_scales = NULL;
    CHECK_STATUS(kvfile_reader_read_parts_many(r, 0, kTokens, pt, 2 * kPartStreams, 0), KVFILE_INVALID_ARGUMENT);
    CHECK(strcmp(kvfile_last_error(), "kvfile_reader_read_parts_many: targets[5].parts.block_scales is NULL") == 0);
    pt[5].parts = parts_in(KVFILE_NVFP4, &many[5]);
    pt[1].parts.scale_count -= 1;
    CHECK_STATUS(kvfile_reader_read_parts_many(r, 0, kTokens, pt, 2 * kPartStreams, 0), KVFILE_BUFFER_TOO_SMALL);
    CHECK_CONTAINS(kvfile_last_error(), "targets[1].parts.scale_count holds 19, the result needs 20");
    pt[1].parts = parts_in(KVFILE_E5M2, &many[1]);
    pt[7].parts.dtype = (kvfile_dtype)9;
    CHECK_STATUS(kvfile_reader_read_parts_many(r, 0, kTokens, pt, 2 * kPartStreams, 0), KVFILE_INVALID_ARGUMENT);
    CHECK(strcmp(kvfile_last_error(), "kvfile_reader_read_parts_many: targets[7].parts.dtype 9 is invalid") == 0);
    pt[7].parts.dtype = KVFILE_F32;
    pt[3].layer = 1;
    CHECK_STATUS(kvfile_reader_read_parts_many(r, 0, kTokens, pt, 2 * kPartStreams, 0), KVFILE_INVALID_ARGUMENT);
    CHECK(strcmp(kvfile_last_error(), "kvfile_reader_read_parts_many: targets[3]: layer 1 out of range (1 layers)") == 0);
    pt[3].layer = 0;
    CHECK_STATUS(kvfile_reader_read_parts_many(r, 0, kTokens + 1, pt, 2 * kPartStreams, 0), KVFILE_INVALID_ARGUMENT);
    CHECK_CONTAINS(kvfile_last_error(), "token range [0, 11) outside [0, 10)");
    CHECK(many[0].data[0] == 0xCD && many[5].block_scales[0] == 0xCD);
  }
  /* Refused, the buffers untouched: each part one short, an fp8 dtype not
   * the stream's, a value that is no dtype. */
  memset(&again, 0xA5, sizeof again);
  memcpy(&before, &again, sizeof again);
  nv = parts_in(KVFILE_NVFP4, &again);
  nv.block_scales_bytes -= 1;
  CHECK_STATUS(kvfile_reader_read_parts(r, 0, 5, 0, kTokens, &nv), KVFILE_BUFFER_TOO_SMALL);
  CHECK(strcmp(kvfile_last_error(), "kvfile_reader_read_parts: block_scales_bytes holds 19, the result needs 20") == 0);
  nv = parts_in(KVFILE_NVFP4, &again);
  nv.scale_count -= 1;
  CHECK_STATUS(kvfile_reader_read_parts(r, 0, 5, 0, kTokens, &nv), KVFILE_BUFFER_TOO_SMALL);
  CHECK(strcmp(kvfile_last_error(), "kvfile_reader_read_parts: scale_count holds 9, the result needs 10") == 0);
  e4 = parts_in(KVFILE_E5M2, &again);
  CHECK_STATUS(kvfile_reader_read_parts(r, 0, 0, 0, kTokens, &e4), KVFILE_INVALID_ARGUMENT);
  CHECK(strcmp(kvfile_last_error(), "kvfile_reader_read_parts: stream 'e4' is e4m3, not e5m2") == 0);
  e4.dtype = (kvfile_dtype)7;
  CHECK_STATUS(kvfile_reader_read_parts(r, 0, 0, 0, kTokens, &e4), KVFILE_INVALID_ARGUMENT);
  CHECK(strcmp(kvfile_last_error(), "kvfile_reader_read_parts: invalid dtype 7") == 0);
  CHECK(memcmp(&again, &before, sizeof again) == 0);
  kvfile_reader_close(r);

  /* The stored parts appended as they are (raw streams as their own dtype). */
  for (int s = 0; s < kPartStreams; ++s) blocks[s] = parts_in(kPartDtypes[s], &stored[s]);
  CHECK_STATUS(kvfile_writer_create(in_dir(dir, "parts2.kv"), &g, "test/parts", 1, NULL, &w), KVFILE_OK);
  blocks[5].block_scales = NULL;
  CHECK_STATUS(kvfile_writer_append_parts(w, ids, kTokens, blocks, kPartStreams), KVFILE_INVALID_ARGUMENT);
  CHECK_CONTAINS(kvfile_last_error(), "nvfp4 codes given without block scales");
  blocks[5].block_scales = stored[5].block_scales;
  blocks[1].scale_count = kTokens * kRows - 1;
  CHECK_STATUS(kvfile_writer_append_parts(w, ids, kTokens, blocks, kPartStreams), KVFILE_BUFFER_TOO_SMALL);
  CHECK(strcmp(kvfile_last_error(), "kvfile_writer_append_parts: block 1 scale_count holds 19, the result needs 20") == 0);
  blocks[1].scale_count = kTokens * kRows;
  CHECK_STATUS(kvfile_writer_append_parts(w, ids, kTokens, blocks, kPartStreams), KVFILE_OK);
  CHECK_STATUS(kvfile_writer_close(w), KVFILE_OK);
  CHECK_STATUS(kvfile_reader_open(in_dir(dir, "parts2.kv"), &r), KVFILE_OK);
  for (uint32_t s = 0; s < kPartStreams; ++s) {
    kvfile_parts p = parts_in(kPartDtypes[s], &again);
    CHECK_STATUS(kvfile_reader_read_parts(r, 0, s, 0, kTokens, &p), KVFILE_OK);
    CHECK(memcmp(again.data, stored[s].data, p.data_bytes) == 0);
    CHECK(memcmp(again.scales, stored[s].scales, p.scale_count * 4) == 0);
    CHECK(memcmp(again.block_scales, stored[s].block_scales, p.block_scales_bytes) == 0);
  }
  kvfile_reader_close(r);
}

/* Layer sets (spec/FORMAT.md 3.2): glm-5.2's indexer layers from the
 * preset; a file whose stream "x" is in layers 1 and 2 of 3, written with
 * kvfile_writer_create_layers and NULL rows where "x" is absent, read back
 * with its layers; a read where it is absent, rows given there, and a short
 * buffer are refused. */
static void test_layer_sets(void) {
  uint32_t layers[1024];
  size_t count = 0;
  CHECK_STATUS(kvfile_preset_stream_layers("glm-5.2", 2, layers, 1024, &count), KVFILE_OK);
  CHECK(count == 21 && layers[0] == 0 && layers[1] == 4 && layers[19] == 76 && layers[20] == 77);
  CHECK_STATUS(kvfile_preset_stream_layers("glm-5.2", 0, layers, 1024, &count), KVFILE_OK);
  CHECK(count == 78 && layers[77] == 77);
  CHECK_STATUS(kvfile_preset_stream_layers("glm-5.2", 2, layers, 20, &count), KVFILE_BUFFER_TOO_SMALL);
  CHECK(count == 21);

  const char* path = in_dir(dir, "layers.kv");
  kvfile_geometry g;
  memset(&g, 0, sizeof g);
  g.layers = 3;
  g.stream_count = 2;
  snprintf(g.streams[0].name, sizeof g.streams[0].name, "k");
  g.streams[0].rows_per_token = 1;
  g.streams[0].row_width = 4;
  g.streams[0].dtype = KVFILE_F32;
  snprintf(g.streams[1].name, sizeof g.streams[1].name, "x");
  g.streams[1].rows_per_token = 1;
  g.streams[1].row_width = 2;
  g.streams[1].dtype = KVFILE_F32;
  const uint32_t x_layers[2] = {1, 2};
  const uint32_t* sets[2] = {NULL, x_layers};
  const uint32_t counts[2] = {0, 2};
  kvfile_writer* w = NULL;
  /* As many entries as layers, but not each layer once: refused, not taken for "every layer". */
  const uint32_t repeated[3] = {0, 0, 2};
  const uint32_t* bad_sets[2] = {NULL, repeated};
  const uint32_t bad_counts[2] = {0, 3};
  CHECK_STATUS(kvfile_writer_create_layers(in_dir(dir, "repeated.kv"), &g, bad_sets, bad_counts, "m", 1, NULL, &w),
               KVFILE_INVALID_ARGUMENT);
  CHECK(w == NULL);
  CHECK_STATUS(kvfile_writer_create_layers(path, &g, sets, counts, "m", 1, NULL, &w), KVFILE_OK);
  float k_rows[4] = {1, 2, 3, 4}, x_rows[2] = {5, 6};
  uint32_t token = 9;
  kvfile_rows rows[6];
  for (int l = 0; l < 3; ++l) {
    rows[2 * l] = (kvfile_rows){KVFILE_F32, k_rows, NULL};
    rows[2 * l + 1] = (kvfile_rows){KVFILE_F32, l == 0 ? NULL : x_rows, NULL};
  }
  rows[1].data = x_rows; /* rows where "x" is absent */
  CHECK_STATUS(kvfile_writer_append(w, &token, 1, rows, 6), KVFILE_INVALID_ARGUMENT);
  CHECK(strcmp(kvfile_last_error(), "layer 0, stream 'x': rows given, but the stream is not in this layer") == 0);
  rows[1].data = NULL;
  CHECK_STATUS(kvfile_writer_append(w, &token, 1, rows, 6), KVFILE_OK);
  CHECK_STATUS(kvfile_writer_close(w), KVFILE_OK);

  kvfile_reader* r = NULL;
  CHECK_STATUS(kvfile_reader_open(path, &r), KVFILE_OK);
  CHECK_STATUS(kvfile_reader_stream_layers(r, 1, layers, 1024, &count), KVFILE_OK);
  CHECK(count == 2 && layers[0] == 1 && layers[1] == 2);
  CHECK_STATUS(kvfile_reader_stream_layers(r, 0, layers, 1024, &count), KVFILE_OK);
  CHECK(count == 3);
  float out[2] = {0, 0};
  CHECK_STATUS(kvfile_reader_read_rows(r, 2, 1, 0, 1, KVFILE_F32, out, sizeof out), KVFILE_OK);
  CHECK(out[0] == 5 && out[1] == 6);
  CHECK_STATUS(kvfile_reader_read_rows(r, 0, 1, 0, 1, KVFILE_F32, out, sizeof out), KVFILE_INVALID_ARGUMENT);
  CHECK_CONTAINS(kvfile_last_error(), ": stream 'x' is not in layer 0 (it is in layers 1,2)");
  kvfile_reader_close(r);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: c_api_test DIR\n");
    return 2;
  }
  snprintf(dir, sizeof dir, "%s", argv[1]);
  CHECK(kvfile_last_error()[0] == '\0');
  fill_rows();
  test_status_names_and_sizes();
  test_presets();
  test_write();
  test_read();
  test_read_many();
  test_cut_file();
  test_verify_and_damage();
  test_explicit_geometry();
  test_nvfp4();
  test_nvfp4_codes_append();
  test_layer_sets();
  test_parts_every_dtype();
  return check_summary("c_api_test");
}
