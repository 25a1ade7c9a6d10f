// SPDX-License-Identifier: Apache-2.0
/* The kvfile C API: create, append to, read and verify .kv files from C.
 *
 * Plain C99 (usable from C++ too): opaque handles, fixed-size structs, no
 * C++ header. It is a thin layer over the C++ Writer, Reader and VerifyFile
 * (kvfile/writer.h, reader.h, verify.h), whose comments state the full
 * semantics (durability, recovery on open, validation of every read).
 *
 * Errors: every function returns a kvfile_status; KVFILE_OK (0) is success.
 * After a failure, kvfile_last_error() gives one readable line saying what
 * and where. No C++ exception ever leaves a function of this API: an
 * allocation failure is KVFILE_OUT_OF_MEMORY, anything else unexpected
 * KVFILE_INTERNAL.
 *
 * Threads: a handle may be used by one thread at a time; different handles
 * may be used concurrently. kvfile_last_error() is per thread.
 *
 * Shapes: rows of one (layer, stream) for a range of tokens are laid out
 * [tokens][rows_per_token][row_width], row after row; fp8 codes are one byte
 * per element and come with one f32 scale per row, [tokens][rows_per_token].
 *
 * Enum ranges: each enum ends with two *_RANGE_MIN_/_MAX_ entries that are
 * not values to use. They make the enum span every int in C and in C++, so
 * that a value outside the listed ones, which C lets a caller store, is
 * still a valid object for the library (in C++ an enum only holds the
 * values its enumerators need) and is refused as KVFILE_INVALID_ARGUMENT.
 */
#ifndef KVFILE_C_H_
#define KVFILE_C_H_

#include <stddef.h>
#include <stdint.h>

#include "kvfile/export.h"

/* Deprecated entry points still work, for one release; a caller sees a
 * compiler warning unless it defines KVFILE_NO_DEPRECATION_WARNINGS. */
#if defined(KVFILE_NO_DEPRECATION_WARNINGS) || !(defined(__GNUC__) || defined(__clang__))
#define KVFILE_DEPRECATED(replacement)
#else
#define KVFILE_DEPRECATED(replacement) __attribute__((deprecated("use " replacement)))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Status codes ------------------------------------------------------- */

/* The first group mirrors kvfile::Status::Code value for value (the data is
 * at fault: CORRUPTION, MISMATCH, NON_FINITE, UNSUPPORTED; the caller or the
 * environment: the rest). The last three exist only in the C API. */
typedef enum kvfile_status {
  KVFILE_OK = 0,
  KVFILE_CORRUPTION = 1,       /* the file's bytes are damaged or not a kvfile */
  KVFILE_MISMATCH = 2,         /* valid file, other model or geometry than expected */
  KVFILE_NON_FINITE = 3,       /* input rows hold NaN or Inf */
  KVFILE_INVALID_ARGUMENT = 4, /* the caller asked for something impossible */
  KVFILE_NOT_FOUND = 5,        /* a path does not exist */
  KVFILE_IO_ERROR = 6,         /* the operating system refused (EIO, ENOSPC, ...) */
  KVFILE_UNSUPPORTED = 7,      /* a version or feature this build cannot handle */
  KVFILE_BUSY = 8,             /* another writer holds the file */
  KVFILE_FAILED = 9,           /* the handle is unusable after an earlier fatal error */
  KVFILE_BUFFER_TOO_SMALL = 100, /* a caller's buffer cannot hold the result */
  KVFILE_OUT_OF_MEMORY = 101,    /* an allocation failed */
  KVFILE_INTERNAL = 102,         /* an unexpected failure inside the library */
  KVFILE_STATUS_RANGE_MIN_ = -0x7FFFFFFF - 1, /* not codes: see "Enum ranges" above */
  KVFILE_STATUS_RANGE_MAX_ = 0x7FFFFFFF
} kvfile_status;

/* The message of the last failed call made by this thread ("" if none has
 * failed yet). Successful calls leave it as it is. The pointer stays valid
 * until this thread's next failing kvfile call; never NULL; do not free. */
KVFILE_EXPORT const char* kvfile_last_error(void);

/* A short constant name for a status ("ok", "corruption", "buffer too
 * small", ...); "unknown" for a value outside the enum. Static storage. */
KVFILE_EXPORT const char* kvfile_status_name(kvfile_status status);

/* ---- Geometry ------------------------------------------------------------ */

/* Storage (and read) dtypes; the values are those written to disk. */
typedef enum kvfile_dtype {
  KVFILE_E4M3 = 1, /* fp8 e4m3 code per element + one f32 scale per row */
  KVFILE_E5M2 = 2, /* fp8 e5m2 code per element + one f32 scale per row */
  KVFILE_BF16 = 3, /* bfloat16, as uint16_t bit patterns */
  KVFILE_F16 = 4,  /* IEEE binary16, as uint16_t bit patterns */
  KVFILE_F32 = 5,  /* IEEE binary32, as float */
  KVFILE_NVFP4 = 6, /* nvfp4 (format 2.2): per token, rows * width E2M1 codes two a byte, one E4M3
                     * block scale per 16 elements, one f32 scale (kvfile_parts) */
  KVFILE_DTYPE_RANGE_MIN_ = -0x7FFFFFFF - 1, /* not dtypes: see "Enum ranges" above */
  KVFILE_DTYPE_RANGE_MAX_ = 0x7FFFFFFF
} kvfile_dtype;

#define KVFILE_MAX_STREAMS 16           /* streams per file (spec/FORMAT.md, "Limits") */
#define KVFILE_STREAM_NAME_CAPACITY 32  /* at most 31 bytes + NUL */
#define KVFILE_MODEL_ID_CAPACITY 256    /* at most 255 bytes + NUL */
#define KVFILE_MESSAGE_CAPACITY 512     /* kvfile_verify_result.first_message */

/* One stream of every layer: rows_per_token rows of row_width elements per
 * token, stored as dtype. name: NUL-terminated, [a-z0-9_.-]{1,31}. */
