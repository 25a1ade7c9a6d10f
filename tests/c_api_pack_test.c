// SPDX-License-Identifier: Apache-2.0
/* Tests of the pack functions of the C API (kvfile/c.h), compiled as C99
 * with warnings as errors: packing .kv files, listing, finding,
 * materialising and verifying members; NULL arguments, a small buffer, a
 * missing member and a damaged pack.
 * Usage: c_api_pack_test DIR (a scratch directory, emptied by the caller). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* kvfile_writer_append and kvfile_reader_read_codes: deprecated, still tested. */
#define KVFILE_NO_DEPRECATION_WARNINGS
#include "kvfile/c.h"
#include "support/c_check.h"

/* The tiny preset: 2 layers, streams k and v of 2 rows x 16. */
enum { kBlocks = 4, kPerToken = 32, kShared = 8 };

static char dir[512];
static float rows[kBlocks][24 * kPerToken];
static uint32_t ids[24];

/* Writes `tokens` tokens: the first kShared the same in every file, the rest
 * depending on `seed`. */
static void write_session(const char* path, int tokens, int seed) {
  kvfile_geometry g;
  CHECK_STATUS(kvfile_preset("tiny", KVFILE_E4M3, &g), KVFILE_OK);
  kvfile_writer_options options;
  memset(&options, 0, sizeof options);
  options.chunk_tokens = 4;
  for (int t = 0; t < tokens; ++t) {
    int k = t < kShared ? 0 : seed;
    ids[t] = (uint32_t)(100 + t + 1000 * k);
    for (int b = 0; b < kBlocks; ++b)
      for (int i = 0; i < kPerToken; ++i)
        rows[b][t * kPerToken + i] = 0.5f + (float)((b * 7 + t * 5 + i + 13 * k) % 32) / 64.0f;
  }
  kvfile_rows blocks[kBlocks];
  for (int b = 0; b < kBlocks; ++b) {
    blocks[b].dtype = KVFILE_F32;
    blocks[b].data = rows[b];
    blocks[b].scales = NULL;
  }
  kvfile_writer* w = NULL;
  CHECK_STATUS(kvfile_writer_create(path, &g, "test/tiny", 7, &options, &w), KVFILE_OK);
  CHECK_STATUS(kvfile_writer_append(w, ids, (size_t)tokens, blocks, kBlocks), KVFILE_OK);
  CHECK_STATUS(kvfile_writer_close(w), KVFILE_OK);
}

