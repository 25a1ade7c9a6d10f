// SPDX-License-Identifier: Apache-2.0
/* The deprecated C header name kvfile/kvfile.h still gives the whole C API
 * (it includes kvfile/c.h) for this release: compiled as C99 like the C API
 * test, it must see kvfile/c.h's guard and call through it. */
#include "kvfile/kvfile.h"

#include <stdio.h>
#include <string.h>

#ifndef KVFILE_C_H_
#error "kvfile/kvfile.h does not include kvfile/c.h"
#endif

int main(void) {
  if (strcmp(kvfile_status_name(KVFILE_CORRUPTION), "corruption") != 0) {
    fprintf(stderr, "c_header_compat_test: kvfile_status_name(KVFILE_CORRUPTION) = %s\n",
            kvfile_status_name(KVFILE_CORRUPTION));
    return 1;
  }
  return 0;
}
