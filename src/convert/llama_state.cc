// SPDX-License-Identifier: Apache-2.0
// llama.cpp state files: parser, row codecs, provenance and writer (see
// llama_state.h). Facts about the layout were read from llama.cpp v0.5.0
// (src/llama-context.cpp, src/llama-kv-cache.cpp); no code of it is used.
#include "kvfile/formats/llama_state.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <map>
#include <tuple>
#include <utility>

#include "kvfile/codec.h"
#include "format/endian.h"
#include "convert/magic.h"

namespace kvfile::llama {

using codec::Bf16ToF32;
using codec::F16ToF32;
using codec::F32ToBf16;
using codec::F32ToF16;

namespace {

// Wire constants.
constexpr uint32_t kSequenceVersion = 3;
constexpr uint32_t kSessionVersion = 10;
constexpr uint64_t kQ8Block = 32;       // values per q8_0 block
constexpr uint64_t kQ8BlockBytes = 34;  // f16 scale + 32 int8
constexpr uint32_t kMaxLayers = 1024;   // the .kv limit; more is refused
constexpr uint32_t kMaxStreams = 1024;
constexpr size_t kMaxCaches = 2;        // llama.cpp's iSWA: a full and a sliding-window cache
constexpr size_t kMaxArch = 64;
constexpr std::string_view kModelIdPrefix = "llama.cpp:";
constexpr int32_t kServerTokensMarker = -1;  // LLAMA_TOKEN_NULL, first value of llama-server's token record
constexpr uint32_t kServerTokensVersion = 1;  // SERVER_TOKENS_STATE_VERSION of llama.cpp v0.5.0

const char* KindName(FileKind k) { return k == FileKind::kSequence ? "llama.cpp sequence state" : "llama.cpp session"; }

std::optional<CacheType> TypeFromId(int32_t id) {
  switch (id) {
    case 0: return CacheType::kF32;
    case 1: return CacheType::kF16;
    case 8: return CacheType::kQ8_0;
    case 30: return CacheType::kBF16;
    default: return std::nullopt;
  }
}

uint32_t ElementBytes(CacheType t) {
  switch (t) {
    case CacheType::kF32: return 4;
    case CacheType::kQ8_0: return static_cast<uint32_t>(kQ8BlockBytes);  // per block, as ggml_type_size
    default: return 2;
  }
}

// Values in a row of `bytes` bytes, or nullopt if no whole number of them.
std::optional<uint64_t> WidthOf(CacheType t, uint64_t bytes) {
  if (t == CacheType::kQ8_0) {
    if (bytes == 0 || bytes % kQ8BlockBytes) return std::nullopt;
    return bytes / kQ8BlockBytes * kQ8Block;
  }
  uint64_t e = ElementBytes(t);
  if (bytes == 0 || bytes % e) return std::nullopt;
  return bytes / e;
}

// Sequential reads through a buffer, every read checked against the size.
class Cursor {
 public:
  Cursor(File& f, uint64_t size, const std::string& what) : f_(f), size_(size), what_(what) {}
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }
  Status Read(void* dst, uint64_t n, const char* field) {
    if (n > left())
      return Status::Corruption(what_ + ": truncated: " + field + " at byte " + std::to_string(pos_) + " needs " +
                                std::to_string(n) + " bytes, " + std::to_string(left()) + " are left");
    auto* out = static_cast<uint8_t*>(dst);
    while (n > 0) {
      if (pos_ < buf_pos_ || pos_ >= buf_pos_ + buf_.size()) {
        buf_.resize(static_cast<size_t>(std::min<uint64_t>(kBuf, left())));
        buf_pos_ = pos_;
        KVFILE_RETURN_IF_ERROR(f_.ReadAt(pos_, buf_.data(), buf_.size()));
      }
      uint64_t at = pos_ - buf_pos_;
      uint64_t take = std::min<uint64_t>(n, buf_.size() - at);
      std::memcpy(out, buf_.data() + at, static_cast<size_t>(take));
      out += take;
      pos_ += take;
      n -= take;
    }
    return Status::OK();
  }
  Status U32(uint32_t* v, const char* field) {
    uint8_t b[4];
    KVFILE_RETURN_IF_ERROR(Read(b, 4, field));
    *v = format::LoadU32(b);
    return Status::OK();
  }
  Status I32(int32_t* v, const char* field) {
    uint32_t u;
    KVFILE_RETURN_IF_ERROR(U32(&u, field));
    *v = static_cast<int32_t>(u);
    return Status::OK();
  }
  Status U64(uint64_t* v, const char* field) {
    uint8_t b[8];
    KVFILE_RETURN_IF_ERROR(Read(b, 8, field));
    *v = format::LoadU64(b);
    return Status::OK();
  }
  Status Skip(uint64_t n, const char* field) {
    if (n > left())
      return Status::Corruption(what_ + ": truncated: " + field + " at byte " + std::to_string(pos_) + " needs " +
                                std::to_string(n) + " bytes, " + std::to_string(left()) + " are left");
    pos_ += n;
    return Status::OK();
  }

 private:
  static constexpr uint64_t kBuf = uint64_t{1} << 16;
  File& f_;
  uint64_t size_;
  const std::string& what_;
  uint64_t pos_ = 0;
  uint64_t buf_pos_ = 0;
  std::vector<uint8_t> buf_;
};

}  // namespace

const char* CacheTypeName(CacheType t) {
  switch (t) {
    case CacheType::kF32: return "f32";
    case CacheType::kF16: return "f16";
    case CacheType::kQ8_0: return "q8_0";
    case CacheType::kBF16: return "bf16";
  }
  return "?";
}

std::optional<CacheType> CacheTypeFromName(std::string_view name) {
  for (CacheType t : {CacheType::kF32, CacheType::kF16, CacheType::kQ8_0, CacheType::kBF16})
    if (name == CacheTypeName(t)) return t;
  return std::nullopt;
}

bool IsQuantized(CacheType t) { return t == CacheType::kQ8_0; }

uint64_t RowBytes(CacheType t, uint64_t width) {
  if (t == CacheType::kQ8_0) return width / kQ8Block * kQ8BlockBytes;
  return width * ElementBytes(t);
}

