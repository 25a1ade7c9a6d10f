// SPDX-License-Identifier: Apache-2.0
// The file-system backends behind FileSystem::Default().
#pragma once

#include <cstdint>
#include <memory>

#include "io/syscall_filter.h"
#include "kvfile/file.h"

namespace kvfile::internal {

// pread/pwrite/fdatasync; always available.
FileSystem* PosixFileSystemInstance();
// Another POSIX file system whose system calls ask `filter` first
// (syscall_filter.h; nullptr: none). The filter must outlive it.
std::unique_ptr<FileSystem> NewPosixFileSystem(SyscallFilter* filter);

// What both backends do the same way on a file descriptor.
// Opens without blocking (O_NONBLOCK) and refuses anything but a regular
// file with NotRegularFile.
Status OpenFd(const std::string& path, OpenMode mode, int* fd);
// "PATH: not a regular file (a FIFO)", kInvalidArgument (the CLI's exit 2).
Status NotRegularFile(const std::string& path, unsigned mode);
Status LockFd(int fd, const std::string& path);
Status FdId(int fd, const std::string& path, FileId* id);
// File::NextData by lseek(SEEK_DATA).
Status FdNextData(int fd, const std::string& path, uint64_t from, uint64_t* next);

// io_uring (liburing): reads, writes and fdatasync go through one ring per
// open File; directory operations are the POSIX ones. Fails (kIOError or
// kUnsupported, saying why) when this process cannot use io_uring: ENOSYS
// (old kernel, gVisor), EPERM (seccomp, kernel.io_uring_disabled), ENOMEM
// (locked-memory limit), or a kernel without IORING_OP_READ/WRITE/FSYNC.
// Its SQEs and its directory fsyncs ask `filter` first (syscall_filter.h;
// nullptr: none). The filter must outlive it.
Status NewUringFileSystem(std::unique_ptr<FileSystem>* out, SyscallFilter* filter = nullptr);

// The process-wide io_uring file system, probed once (thread-safe); on
// failure *out is nullptr and the probe's failure is returned every time.
Status UringFileSystemInstance(FileSystem** out);

// How many times, process-wide, queued io_uring writes/fsyncs were
// resubmitted (short write, link cancelled, -EINTR/-EAGAIN); for tests.
uint64_t UringChainResubmissions();

// The choice FileSystem::Default() makes for a KVFILE_IO value:
//   "posix"            -> the POSIX file system; OK.
//   "uring"/"io_uring" -> io_uring; if it cannot be initialised, *out is the
//                         POSIX file system and the io_uring failure is
//                         returned (Default() ignores it and falls back
//                         silently; `kvfile info --json` shows "io_backend").
//   nullptr, "", other -> io_uring when it can be initialised, else POSIX;
//                         OK either way.
// *out is never nullptr afterwards.
Status MakeFileSystemFromEnv(const char* value, FileSystem** out);

}  // namespace kvfile::internal