typedef struct kvfile_stream {
  char name[KVFILE_STREAM_NAME_CAPACITY];
  uint32_t rows_per_token;
  uint32_t row_width;
  kvfile_dtype dtype;
} kvfile_stream;

/* What a file stores per token: `layers` layers of the streams
 * streams[0, stream_count). */
typedef struct kvfile_geometry {
  uint32_t layers;
  uint32_t stream_count;
  kvfile_stream streams[KVFILE_MAX_STREAMS];
} kvfile_geometry;

/* Fills *out with a named preset ("llama-3.1-8b", "qwen2.5-7b",
 * "deepseek-v3", "dsa-mixed", "glm-5.2", "tiny"); its fp8 streams use fp8_dtype
 * (KVFILE_E4M3 or KVFILE_E5M2). KVFILE_INVALID_ARGUMENT for an unknown name
 * (the message lists the known ones) or a dtype that is not fp8. */
KVFILE_EXPORT kvfile_status kvfile_preset(const char* name, kvfile_dtype fp8_dtype, kvfile_geometry* out);

/* ---- Layer sets: a stream present in some layers only (spec/FORMAT.md 3.2) --
 * kvfile_geometry says nothing of them; these functions carry them beside it.
 * A stream's layers are ascending layer numbers; a stream in every layer has
 * them all. */

/* The layers stream `stream` of preset `name` is present in (glm-5.2's
 * indexer: 21 of 78), copied into out[0, capacity) as kvfile_reader_tokens
 * copies tokens: KVFILE_BUFFER_TOO_SMALL (nothing copied) when capacity is
 * short; *count (may be NULL) receives how many either way. */
KVFILE_EXPORT kvfile_status kvfile_preset_stream_layers(const char* name, uint32_t stream, uint32_t* out,
                                                        size_t capacity, size_t* count);

/* Bytes of one element of a dtype as stored and as read (1, 2 or 4); 0 for
 * a value outside the enum. */
KVFILE_EXPORT size_t kvfile_dtype_size(kvfile_dtype dtype);
/* (kvfile_dtype_size gives 0 for KVFILE_NVFP4: two codes share a byte.) */

/* ---- Writing ------------------------------------------------------------- */

typedef struct kvfile_writer kvfile_writer; /* opaque */

/* When appended tokens become durable (spec/RECOVERY.md, "Sync modes"). */
typedef enum kvfile_sync_mode {
  KVFILE_SYNC_CLOSE = 0, /* kvfile_writer_close makes everything durable (default) */
  KVFILE_SYNC_CHUNK = 1, /* every chunk is durable before its append returns */
  KVFILE_SYNC_NONE = 2,  /* only an explicit kvfile_writer_sync makes data durable */
  KVFILE_SYNC_RANGE_MIN_ = -0x7FFFFFFF - 1, /* not modes: see "Enum ranges" above */
  KVFILE_SYNC_RANGE_MAX_ = 0x7FFFFFFF
} kvfile_sync_mode;

/* Writer options; an all-zero struct (or NULL) means the defaults. */
typedef struct kvfile_writer_options {
  uint32_t chunk_tokens;     /* tokens per chunk, 1..65536; 0: 256. Create only */
  kvfile_sync_mode sync;     /* default KVFILE_SYNC_CLOSE */
  int overwrite;             /* nonzero: create replaces an existing file at once with the new,
                                empty one (spec/RECOVERY.md, section 7) */
} kvfile_writer_options;

/* Creates `path` for the given geometry and model identity (model_id: a
 * NUL-terminated string of at most 255 bytes, NULL for ""; fingerprint:
 * any value the caller uses to tell models apart) and opens it for
 * appending. options may be NULL. On success *out owns a new writer, to be
 * released with kvfile_writer_close; on failure *out is NULL. Fails with
 * KVFILE_INVALID_ARGUMENT if the file exists and options->overwrite is 0,
 * or if the geometry breaks the format's limits. */
KVFILE_EXPORT kvfile_status kvfile_writer_create(const char* path, const kvfile_geometry* geometry,
                                   const char* model_id, uint64_t fingerprint,
                                   const kvfile_writer_options* options, kvfile_writer** out);

/* kvfile_writer_create for a geometry with layer sets: stream s is present
 * in layers stream_layers[s][0, stream_layer_counts[s]) (ascending), or in
 * every layer where stream_layer_counts[s] is 0 (stream_layers may then be
 * NULL, or stream_layers[s]). A file with such a stream is format 2.3. The
 * appends then give a kvfile_rows with data NULL for each (layer, stream)
 * the stream is absent from; rows given there are refused. */
KVFILE_EXPORT kvfile_status kvfile_writer_create_layers(const char* path, const kvfile_geometry* geometry,
                                                        const uint32_t* const* stream_layers,
                                                        const uint32_t* stream_layer_counts, const char* model_id,
                                                        uint64_t fingerprint, const kvfile_writer_options* options,
                                                        kvfile_writer** out);

/* Opens an existing file to append to it. First finishes what a crash left
 * (cuts a torn tail, commits whole chunks) and upgrades a v1 file to v2.
 * KVFILE_BUSY if another writer holds it. options may be NULL (chunk_tokens
 * and overwrite are ignored). *out as for kvfile_writer_create. */
KVFILE_EXPORT kvfile_status kvfile_writer_open(const char* path, const kvfile_writer_options* options,
                                 kvfile_writer** out);

/* The stored parts of one (layer, stream) for the tokens of one append or
 * read, for every dtype (the dtype table of spec/FORMAT.md section 2).
 * With T tokens and n = T * rows_per_token * row_width elements:
 *   KVFILE_BF16, KVFILE_F16, KVFILE_F32: `data` holds n values (2 or 4
 *     bytes each); scales and block_scales are NULL.
 *   KVFILE_E4M3, KVFILE_E5M2: `data` holds n codes (one byte each),
 *     `scales` T * rows_per_token f32 scales (one per row); block_scales
 *     NULL.
 *   KVFILE_NVFP4: per token, rows_per_token * row_width / 2 bytes of packed
 *     E2M1 codes (low nibble first) in `data`, rows_per_token * row_width /
 *     16 E4M3 block scale codes in `block_scales` and one f32 scale in
 *     `scales`, token after token.
 * data_bytes, scale_count and block_scales_bytes are the sizes of the
 * buffers: at least what the tokens need (else KVFILE_BUFFER_TOO_SMALL,
 * nothing done); those of a part the dtype does not have are ignored. An
 * append only reads the buffers (during the call). */