void DecodeRow(CacheType t, const uint8_t* src, uint64_t width, float* out) {
  switch (t) {
    case CacheType::kF32:
      for (uint64_t i = 0; i < width; ++i) {
        uint32_t u = format::LoadU32(src + 4 * i);
        std::memcpy(&out[i], &u, 4);
      }
      return;
    case CacheType::kF16:
      for (uint64_t i = 0; i < width; ++i) out[i] = F16ToF32(format::LoadU16(src + 2 * i));
      return;
    case CacheType::kBF16:
      for (uint64_t i = 0; i < width; ++i) out[i] = Bf16ToF32(format::LoadU16(src + 2 * i));
      return;
    case CacheType::kQ8_0:
      for (uint64_t b = 0; b < width / kQ8Block; ++b) {
        const uint8_t* blk = src + b * kQ8BlockBytes;
        float d = F16ToF32(format::LoadU16(blk));
        for (uint64_t i = 0; i < kQ8Block; ++i) out[b * kQ8Block + i] = d * static_cast<int8_t>(blk[2 + i]);
      }
      return;
  }
}

void EncodeRow(CacheType t, const float* src, uint64_t width, uint8_t* out) {
  switch (t) {
    case CacheType::kF32:
      for (uint64_t i = 0; i < width; ++i) {
        uint32_t u;
        std::memcpy(&u, &src[i], 4);
        format::StoreU32(out + 4 * i, u);
      }
      return;
    case CacheType::kF16:
      for (uint64_t i = 0; i < width; ++i) format::StoreU16(out + 2 * i, F32ToF16(src[i]));
      return;
    case CacheType::kBF16:
      for (uint64_t i = 0; i < width; ++i) format::StoreU16(out + 2 * i, F32ToBf16(src[i]));
      return;
    case CacheType::kQ8_0:
      for (uint64_t b = 0; b < width / kQ8Block; ++b) {
        const float* x = src + b * kQ8Block;
        uint8_t* blk = out + b * kQ8BlockBytes;
        float amax = 0;
        for (uint64_t i = 0; i < kQ8Block; ++i) amax = std::max(amax, std::fabs(x[i]));
        float d = amax / 127.0f;
        float id = d != 0 ? 1.0f / d : 0.0f;
        format::StoreU16(blk, F32ToF16(d));
        for (uint64_t i = 0; i < kQ8Block; ++i)
          blk[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(x[i] * id)));
      }
      return;
  }
}

namespace {
Status ParseCache(Cursor& c, const std::string& what, StateLayout* sp);
}  // namespace

