// SPDX-License-Identifier: Apache-2.0
/* The C example of docs/api.md, compiled and run by CI: the same session as the
 * C++ example through the C API (kvfile/c.h), with f32 input rows.
 * Usage: example_c [FILE]; exit status 0 only if everything matches. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kvfile/c.h"

enum { kTokens = 16, kReuse = 10 };

/* Element i of (layer, stream) for token t: magnitudes in [0.5, 1). */
static float value(uint32_t layer, uint32_t stream, uint64_t t, uint64_t i) {
  float v = 0.5f + (float)((layer * 7 + stream * 3 + t * 5 + i) % 64) / 128.0f;
  return (i % 2 == 0) ? v : -v;
}

static int fail(const char* what, kvfile_status st) {
  fprintf(stderr, "example: %s: %s: %s\n", what, kvfile_status_name(st), kvfile_last_error());
  return 1;
}

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : "example.kv";
  const uint32_t tokens[kTokens] = {128000, 791, 4062, 14198, 39935, 35308, 927, 279,
                                    16053, 5679, 13, 578, 4062, 374, 6437, 13};
  kvfile_geometry g;
  kvfile_status st = kvfile_preset("llama-3.1-8b", KVFILE_E4M3, &g);
  if (st != KVFILE_OK) return fail("preset", st);

  /* Rows of every (layer, stream), blocks[layer * stream_count + stream]. */
  size_t block_count = (size_t)g.layers * g.stream_count;
  kvfile_parts* blocks = calloc(block_count, sizeof *blocks);
  if (blocks == NULL) return 1;
  for (uint32_t layer = 0; layer < g.layers; ++layer) {
    for (uint32_t s = 0; s < g.stream_count; ++s) {
      uint64_t per_token = (uint64_t)g.streams[s].rows_per_token * g.streams[s].row_width;
      float* rows = malloc(kTokens * per_token * sizeof *rows);
      if (rows == NULL) return 1;
      for (uint64_t e = 0; e < kTokens * per_token; ++e) rows[e] = value(layer, s, e / per_token, e % per_token);
      blocks[layer * g.stream_count + s].dtype = KVFILE_F32;
      blocks[layer * g.stream_count + s].data = rows;
      blocks[layer * g.stream_count + s].data_bytes = kTokens * per_token * sizeof *rows;
    }
  }

  kvfile_writer_options options = {0};
  options.overwrite = 1;
  kvfile_writer* w = NULL;
  st = kvfile_writer_create(path, &g, "meta-llama/Llama-3.1-8B", 0x5eed, &options, &w);
  if (st != KVFILE_OK) return fail("create", st);
  st = kvfile_writer_append_parts(w, tokens, kTokens, blocks, block_count);
  if (st != KVFILE_OK) return fail("append", st);
  st = kvfile_writer_close(w); /* durable and committed; frees w */
  if (st != KVFILE_OK) return fail("close", st);

  kvfile_reader* r = NULL;
  st = kvfile_reader_open(path, &r);
  if (st != KVFILE_OK) return fail("open", st);
  uint32_t prompt[kReuse + 1];
  for (int i = 0; i < kReuse; ++i) prompt[i] = tokens[i];
  prompt[kReuse] = 42;
  uint64_t reuse = 0;
  st = kvfile_reader_common_prefix(r, prompt, kReuse + 1, &reuse);
  if (st != KVFILE_OK) return fail("common prefix", st);
  if (reuse != kReuse) {
    fprintf(stderr, "example: common prefix %llu, expected %d\n", (unsigned long long)reuse, kReuse);
    return 1;
  }
  for (uint32_t layer = 0; layer < g.layers; ++layer) {
    for (uint32_t s = 0; s < g.stream_count; ++s) {
      uint64_t n = reuse * g.streams[s].rows_per_token * g.streams[s].row_width;
      float* got = malloc(n * sizeof *got);
      if (got == NULL) return 1;
      st = kvfile_reader_read_rows(r, layer, s, 0, reuse, KVFILE_F32, got, n * sizeof *got);
      if (st != KVFILE_OK) return fail("read", st);
      const float* want = blocks[layer * g.stream_count + s].data;
      for (uint64_t e = 0; e < n; ++e) {
        if (!(fabsf(got[e] - want[e]) <= fabsf(want[e]) / 16)) {
          fprintf(stderr, "example: layer %u stream %u element %llu: read %g, wrote %g\n", layer, s,
                  (unsigned long long)e, got[e], want[e]);
          return 1;
        }
      }
      free(got);
    }
  }
  kvfile_info info;
  st = kvfile_reader_info(r, &info);
  if (st != KVFILE_OK) return fail("info", st);
  printf("%s: %llu tokens of %s, %llu reusable, every value within fp8 rounding\n", path,
         (unsigned long long)info.tokens, info.model_id, (unsigned long long)reuse);
  kvfile_reader_close(r);
  for (size_t i = 0; i < block_count; ++i) free((void*)blocks[i].data);
  free(blocks);
  return 0;
}
