// SPDX-License-Identifier: Apache-2.0
// Python exceptions for the library's Status codes.
//
// A failed library call raises a subclass of kvfile.Error named after its
// Status code (CorruptionError, NotFoundError, ...), whose message is the
// Status message unchanged and whose `code` attribute names the code. Some
// classes also derive from the builtin a Python caller would reach for:
// NotFoundError is a FileNotFoundError, IoError an OSError,
// InvalidArgumentError and NonFiniteError are ValueErrors.
#pragma once

#include <pybind11/pybind11.h>

#include "kvfile/status.h"

namespace kvfile::python {

// Creates kvfile.Error and its subclasses as attributes of `m`.
void RegisterExceptions(pybind11::module_& m);

// Raises the exception for `st` when it is not OK (throws
// pybind11::error_already_set, which pybind11 hands to Python as is).
// Must be called with the GIL held.
void ThrowIfError(const Status& st);

}  // namespace kvfile::python