Status ParseState(File& file, const std::string& path, StateLayout* out) {
  StateLayout s;
  KVFILE_RETURN_IF_ERROR(file.Size(&s.file_size));
  std::string what = path;
  Cursor c(file, s.file_size, what);
  uint32_t magic = 0;
  KVFILE_RETURN_IF_ERROR(c.U32(&magic, "magic"));
  if (magic != kMagicSequence && magic != kMagicSession)
    return Status::Corruption(path + ": not a llama.cpp state file (magic is not 'ggsq' or 'ggsn')");
  s.kind = magic == kMagicSequence ? FileKind::kSequence : FileKind::kSession;
  what = path + ": " + KindName(s.kind);
  KVFILE_RETURN_IF_ERROR(c.U32(&s.version, "version"));
  uint32_t want = s.kind == FileKind::kSequence ? kSequenceVersion : kSessionVersion;
  if (s.version != want)
    return Status::Unsupported(what + " version " + std::to_string(s.version) + " (kvfile reads version " +
                               std::to_string(want) + ", the one of llama.cpp v0.5.0)");
  uint32_t n_tokens = 0;
  KVFILE_RETURN_IF_ERROR(c.U32(&n_tokens, "token count"));
  if (uint64_t{n_tokens} * 4 > c.left())
    return Status::Corruption(what + ": truncated: " + std::to_string(n_tokens) + " token ids need " +
                              std::to_string(uint64_t{n_tokens} * 4) + " bytes, " + std::to_string(c.left()) +
                              " are left");
  std::vector<int32_t> raw(n_tokens);
  for (uint32_t i = 0; i < n_tokens; ++i) KVFILE_RETURN_IF_ERROR(c.I32(&raw[i], "token id"));
  size_t first = 0, count = n_tokens;
  if (n_tokens > 0 && raw[0] == kServerTokensMarker) {
    // llama-server's serialized token record: marker, version, n, the n
    // ids, the media chunk count (then the chunks, which kvfile does not
    // import).
    std::string rec = what + ": llama-server token record";
    if (n_tokens < 4 || static_cast<uint32_t>(raw[1]) != kServerTokensVersion)
      return Status::Unsupported(rec + (n_tokens < 2 ? " without a version" : " version " +
                                 std::to_string(static_cast<uint32_t>(raw[1]))) + " (kvfile reads version " +
                                 std::to_string(kServerTokensVersion) + ")");
    uint64_t n = static_cast<uint32_t>(raw[2]);
    if (n + 4 > n_tokens)
      return Status::Corruption(rec + ": " + std::to_string(n) + " token ids in a record of " +
                                std::to_string(n_tokens) + " values");
    if (raw[3 + n] != 0)
      return Status::Unsupported(rec + ": " + std::to_string(static_cast<uint32_t>(raw[3 + n])) +
                                 " media chunks (kvfile imports text tokens only)");
    if (n + 4 != n_tokens)
      return Status::Corruption(rec + ": " + std::to_string(n_tokens - n - 4) + " values after the record");
    s.server_tokens = true;
    first = 3;
    count = n;
  }
  s.tokens.resize(count);
  for (size_t i = 0; i < count; ++i) {
    int32_t t = raw[first + i];
    if (t < 0) return Status::Corruption(what + ": token " + std::to_string(i) + " has the negative id " + std::to_string(t));
    s.tokens[i] = static_cast<uint32_t>(t);
  }
  if (s.kind == FileKind::kSession) {
    uint32_t len = 0;
    KVFILE_RETURN_IF_ERROR(c.U32(&len, "architecture length"));
    if (len == 0 || len > kMaxArch)
      return Status::Corruption(what + ": architecture name of " + std::to_string(len) + " bytes (1 to " +
                                std::to_string(kMaxArch) + " expected)");
    s.arch.resize(len);
    KVFILE_RETURN_IF_ERROR(c.Read(s.arch.data(), len, "architecture name"));
    Status st = CheckArch(s.arch);
    if (!st.ok()) return Status::Corruption(what + ": " + st.message());
  }
  KVFILE_RETURN_IF_ERROR(ParseCache(c, what, &s));
  s.cache_layers = {s.layers};
  // A second cache (llama.cpp's iSWA models) begins with the same stream
  // count; anything else after the first cache is trailing bytes.
  while (c.left() >= 4 && s.cache_layers.size() < kMaxCaches) {
    uint8_t b[4];
    KVFILE_RETURN_IF_ERROR(file.ReadAt(c.pos(), b, 4));
    if (format::LoadU32(b) != s.n_stream) break;
    std::string cw = what + ": cache " + std::to_string(s.cache_layers.size()) + " (from byte " +
                     std::to_string(c.pos()) + ")";
    StateLayout t;
    KVFILE_RETURN_IF_ERROR(ParseCache(c, cw, &t));
    if (t.cells != s.cells || t.stream != s.stream)
      return Status::Unsupported(cw + ": holds " + std::to_string(t.cells) + " cells in stream " +
                                 std::to_string(t.stream) + ", the first cache " + std::to_string(s.cells) +
                                 " in stream " + std::to_string(s.stream) +
                                 ": a sliding-window cache (llama.cpp iSWA) that dropped the positions outside its "
                                 "window; kvfile stores every position in every layer");
    if (t.seq_id != s.seq_id || t.first_pos != s.first_pos)
      return Status::Unsupported(cw + ": cells of sequence " + std::to_string(t.seq_id) + " from position " +
                                 std::to_string(t.first_pos) + ", the first cache's of sequence " +
                                 std::to_string(s.seq_id) + " from " + std::to_string(s.first_pos) +
                                 " (kvfile needs the same cells in both caches)");
    if (t.v_trans != s.v_trans || t.k_width != s.k_width || t.v_width != s.v_width ||
        t.k[0].type != s.k[0].type || t.v[0].type != s.v[0].type)
      return Status::Unsupported(cw + ": K " + CacheTypeName(t.k[0].type) + " x " + std::to_string(t.k_width) +
                                 ", V " + CacheTypeName(t.v[0].type) + " x " + std::to_string(t.v_width) +
                                 (t.v_trans ? " transposed" : "") + " differ from the first cache's (K " +
                                 CacheTypeName(s.k[0].type) + " x " + std::to_string(s.k_width) + ", V " +
                                 CacheTypeName(s.v[0].type) + " x " + std::to_string(s.v_width) +
                                 (s.v_trans ? " transposed" : "") + "); kvfile needs the same shape in every layer");
    if (s.layers + t.layers > kMaxLayers)
      return Status::Corruption(cw + ": " + std::to_string(s.layers + t.layers) + " layers in all (1 to " +
                                std::to_string(kMaxLayers) + " expected)");
    s.layers += t.layers;
    s.cache_layers.push_back(t.layers);
    s.k.insert(s.k.end(), t.k.begin(), t.k.end());
    s.v.insert(s.v.end(), t.v.begin(), t.v.end());
  }
  if (c.left() != 0)
    return Status::Corruption(what + ": " + std::to_string(c.left()) + " bytes after the end of the cache data at byte " +
                              std::to_string(c.pos()));
  if (s.tokens.size() != s.cells)
    return Status::Unsupported(what + ": " + std::to_string(s.tokens.size()) + " token ids for " +
                               std::to_string(s.cells) + " cache cells (kvfile stores one token id per cell)");
  *out = std::move(s);
  return Status::OK();
}

Status CheckArch(std::string_view arch) {
  if (arch.empty() || arch.size() > kMaxArch)
    return Status::InvalidArgument("architecture name of " + std::to_string(arch.size()) + " bytes (1 to " +
                                   std::to_string(kMaxArch) + " expected)");
  for (char ch : arch)
    if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.'))
      return Status::InvalidArgument("architecture name has a byte outside [a-z0-9._-]");
  return Status::OK();
}

const char* RotationName(Rotation r) {
  switch (r) {
    case Rotation::kNo: return "no";
    case Rotation::kYes: return "yes";
    case Rotation::kUnknown: return "unknown";
  }
  return "?";
}

bool RotatesRows(CacheType t, uint64_t head_size) { return IsQuantized(t) && head_size > 0 && head_size % 64 == 0; }

uint32_t RotationBlock(bool v, uint64_t head_size) {
  if (v) return 64;
  uint32_t n = 64;
  while (n < (uint32_t{1} << 30) && head_size % (2 * n) == 0) n *= 2;
  return n;
}

void Hadamard(float* x, uint64_t width, uint32_t block) {
  // The fast transform of Sylvester's matrix (entry (i, j) is
  // (-1)^popcount(i & j)), scaled by 1/sqrt(block): the matrix ggml_gen_hadamard builds.
  const float scale = 1.0f / std::sqrt(static_cast<float>(block));
  for (uint64_t b0 = 0; b0 + block <= width; b0 += block) {
    float* y = x + b0;
    for (uint32_t h = 1; h < block; h *= 2)
      for (uint32_t i = 0; i < block; i += 2 * h)
        for (uint32_t j = i; j < i + h; ++j) {
          float a = y[j], b = y[j + h];
          y[j] = a + b;
          y[j + h] = a - b;
        }
    for (uint32_t i = 0; i < block; ++i) y[i] *= scale;
  }
}

