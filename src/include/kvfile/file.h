// SPDX-License-Identifier: Apache-2.0
// The small file interface all kvfile I/O goes through.
//
// The library never calls the operating system directly: it asks a
// FileSystem for Files. Tests substitute a FileSystem that records every
// operation and injects faults (EIO, ENOSPC, short writes, lost syncs) into
// the library's real code paths.
//
// Threads. A File is used by one thread at a time: the library never calls
// one File from two threads at once, though it may call it from different
// threads one after the other (a worker of ReadMany or VerifyFile gets a
// File of its own, opened for it; an io_uring File's queued writes may be
// waited for by another thread than the one that queued them). A
// FileSystem is called from every thread that uses a Reader, Writer or
// other library object made with it, at once: its members must be safe to
// call concurrently (for different paths and Files). FileSystem::Default()
// is: it may be called from any thread, and the same instance is returned
// to all of them (the backend is chosen at the first call).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvfile/export.h"
#include "kvfile/status.h"

namespace kvfile {

// Which file an open file or a path refers to (device and inode), to tell
// whether a path still names the file a writer locked.
struct FileId {
  uint64_t device = 0;
  uint64_t inode = 0;
  bool operator==(const FileId&) const = default;
};

// What a path names (symlinks followed), for replacing a whole file
// (src/io/atomic_replace.h): whether it exists, whether it is a regular file,
// which file it is, and what a replacement keeps.
struct PathInfo {
  bool exists = false;
  bool regular = false;  // not a directory, FIFO, device or socket
  FileId id;
  uint32_t mode = 0;  // permission bits (07777)
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint64_t links = 0;  // hard links
};

// One read of File::ReadBatch.
struct ReadRequest {
  uint64_t offset = 0;
  void* buf = nullptr;
  size_t n = 0;
};

class KVFILE_EXPORT File {
 public:
  virtual ~File() = default;
  // Reads exactly n bytes at offset; reading past the end is kCorruption
  // ("unexpected end of file"), since sizes come from the file itself.
  virtual Status ReadAt(uint64_t offset, void* buf, size_t n) = 0;
  // Many independent reads, each as ReadAt would do it; the first failure
  // is returned (the other buffers' contents are then unspecified). The
  // io_uring backend submits them together: one system call for dozens of
  // small reads (the chunk heads an open reads). The default loops ReadAt.
  virtual Status ReadBatch(std::span<const ReadRequest> requests);
  // A hint: the caller reads [offset, offset + n) next, front to back. A
  // remote File fetches that span ahead of the reads, several ranged GETs in
  // flight (docs/object-storage.md); the default ignores it.
  virtual void WillRead(uint64_t offset, uint64_t n) {
    (void)offset;
    (void)n;
  }
  // Writes all n bytes at offset (retrying short writes and EINTR).
  virtual Status WriteAt(uint64_t offset, const void* buf, size_t n) = 0;
  // Makes every completed write durable (fdatasync).
  virtual Status Sync() = 0;
  virtual Status Truncate(uint64_t size) = 0;
  virtual Status Size(uint64_t* size) = 0;
  // Where data may start at or after `from`: *next is the first offset >=
  // `from` that is not inside a hole of a sparse file (SEEK_DATA), or the
  // file's size if only a hole follows. Bytes in [from, *next) read as
  // zeros. The default, for files that cannot tell, is `from` itself.
  virtual Status NextData(uint64_t from, uint64_t* next);
  // Takes an exclusive advisory lock without waiting; kBusy if another
  // process (or another open file description) holds it.
  virtual Status LockExclusive() = 0;
  virtual Status Id(FileId* id) = 0;
  // Asynchronous writes, for overlapping I/O with quantization. Queues a
  // write of n bytes at offset (the buffer must stay untouched until
  // WaitWrites returns); with sync_after, a fdatasync ordered after it (and
  // after every write queued before it). The default runs both at once.
  virtual Status SubmitWrite(uint64_t offset, const void* buf, size_t n, bool sync_after);
  // Waits for every queued write and sync; returns the first failure among
  // them (the file's state after a failed queued write is unknown).
  virtual Status WaitWrites();

  // Name of the I/O backend ("posix", "io_uring", "memory", ...).
  virtual const char* backend() const = 0;
  virtual const std::string& path() const = 0;
};

enum class OpenMode {
  kRead,             // existing file, read only
  kReadWrite,        // existing file, read and write
  kCreateExclusive,  // new file (fails if it exists), read and write
};

class KVFILE_EXPORT FileSystem {
 public:
  virtual ~FileSystem() = default;
  virtual Status Open(const std::string& path, OpenMode mode, std::unique_ptr<File>* out) = 0;
  // Atomically renames; with replace == false fails if `to` exists.
  virtual Status Rename(const std::string& from, const std::string& to, bool replace) = 0;
  virtual Status Remove(const std::string& path) = 0;
  // Makes directory entries (creations, renames, removals) in dir durable.
  virtual Status SyncDir(const std::string& dir) = 0;
  virtual Status Exists(const std::string& path, bool* exists) = 0;
  virtual Status PathId(const std::string& path, FileId* id) = 0;

  // For replacing whole files. The defaults suit a file system without
  // links, owners or directory listings (an in-memory one): Stat from
  // Exists and PathId (a regular file, mode 0644, one link); the path is
  // its own target; attributes are not kept; directories list as empty.
  virtual Status Stat(const std::string& path, PathInfo* info);
  // The path a symlink chain ends at (the path itself if it is no symlink);
  // the end may not exist.
  virtual Status ResolveSymlinks(const std::string& path, std::string* target);
  // Gives `path` the mode, owner and group of `like`.
  virtual Status CopyAttributes(const PathInfo& like, const std::string& path);
  // The names in `dir` (no "." or "..").
  virtual Status ListDir(const std::string& dir, std::vector<std::string>* names);

  // The process-wide default: io_uring where the kernel allows it, else
  // pread/pwrite; KVFILE_IO=uring or KVFILE_IO=posix forces one.
  static FileSystem* Default();
};

// The directory part of a path ("." for a bare name).
KVFILE_EXPORT std::string DirName(const std::string& path);

// One result of WalkDirectory: a file found, or a subdirectory that could
// not be read (error says why and names it).
struct WalkEntry {
  std::string path;  // the directory as given, then the path under it
  Status error;      // ok: a file; else an unreadable subdirectory
};

// The walk every directory-taking verb and the prefix index use
// (docs/cli.md, "Directories"): the regular files under `dir` (symlinks to
// files followed, symlinks to directories not entered) whose names end in
// one of `suffixes`, and every subdirectory that cannot be opened or read,
// as an entry with its error, in no particular order. A subdirectory that
// cannot be read never stops the walk; only `dir` itself failing does.
KVFILE_EXPORT Status WalkDirectory(const std::string& dir, const std::vector<std::string>& suffixes,
                                   std::vector<WalkEntry>* out);

}  // namespace kvfile
