// SPDX-License-Identifier: Apache-2.0
/* Deprecated: the C API's old header name, kept for one release (0.1.x).
 * Include kvfile/c.h instead; this name read as the C++ umbrella header.
 *
 * The installed headers come in two tiers (docs/api.md, "Header tiers"):
 * the headers directly in kvfile/, this one among them, are the stable
 * tier (a change to them goes through a deprecation first); the
 * headers in kvfile/formats/, the optional format drivers (built with
 * KVFILE_WITH_FORMATS), are the experimental tier and may change between
 * minor releases. */
#ifndef KVFILE_KVFILE_H_
#define KVFILE_KVFILE_H_

#include "kvfile/c.h"

#endif /* KVFILE_KVFILE_H_ */