namespace {

// One cache's part of a state file (llama_kv_cache::state_write): the
// stream count, each stream's cells and, for the one stream holding cells,
// their positions and sequence ids, v_trans and every layer's K and V.
// Fills the cache's fields of `s`; errors begin with `what`.
Status ParseCache(Cursor& c, const std::string& what, StateLayout* sp) {
  StateLayout& s = *sp;
  KVFILE_RETURN_IF_ERROR(c.U32(&s.n_stream, "cache stream count"));
  if (s.n_stream == 0 || s.n_stream > kMaxStreams)
    return Status::Corruption(what + ": " + std::to_string(s.n_stream) + " cache streams (1 to " +
                              std::to_string(kMaxStreams) + " expected)");
  bool found = false;
  for (uint32_t st = 0; st < s.n_stream; ++st) {
    uint32_t cells = 0;
    KVFILE_RETURN_IF_ERROR(c.U32(&cells, "cell count"));
    if (cells == 0) continue;
    if (found)
      return Status::Unsupported(what + ": more than one cache stream holds cells (kvfile imports one sequence)");
    found = true;
    s.stream = st;
    s.cells = cells;
    if (uint64_t{cells} * 12 > c.left())
      return Status::Corruption(what + ": truncated: " + std::to_string(cells) + " cells need at least " +
                                std::to_string(uint64_t{cells} * 12) + " bytes, " + std::to_string(c.left()) +
                                " are left");
    for (uint32_t i = 0; i < cells; ++i) {
      int32_t pos = 0, seq = 0;
      uint32_t n_seq = 0;
      KVFILE_RETURN_IF_ERROR(c.I32(&pos, "cell position"));
      KVFILE_RETURN_IF_ERROR(c.U32(&n_seq, "cell sequence count"));
      if (n_seq != 1)
        return Status::Unsupported(what + ": cell " + std::to_string(i) + " belongs to " + std::to_string(n_seq) +
                                   " sequences (kvfile imports cells of exactly one)");
      KVFILE_RETURN_IF_ERROR(c.I32(&seq, "cell sequence id"));
      if (i == 0) {
        s.first_pos = pos;
        s.seq_id = seq;
        if (pos < 0 || seq < 0)
          return Status::Corruption(what + ": cell 0 has position " + std::to_string(pos) + ", sequence " +
                                    std::to_string(seq));
      } else if (seq != s.seq_id || int64_t{pos} != int64_t{s.first_pos} + i) {
        return Status::Unsupported(what + ": cell " + std::to_string(i) + " has position " + std::to_string(pos) +
                                   " of sequence " + std::to_string(seq) + "; kvfile imports positions " +
                                   std::to_string(s.first_pos) + ", " + std::to_string(s.first_pos + 1) +
                                   ", ... of one sequence");
      }
    }
    uint32_t v_trans = 0;
    KVFILE_RETURN_IF_ERROR(c.U32(&v_trans, "v_trans"));
    if (v_trans > 1) return Status::Corruption(what + ": v_trans is " + std::to_string(v_trans) + " (0 or 1 expected)");
    s.v_trans = v_trans == 1;
    KVFILE_RETURN_IF_ERROR(c.U32(&s.layers, "layer count"));
    if (s.layers == 0 || s.layers > kMaxLayers)
      return Status::Corruption(what + ": " + std::to_string(s.layers) + " layers (1 to " +
                                std::to_string(kMaxLayers) + " expected)");
    // K of every layer, then V of every layer.
    std::string prev;  // the block before, "<what>: layer L K: row size R x C cells"
    for (int part = 0; part < 2; ++part) {
      bool is_v = part == 1;
      const char* name = is_v ? "V" : "K";
      for (uint32_t l = 0; l < s.layers; ++l) {
        std::string at = what + ": layer " + std::to_string(l) + " " + name;
        int32_t type_id = 0;
        uint64_t header_at = c.pos();
        KVFILE_RETURN_IF_ERROR(c.I32(&type_id, "cache type"));
        std::optional<CacheType> type = TypeFromId(type_id);
        if (!type && !prev.empty())
          // The previous block's size led here: name it, not this header.
          return Status::Corruption(prev + " ends at byte " + std::to_string(header_at) + ", where " + name +
                                    " of layer " + std::to_string(l) + " would begin but ggml type " +
                                    std::to_string(type_id) + " is: that size or the header after it is damaged");
        if (!type)
          return Status::Unsupported(at + ": ggml type " + std::to_string(type_id) +
                                     " (kvfile reads f32, f16, bf16 and q8_0 caches)");
        uint64_t width = 0, bytes = 0;
        if (is_v && s.v_trans) {
          uint32_t el = 0, n_embd = 0;
          KVFILE_RETURN_IF_ERROR(c.U32(&el, "element size"));
          KVFILE_RETURN_IF_ERROR(c.U32(&n_embd, "value width"));
          if (IsQuantized(*type) || el != ElementBytes(*type))
            return Status::Corruption(at + ": transposed " + CacheTypeName(*type) + " values of element size " +
                                      std::to_string(el));
          if (n_embd == 0) return Status::Corruption(at + ": value width 0");
          width = n_embd;
          bytes = uint64_t{n_embd} * el;
        } else {
          uint64_t row = 0;
          KVFILE_RETURN_IF_ERROR(c.U64(&row, "row size"));
          std::optional<uint64_t> w = WidthOf(*type, row);
          if (!w || *w > 0xFFFFFFFFu)
            return Status::Corruption(at + ": row size " + std::to_string(row) + " is not a whole number of " +
                                      CacheTypeName(*type) + " values");
          width = *w;
          bytes = row;
        }
        uint32_t& want_w = is_v ? s.v_width : s.k_width;
        std::vector<LayerBlock>& blocks = is_v ? s.v : s.k;
        if (l == 0) {
          want_w = static_cast<uint32_t>(width);
        } else if (width != want_w || *type != blocks[0].type) {
          return Status::Unsupported(at + ": " + CacheTypeName(*type) + " x " + std::to_string(width) +
                                     " differs from layer 0 (" + CacheTypeName(blocks[0].type) + " x " +
                                     std::to_string(want_w) + "); kvfile needs the same shape in every layer");
        }
        blocks.push_back({*type, c.pos()});
        // bytes is below 2^35 and cells below 2^32: their product can
        // overflow 64 bits, so the check divides.
        if (bytes > c.left() / cells)
          return Status::Corruption(at + ": truncated: " + std::to_string(cells) + " cells of " +
                                    std::to_string(bytes) + " bytes at byte " + std::to_string(c.pos()) + ", " +
                                    std::to_string(c.left()) + " bytes are left");
        KVFILE_RETURN_IF_ERROR(c.Skip(bytes * cells, "cache rows"));
        prev = at + ": " + (is_v && s.v_trans ? "value width " + std::to_string(width) + " (x " +
                                                    std::to_string(bytes / width) + " bytes)"
                                              : "row size " + std::to_string(bytes)) +
               " x " + std::to_string(cells) + " cells";
      }
    }
  }
  if (!found) return Status::Corruption(what + ": no cache stream holds cells (nothing to import)");
  return Status::OK();
}

}  // namespace