static void test_pack(void) {
  char a[1100], b[1100], pack[1100];
  snprintf(a, sizeof a, "%s", in_dir(dir, "a.kv"));
  snprintf(b, sizeof b, "%s", in_dir(dir, "b.kv"));
  snprintf(pack, sizeof pack, "%s", in_dir(dir, "c.kvpack"));
  write_session(a, 12, 1);
  write_session(b, 20, 2);
  const char* paths[2] = {b, a};
  const char* names[2] = {"z/b.kv", "a.kv"};
  CHECK_STATUS(kvfile_pack_files(pack, paths, NULL, 2, 4), KVFILE_INVALID_ARGUMENT);
  CHECK(strcmp(kvfile_last_error(), "kvfile_pack_files: names is NULL") == 0);
  CHECK_STATUS(kvfile_pack_files(pack, paths, names, 2, 4), KVFILE_OK);
  CHECK_STATUS(kvfile_pack_files(pack, paths, names, 2, 4), KVFILE_INVALID_ARGUMENT);
  CHECK_CONTAINS(kvfile_last_error(), "file exists");

  kvfile_pack* p = (kvfile_pack*)1;
  CHECK_STATUS(kvfile_pack_open(in_dir(dir, "nosuch.kvpack"), &p), KVFILE_NOT_FOUND);
  CHECK(p == NULL);
  CHECK_STATUS(kvfile_pack_open(pack, &p), KVFILE_OK);
  size_t count = 0;
  CHECK_STATUS(kvfile_pack_member_count(p, &count), KVFILE_OK);
  CHECK(count == 2);
  /* Name order: a.kv, then z/b.kv. */
  char name[16];
  size_t length = 0;
  CHECK_STATUS(kvfile_pack_member_name(p, 1, name, sizeof name, &length), KVFILE_OK);
  CHECK(strcmp(name, "z/b.kv") == 0 && length == 6);
  CHECK_STATUS(kvfile_pack_member_name(p, 1, name, 6, &length), KVFILE_BUFFER_TOO_SMALL);
  CHECK(length == 6);
  CHECK_STATUS(kvfile_pack_member_name(p, 2, name, sizeof name, NULL), KVFILE_INVALID_ARGUMENT);
  CHECK_CONTAINS(kvfile_last_error(), "member 2 of 2");
  uint64_t tokens = 0;
  CHECK_STATUS(kvfile_pack_member_tokens(p, 0, &tokens), KVFILE_OK);
  CHECK(tokens == 12);
  size_t index = 9;
  CHECK_STATUS(kvfile_pack_find(p, "z/b.kv", &index), KVFILE_OK);
  CHECK(index == 1);
  CHECK_STATUS(kvfile_pack_find(p, "b.kv", &index), KVFILE_NOT_FOUND);
  CHECK_CONTAINS(kvfile_last_error(), "no member 'b.kv'");
  CHECK_STATUS(kvfile_pack_verify(p), KVFILE_OK);

  /* The materialised member holds the source's tokens and codes. */
  CHECK_STATUS(kvfile_pack_materialize(p, 1, in_dir(dir, "out.kv")), KVFILE_OK);
  kvfile_pack_close(p);
  kvfile_reader *src = NULL, *out = NULL;
  CHECK_STATUS(kvfile_reader_open(b, &src), KVFILE_OK);
  CHECK_STATUS(kvfile_reader_open(in_dir(dir, "out.kv"), &out), KVFILE_OK);
  uint32_t t1[20], t2[20];
  size_t n1 = 0, n2 = 0;
  CHECK_STATUS(kvfile_reader_tokens(src, t1, 20, &n1), KVFILE_OK);
  CHECK_STATUS(kvfile_reader_tokens(out, t2, 20, &n2), KVFILE_OK);
  CHECK(n1 == 20 && n2 == 20 && memcmp(t1, t2, sizeof t1) == 0);
  for (uint32_t blk = 0; blk < kBlocks; ++blk) {
    uint8_t c1[20 * kPerToken], c2[20 * kPerToken];
    float s1[40], s2[40];
    CHECK_STATUS(kvfile_reader_read_codes(src, blk / 2, blk % 2, 0, 20, c1, sizeof c1, s1, 40), KVFILE_OK);
    CHECK_STATUS(kvfile_reader_read_codes(out, blk / 2, blk % 2, 0, 20, c2, sizeof c2, s2, 40), KVFILE_OK);
    CHECK(memcmp(c1, c2, sizeof c1) == 0 && memcmp(s1, s2, sizeof s1) == 0);
  }
  kvfile_reader_close(src);
  kvfile_reader_close(out);

  /* A flipped payload byte: verify and materialise report corruption, and
   * nothing is written. */
  static uint8_t bytes[1 << 16];
  long size = slurp(pack, bytes, sizeof bytes);
  CHECK(size > 200);
  bytes[200] ^= 0x10;
  FILE* f = fopen(in_dir(dir, "bad.kvpack"), "wb");
  CHECK(f != NULL && fwrite(bytes, 1, (size_t)size, f) == (size_t)size);
  if (f) fclose(f);
  CHECK_STATUS(kvfile_pack_open(in_dir(dir, "bad.kvpack"), &p), KVFILE_OK);
  CHECK_STATUS(kvfile_pack_verify(p), KVFILE_CORRUPTION);
  CHECK_CONTAINS(kvfile_last_error(), "checksum mismatch");
  CHECK_STATUS(kvfile_pack_materialize(p, 0, in_dir(dir, "bad.kv")), KVFILE_CORRUPTION);
  CHECK(fopen(in_dir(dir, "bad.kv"), "rb") == NULL);
  kvfile_pack_close(p);
  kvfile_pack_close(NULL);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: c_api_pack_test DIR\n");
    return 2;
  }
  snprintf(dir, sizeof dir, "%s", argv[1]);
  test_pack();
  return check_summary("c_api_pack_test");
}
