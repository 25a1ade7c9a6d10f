// SPDX-License-Identifier: Apache-2.0
/* Tests of the C API of the seeds' formats (kvfile/c.h: kvfile_mooncake_*,
 * kvfile_coli_*), compiled as C99 with warnings as errors: the Mooncake
 * golden record both ways, refusals that leave the destination untouched,
 * and a colibri session imported and exported byte for byte.
 * Usage: c_api_seeds_test DIR FIXTURES (a scratch directory, emptied by the
 * caller, and tests/fixtures/seeds). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvfile/c.h"
#include "support/c_check.h"

static char dir[512], fixtures[512];

static void test_mooncake(void) {
  static const uint16_t values[4] = {0x5F00, 0xDF00, 0x3C00, 0x8000}; /* fp16 448, -448, 1, -0.0 */
  uint8_t golden[64], rec[64], small[47];
  long golden_size = slurp(in_dir(fixtures, "mooncake_golden_fp16.mckv"), golden, sizeof golden);
  kvfile_mooncake_desc d, got;
  size_t size = 0;
  uint16_t out[4] = {1, 1, 1, 1};
  memset(&d, 0, sizeof d);
  d.source_dtype = 1;
  d.rank = 1;
  d.group_size = 4;
  d.shape[0] = 4;
  CHECK(golden_size == 48);
  CHECK(kvfile_mooncake_record_size(&d, &size) == KVFILE_OK && size == 48);
  memset(small, 0xAA, sizeof small);
  CHECK(kvfile_mooncake_encode(&d, values, small, sizeof small, &size) == KVFILE_BUFFER_TOO_SMALL);
  CHECK(small[0] == 0xAA && small[46] == 0xAA);
  CHECK(kvfile_mooncake_encode(&d, values, rec, sizeof rec, &size) == KVFILE_OK);
  CHECK(size == 48 && memcmp(rec, golden, 48) == 0);
  CHECK(kvfile_mooncake_decode(golden, 48, &got, out, 4) == KVFILE_OK);
  CHECK(memcmp(out, values, sizeof out) == 0);
  CHECK(got.source_dtype == 1 && got.rank == 1 && got.group_size == 4 && got.shape[0] == 4);
  CHECK(kvfile_mooncake_decode(golden, 48, &got, NULL, 0) == KVFILE_OK);
  CHECK(kvfile_mooncake_decode(golden, 48, &got, out, 3) == KVFILE_BUFFER_TOO_SMALL);
  /* A NaN code, CRC left as it is: refused by the CRC, dst untouched. */
  memcpy(rec, golden, 48);
  rec[46] = 0x7F;
  memset(out, 0, sizeof out);
  CHECK(kvfile_mooncake_decode(rec, 48, &got, out, 4) == KVFILE_CORRUPTION);
  CHECK(strcmp(kvfile_last_error(), "CRC32 mismatch") == 0);
  CHECK(out[0] == 0 && out[3] == 0);
  CHECK(kvfile_mooncake_decode(golden, 47, &got, out, 4) == KVFILE_CORRUPTION);
  d.group_size = 0;
  CHECK(kvfile_mooncake_record_size(&d, &size) == KVFILE_INVALID_ARGUMENT);
  d.group_size = 4;
  out[1] = 0x7C00; /* fp16 +Inf */
  CHECK(kvfile_mooncake_encode(&d, out, rec, sizeof rec, &size) == KVFILE_NON_FINITE);
}

static void test_coli(void) {
  static uint8_t want[512], got[512];
  long n = slurp(in_dir(fixtures, "coli_v2.coli_kv"), want, sizeof want);
  CHECK(n == 215);
  CHECK(kvfile_coli_import(in_dir(fixtures, "coli_v2.coli_kv"), in_dir(dir, "a.kv")) == KVFILE_OK);
  CHECK(kvfile_coli_import(in_dir(fixtures, "coli_v2.coli_kv"), in_dir(dir, "a.kv")) == KVFILE_INVALID_ARGUMENT);
  CHECK(kvfile_coli_export(in_dir(dir, "a.kv"), in_dir(dir, "b.coli_kv"), 0) == KVFILE_OK);
  CHECK(slurp(in_dir(dir, "b.coli_kv"), got, sizeof got) == 208);
  CHECK(memcmp(got, want, 208) == 0);
  CHECK(kvfile_coli_export(in_dir(dir, "a.kv"), in_dir(dir, "b.coli_kv"), 0) == KVFILE_INVALID_ARGUMENT);
  /* Cut inside the committed records: corruption, no output left. */
  {
    FILE* f = fopen(in_dir(dir, "cut.coli_kv"), "wb");
    fwrite(want, 1, 100, f);
    fclose(f);
  }
  CHECK(kvfile_coli_import(in_dir(dir, "cut.coli_kv"), in_dir(dir, "c.kv")) == KVFILE_CORRUPTION);
  CHECK(slurp(in_dir(dir, "c.kv"), got, sizeof got) == -1);
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: c_api_seeds_test DIR FIXTURES\n");
    return 2;
  }
  snprintf(dir, sizeof dir, "%s", argv[1]);
  snprintf(fixtures, sizeof fixtures, "%s", argv[2]);
  test_mooncake();
  test_coli();
  return check_summary("c_api_seeds_test");
}