typedef struct kvfile_parts {
  kvfile_dtype dtype;
  void* data;
  size_t data_bytes;
  float* scales;
  size_t scale_count;
  uint8_t* block_scales;
  size_t block_scales_bytes;
} kvfile_parts;

/* Appends token_count tokens: their ids, and for every layer and stream its
 * parts, blocks[layer * stream_count + stream]; block_count must be layers
 * * stream_count (a stream absent from a layer: dtype KVFILE_BF16, data
 * NULL). Parts of a raw dtype (bf16, f16, f32) are rows the writer
 * quantizes, or converts for a raw stream; parts of the stream's own
 * quantized dtype are stored exactly as given, after the checks of
 * spec/CODEC.md 8 and 14.6. Everything is validated first: a NaN or Inf
 * row, a wrong dtype or an invalid scale fails the whole append
 * (KVFILE_NON_FINITE or KVFILE_INVALID_ARGUMENT, naming layer, stream,
 * token and row) and nothing of it is written. */
KVFILE_EXPORT kvfile_status kvfile_writer_append_parts(kvfile_writer* writer, const uint32_t* tokens,
                                                       size_t token_count, const kvfile_parts* blocks,
                                                       size_t block_count);

/* Deprecated (kvfile_parts and kvfile_writer_append_parts replace them).
 * The rows of one (layer, stream) for the tokens of one append.
 * dtype KVFILE_BF16, KVFILE_F16 or KVFILE_F32: `data` holds
 *   tokens * rows_per_token * row_width values, and `scales` must be NULL;
 *   the writer quantizes them (or stores them, for a raw stream).
 * dtype equal to the stream's own fp8 dtype: `data` holds that many codes
 *   (one byte each) and `scales` tokens * rows_per_token positive finite
 *   f32 scales: stored exactly as given.
 * An nvfp4 stream takes rows (bf16, f16, f32) only through this struct:
 *   KVFILE_NVFP4 codes are refused (KVFILE_INVALID_ARGUMENT), as they need
 *   block scales it has no room for (kvfile_rows2 has). */
typedef struct kvfile_rows {
  kvfile_dtype dtype;
  const void* data;
  const float* scales;
} kvfile_rows;

/* Appends token_count tokens: their ids, and for every layer and stream a
 * kvfile_rows, blocks[layer * stream_count + stream]; block_count must be
 * layers * stream_count. Everything is validated first: a NaN or Inf row, a
 * wrong dtype or an invalid scale fails the whole append (KVFILE_NON_FINITE
 * or KVFILE_INVALID_ARGUMENT, naming layer, stream, token and row) and
 * nothing of it is written. The buffers are only read during the call. */
KVFILE_EXPORT kvfile_status kvfile_writer_append(kvfile_writer* writer, const uint32_t* tokens,
                                   size_t token_count, const kvfile_rows* blocks,
                                   size_t block_count) KVFILE_DEPRECATED("kvfile_writer_append_parts");

/* Deprecated (kvfile_parts replaces it).
 * kvfile_rows with room for an nvfp4 stream's block scales: dtype, data and
 * scales as in kvfile_rows (the same offsets), and
 * dtype KVFILE_NVFP4 (pre-quantized codes of an nvfp4 stream): per token,
 *   `data` holds rows_per_token * row_width / 2 bytes of packed E2M1 codes
 *   (low nibble first), `block_scales` rows_per_token * row_width / 16 E4M3
 *   block scale codes and `scales` one f32 row scale, token after token (as
 *   kvfile_reader_read_nvfp4_codes gives them): stored exactly as given,
 *   after the checks of spec/CODEC.md 14.6.
 * For every other dtype block_scales must be NULL. */
typedef struct kvfile_rows2 {
  kvfile_dtype dtype;
  const void* data;
  const float* scales;
  const uint8_t* block_scales;
} kvfile_rows2;

/* kvfile_writer_append with kvfile_rows2 blocks: the same rules, and nvfp4
 * codes too. */
KVFILE_EXPORT kvfile_status kvfile_writer_append2(kvfile_writer* writer, const uint32_t* tokens,
                                                  size_t token_count, const kvfile_rows2* blocks,
                                                  size_t block_count) KVFILE_DEPRECATED("kvfile_writer_append_parts");

/* Writes what is staged and makes every appended token durable. */
KVFILE_EXPORT kvfile_status kvfile_writer_sync(kvfile_writer* writer);

/* Keeps the first n tokens and drops the rest, durably (n at most the token
 * count, else KVFILE_INVALID_ARGUMENT). */
KVFILE_EXPORT kvfile_status kvfile_writer_rewind(kvfile_writer* writer, uint64_t n);

/* Number of leading tokens the file shares with prompt[0, prompt_count):
 * how much of a cached session a new prompt can reuse. */
KVFILE_EXPORT kvfile_status kvfile_writer_common_prefix(const kvfile_writer* writer, const uint32_t* prompt,
                                          size_t prompt_count, uint64_t* out);

/* Tokens appended so far (staged ones included). */
KVFILE_EXPORT kvfile_status kvfile_writer_token_count(const kvfile_writer* writer, uint64_t* out);

/* Writes what is staged, syncs unless the mode is KVFILE_SYNC_NONE, and
 * releases the writer, whatever the result (the handle is invalid after).
 * NULL is a no-op returning KVFILE_OK. */
KVFILE_EXPORT kvfile_status kvfile_writer_close(kvfile_writer* writer);

/* ---- Reading ------------------------------------------------------------- */