Status ReadCells(File& file, const StateLayout& s, bool v, uint32_t layer, uint32_t c0, uint32_t c1, float* out) {
  const LayerBlock& b = v ? s.v[layer] : s.k[layer];
  uint64_t width = v ? s.v_width : s.k_width;
  uint64_t n = c1 - c0;
  std::vector<uint8_t> raw;
  if (v && s.v_trans) {
    uint64_t el = ElementBytes(b.type);
    raw.resize(n * width * el);
    std::vector<ReadRequest> reqs(width);
    for (uint64_t j = 0; j < width; ++j)
      reqs[j] = {b.offset + (j * s.cells + c0) * el, raw.data() + j * n * el, static_cast<size_t>(n * el)};
    KVFILE_RETURN_IF_ERROR(file.ReadBatch(reqs));
    std::vector<float> col(n);
    for (uint64_t j = 0; j < width; ++j) {
      DecodeRow(b.type, raw.data() + j * n * el, n, col.data());
      for (uint64_t i = 0; i < n; ++i) out[i * width + j] = col[i];
    }
    return Status::OK();
  }
  uint64_t row = RowBytes(b.type, width);
  raw.resize(n * row);
  KVFILE_RETURN_IF_ERROR(file.ReadAt(b.offset + c0 * row, raw.data(), raw.size()));
  for (uint64_t i = 0; i < n; ++i) DecodeRow(b.type, raw.data() + i * row, width, out + i * width);
  return Status::OK();
}

bool IsRowMajor(const StateLayout& s, bool v) { return !(v && s.v_trans); }

Status ReadCellBytes(File& file, const StateLayout& s, bool v, uint32_t layer, uint32_t c0, uint32_t c1,
                     uint8_t* out) {
  const LayerBlock& b = v ? s.v[layer] : s.k[layer];
  uint64_t row = RowBytes(b.type, v ? s.v_width : s.k_width);
  return file.ReadAt(b.offset + c0 * row, out, (c1 - c0) * row);
}

// ---- Provenance in the model id ----------------------------------------------------------

std::string FormatModelId(const Provenance& p) {
  std::string s(kModelIdPrefix);
  s += (p.kind == FileKind::kSequence ? "seq" : "session") + std::to_string(p.version);
  if (!p.arch.empty()) s += " arch=" + p.arch;
  s += std::string(" k=") + CacheTypeName(p.k_type) + " v=" + CacheTypeName(p.v_type);
  s += " v_trans=" + std::to_string(p.v_trans ? 1 : 0);
  s += " stream=" + std::to_string(p.stream) + "/" + std::to_string(p.n_stream);
  s += " seq=" + std::to_string(p.seq_id) + " pos=" + std::to_string(p.first_pos);
  if (p.server_tokens) s += " tokens=server";
  if (p.cache_layers.size() > 1) {
    s += " caches=";
    for (size_t i = 0; i < p.cache_layers.size(); ++i) s += (i ? "+" : "") + std::to_string(p.cache_layers[i]);
  }
  s += std::string(" rotated=") + RotationName(p.rotated);
  return s;
}

Rotation StreamRotation(const Provenance& p, bool v, uint64_t head_size) {
  if (!RotatesRows(v ? p.v_type : p.k_type, head_size)) return Rotation::kNo;
  return p.rotated;
}

std::optional<Provenance> ParseModelId(std::string_view id) {
  if (!id.starts_with(kModelIdPrefix)) return std::nullopt;
  id.remove_prefix(kModelIdPrefix.size());
  Provenance p;
  auto number = [](std::string_view v, int64_t lo, int64_t hi, int64_t* out) {
    if (v.empty() || v.size() > 10) return false;
    int64_t x = 0;
    for (char ch : v) {
      if (ch < '0' || ch > '9') return false;
      x = x * 10 + (ch - '0');
    }
    if (x < lo || x > hi) return false;
    *out = x;
    return true;
  };
  bool first = true;
  while (!id.empty()) {
    size_t sp = id.find(' ');
    std::string_view item = id.substr(0, sp);
    id = sp == std::string_view::npos ? std::string_view() : id.substr(sp + 1);
    int64_t x = 0;
    if (first) {
      first = false;
      if (item.starts_with("seq") && number(item.substr(3), 0, 0xFFFFFFFF, &x)) p.kind = FileKind::kSequence;
      else if (item.starts_with("session") && number(item.substr(7), 0, 0xFFFFFFFF, &x)) p.kind = FileKind::kSession;
      else return std::nullopt;
      p.version = static_cast<uint32_t>(x);
      continue;
    }
    size_t eq = item.find('=');
    if (eq == std::string_view::npos) return std::nullopt;
    std::string_view key = item.substr(0, eq), val = item.substr(eq + 1);
    if (key == "arch") {
      p.arch = std::string(val);
    } else if (key == "k" || key == "v") {
      std::optional<CacheType> t = CacheTypeFromName(val);
      if (!t) return std::nullopt;
      (key == "k" ? p.k_type : p.v_type) = *t;
    } else if (key == "v_trans") {
      if (!number(val, 0, 1, &x)) return std::nullopt;
      p.v_trans = x == 1;
    } else if (key == "stream") {
      size_t slash = val.find('/');
      int64_t n = 0;
      if (slash == std::string_view::npos || !number(val.substr(0, slash), 0, kMaxStreams - 1, &x) ||
          !number(val.substr(slash + 1), 1, kMaxStreams, &n) || x >= n)
        return std::nullopt;
      p.stream = static_cast<uint32_t>(x);
      p.n_stream = static_cast<uint32_t>(n);
    } else if (key == "tokens") {
      if (val != "server") return std::nullopt;
      p.server_tokens = true;
    } else if (key == "seq" || key == "pos") {
      if (!number(val, 0, 0x7FFFFFFF, &x)) return std::nullopt;
      (key == "seq" ? p.seq_id : p.first_pos) = static_cast<int32_t>(x);
    } else if (key == "caches") {
      p.cache_layers.clear();
      while (!val.empty()) {
        size_t plus = val.find('+');
        if (!number(val.substr(0, plus), 1, kMaxLayers, &x) || p.cache_layers.size() == kMaxCaches)
          return std::nullopt;
        p.cache_layers.push_back(static_cast<uint32_t>(x));
        val = plus == std::string_view::npos ? std::string_view() : val.substr(plus + 1);
      }
      if (p.cache_layers.size() < 2) return std::nullopt;
    } else if (key == "rotated") {
      if (val == "no") p.rotated = Rotation::kNo;
      else if (val == "yes") p.rotated = Rotation::kYes;
      else p.rotated = Rotation::kUnknown;  // "unknown", or a value this reader does not know
    }
    // Other keys are ignored.
  }
  return first ? std::nullopt : std::optional<Provenance>(p);
}

