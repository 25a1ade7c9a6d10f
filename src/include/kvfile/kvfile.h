// SPDX-License-Identifier: Apache-2.0
/* Deprecated: the C API's old header name, kept for one release (0.1.x).
 * Include kvfile/c.h instead; this name read as the C++ umbrella header. */
#ifndef KVFILE_KVFILE_H_
#define KVFILE_KVFILE_H_

#include "kvfile/c.h"

#endif /* KVFILE_KVFILE_H_ */
