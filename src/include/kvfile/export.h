// SPDX-License-Identifier: Apache-2.0
/* KVFILE_EXPORT marks what libkvfile.so exports: the public classes and
 * functions of these headers. The library is compiled with
 * -fvisibility=hidden, so everything else (kvfile::internal, Writer::Impl,
 * the codec kernels, the test hooks) stays inside it. Plain C as well: the
 * C API (kvfile/c.h) uses it too. */
#ifndef KVFILE_EXPORT_H_
#define KVFILE_EXPORT_H_

#if defined(__cplusplus) && (defined(__GNUC__) || defined(__clang__))
/* The standard attribute syntax: it may follow [[nodiscard]]. */
#define KVFILE_EXPORT [[gnu::visibility("default")]]
/* A member of an exported class that stays inside the library. */
#define KVFILE_NO_EXPORT [[gnu::visibility("hidden")]]
#elif defined(__GNUC__) || defined(__clang__)
#define KVFILE_EXPORT __attribute__((visibility("default")))
#else
#define KVFILE_EXPORT
#endif
#if defined(__cplusplus) && !defined(KVFILE_NO_EXPORT)
#define KVFILE_NO_EXPORT
#endif

#endif /* KVFILE_EXPORT_H_ */