// ---- Writing ----------------------------------------------------------------------------------

namespace {
// The layers of each cache a file holds.
std::vector<uint32_t> Caches(const WriteSpec& w) {
  return w.cache_layers.empty() ? std::vector<uint32_t>{w.layers} : w.cache_layers;
}
}  // namespace

Status CheckWriteSpec(const WriteSpec& w) {
  if (w.layers == 0 || w.layers > kMaxLayers) return Status::InvalidArgument("layer count out of range");
  if (!w.cache_layers.empty()) {
    uint64_t sum = 0;
    for (uint32_t n : w.cache_layers) sum += n;
    if (w.cache_layers.size() > kMaxCaches || sum != w.layers ||
        std::count(w.cache_layers.begin(), w.cache_layers.end(), 0u) > 0)
      return Status::InvalidArgument("the caches' layers (caches=) do not add up to the " + std::to_string(w.layers) +
                                     " layers");
  }
  if (w.n_stream == 0 || w.n_stream > kMaxStreams || w.stream >= w.n_stream)
    return Status::InvalidArgument("cache stream " + std::to_string(w.stream) + " of " + std::to_string(w.n_stream) +
                                   " (a stream below the stream count, at most " + std::to_string(kMaxStreams) +
                                   ", expected)");
  if (w.kind == FileKind::kSession) {
    if (w.arch.empty()) return Status::InvalidArgument("a session file needs the model architecture name (--arch)");
    Status st = CheckArch(w.arch);
    if (!st.ok()) return Status::InvalidArgument("--arch '" + w.arch + "': " + st.message());
  }
  for (auto [t, width, name] : {std::tuple{w.k_type, w.k_width, "K"}, std::tuple{w.v_type, w.v_width, "V"}}) {
    if (width == 0) return Status::InvalidArgument(std::string(name) + " width 0");
    if (t == CacheType::kQ8_0 && width % kQ8Block)
      return Status::InvalidArgument(std::string(name) + " has " + std::to_string(width) +
                                     " values per token: q8_0 needs a multiple of 32");
  }
  if (w.v_trans && IsQuantized(w.v_type))
    return Status::InvalidArgument("a transposed V cache (--v-trans 1) cannot be q8_0 (llama.cpp quantizes V only "
                                   "with flash attention, which does not transpose it)");
  return Status::OK();
}

namespace {
// Magic, version, token ids (llama-server's record: 16 bytes more) and
// (session) the architecture name.
uint64_t TopBytes(const WriteSpec& w, uint64_t tokens) {
  uint64_t n = 12 + tokens * 4 + (w.server_tokens ? 16 : 0);
  if (w.kind == FileKind::kSession) n += 4 + w.arch.size();
  return n;
}
// A cache's stream count, the cell counts up to the one holding cells,
// cells, v_trans, layer count.
uint64_t CacheHeadBytes(const WriteSpec& w, uint64_t tokens) {
  return 4 + 4 * (uint64_t{w.stream} + 1) + tokens * 12 + 8;
}
uint64_t KLayerBytes(const WriteSpec& w, uint64_t tokens) { return 12 + tokens * RowBytes(w.k_type, w.k_width); }
// type + row size, or (transposed) type + element size + width: 12 bytes either way.
uint64_t VLayerBytes(const WriteSpec& w, uint64_t tokens) { return 12 + tokens * RowBytes(w.v_type, w.v_width); }
// A cache of `layers` layers, with the cell counts (0) of the streams after
// the one holding cells last.
uint64_t CacheBytes(const WriteSpec& w, uint64_t tokens, uint32_t layers) {
  return CacheHeadBytes(w, tokens) + layers * (KLayerBytes(w, tokens) + VLayerBytes(w, tokens)) +
         4 * uint64_t{w.n_stream - w.stream - 1};
}
// The cache holding a layer, and the layer's index in it.
std::pair<size_t, uint32_t> CacheOf(const std::vector<uint32_t>& caches, uint32_t layer) {
  size_t c = 0;
  while (c + 1 < caches.size() && layer >= caches[c]) layer -= caches[c++];
  return {c, layer};
}
}  // namespace

uint64_t StateFileSize(const WriteSpec& w, uint64_t tokens) {
  uint64_t n = TopBytes(w, tokens);
  for (uint32_t layers : Caches(w)) n += CacheBytes(w, tokens, layers);
  return n;
}

StateWriter::StateWriter(File* file, WriteSpec spec, uint64_t tokens)
    : file_(file), spec_(std::move(spec)), cells_(tokens) {
  meta_end_ = TopBytes(spec_, cells_);
}

