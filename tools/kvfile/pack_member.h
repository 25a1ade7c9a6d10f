// SPDX-License-Identifier: Apache-2.0
// `PACK:MEMBER` for the read-only verbs that take a .kv file (info, dump,
// verify, the input of convert): `corpus.kvpack:docs/a.kv` names member
// docs/a.kv of the pack corpus.kvpack. The member is materialised as a .kv
// file without a name in $TMPDIR (else /tmp; unnamed_file.h: O_TMPFILE),
// from its first byte: the verb reads it through /proc/self/fd/N, and the
// kernel frees it whatever ends the process, SIGKILL included. Without
// /proc it is written by name in a private directory, removed when the
// verb ends (a SIGKILL leaves it). Memory stays bounded
// (PackReader::Materialize holds one chunk and the writer's staging).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "kvfile/status.h"

namespace kvfile::cli {

// Splits `arg` into a pack and a member name when `arg` is no existing path
// and a prefix of it ending before a ':' is a regular file that starts with
// the .kvpack magic (the first such ':'). Otherwise returns false.
bool SplitPackMember(const std::string& arg, std::string* pack, std::string* member);

// For the verbs that write FILE (synth, append, rewind, repair, the OUT of
// convert): InvalidArgument when `arg` is PACK:MEMBER (SplitPackMember), a
// pack is never changed in place and FILE would be a new file of that odd
// name that then shadows the member; the line says how to get a writable
// copy ("PACK:MEMBER: a pack member cannot be written in place; write a
// copy with: kvfile unpack PACK -o DIR MEMBER"). Else OK.
Status RefusePackMemberTarget(const std::string& arg);

class PackMemberInputs {
 public:
  PackMemberInputs() = default;
  ~PackMemberInputs();  // closes the copies (and removes one kept by name)
  PackMemberInputs(const PackMemberInputs&) = delete;
  PackMemberInputs& operator=(const PackMemberInputs&) = delete;

  // Sets *opened to the path the verb opens for `arg`: `arg` itself, or for
  // PACK:MEMBER the member's materialised copy (every record and chunk it
  // uses checked on the way). Errors name the pack ("P: no member 'm'",
  // exit 2; damage, exit 1).
  Status Resolve(const std::string& arg, std::string* opened);
  // `st` / `text` with each copy's path replaced by the PACK:MEMBER it is.
  Status Name(const Status& st) const;
  std::string Name(const std::string& text) const;

 private:
  struct Copy {
    std::string opened;  // /proc/self/fd/N, or the file's path
    std::string arg;     // PACK:MEMBER
    int fd = -1;
    std::string kept;    // a copy kept by name (no /proc): removed at the end
  };
  Status ResolveByName(const std::string& arg, const std::string& pack_path, const std::string& name,
                       std::string* opened);
  std::vector<Copy> copies_;
};

}  // namespace kvfile::cli
