// SPDX-License-Identifier: Apache-2.0
/* Tests of kvfile_repair (kvfile/c.h), compiled as C99 with warnings as
 * errors: a healthy file, a torn tail (dry run: every byte kept; then cut),
 * damage before the end refused without KVFILE_REPAIR_FORCE, damage in a
 * committed chunk refused even with it, bad arguments.
 * Usage: c_repair_test DIR (a scratch directory, emptied by the caller). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvfile/c.h"
#include "support/c_check.h"

/* The tiny preset: 2 layers, streams k and v of 2 rows x 16; 10 tokens in
 * chunks of 4 (three chunks of 4096 bytes after 12288 bytes of header). */
enum { kLayers = 2, kStreams = 2, kPerToken = 2 * 16, kTokens = 10 };
enum { kDataOffset = 12288, kChunkBytes = 4096, kFileBytes = kDataOffset + 3 * kChunkBytes };

static char dir[512];
static float rows[kLayers * kStreams][kTokens * kPerToken];
static uint8_t before[kFileBytes + 200], after[kFileBytes + 200];

static void write_file(const char* path) {
  kvfile_geometry g;
  kvfile_writer_options options;
  kvfile_writer* w = NULL;
  kvfile_parts blocks[kLayers * kStreams];
  uint32_t ids[kTokens];
  CHECK_STATUS(kvfile_preset("tiny", KVFILE_E4M3, &g), KVFILE_OK);
  memset(&options, 0, sizeof options);
  options.chunk_tokens = 4;
  for (int b = 0; b < kLayers * kStreams; ++b) {
    for (int i = 0; i < kTokens * kPerToken; ++i) rows[b][i] = 0.5f + (float)((b * 7 + i) % 32) / 64.0f;
    memset(&blocks[b], 0, sizeof blocks[b]);
    blocks[b].dtype = KVFILE_F32;
    blocks[b].data = rows[b];
    blocks[b].data_bytes = sizeof rows[b];
  }
  for (int t = 0; t < kTokens; ++t) ids[t] = (uint32_t)(100 + t);
  CHECK_STATUS(kvfile_writer_create(path, &g, "test/tiny", 1, &options, &w), KVFILE_OK);
  CHECK_STATUS(kvfile_writer_append_parts(w, ids, kTokens, blocks, kLayers * kStreams), KVFILE_OK);
  CHECK_STATUS(kvfile_writer_close(w), KVFILE_OK);
}

/* Writes n bytes of value v at offset `at` of path (past the end: appends). */
static void poke(const char* path, long at, int v, size_t n) {
  uint8_t bytes[256];
  FILE* f = fopen(path, "r+b");
  CHECK(f != NULL);
  if (f == NULL) return;
  memset(bytes, v, sizeof bytes);
  CHECK(fseek(f, at, SEEK_SET) == 0);
  CHECK(fwrite(bytes, 1, n, f) == n);
  fclose(f);
}

static void test_healthy_and_torn_tail(void) {
  const char* path = in_dir(dir, "torn.kv");
  kvfile_repair_result r;
  long n;
  write_file(path);
  CHECK_STATUS(kvfile_repair(path, 0, &r), KVFILE_OK);
  CHECK(r.healthy == 1 && r.repaired == 0 && r.findings == 0 && r.tokens == kTokens);
  CHECK(r.refused_kind == KVFILE_FINDING_NONE && r.cut_kind == KVFILE_FINDING_NONE);
  CHECK(slurp(path, before, sizeof before) == kFileBytes);

  poke(path, kFileBytes, 0x42, 100);
  n = slurp(path, before, sizeof before);
  CHECK(n == kFileBytes + 100);
  CHECK_STATUS(kvfile_repair(path, KVFILE_REPAIR_DRY_RUN, &r), KVFILE_OK);
  CHECK(r.healthy == 0 && r.repaired == 0 && r.findings == 1);
  CHECK(r.cut_kind == KVFILE_FINDING_TORN_TAIL);
  CHECK(r.cut_offset == kFileBytes && r.cut_bytes == 100);
  CHECK_CONTAINS(r.message, "torn tail: 100 bytes after the last valid chunk");
  CHECK(slurp(path, after, sizeof after) == n && memcmp(before, after, (size_t)n) == 0);

  CHECK_STATUS(kvfile_repair(path, 0, &r), KVFILE_OK);
  CHECK(r.repaired == 1 && r.cut_kind == KVFILE_FINDING_TORN_TAIL && r.cut_bytes == 100);
  CHECK(r.tokens == kTokens);
  CHECK(slurp(path, after, sizeof after) == kFileBytes && memcmp(before, after, kFileBytes) == 0);
}

static void test_refusals(void) {
  const char* path = in_dir(dir, "damaged.kv");
  kvfile_repair_result r;
  write_file(path);
  poke(path, kDataOffset + kChunkBytes + 2000, 0x55, 4); /* chunk 1's payload, committed */
  CHECK(slurp(path, before, sizeof before) == kFileBytes);
  CHECK_STATUS(kvfile_repair(path, KVFILE_REPAIR_FORCE, &r), KVFILE_CORRUPTION);
  CHECK(r.refused_kind == KVFILE_FINDING_DAMAGED_CHUNK && r.repaired == 0 && r.findings == 1);
  CHECK_CONTAINS(kvfile_last_error(), "; not repaired (damage, not a crash's leftovers)");
  CHECK(strcmp(r.message, kvfile_last_error()) == 0);
  CHECK(slurp(path, after, sizeof after) == kFileBytes && memcmp(before, after, kFileBytes) == 0);

  poke(path, 0, 0, 4); /* the magic */
  CHECK_STATUS(kvfile_repair(path, 0, &r), KVFILE_CORRUPTION);
  CHECK(r.refused_kind == KVFILE_FINDING_UNREADABLE);
}

static void test_arguments(void) {
  kvfile_repair_result r;
  CHECK_STATUS(kvfile_repair(NULL, 0, &r), KVFILE_INVALID_ARGUMENT);
  CHECK(strcmp(kvfile_last_error(), "kvfile_repair: path is NULL") == 0);
  CHECK_STATUS(kvfile_repair(in_dir(dir, "torn.kv"), 0, NULL), KVFILE_INVALID_ARGUMENT);
  CHECK(strcmp(kvfile_last_error(), "kvfile_repair: out is NULL") == 0);
  CHECK_STATUS(kvfile_repair(in_dir(dir, "torn.kv"), 4, &r), KVFILE_INVALID_ARGUMENT);
  CHECK(strcmp(kvfile_last_error(), "kvfile_repair: unknown flags 4") == 0);
  CHECK_STATUS(kvfile_repair(in_dir(dir, "missing.kv"), 0, &r), KVFILE_NOT_FOUND);
  CHECK_CONTAINS(kvfile_last_error(), "missing.kv");
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: c_repair_test DIR\n");
    return 2;
  }
  snprintf(dir, sizeof dir, "%s", argv[1]);
  test_healthy_and_torn_tail();
  test_refusals();
  test_arguments();
  return check_summary("c_repair_test");
}
