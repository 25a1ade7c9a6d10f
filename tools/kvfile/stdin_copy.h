// SPDX-License-Identifier: Apache-2.0
// `-` as FILE for the verbs that read a whole .kv file (info, verify): the
// file format is read at random offsets, so standard input is first copied
// to a temporary file, removed again when the verb ends.
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
  // and sets *path to it. An error names "-" (standard input).
  Status Copy(std::string* path);

 private:
  std::string path_;
};

// `st` with every mention of `copy` (the temporary file) in its message
// replaced by "-", and the same code.
Status NameStdin(const Status& st, const std::string& copy);
// `st` with every mention of `from` in its message replaced by `to`, and the
// same code (NameStdin is RenamePath(st, copy, "-")).
Status RenamePath(const Status& st, const std::string& from, const std::string& to);

}  // namespace kvfile::cli