typedef struct kvfile_reader kvfile_reader; /* opaque */

/* Opens a .kv file (v1 or v2) for reading: checks the header, the commit
 * record and every chunk head; row payloads are checked when read. On
 * success *out owns a new reader, to be released with kvfile_reader_close;
 * on failure *out is NULL. */
KVFILE_EXPORT kvfile_status kvfile_reader_open(const char* path, kvfile_reader** out);

/* Releases a reader. NULL is a no-op. */
KVFILE_EXPORT void kvfile_reader_close(kvfile_reader* reader);

/* Number of tokens in the file. */
KVFILE_EXPORT kvfile_status kvfile_reader_token_count(const kvfile_reader* reader, uint64_t* out);

/* The layers stream `stream` is present in (every layer but for a layer
 * set, spec/FORMAT.md 3.2), copied as kvfile_preset_stream_layers copies
 * them. Reads of a (layer, stream) the stream is absent from fail with
 * KVFILE_INVALID_ARGUMENT. */
KVFILE_EXPORT kvfile_status kvfile_reader_stream_layers(const kvfile_reader* reader, uint32_t stream, uint32_t* out,
                                                        size_t capacity, size_t* count);

/* Copies every token id into out[0, capacity). If capacity is smaller than
 * the token count, copies nothing and returns KVFILE_BUFFER_TOO_SMALL.
 * *count (may be NULL) receives the token count either way. */
KVFILE_EXPORT kvfile_status kvfile_reader_tokens(const kvfile_reader* reader, uint32_t* out, size_t capacity,
                                   size_t* count);

/* Number of leading tokens the file shares with prompt[0, prompt_count). */
KVFILE_EXPORT kvfile_status kvfile_reader_common_prefix(const kvfile_reader* reader, const uint32_t* prompt,
                                          size_t prompt_count, uint64_t* out);

/* Rows of (layer, stream) for tokens [begin, end), decoded into dst as
 * out_dtype (KVFILE_BF16, KVFILE_F16 or KVFILE_F32). dst_bytes is the size
 * of dst; it must be at least (end - begin) * rows_per_token * row_width *
 * kvfile_dtype_size(out_dtype), else KVFILE_BUFFER_TOO_SMALL. Every byte
 * read is checked first: a failed read leaves dst untouched. */
KVFILE_EXPORT kvfile_status kvfile_reader_read_rows(kvfile_reader* reader, uint32_t layer, uint32_t stream,
                                      uint64_t begin, uint64_t end, kvfile_dtype out_dtype,
                                      void* dst, size_t dst_bytes);

/* The parts of (layer, stream) for tokens [begin, end) into `parts`, as
 * parts->dtype says (the sizes of kvfile_parts; a failed read leaves every
 * buffer untouched):
 *   KVFILE_BF16, KVFILE_F16, KVFILE_F32: the rows decoded, as
 *     kvfile_reader_read_rows;
 *   the stream's own quantized dtype: its stored codes and scales (and
 *     nvfp4 block scales), exactly;
 *   KVFILE_E4M3 or KVFILE_E5M2 for a stream of a v1 file (raw rows only):
 *     the rows quantized on the fly, exactly as an upgrade to v2 stores
 *     them.
 * Another quantized dtype is KVFILE_INVALID_ARGUMENT ("stream 'k' is
 * e4m3, not e5m2"; a raw stream of a v2 file has no codes). */
KVFILE_EXPORT kvfile_status kvfile_reader_read_parts(kvfile_reader* reader, uint32_t layer, uint32_t stream,
                                                     uint64_t begin, uint64_t end, const kvfile_parts* parts);

/* Deprecated (kvfile_reader_read_parts replaces it).
 * The fp8 codes and scales of (layer, stream) for tokens [begin, end):
 * codes_bytes must be at least (end - begin) * rows_per_token * row_width
 * and scale_count at least (end - begin) * rows_per_token, else
 * KVFILE_BUFFER_TOO_SMALL. A raw stream of a v2 file has no codes
 * (KVFILE_INVALID_ARGUMENT: read it with kvfile_reader_read_rows); the raw
 * rows of a v1 file are quantized on the fly as e4m3, exactly as an upgrade
 * to v2 stores them. A failed read leaves both buffers untouched. */
KVFILE_EXPORT kvfile_status kvfile_reader_read_codes(kvfile_reader* reader, uint32_t layer, uint32_t stream,
                                       uint64_t begin, uint64_t end, uint8_t* codes,
                                       size_t codes_bytes, float* scales, size_t scale_count)
    KVFILE_DEPRECATED("kvfile_reader_read_parts");

/* Deprecated (kvfile_reader_read_parts replaces it).
 * The stored data of an nvfp4 stream (format 2.2) for tokens [begin, end):
 * per token, rows_per_token * row_width / 2 bytes of packed E2M1 codes (low
 * nibble first), rows_per_token * row_width / 16 E4M3 block scale codes and
 * one f32 row scale, in token order. codes_bytes, block_scales_bytes and
 * scale_count must be at least (end - begin) times those, else
 * KVFILE_BUFFER_TOO_SMALL; another dtype is KVFILE_INVALID_ARGUMENT. A
 * failed read leaves the three buffers untouched. */
KVFILE_EXPORT kvfile_status kvfile_reader_read_nvfp4_codes(kvfile_reader* reader, uint32_t layer, uint32_t stream,
                                             uint64_t begin, uint64_t end, uint8_t* codes, size_t codes_bytes,
                                             uint8_t* block_scales, size_t block_scales_bytes, float* scales,
                                             size_t scale_count) KVFILE_DEPRECATED("kvfile_reader_read_parts");

/* One destination of kvfile_reader_read_many: the rows of (layer, stream),
 * decoded, laid out as for kvfile_reader_read_rows; dst_bytes is the size
 * of dst. */
typedef struct kvfile_rows_target {
  uint32_t layer;
  uint32_t stream;
  void* dst;
  size_t dst_bytes;
} kvfile_rows_target;