uint64_t StateWriter::CacheStart(size_t cache) const {
  std::vector<uint32_t> caches = Caches(spec_);
  uint64_t at = meta_end_;
  for (size_t c = 0; c < cache; ++c) at += CacheBytes(spec_, cells_, caches[c]);
  return at;
}
uint64_t StateWriter::KOffset(uint32_t layer) const {
  auto [c, l] = CacheOf(Caches(spec_), layer);
  return CacheStart(c) + CacheHeadBytes(spec_, cells_) + l * KLayerBytes(spec_, cells_);
}
uint64_t StateWriter::VOffset(uint32_t layer) const {
  std::vector<uint32_t> caches = Caches(spec_);
  auto [c, l] = CacheOf(caches, layer);
  return CacheStart(c) + CacheHeadBytes(spec_, cells_) + caches[c] * KLayerBytes(spec_, cells_) +
         l * VLayerBytes(spec_, cells_);
}

Status StateWriter::Header(const std::vector<uint32_t>& tokens) {
  std::vector<uint8_t> b;
  auto u32 = [&b](uint32_t v) {
    uint8_t x[4];
    format::StoreU32(x, v);
    b.insert(b.end(), x, x + 4);
  };
  auto u64 = [&b](uint64_t v) {
    uint8_t x[8];
    format::StoreU64(x, v);
    b.insert(b.end(), x, x + 8);
  };
  bool seq = spec_.kind == FileKind::kSequence;
  u32(seq ? kMagicSequence : kMagicSession);
  u32(seq ? kSequenceVersion : kSessionVersion);
  if (spec_.server_tokens) {
    u32(static_cast<uint32_t>(cells_ + 4));
    u32(static_cast<uint32_t>(kServerTokensMarker));
    u32(kServerTokensVersion);
  }
  u32(static_cast<uint32_t>(cells_));
  for (uint32_t t : tokens) u32(t);
  if (spec_.server_tokens) u32(0);  // no media chunks
  if (!seq) {
    u32(static_cast<uint32_t>(spec_.arch.size()));
    b.insert(b.end(), spec_.arch.begin(), spec_.arch.end());
  }
  KVFILE_RETURN_IF_ERROR(file_->WriteAt(0, b.data(), b.size()));
  std::vector<uint32_t> caches = Caches(spec_);
  for (size_t c = 0; c < caches.size(); ++c) {
    b.clear();
    u32(spec_.n_stream);
    for (uint32_t s = 0; s < spec_.stream; ++s) u32(0);
    u32(static_cast<uint32_t>(cells_));
    for (uint64_t i = 0; i < cells_; ++i) {
      u32(static_cast<uint32_t>(spec_.first_pos + static_cast<int64_t>(i)));
      u32(1);
      u32(static_cast<uint32_t>(spec_.seq_id));
    }
    u32(spec_.v_trans ? 1 : 0);
    u32(caches[c]);
    KVFILE_RETURN_IF_ERROR(file_->WriteAt(CacheStart(c), b.data(), b.size()));
    if (spec_.stream + 1 < spec_.n_stream) {
      b.assign(4 * uint64_t{spec_.n_stream - spec_.stream - 1}, 0);
      KVFILE_RETURN_IF_ERROR(file_->WriteAt(CacheStart(c + 1) - b.size(), b.data(), b.size()));
    }
  }
  // Each layer's own header.
  for (uint32_t l = 0; l < spec_.layers; ++l) {
    b.clear();
    u32(static_cast<uint32_t>(spec_.k_type));
    u64(RowBytes(spec_.k_type, spec_.k_width));
    KVFILE_RETURN_IF_ERROR(file_->WriteAt(KOffset(l), b.data(), b.size()));
    b.clear();
    u32(static_cast<uint32_t>(spec_.v_type));
    if (spec_.v_trans) {
      u32(ElementBytes(spec_.v_type));
      u32(spec_.v_width);
    } else {
      u64(RowBytes(spec_.v_type, spec_.v_width));
    }
    KVFILE_RETURN_IF_ERROR(file_->WriteAt(VOffset(l), b.data(), b.size()));
  }
  return Status::OK();
}

Status StateWriter::Rows(bool v, uint32_t layer, uint64_t c0, uint64_t n, const float* values) {
  CacheType t = v ? spec_.v_type : spec_.k_type;
  uint64_t width = v ? spec_.v_width : spec_.k_width;
  uint64_t base = (v ? VOffset(layer) : KOffset(layer)) + 12;
  if (v && spec_.v_trans) {
    uint64_t el = ElementBytes(t);
    buf_.resize(n * width * el);
    std::vector<float> col(n);
    for (uint64_t j = 0; j < width; ++j) {
      for (uint64_t i = 0; i < n; ++i) col[i] = values[i * width + j];
      EncodeRow(t, col.data(), n, buf_.data() + j * n * el);
    }
    for (uint64_t j = 0; j < width; ++j)
      KVFILE_RETURN_IF_ERROR(file_->WriteAt(base + (j * cells_ + c0) * el, buf_.data() + j * n * el, n * el));
    return Status::OK();
  }
  uint64_t row = RowBytes(t, width);
  buf_.resize(n * row);
  for (uint64_t i = 0; i < n; ++i) EncodeRow(t, values + i * width, width, buf_.data() + i * row);
  return file_->WriteAt(base + c0 * row, buf_.data(), buf_.size());
}

Status StateWriter::RawRows(bool v, uint32_t layer, uint64_t c0, uint64_t n, const uint8_t* rows) {
  uint64_t row = RowBytes(v ? spec_.v_type : spec_.k_type, v ? spec_.v_width : spec_.k_width);
  uint64_t base = (v ? VOffset(layer) : KOffset(layer)) + 12;
  return file_->WriteAt(base + c0 * row, rows, n * row);
}

// ---- GGUF model metadata -------------------------------------------------------------------

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF"
enum GgufType : uint32_t { kGgufU32 = 4, kGgufI32 = 5, kGgufString = 8, kGgufArray = 9, kGgufU64 = 10 };

// Bytes of one value of a fixed-size GGUF type, 0 for a string or array,
// nullopt for a type id GGUF does not have.
std::optional<uint64_t> GgufFixedSize(uint32_t type) {
  static constexpr uint64_t kSizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
  if (type >= std::size(kSizes)) return std::nullopt;
  return kSizes[type];
}

