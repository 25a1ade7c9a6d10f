// SPDX-License-Identifier: Apache-2.0
/* Tests of the C API of prefix lookup (kvfile/c.h: kvfile_find_prefix,
 * kvfile_index_directory), compiled as C99 with warnings as errors.
 * Usage: prefix_c_test DIR (a scratch directory, emptied by the caller). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* kvfile_writer_append and kvfile_reader_read_codes: deprecated, still tested. */
#define KVFILE_NO_DEPRECATION_WARNINGS
#include "kvfile/c.h"
#include "support/c_check.h"

static char dir[512];

/* A .kv file of one layer and one bf16 stream of four values per token. */
static void write_kv(const char* name, const uint32_t* ids, size_t n, uint64_t fingerprint) {
  kvfile_geometry g;
  kvfile_writer_options o;
  kvfile_writer* w = NULL;
  kvfile_rows rows;
  static uint16_t zeros[4 * 16];
  memset(&g, 0, sizeof g);
  memset(&o, 0, sizeof o);
  g.layers = 1;
  g.stream_count = 1;
  strcpy(g.streams[0].name, "k");
  g.streams[0].rows_per_token = 1;
  g.streams[0].row_width = 4;
  g.streams[0].dtype = KVFILE_BF16;
  o.sync = KVFILE_SYNC_NONE;
  rows.dtype = KVFILE_BF16;
  rows.data = zeros;
  rows.scales = NULL;
  CHECK_STATUS(kvfile_writer_create(in_dir(dir, name), &g, "org/m", fingerprint, &o, &w), KVFILE_OK);
  CHECK_STATUS(kvfile_writer_append(w, ids, n, &rows, 1), KVFILE_OK);
  CHECK_STATUS(kvfile_writer_close(w), KVFILE_OK);
}

int main(int argc, char** argv) {
  static const uint32_t a[3] = {1, 2, 3}, b[4] = {1, 2, 4, 5}, q[5] = {1, 2, 4, 9, 9}, miss[2] = {7, 1};
  uint64_t other = 0x99;
  kvfile_prefix_match m;
  char sub[600];
  uint8_t magic[8];
  if (argc != 2) return 2;
  snprintf(dir, sizeof dir, "%s", argv[1]);
  write_kv("a.kv", a, 3, 0x11);
  write_kv("b.kv", b, 4, 0x22);

  CHECK_STATUS(kvfile_index_directory(dir), KVFILE_OK);
  CHECK(slurp(in_dir(dir, ".kvfile-index"), magic, sizeof magic) == 8 && memcmp(magic + 1, "KVI", 3) == 0);
  memset(&m, 0xAA, sizeof m);
  CHECK_STATUS(kvfile_find_prefix(dir, q, 5, NULL, &m), KVFILE_OK);
  CHECK(m.found == 1 && strcmp(m.path, "b.kv") == 0 && m.matched == 3 && m.tokens == 4);
  CHECK(m.fingerprint == 0x22 && strcmp(m.model_id, "org/m") == 0);
  /* Restricted to a's fingerprint; then to one no file has. */
  other = 0x11;
  CHECK_STATUS(kvfile_find_prefix(dir, q, 5, &other, &m), KVFILE_OK);
  CHECK(m.found == 1 && strcmp(m.path, "a.kv") == 0 && m.matched == 2);
  other = 0x99;
  CHECK_STATUS(kvfile_find_prefix(dir, q, 5, &other, &m), KVFILE_OK);
  CHECK(m.found == 0 && m.path[0] == '\0' && m.matched == 0);
  CHECK_STATUS(kvfile_find_prefix(dir, miss, 2, NULL, &m), KVFILE_OK);
  CHECK(m.found == 0);
  /* Errors: NULL arguments, a missing path, a file that is no directory or pack. */
  CHECK_STATUS(kvfile_find_prefix(NULL, q, 5, NULL, &m), KVFILE_INVALID_ARGUMENT);
  CHECK_CONTAINS(kvfile_last_error(), "path is NULL");
  CHECK_STATUS(kvfile_find_prefix(dir, NULL, 5, NULL, &m), KVFILE_INVALID_ARGUMENT);
  CHECK_STATUS(kvfile_find_prefix(dir, q, 5, NULL, NULL), KVFILE_INVALID_ARGUMENT);
  CHECK_STATUS(kvfile_find_prefix(in_dir(dir, "nothing"), q, 5, NULL, &m), KVFILE_NOT_FOUND);
  CHECK_STATUS(kvfile_find_prefix(in_dir(dir, "a.kv"), q, 5, NULL, &m), KVFILE_CORRUPTION);
  CHECK_CONTAINS(kvfile_last_error(), "not a kvfile pack");
  snprintf(sub, sizeof sub, "%s", in_dir(dir, "a.kv"));
  CHECK_STATUS(kvfile_index_directory(sub), KVFILE_INVALID_ARGUMENT);
  CHECK_CONTAINS(kvfile_last_error(), "not a directory");
  return check_summary("prefix_c_test");
}