/* Bulk read: the rows of every target for tokens [begin, end), decoded as
 * out_dtype (KVFILE_BF16, KVFILE_F16 or KVFILE_F32), in one call: what an
 * engine resuming a session does (pass every (layer, stream) pair). The
 * file is read chunk by chunk by `threads` workers (0: as many as the
 * machine has cores; the library caps them at 16 and at the number of
 * chunks): the calling thread and threads of the reader's, each with a
 * handle of the file of its own, made by the first call that needs them and
 * kept until the reader is closed. Every target is checked before anything is read
 * (range, layer, stream, KVFILE_BUFFER_TOO_SMALL for a short buffer). Data
 * is checked chunk by chunk: on a failure every destination is zero-filled
 * (no partly decoded data is left) and the message names the first failing
 * chunk. */
KVFILE_EXPORT kvfile_status kvfile_reader_read_many(kvfile_reader* reader, uint64_t begin, uint64_t end,
                                      kvfile_dtype out_dtype, const kvfile_rows_target* targets,
                                      size_t target_count, unsigned threads);

/* One destination of kvfile_reader_read_codes_many: codes and scales of
 * (layer, stream), laid out as for kvfile_reader_read_codes. */
typedef struct kvfile_codes_target {
  uint32_t layer;
  uint32_t stream;
  uint8_t* codes;
  size_t codes_bytes;
  float* scales;
  size_t scale_count;
} kvfile_codes_target;

/* Deprecated (kvfile_reader_read_parts_many replaces it). Bulk read of fp8
 * codes and scales: kvfile_reader_read_codes for every target, with the
 * threads and the failure contract of kvfile_reader_read_many (a raw stream
 * of a v2 file: KVFILE_INVALID_ARGUMENT; a v1 file's rows are quantized as
 * e4m3). */
KVFILE_EXPORT kvfile_status kvfile_reader_read_codes_many(kvfile_reader* reader, uint64_t begin, uint64_t end,
                                            const kvfile_codes_target* targets, size_t target_count,
                                            unsigned threads) KVFILE_DEPRECATED("kvfile_reader_read_parts_many");

/* One destination of kvfile_reader_read_parts_many: tokens [begin, end) of
 * (layer, stream) as `parts` (its dtype and buffers, laid out as for
 * kvfile_reader_read_parts). */
typedef struct kvfile_parts_target {
  uint32_t layer;
  uint32_t stream;
  kvfile_parts parts;
} kvfile_parts_target;

/* Bulk read of any dtype's parts: kvfile_reader_read_parts for every target
 * (a quantized dtype: the stream's own codes, or a v1 file's rows quantized
 * as that fp8 dtype; a raw dtype: the rows decoded to it), with the threads
 * and the failure contract of kvfile_reader_read_many: every target is
 * checked before anything is read, and on a failure every part of every
 * target is zero-filled. Targets of one dtype are read in one pass over the
 * file, so a call whose targets share a dtype reads the file once. */
KVFILE_EXPORT kvfile_status kvfile_reader_read_parts_many(kvfile_reader* reader, uint64_t begin, uint64_t end,
                                                          const kvfile_parts_target* targets, size_t target_count,
                                                          unsigned threads);

/* What kvfile_reader_info reports. */
typedef struct kvfile_info {
  uint16_t major_version;             /* 1 or 2 */
  uint16_t minor_version;
  char model_id[KVFILE_MODEL_ID_CAPACITY]; /* NUL-terminated */
  uint64_t fingerprint;
  kvfile_geometry geometry;           /* dtype per stream in geometry.streams[i].dtype */
  uint64_t tokens;
  uint64_t chunks;
  uint32_t nominal_chunk_tokens;      /* the writer's tokens per chunk */
  uint64_t bytes;                     /* file size */
  uint64_t torn_tail_bytes;           /* bytes after the last valid chunk */
  int damage_before_end;              /* 1: a valid chunk follows the tail (run kvfile_verify) */
  /* 1: the file ends inside its committed data (cut short): the reader
   * returns the whole chunks before the cut; kvfile_verify reports an
   * error and a writable open refuses the file. What is gone: */
  int committed_data_missing;
  uint64_t committed_tokens_missing;
  uint64_t committed_bytes_missing;
} kvfile_info;

/* Fills *out with the file's versions, identity, geometry and sizes. */
KVFILE_EXPORT kvfile_status kvfile_reader_info(const kvfile_reader* reader, kvfile_info* out);

/* ---- Verifying ----------------------------------------------------------- */

typedef struct kvfile_verify_result {
  int ok;                  /* 1: no errors (warnings allowed), 0: errors */
  uint64_t errors;         /* damage found */
  uint64_t warnings;       /* a torn tail (what a crash leaves) */
  uint16_t major_version;  /* 0 if the header was unreadable */
  uint16_t minor_version;
  uint64_t tokens;
  uint64_t chunks;
  uint64_t bytes;
  uint64_t torn_tail_bytes;
  /* The first finding (error or warning), NUL-terminated, cut to fit; "" if
   * there is none. */
  char first_message[KVFILE_MESSAGE_CAPACITY];
} kvfile_verify_result;

/* Checks every checksum, the structure and every code and scale of `path`
 * without modifying it (quick nonzero: headers and structure only). Returns
 * KVFILE_OK when the file could be examined, whatever it holds (damage is
 * reported in *out); an error only when it cannot be examined at all
 * (missing, permission, I/O error). */
KVFILE_EXPORT kvfile_status kvfile_verify(const char* path, int quick, kvfile_verify_result* out);

/* ---- Repairing ------------------------------------------------------------
 * kvfile/repair.h states the full rules: a torn tail is cut, a damaged
 * commit slot rewritten, whole chunks past the commit record committed;
 * damage that valid chunks follow, and a file shorter than its commit
 * record, only with KVFILE_REPAIR_FORCE; anything else is refused. */

/* What a verify finding is about (kvfile::VerifyFindingKind, value for
 * value; more may be added: treat an unknown one as damage). */
