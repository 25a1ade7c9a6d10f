// SPDX-License-Identifier: Apache-2.0
// What the C API's files share (c_api.cc, c_api_formats.cc and
// c_api_formats_unavailable.cc): the last-error string and the turning of
// statuses and exceptions into codes (c_api.cc's opening comment).
#pragma once

#include <cstdint>
#include <exception>
#include <new>
#include <string_view>

#include "kvfile/c.h"
#include "kvfile/file.h"
#include "kvfile/status.h"

namespace kvfile::capi {

// This thread's last error (kvfile_last_error).
const char* LastError() noexcept;

// Records `message` (the two parts joined) as this thread's last error and
// returns `code`. Never throws: if even the message cannot be stored, the
// code still reaches the caller, with an empty message.
kvfile_status Fail(kvfile_status code, std::string_view message, std::string_view detail = {}) noexcept;

// KVFILE_OK, or st's code with its message as the last error.
kvfile_status Report(const Status& st) noexcept;

// "<function>: <argument> is NULL".
kvfile_status NullArgument(std::string_view function, std::string_view argument) noexcept;

// The converters never replace a file: KVFILE_INVALID_ARGUMENT
// ("<path>: file exists") where `path` exists.
kvfile_status RefuseExisting(FileSystem* fs, const char* path);

// KVFILE_BUFFER_TOO_SMALL unless `have` >= `need` (`what` names the buffer).
kvfile_status CheckCapacity(std::string_view what, uint64_t need, uint64_t have);

// Runs an entry point's body, turning any exception into a code.
template <typename Body>
kvfile_status Guarded(Body&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Fail(KVFILE_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return Fail(KVFILE_INTERNAL, "internal error: ", e.what());
  } catch (...) {
    return Fail(KVFILE_INTERNAL, "internal error: unknown exception");
  }
}

}  // namespace kvfile::capi