Status GgufString(Cursor& c, const std::string& what, const char* field, std::string* out) {
  uint64_t n = 0;
  KVFILE_RETURN_IF_ERROR(c.U64(&n, field));
  if (n > c.left() || n > (uint64_t{1} << 20))
    return Status::Corruption(what + ": " + field + " of " + std::to_string(n) + " bytes (" + std::to_string(c.left()) +
                              " are left)");
  out->resize(static_cast<size_t>(n));
  return c.Read(out->data(), n, field);
}

// Skips one value of `type` (arrays: of one level, GGUF has no deeper ones).
Status GgufSkip(Cursor& c, const std::string& what, const std::string& key, uint32_t type, bool in_array) {
  std::optional<uint64_t> size = GgufFixedSize(type);
  if (!size || (in_array && type == kGgufArray))
    return Status::Corruption(what + ": key " + key + " has value type " + std::to_string(type));
  if (*size) return c.Skip(*size, "metadata value");
  if (type == kGgufString) {
    uint64_t n = 0;
    KVFILE_RETURN_IF_ERROR(c.U64(&n, "string length"));
    return c.Skip(n, "string");
  }
  uint32_t elem = 0;
  uint64_t n = 0;
  KVFILE_RETURN_IF_ERROR(c.U32(&elem, "array type"));
  KVFILE_RETURN_IF_ERROR(c.U64(&n, "array length"));
  std::optional<uint64_t> esize = GgufFixedSize(elem);
  if (!esize || elem == kGgufArray)
    return Status::Corruption(what + ": key " + key + " is an array of value type " + std::to_string(elem));
  if (*esize) {
    if (n > c.left() / *esize)
      return Status::Corruption(what + ": key " + key + ": an array of " + std::to_string(n) + " values of " +
                                std::to_string(*esize) + " bytes, " + std::to_string(c.left()) + " bytes are left");
    return c.Skip(n * *esize, "array");
  }
  if (n > c.left() / 8)  // each string has at least its 8-byte length
    return Status::Corruption(what + ": key " + key + ": an array of " + std::to_string(n) + " strings, " +
                              std::to_string(c.left()) + " bytes are left");
  for (uint64_t i = 0; i < n; ++i) KVFILE_RETURN_IF_ERROR(GgufSkip(c, what, key, elem, true));
  return Status::OK();
}

}  // namespace

Status ReadModelHeads(File& file, const std::string& path, ModelHeads* out) {
  uint64_t size = 0;
  KVFILE_RETURN_IF_ERROR(file.Size(&size));
  std::string what = path + ": GGUF model";
  Cursor c(file, size, what);
  uint32_t magic = 0, version = 0;
  KVFILE_RETURN_IF_ERROR(c.U32(&magic, "magic"));
  if (magic != kGgufMagic) return Status::Corruption(path + ": not a GGUF model file (magic is not 'GGUF')");
  KVFILE_RETURN_IF_ERROR(c.U32(&version, "version"));
  if (version != 2 && version != 3)
    return Status::Unsupported(what + " version " + std::to_string(version) + " (kvfile reads versions 2 and 3)");
  uint64_t tensors = 0, keys = 0;
  KVFILE_RETURN_IF_ERROR(c.U64(&tensors, "tensor count"));
  KVFILE_RETURN_IF_ERROR(c.U64(&keys, "metadata key count"));
  // Every key needs at least its length and value type.
  if (keys > c.left() / 12)
    return Status::Corruption(what + ": " + std::to_string(keys) + " metadata keys, " + std::to_string(c.left()) +
                              " bytes are left");
  std::string arch;
  std::map<std::string, uint64_t> numbers;  // the unsigned integer values, by key
  for (uint64_t i = 0; i < keys; ++i) {
    std::string key;
    uint32_t type = 0;
    KVFILE_RETURN_IF_ERROR(GgufString(c, what, "metadata key", &key));
    KVFILE_RETURN_IF_ERROR(c.U32(&type, "value type"));
    if (key == "general.architecture" && type == kGgufString) {
      KVFILE_RETURN_IF_ERROR(GgufString(c, what, "general.architecture", &arch));
    } else if (type == kGgufU32 || type == kGgufI32) {
      uint32_t v = 0;
      KVFILE_RETURN_IF_ERROR(c.U32(&v, "metadata value"));
      if (type == kGgufU32 || v < 0x80000000u) numbers[key] = v;
    } else if (type == kGgufU64) {
      uint64_t v = 0;
      KVFILE_RETURN_IF_ERROR(c.U64(&v, "metadata value"));
      numbers[key] = v;
    } else {
      KVFILE_RETURN_IF_ERROR(GgufSkip(c, what, key, type, false));
    }
  }
  if (arch.empty()) return Status::Corruption(what + ": no general.architecture");
  auto get = [&](const std::string& name) -> std::optional<uint64_t> {
    auto it = numbers.find(arch + "." + name);
    if (it == numbers.end()) return std::nullopt;
    return it->second;
  };
  std::optional<uint64_t> embd = get("embedding_length"), heads = get("attention.head_count");
  std::optional<uint64_t> kl = get("attention.key_length"), vl = get("attention.value_length");
  std::optional<uint64_t> fallback;
  if (embd && heads && *heads > 0 && *embd % *heads == 0) fallback = *embd / *heads;
  ModelHeads m;
  m.arch = arch;
  for (auto [len, name, dst] : {std::tuple{kl, "key_length", &m.k_head}, std::tuple{vl, "value_length", &m.v_head}}) {
    std::optional<uint64_t> h = len ? len : fallback;
    if (!h)
      return Status::Unsupported(what + ": no " + arch + ".attention." + name + ", nor an " + arch +
                                 ".embedding_length that " + arch +
                                 ".attention.head_count (a number, not one per layer) divides: give --head-size");
    if (*h == 0 || *h > 65536)
      return Status::Corruption(what + ": " + arch + ".attention." + name + " is " + std::to_string(*h) +
                                " (1 to 65536 expected)");
    *dst = static_cast<uint32_t>(*h);
  }
  *out = std::move(m);
  return Status::OK();
}

}  // namespace kvfile::llama