typedef enum kvfile_finding_kind {
  KVFILE_FINDING_NONE = -1,                  /* no finding */
  KVFILE_FINDING_UNREADABLE = 0,             /* header, commit record or structure damaged */
  KVFILE_FINDING_COMMIT_SLOT = 1,            /* one commit slot damaged, the other in use */
  KVFILE_FINDING_DAMAGED_CHUNK = 2,          /* a committed chunk fails its checks */
  KVFILE_FINDING_TORN_TAIL = 3,              /* what a crash leaves after the last chunk */
  KVFILE_FINDING_DAMAGE_BEFORE_END = 4,      /* a torn tail that a valid chunk follows */
  KVFILE_FINDING_COMMITTED_DATA_MISSING = 5, /* the file ends inside its committed data */
  KVFILE_FINDING_KIND_RANGE_MIN_ = -0x7FFFFFFF - 1, /* not kinds: see "Enum ranges" above */
  KVFILE_FINDING_KIND_RANGE_MAX_ = 0x7FFFFFFF
} kvfile_finding_kind;

#define KVFILE_REPAIR_FORCE 1u   /* also cut damage before the end and a file cut inside its commits */
#define KVFILE_REPAIR_DRY_RUN 2u /* decide and report; change nothing */

typedef struct kvfile_repair_result {
  int healthy;          /* 1: nothing to repair */
  int repaired;         /* 1: repaired (never in a dry run) */
  int upgrade;          /* 1: a v1 file, upgraded to v2 by the repair (dry run: would be) */
  int slot_rewritten;   /* 1: a damaged commit slot was rewritten */
  int leftover_removed; /* 1: a leftover <path>.kvupgrade was removed */
  kvfile_finding_kind refused_kind; /* the finding that refused the repair, or NONE */
  kvfile_finding_kind cut_kind;     /* the finding whose bytes are cut, or NONE */
  uint64_t findings;                /* verify's findings before the repair */
  uint64_t cut_offset;              /* where the cut is (with cut_kind) */
  uint64_t cut_bytes;               /* bytes cut (dry run: that would be) */
  uint64_t recommitted_chunks;      /* whole chunks past the commit record, committed */
  uint64_t committed_tokens_lost;   /* committed tokens a forced cut gave up */
  uint64_t tokens;                  /* tokens after the repair (before, in a dry run) */
  /* The refusal, else the first finding, NUL-terminated, cut to fit; "". */
  char message[KVFILE_MESSAGE_CAPACITY];
} kvfile_repair_result;

/* Repairs `path` (flags: KVFILE_REPAIR_FORCE, KVFILE_REPAIR_DRY_RUN, or 0).
 * KVFILE_OK when the file is healthy, repaired, or (dry run) would be;
 * KVFILE_CORRUPTION, the file untouched, when the repair is refused (*out
 * says which finding, kvfile_last_error() the line); another status when
 * the file cannot be examined or written. *out is filled in every case
 * where the file was examined. */
KVFILE_EXPORT kvfile_status kvfile_repair(const char* path, unsigned flags, kvfile_repair_result* out);

/* ---- Prefix lookup ---------------------------------------------------------
 * kvfile/prefix_index.h states the full rules (spec/INDEX.md the index file). */

#define KVFILE_PATH_CAPACITY 4097 /* a path of up to 4096 bytes + NUL */

typedef struct kvfile_prefix_match {
  int found;                               /* 1: a match; 0: nothing shares the first token */
  char path[KVFILE_PATH_CAPACITY];         /* relative path in the directory, or member name */
  char model_id[KVFILE_MODEL_ID_CAPACITY]; /* NUL-terminated */
  uint64_t fingerprint;
  uint64_t tokens;  /* the file's or member's token count */
  uint64_t matched; /* tokens in common with the query */
} kvfile_prefix_match;

/* The .kv file or pack member (PACK:MEMBER) under directory `path` (through
 * DIR/.kvfile-index, refreshed when files changed and written back when the
 * directory is writable), or the member of the pack `path` (through the
 * index beside it when that lists the pack as it is, else member by
 * member), with the longest common prefix with
 * tokens[0, token_count); among equally long matches the smallest
 * fingerprint, then the smallest token sequence, then the smallest path.
 * model_fingerprint NULL: any model. No match is KVFILE_OK with
 * out->found = 0. A path longer than the field: KVFILE_BUFFER_TOO_SMALL. */
KVFILE_EXPORT kvfile_status kvfile_find_prefix(const char* path, const uint32_t* tokens, size_t token_count,
                                               const uint64_t* model_fingerprint, kvfile_prefix_match* out);

/* Writes or refreshes dir/.kvfile-index (kvfile index DIR). */
KVFILE_EXPORT kvfile_status kvfile_index_directory(const char* dir);

/* ---- The seeds' formats ---------------------------------------------------
 * Mooncake FP8 codec records (version 1) and colibri .coli_kv sessions;
 * kvfile/formats/mooncake.h and kvfile/formats/coli_kv.h state the full rules, and
 * docs/formats.md how they map to .kv files. */

/* A Mooncake record's descriptor: source_dtype 1 (fp16) or 2 (bf16), rank
 * 1..8 dimensions in shape[0, rank), group_size elements per scale. */
typedef struct kvfile_mooncake_desc {
  uint8_t source_dtype;
  uint8_t rank;
  uint32_t group_size;
  uint64_t shape[8];
} kvfile_mooncake_desc;

/* Bytes of a record of *desc (KVFILE_INVALID_ARGUMENT for a descriptor the
 * format cannot hold). */
KVFILE_EXPORT kvfile_status kvfile_mooncake_record_size(const kvfile_mooncake_desc* desc, size_t* bytes);

/* Mooncake's encoder: `values` holds the tensor's n elements as fp16 or bf16
 * bit patterns (desc->source_dtype); writes the record into out[0, capacity)
 * and its size into *size. KVFILE_NON_FINITE for a NaN or infinity,
 * KVFILE_BUFFER_TOO_SMALL if capacity is less than the record; out is
 * untouched on failure. */
