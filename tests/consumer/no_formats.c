/* SPDX-License-Identifier: Apache-2.0 */
/* A library built with -DKVFILE_WITH_FORMATS=OFF (scripts/install_test.sh):
 * kvfile_convert from the .kv IN to the safetensors OUT and
 * kvfile_coli_export from IN to OUT2 and kvfile_append_safetensors of OUT
 * (a safetensors file, which need not exist) to IN must each answer
 * KVFILE_UNSUPPORTED;
 * prints each status's name and the last error, one line each, for the
 * script to compare with what it expects. */
#include <stdio.h>

#include "kvfile/c.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: no_formats IN.kv OUT.safetensors OUT2.coli_kv\n");
    return 2;
  }
  kvfile_status st = kvfile_convert(argv[1], argv[2], NULL, NULL);
  printf("%s: %s\n", kvfile_status_name(st), kvfile_last_error());
  st = kvfile_coli_export(argv[1], argv[3], 0);
  printf("%s: %s\n", kvfile_status_name(st), kvfile_last_error());
  st = kvfile_append_safetensors(argv[1], argv[2], NULL, NULL);
  printf("%s: %s\n", kvfile_status_name(st), kvfile_last_error());
  return 0;
}
