// SPDX-License-Identifier: Apache-2.0
// PACK:MEMBER arguments, materialised to unlinked temporary files (see
// pack_member.h).
#include "pack_member.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "cmd_pack.h"
#include "kvfile/pack.h"
#include "stdin_copy.h"

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

namespace {

// SIGINT, SIGTERM and SIGHUP held back while a copy has a name, so that
// none ends the process between its creation and its unlinking; a signal
// that arrived meanwhile is delivered when the guard ends.
class HoldSignals {
 public:
  HoldSignals() {
    sigset_t set;
    sigemptyset(&set);
    for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, s);
    pthread_sigmask(SIG_BLOCK, &set, &old_);
  }
  ~HoldSignals() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  HoldSignals(const HoldSignals&) = delete;
  HoldSignals& operator=(const HoldSignals&) = delete;

 private:
  sigset_t old_;
};

}  // namespace

Status PackMemberInputs::Resolve(const std::string& arg, std::string* opened) {
  std::string pack_path, name;
  if (!SplitPackMember(arg, &pack_path, &name)) {
    *opened = arg;
    return Status::OK();
  }
  std::unique_ptr<PackReader> pack;
  KVFILE_RETURN_IF_ERROR(PackReader::Open(pack_path, nullptr, &pack));
  std::optional<size_t> index = pack->Find(name);
  if (!index) return Status::NotFound(pack_path + ": no member '" + name + "'");
  const char* env = std::getenv("TMPDIR");
  std::string tmpl = std::string(env && *env ? env : "/tmp") + "/kvfile-member-XXXXXX";
  HoldSignals hold;
  if (!::mkdtemp(tmpl.data()))
    return Status::IOError(arg + ": cannot create a temporary directory like " + tmpl + ": " + std::strerror(errno));
  Copy c;
  c.arg = arg;
  const std::string file = tmpl + "/member.kv";
  Status st = pack->Materialize(*index, file);
  if (st.ok()) {
    c.fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (c.fd < 0) st = Status::IOError(file + ": " + std::strerror(errno));
  }
  c.opened = "/proc/self/fd/" + std::to_string(c.fd);
  if (st.ok() && ::access(c.opened.c_str(), R_OK) != 0) {
    c.opened = c.kept = file;  // no /proc: the file keeps its name until the end
  } else {
    ::unlink(file.c_str());
    ::rmdir(tmpl.c_str());
  }
  if (!st.ok()) {
    if (c.fd >= 0) ::close(c.fd);
    return RenamePath(st, file, arg);
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