KVFILE_EXPORT kvfile_status kvfile_mooncake_encode(const kvfile_mooncake_desc* desc, const uint16_t* values, uint8_t* out,
                                     size_t capacity, size_t* size);

/* Checks a record (magic, version, reserved field, CRC, descriptor, size,
 * scales finite and > 0, no NaN code: KVFILE_CORRUPTION naming the rule)
 * and decodes it into dst[0, n) as its source dtype; *desc receives the
 * descriptor. dst NULL with dst_count 0 only checks and fills *desc.
 * KVFILE_BUFFER_TOO_SMALL if dst_count < n. Nothing is written to dst
 * unless every check passed. */
KVFILE_EXPORT kvfile_status kvfile_mooncake_decode(const uint8_t* record, size_t record_bytes, kvfile_mooncake_desc* desc,
                                     uint16_t* dst, size_t dst_count);

/* Imports a colibri session (COLIKV1 or COLIKV2) as a new .kv file at
 * kv_path (which must not exist): streams latent, rope (e4m3) and indexer
 * (f32). Bad data: KVFILE_CORRUPTION or KVFILE_UNSUPPORTED; kv_path is then
 * removed. A session whose indexer is in some layers only needs them named:
 * KVFILE_INVALID_ARGUMENT here, kvfile_coli_import_layers takes them. */
KVFILE_EXPORT kvfile_status kvfile_coli_import(const char* coli_path, const char* kv_path);

/* kvfile_coli_import of a session whose indexer is in some layers only
 * (h[4] < h[0]; its header does not say which): indexer_layers[0, count)
 * names them, ascending, exactly h[4] of them; the .kv file records them.
 * A wrong list: KVFILE_INVALID_ARGUMENT naming what is wrong. */
KVFILE_EXPORT kvfile_status kvfile_coli_import_layers(const char* coli_path, const char* kv_path,
                                                      const uint32_t* indexer_layers, size_t count);

/* Writes a .kv file of colibri's geometry as a COLIKV2 session at
 * coli_path (created; it must not exist), codes and scales as stored.
 * vocab: the model's vocabulary size for the header, 0 to take it from a
 * model id "coli_kv:vocab=N". Another geometry, or ids outside the
 * vocabulary: KVFILE_INVALID_ARGUMENT with the reason, nothing written. */
KVFILE_EXPORT kvfile_status kvfile_coli_export(const char* kv_path, const char* coli_path, uint32_t vocab);

/* ---- Converting between formats (kvfile/convert.h) ------------------------
 * One call for every format: .kv, safetensors, llama.cpp state files,
 * Mooncake record directories, colibri sessions; kvfile/convert.h states the
 * full rules (the transaction, verify-before-convert, the dtype policy). */

typedef enum kvfile_format {
  KVFILE_FORMAT_AUTO = 0,        /* by the path (options.to: by OUT's name) */
  KVFILE_FORMAT_KV = 1,
  KVFILE_FORMAT_SAFETENSORS = 2,
  KVFILE_FORMAT_LLAMA = 3,       /* a llama.cpp state file */
  KVFILE_FORMAT_MOONCAKE = 4,    /* a directory of Mooncake FP8 codec records */
  KVFILE_FORMAT_COLI = 5,        /* a colibri .coli_kv session */
  KVFILE_FORMAT_RANGE_MIN_ = -0x7FFFFFFF - 1, /* not formats: see "Enum ranges" above */
  KVFILE_FORMAT_RANGE_MAX_ = 0x7FFFFFFF
} kvfile_format;

/* Conversion options; an all-zero struct (or NULL) means the defaults. */
/* A yes/no option whose zero is the default (an int field holds it). */
typedef enum kvfile_choice { KVFILE_CHOICE_DEFAULT = 0, KVFILE_CHOICE_YES = 1, KVFILE_CHOICE_NO = 2 } kvfile_choice;

typedef struct kvfile_convert_options {
  kvfile_format to;          /* OUT's format; AUTO: by its name */
  uint16_t kv_major;         /* a .kv OUT's format, 1 or 2; 0: 2 */
  kvfile_dtype dtype;        /* the target-dtype policy (kvfile convert --dtype); 0: none */
  int every_stream;          /* nonzero: a quantized dtype quantizes raw streams too */
  const char* keep_raw;      /* streams stored raw, comma separated; NULL or "": none */
  int codes;                 /* safetensors: codes and scales instead of values */
  uint32_t chunk_tokens;     /* tokens per chunk of a .kv OUT; 0: the default rule */
  int salvage;               /* a damaged .kv IN: convert its verified prefix */
  int force;                 /* replace an existing OUT */
  uint32_t llama_head_size;  /* a llama.cpp IN: values per KV head (required by that format) */
  uint32_t mooncake_group_size; /* a Mooncake OUT: elements per scale group; 0: a row */
  uint32_t coli_vocab;       /* a colibri OUT: the vocabulary size; 0: from the model id */
  int coli_v1;               /* a colibri OUT: COLIKV1 instead of COLIKV2 (kvfile convert --format coli-v1) */
  const char* coli_indexer_layers; /* a .coli_kv IN whose indexer is in some layers only: which, ascending
                                      ("0..20" or "0,4,8"); NULL: every layer */
  /* llama.cpp state files, as the flags of kvfile convert (docs/formats.md). */
  const char* llama_model;   /* an IN: the model's GGUF file, whose metadata gives the head size */
  int llama_rotated;         /* a kvfile_choice; an IN: rows stored Hadamard-rotated; an OUT: the restoring
                                context rotates; DEFAULT: as llama.cpp does for the cache type */
  int llama_unrotate;        /* an IN: store a rotated quantized cache's rows un-rotated */
  int llama_session;         /* an OUT: a session file ('ggsn', --format llama-session), not a sequence state */
  const char* llama_type;    /* an OUT: the cache type, "f16", "q8_0", ..., or "K,V"; NULL: as imported */
  int llama_v_trans;         /* a kvfile_choice; an OUT: V stored transposed (no flash attention); DEFAULT: as
                                imported, else no */
  const char* llama_arch;    /* a session OUT: the model architecture; NULL: as imported */
  uint32_t llama_n_stream;   /* an OUT: cache streams in the file (llama-server -np N); 0: as imported, else 1 */
} kvfile_convert_options;

