// SPDX-License-Identifier: Apache-2.0
// PACK:MEMBER arguments, materialised to unlinked temporary files (see
// pack_member.h).
#include "pack_member.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "cmd_pack.h"
#include "kvfile/pack.h"
#include "stdin_copy.h"
#include "unnamed_file.h"

namespace kvfile::cli {

bool SplitPackMember(const std::string& arg, std::string* pack, std::string* member) {
  std::error_code ec;
  if (std::filesystem::exists(arg, ec)) return false;  // a plain path wins
  for (size_t colon = arg.find(':'); colon != std::string::npos; colon = arg.find(':', colon + 1)) {
    std::string prefix = arg.substr(0, colon);
    if (!prefix.empty() && IsPackFile(prefix)) {
      *pack = prefix;
      *member = arg.substr(colon + 1);
      return true;
    }
  }
  return false;
}

Status RefusePackMemberTarget(const std::string& arg) {
  std::string pack, member;
  if (!SplitPackMember(arg, &pack, &member)) return Status::OK();
  return Status::InvalidArgument(arg + ": a pack member cannot be written in place; write a copy with: kvfile unpack " +
                                 pack + " -o DIR " + member);
}

PackMemberInputs::~PackMemberInputs() {
  for (const Copy& c : copies_) {
    if (c.fd >= 0) ::close(c.fd);
    if (!c.kept.empty()) {
      ::unlink(c.kept.c_str());
      ::rmdir(std::filesystem::path(c.kept).parent_path().c_str());
    }
  }
}

Status PackMemberInputs::Resolve(const std::string& arg, std::string* opened) {
  std::string pack_path, name;
  if (!SplitPackMember(arg, &pack_path, &name)) {
    *opened = arg;
    return Status::OK();
  }
  if (!ProcFdAvailable()) return ResolveByName(arg, pack_path, name, opened);
  // Declared before the pack, which writes through it: it outlives it.
  UnnamedFileSystem unnamed(FileSystem::Default(), TempDirectory() + "/kvfile-member");
  std::unique_ptr<PackReader> pack;
  KVFILE_RETURN_IF_ERROR(PackReader::Open(pack_path, &unnamed, &pack));
  std::optional<size_t> index = pack->Find(name);
  if (!index) return Status::NotFound(pack_path + ": no member '" + name + "'");
  const std::string file = TempDirectory() + "/kvfile-member/member.kv";
  Status st = pack->Materialize(*index, file);
  if (!st.ok()) return RenamePath(st, file, arg);
  Copy c;
  c.arg = arg;
  c.fd = ::fcntl(unnamed.Descriptor(file), F_DUPFD_CLOEXEC, 0);
  if (c.fd < 0) return Status::IOError(arg + ": " + std::strerror(errno));
  c.opened = ReopenPath(c.fd);
  *opened = c.opened;
  copies_.push_back(std::move(c));
  return Status::OK();
}

// Without /proc the member is materialised by name in a private directory
// and keeps that name until the verb ends (SIGKILL leaves it).
Status PackMemberInputs::ResolveByName(const std::string& arg, const std::string& pack_path,
                                       const std::string& name, std::string* opened) {
  std::unique_ptr<PackReader> pack;
  KVFILE_RETURN_IF_ERROR(PackReader::Open(pack_path, nullptr, &pack));
  std::optional<size_t> index = pack->Find(name);
  if (!index) return Status::NotFound(pack_path + ": no member '" + name + "'");
  std::string tmpl = TempDirectory() + "/kvfile-member-XXXXXX";
  HoldSignals hold;  // SIGINT, SIGTERM, SIGHUP: after the copy is removed
  if (!::mkdtemp(tmpl.data()))
    return Status::IOError(arg + ": cannot create a temporary directory like " + tmpl + ": " + std::strerror(errno));
  Copy c;
  c.arg = arg;
  c.opened = c.kept = tmpl + "/member.kv";
  Status st = pack->Materialize(*index, c.kept);
  if (!st.ok()) {
    ::rmdir(tmpl.c_str());
    return RenamePath(st, c.kept, arg);
  }
  *opened = c.opened;
  copies_.push_back(std::move(c));
  return Status::OK();
}

Status PackMemberInputs::Name(const Status& st) const {
  // Longest first: /proc/self/fd/3 is a prefix of /proc/self/fd/31.
  std::vector<const Copy*> order;
  for (const Copy& c : copies_) order.push_back(&c);
  std::sort(order.begin(), order.end(), [](const Copy* a, const Copy* b) { return a->opened.size() > b->opened.size(); });
  Status out = st;
  for (const Copy* c : order) out = RenamePath(out, c->opened, c->arg);
  return out;
}

std::string PackMemberInputs::Name(const std::string& text) const {
  return Name(Status::Corruption(text)).message();
}

}  // namespace kvfile::cli
