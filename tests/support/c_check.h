/* SPDX-License-Identifier: Apache-2.0 */
/* The checks of the C API's tests (plain C99): CHECK counts and reports a
 * failed condition with kvfile_last_error(), in_dir() builds a path,
 * slurp() reads a file, check_summary() ends the program. Functions are
 * static inline: include this header in one file of each test program. */
#ifndef KVFILE_TESTS_SUPPORT_C_CHECK_H_
#define KVFILE_TESTS_SUPPORT_C_CHECK_H_

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kvfile/c.h"

static int failures = 0;

#define CHECK(cond)                                                           \
  do {                                                                        \
    if (!(cond)) {                                                            \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, \
              __LINE__, #cond, kvfile_last_error());                          \
      ++failures;                                                             \
    }                                                                         \
  } while (0)

#define CHECK_STATUS(expr, want) CHECK((expr) == (want))
#define CHECK_CONTAINS(text, part) CHECK(strstr((text), (part)) != NULL)

/* base/name, in one of four buffers that take turns (so that one call may
 * take up to four of these paths). */
static inline const char* in_dir(const char* base, const char* name) {
  static char buf[4][1100];
  static int next = 0;
  char* p = buf[next++ % 4];
  snprintf(p, sizeof buf[0], "%s/%s", base, name);
  return p;
}

/* Reads a whole file into buf (at most cap bytes); returns its size or -1. */
static inline long slurp(const char* path, uint8_t* buf, long cap) {
  FILE* f = fopen(path, "rb");
  long n;
  if (f == NULL) return -1;
  n = (long)fread(buf, 1, (size_t)cap, f);
  fclose(f);
  return n;
}

/* The program's exit status: 1 (and the count on stderr) if a check
 * failed, else 0 (and a line on stdout). */
static inline int check_summary(const char* program) {
  if (failures != 0) {
    fprintf(stderr, "%s: %d checks failed\n", program, failures);
    return 1;
  }
  printf("%s: all checks passed\n", program);
  return 0;
}

#endif /* KVFILE_TESTS_SUPPORT_C_CHECK_H_ */
