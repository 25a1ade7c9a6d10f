// SPDX-License-Identifier: Apache-2.0
// `-` as FILE for the verbs that read a whole .kv file (info, verify): the
// file format is read at random offsets, so standard input is first copied
// to a temporary file without a name (unnamed_file.h), which the kernel
// frees whatever ends the process, SIGKILL included; the verb reads it
// through /proc/self/fd/N. Without /proc the copy has a name in $TMPDIR
// (else /tmp), removed when the verb ends (a SIGKILL leaves it).
#pragma once

#include <string>

#include "kvfile/status.h"

namespace kvfile::cli {

class StdinCopy {
 public:
  StdinCopy() = default;
  ~StdinCopy();
  StdinCopy(const StdinCopy&) = delete;
  StdinCopy& operator=(const StdinCopy&) = delete;

  // Copies all of standard input to a new file under $TMPDIR (else /tmp)
  // and sets *path to the path that opens it. An error names "-"
  // (standard input).
  Status Copy(std::string* path);

 private:
  int fd_ = -1;
  std::string path_;  // the copy's name, without /proc only
};

// `st` with every mention of `copy` (the temporary file) in its message
// replaced by "-", and the same code.
Status NameStdin(const Status& st, const std::string& copy);
// `st` with every mention of `from` in its message replaced by `to`, and the
// same code (NameStdin is RenamePath(st, copy, "-")).
Status RenamePath(const Status& st, const std::string& from, const std::string& to);

}  // namespace kvfile::cli
