// SPDX-License-Identifier: Apache-2.0
// PendingReplace: whole-file replacement through a temporary file in the
// destination's directory (see atomic_replace.h and spec/RECOVERY.md,
// "Replacing a file").
#include "io/atomic_replace.h"

#include <signal.h>
#include <xxhash.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "s3/s3_file_system.h"
#include "s3/s3_url.h"

namespace kvfile::internal {

Status LockWithGrace(File& file) {
  Status st = file.LockExclusive();
  for (int waited_ms = 0; st.code() == Status::Code::kBusy && waited_ms < 1000; waited_ms += 2) {
    struct timespec ts = {0, 2'000'000};
    nanosleep(&ts, nullptr);
    st = file.LockExclusive();
  }
  return st;
}

namespace {

std::string BaseName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Parses a run of decimal digits at s[*i], at most 18 of them.
bool Digits(const std::string& s, size_t* i, long* value) {
  size_t start = *i;
  long v = 0;
  while (*i < s.size() && s[*i] >= '0' && s[*i] <= '9' && *i - start < 18) v = v * 10 + (s[(*i)++] - '0');
  *value = v;
  return *i > start;
}

// Whether a process with this id exists (EPERM: it does, someone else's).
// An id beyond pid_t names none.
bool ProcessAlive(long pid) {
  return pid > 0 && pid <= INT32_MAX && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

std::atomic<uint64_t> next_temp{0};

}  // namespace

bool IsReplaceTemp(const std::string& dest_name, const std::string& name, long* pid) {
  *pid = 0;
  // Either stem: TempPathFor keeps the whole name where the suffix fits.
  const std::string stem = TempStem(dest_name);
  if (name == dest_name + ".kvnew" || name == stem + ".kvnew") return true;
  std::string prefix = dest_name + ".kvtmp-";
  if (!name.starts_with(prefix)) prefix = stem + ".kvtmp-";
  if (!name.starts_with(prefix)) return false;
  size_t i = prefix.size();
  if (!Digits(name, &i, pid)) return false;
  long n;
  if (i < name.size() && name[i] == '-') {
    ++i;
    if (!Digits(name, &i, &n)) return false;
  }
  std::string rest = name.substr(i);
  return rest.empty() || rest == ".kvnew";
}

}  // namespace kvfile::internal

namespace kvfile {

namespace {
constexpr size_t kNameMax = 255;  // NAME_MAX of Linux file systems, in bytes
}  // namespace

std::string TempStem(const std::string& base_name) {
  constexpr size_t kStemMax = kNameMax - kMaxTempSuffixBytes;
  if (base_name.size() <= kStemMax) return base_name;
  char hash[24];
  std::snprintf(hash, sizeof hash, "~%016llx",
                static_cast<unsigned long long>(XXH3_64bits(base_name.data(), base_name.size())));
  size_t keep = kStemMax - 17;
  while (keep > 0 && (static_cast<unsigned char>(base_name[keep]) & 0xC0) == 0x80) --keep;  // not inside a character
  return base_name.substr(0, keep) + hash;
}

std::string TempPathFor(const std::string& path, const std::string& suffix) {
  size_t slash = path.find_last_of('/');
  size_t base_at = slash == std::string::npos ? 0 : slash + 1;
  std::string base = path.substr(base_at);
  if (base.size() + suffix.size() <= kNameMax) return path + suffix;
  return path.substr(0, base_at) + TempStem(base) + suffix;
}

using namespace internal;  // LockWithGrace, IsReplaceTemp and the helpers above

Status PendingReplace::Begin(const std::string& dest, FileSystem* fs, std::unique_ptr<PendingReplace>* out) {
  std::unique_ptr<PendingReplace> r(new PendingReplace());
  r->fs_ = fs ? fs : FileSystem::Default();
  r->dest_ = dest;
  if (s3::IsS3Path(dest)) {
    KVFILE_RETURN_IF_ERROR(r->BeginRemote());
    *out = std::move(r);
    return Status::OK();
  }
  KVFILE_RETURN_IF_ERROR(r->fs_->ResolveSymlinks(dest, &r->target_));
  KVFILE_RETURN_IF_ERROR(r->fs_->Stat(r->target_, &r->original_));
  if (r->original_.exists && !r->original_.regular)
    return Status::InvalidArgument(dest + ": not a regular file; not replaced");
  KVFILE_RETURN_IF_ERROR(r->RemoveStaleTemps());
  // Always the stem, so that a Writer's ".kvnew" still fits after it.
  const size_t base_at = r->target_.size() - BaseName(r->target_).size();
  std::string stem = r->target_.substr(0, base_at) + TempStem(BaseName(r->target_)) + ".kvtmp-" +
                     std::to_string(::getpid()) + "-";
  for (;;) {
    r->temp_ = stem + std::to_string(next_temp.fetch_add(1));
    bool exists = false;
    KVFILE_RETURN_IF_ERROR(r->fs_->Exists(r->temp_, &exists));
    if (!exists) break;
  }
  *out = std::move(r);
  return Status::OK();
}

// A remote destination: staged in $TMPDIR as kvfile-upload-<pid>-<n>-<name>
// (such files of dead processes removed first), uploaded by Commit. The
// uploads a killed kvfile left for the same key are aborted here.
Status PendingReplace::BeginRemote() {
  remote_ = true;
  target_ = dest_;
  KVFILE_RETURN_IF_ERROR(s3::StatObject(dest_, &original_));
  KVFILE_RETURN_IF_ERROR(s3::AbortStaleUploads(dest_, &removed_stale_));
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir = tmp && *tmp ? tmp : "/tmp";
  const std::string prefix = "kvfile-upload-";
  std::vector<std::string> names;
  if (fs_->ListDir(dir, &names).ok()) {
    for (const std::string& name : names) {
      if (!name.starts_with(prefix)) continue;
      size_t i = prefix.size();
      long pid;
      if (!Digits(name, &i, &pid) || pid == ::getpid() || ProcessAlive(pid)) continue;
      (void)fs_->Remove(dir + "/" + name);
    }
  }
  const std::string stem = dir + "/" + prefix + std::to_string(::getpid()) + "-";
  for (;;) {
    temp_ = stem + std::to_string(next_temp.fetch_add(1)) + "-" + TempStem(BaseName(dest_));
    bool exists = false;
    KVFILE_RETURN_IF_ERROR(fs_->Exists(temp_, &exists));
    if (!exists) break;
  }
  return Status::OK();
}

// A temporary file is stale when the process its name names is gone (or
// the name names none) and no process holds its writer lock (a dead
// creator's for more than LockWithGrace's second): a live
// creator holds the lock while its Writer writes the file, and is alive
// from the first byte to the rename. It is removed while locked, and only
// if the name still refers to the file locked.
Status PendingReplace::RemoveStaleTemps() {
  std::string dir = DirName(target_);
  std::string base = BaseName(target_);
  std::vector<std::string> names;
  KVFILE_RETURN_IF_ERROR(fs_->ListDir(dir, &names));
  for (const std::string& name : names) {
    long pid;
    if (!IsReplaceTemp(base, name, &pid)) continue;
    if (pid != 0 && (pid == ::getpid() || ProcessAlive(pid))) continue;
    std::string path = dir + "/" + name;
    std::unique_ptr<File> stale;
    if (!fs_->Open(path, OpenMode::kReadWrite, &stale).ok()) continue;
    // A creator killed with io_uring requests in flight holds the lock
    // until the kernel has torn its ring down, after the process is gone:
    // a dead creator's lock is waited for (LockWithGrace). A name without
    // a pid may be a live writer's: not waited for.
    if (!(pid != 0 ? LockWithGrace(*stale) : stale->LockExclusive()).ok()) continue;
    FileId locked, named;
    if (!stale->Id(&locked).ok() || !fs_->PathId(path, &named).ok() || !(locked == named)) continue;
    KVFILE_RETURN_IF_ERROR(fs_->Remove(path));
    ++removed_stale_;
  }
  if (removed_stale_ > 0) KVFILE_RETURN_IF_ERROR(fs_->SyncDir(dir));
  return Status::OK();
}

Status PendingReplace::Commit() {
  if (committed_) return Status::OK();
  if (remote_) {
    KVFILE_RETURN_IF_ERROR(s3::UploadFile(fs_, temp_, target_, original_));
    committed_ = true;
    (void)fs_->Remove(temp_);  // the staged copy: the object now holds its bytes
    return Status::OK();
  }
  std::unique_ptr<File> temp;
  KVFILE_RETURN_IF_ERROR(fs_->Open(temp_, OpenMode::kReadWrite, &temp));
  Status st = temp->LockExclusive();
  if (st.code() == Status::Code::kBusy) return Status::Busy(temp_ + ": still open for writing; not committed");
  KVFILE_RETURN_IF_ERROR(st);
  KVFILE_RETURN_IF_ERROR(temp->Sync());
  // The destination stays locked until it has been replaced, so that no
  // writer can open it in between and append to a file about to vanish.
  std::unique_ptr<File> held;
  if (original_.exists) {
    st = fs_->Open(target_, OpenMode::kReadWrite, &held);
    if (st.code() == Status::Code::kNotFound)
      return Status::Busy(dest_ + ": removed by another process while the new file was written; not replaced");
    KVFILE_RETURN_IF_ERROR(st);
    st = LockWithGrace(*held);
    if (st.code() == Status::Code::kBusy)
      return Status::Busy(dest_ + ": another writer has the file open; not replaced");
    KVFILE_RETURN_IF_ERROR(st);
    FileId locked;
    PathInfo now;
    KVFILE_RETURN_IF_ERROR(held->Id(&locked));
    KVFILE_RETURN_IF_ERROR(fs_->Stat(target_, &now));
    if (!(locked == original_.id) || !now.exists || !(now.id == original_.id))
      return Status::Busy(dest_ + ": replaced by another process while the new file was written; not replaced");
    KVFILE_RETURN_IF_ERROR(fs_->CopyAttributes(now, temp_));
    KVFILE_RETURN_IF_ERROR(fs_->Rename(temp_, target_, /*replace=*/true));
  } else {
    st = fs_->Rename(temp_, target_, /*replace=*/false);
    if (!st.ok()) {
      bool exists = false;
      if (fs_->Exists(target_, &exists).ok() && exists)
        return Status::Busy(dest_ + ": created by another process while the new file was written; not replaced");
      return st;
    }
  }
  committed_ = true;
  return fs_->SyncDir(DirName(target_));
}

PendingReplace::~PendingReplace() {
  if (committed_) return;
  for (const std::string& path : {temp_, TempPathFor(temp_, ".kvnew")}) {
    bool exists = false;
    if (fs_->Exists(path, &exists).ok() && exists) (void)fs_->Remove(path);
  }
}

}  // namespace kvfile