typedef struct kvfile_convert_result {
  kvfile_format from, to;
  uint64_t tokens;                          /* tokens written */
  uint32_t warnings;                        /* how many warnings (salvage, rotation, ...) */
  char summary[KVFILE_MESSAGE_CAPACITY];    /* what was written, one line, cut to fit */
  char warning[KVFILE_MESSAGE_CAPACITY];    /* the warnings, joined by "; ", cut to fit; "" if none */
} kvfile_convert_result;

/* Converts IN to OUT as one transaction: OUT is afterwards what it was (or
 * absent) or the whole result. An existing OUT without options->force:
 * KVFILE_INVALID_ARGUMENT ("OUT: file exists; use --force to replace it"),
 * OUT untouched. A .kv IN that verify fails on: KVFILE_CORRUPTION, nothing
 * written, unless options->salvage. result may be NULL. */
KVFILE_EXPORT kvfile_status kvfile_convert(const char* in, const char* out, const kvfile_convert_options* options,
                                           kvfile_convert_result* result);

/* ---- Appending a safetensors file (kvfile append; kvfile/append.h) ------- */

/* Append options; an all-zero struct (or NULL) means the defaults. The
 * dtype fields are ints holding a kvfile_dtype (0: the default), sync an
 * int holding a kvfile_sync_mode. */
typedef struct kvfile_append_options {
  const char* model;     /* a new FILE's model id, and the one an existing FILE must have; NULL: INPUT's */
  int dtype;             /* E4M3, E5M2 or NVFP4 for the quantized streams; 0: codes keep theirs, values take an
                            existing stream's dtype, else e4m3 */
  int upgrade_dtype;     /* E4M3 or E5M2: what a v1 FILE's upgrade quantizes to; 0: dtype if fp8, else e4m3 */
  const char* keep_raw;  /* streams kept raw by a v1 FILE's upgrade, or stored bf16 in a new FILE; comma
                            separated; NULL or "": none */
  uint32_t chunk_tokens; /* tokens per chunk of a new FILE; 0: 256 fitted to INPUT's size */
  int sync;              /* KVFILE_SYNC_CLOSE (0, default), KVFILE_SYNC_CHUNK or KVFILE_SYNC_NONE */
} kvfile_append_options;

typedef struct kvfile_append_result {
  int created;                    /* FILE did not exist: created with INPUT's geometry */
  int upgraded;                   /* FILE was format 1: upgraded to 2 first */
  uint64_t tokens_before;         /* FILE's tokens before */
  uint64_t tokens_appended;       /* INPUT's tokens, all appended */
  char note[KVFILE_MESSAGE_CAPACITY]; /* INPUT names no model: what it was appended to; "" otherwise */
} kvfile_append_result;

/* Appends the tokens of a safetensors file in the kvfile convention
 * (docs/formats.md) to FILE, creating it with INPUT's geometry if it does
 * not exist, as one transaction: everything is checked before the first
 * byte is written (a model or geometry mismatch: KVFILE_MISMATCH; a value
 * that is not finite: KVFILE_NON_FINITE), and a failure leaves FILE with
 * none of INPUT's tokens, or (an I/O error in the commit itself) all of
 * them, never part. result may be NULL. */
KVFILE_EXPORT kvfile_status kvfile_append_safetensors(const char* file, const char* input,
                                                      const kvfile_append_options* options,
                                                      kvfile_append_result* result);

/* ---- Packs: many sessions in one .kvpack (spec/PACK.md, docs/packs.md) --- */

typedef struct kvfile_pack kvfile_pack; /* opaque */

/* Packs the .kv files paths[0, count) as members names[0, count) (relative
 * paths, unique) into a new .kvpack at dest, which must not exist; chunks
 * the members share are stored once. chunk_tokens: tokens per pack chunk
 * (0: 256). Written under a temporary name and renamed into place when
 * complete: a failure leaves nothing at dest. */
KVFILE_EXPORT kvfile_status kvfile_pack_files(const char* dest, const char* const* paths, const char* const* names,
                                              size_t count, uint32_t chunk_tokens);

/* Opens a pack and checks its header, tables, names and member index. On
 * success *out owns it, to be released with kvfile_pack_close. */
KVFILE_EXPORT kvfile_status kvfile_pack_open(const char* path, kvfile_pack** out);
KVFILE_EXPORT void kvfile_pack_close(kvfile_pack* pack); /* NULL: no-op */

/* Members are indexed 0..count-1 in name order. */
KVFILE_EXPORT kvfile_status kvfile_pack_member_count(const kvfile_pack* pack, size_t* out);
/* Member index's name, with a NUL, into out[0, capacity); *length (may be
 * NULL) receives its length without the NUL. KVFILE_BUFFER_TOO_SMALL (and
 * *length set) if capacity <= length. */
KVFILE_EXPORT kvfile_status kvfile_pack_member_name(const kvfile_pack* pack, size_t index, char* out, size_t capacity,
                                                    size_t* length);
KVFILE_EXPORT kvfile_status kvfile_pack_member_tokens(const kvfile_pack* pack, size_t index, uint64_t* out);
/* The index of the member named name: KVFILE_NOT_FOUND if there is none. */
KVFILE_EXPORT kvfile_status kvfile_pack_find(const kvfile_pack* pack, const char* name, size_t* index);
/* Writes member index as the .kv file dest (replaced atomically), after
 * checking its record and every chunk it uses (KVFILE_CORRUPTION: nothing
 * is written). */
KVFILE_EXPORT kvfile_status kvfile_pack_materialize(kvfile_pack* pack, size_t index, const char* dest);
/* Checks every member record and every stored chunk once. */
KVFILE_EXPORT kvfile_status kvfile_pack_verify(kvfile_pack* pack);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* KVFILE_C_H_ */
