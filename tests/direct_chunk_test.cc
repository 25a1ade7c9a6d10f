// SPDX-License-Identifier: Apache-2.0
// Tests of chunks written whole without staging (src/writer/direct_chunk.h) and of
// the early writeback hint (src/writer/write_behind.h): a DirectChunk's bytes are
// the bytes Append() writes for the same rows, one append per chunk; it
// refuses to start over staged tokens; a failed write stops the writer and
// leaves the last sync's state; WriteBehind hints only the file the writer
// has open.
#include "writer/direct_chunk.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvfile/reader.h"
#include "kvfile/writer.h"
#include "support/fault_fs.h"
#include "support/testing_hooks.h"
#include "writer/write_behind.h"

namespace kvfile::internal {
namespace {

using format::ChunkLayout;
using format::SectionLayout;
using testing::FaultFs;
using testing::FsOp;

Geometry Mixed() {
  Geometry g;
  g.layers = 2;
  g.streams = {{"k", 2, 16, Dtype::kE4M3}, {"v", 1, 8, Dtype::kE5M2}, {"r", 1, 3, Dtype::kBF16}};
  return g;
}

// Stored rows of tokens [first, first + n): valid codes (never a NaN
// pattern), valid scales, finite bf16; one vector per (layer, stream) and
// one of scales per fp8 (layer, stream).
struct Rows {
  std::vector<uint32_t> tokens;
  std::vector<std::vector<uint8_t>> data;
  std::vector<std::vector<float>> scales;

  Rows(const Geometry& g, uint64_t first, uint32_t n) {
    for (uint32_t t = 0; t < n; ++t) tokens.push_back(static_cast<uint32_t>(500 + 3 * (first + t)));
    for (uint32_t l = 0; l < g.layers; ++l)
      for (const StreamSpec& s : g.streams) {
        const size_t rows = size_t{n} * s.rows_per_token, elems = rows * s.row_width;
        std::vector<uint8_t> d(elems * ElementSize(s.dtype));
        for (size_t i = 0; i < d.size(); ++i) {
          uint8_t v = static_cast<uint8_t>((first * 131 + i * 29 + l * 7) % 251);
          if (s.dtype == Dtype::kBF16 && i % 2 == 1) v = 0x3f;  // high bytes: finite bf16
          d[i] = (v & 0x7F) == 0x7F ? 0x11 : v;                 // no e4m3 NaN; e5m2 NaN/inf have 0x7C set
          if (s.dtype == Dtype::kE5M2 && (d[i] & 0x7C) == 0x7C) d[i] &= 0x3F;
        }
        data.push_back(std::move(d));
        std::vector<float> sc;
        if (IsFp8(s.dtype))
          for (size_t r = 0; r < rows; ++r) sc.push_back(0.25f * static_cast<float>(1 + (first + r) % 9));
        scales.push_back(std::move(sc));
      }
  }
  AppendBatch Batch(const Geometry& g) const {
    AppendBatch b;
    b.tokens = tokens;
    for (size_t k = 0; k < data.size(); ++k)
      b.blocks.push_back({g.streams[k % g.streams.size()].dtype, data[k].data(), scales[k].empty() ? nullptr : scales[k].data()});
    return b;
  }
  // Section k of a chunk of these rows, laid out as `layout` says.
  std::vector<uint8_t> Section(const ChunkLayout& layout, size_t k) const {
    const SectionLayout& sec = layout.sections[k];
    std::vector<uint8_t> out(sec.end - sec.offset, 0xEE);  // padding garbage: DirectChunk zeroes it
    std::memcpy(out.data(), data[k].data(), data[k].size());
    if (!scales[k].empty()) std::memcpy(out.data() + (sec.scales_offset - sec.offset), scales[k].data(), scales[k].size() * 4);
    return out;
  }
};

std::unique_ptr<Writer> Create(FaultFs& fs, const std::string& path, uint32_t chunk) {
  WriterOptions wo;
  wo.fs = &fs;
  wo.chunk_tokens = chunk;
  std::unique_ptr<Writer> w;
  Status st = hooks::CreateWriter(path, Mixed(), {"test/direct", 7}, wo, &w);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return w;
}

Status WriteDirect(Writer& w, const Rows& rows, uint32_t n) {
  DirectChunk dc;
  KVFILE_RETURN_IF_ERROR(dc.Begin(w, n));
  std::vector<std::vector<uint8_t>> sections;
  for (size_t k = 0; k < dc.layout().sections.size(); ++k) sections.push_back(rows.Section(dc.layout(), k));
  for (size_t k = 0; k < sections.size(); ++k) KVFILE_RETURN_IF_ERROR(dc.WriteSection(k, sections[k].data()));
  return dc.Finish(rows.tokens);
}

std::vector<uint8_t> Bytes(FaultFs& fs, const std::string& path) { return fs.Image()[path]; }

// Chunks of 8, 8 and a short 5: the same file, byte for byte, as three
// appends; the reader reads the rows back.
TEST(DirectChunkTest, SameBytesAsOneAppendPerChunk) {
  const Geometry g = Mixed();
  hooks::SetWriterSalt(0xD1EC7);
  FaultFs fs;
  const uint32_t sizes[] = {8, 8, 5};
  {
    auto w = Create(fs, "/staged.kv", 8);
    uint64_t first = 0;
    for (uint32_t n : sizes) {
      Rows rows(g, first, n);
      ASSERT_TRUE(w->Append(rows.Batch(g)).ok());
      first += n;
    }
    ASSERT_TRUE(w->Close().ok());
  }
  {
    auto w = Create(fs, "/direct.kv", 8);
    uint64_t first = 0;
    for (uint32_t n : sizes) {
      Status st = WriteDirect(*w, Rows(g, first, n), n);
      ASSERT_TRUE(st.ok()) << st.ToString();
      first += n;
    }
    EXPECT_EQ(w->token_count(), 21u);
    ASSERT_TRUE(w->Close().ok());
  }
  hooks::SetWriterSalt(0);
  std::vector<uint8_t> staged = Bytes(fs, "/staged.kv"), direct = Bytes(fs, "/direct.kv");
  ASSERT_GT(staged.size(), 3u * 4096);
  EXPECT_EQ(direct, staged);
  ReaderOptions ro;
  ro.fs = &fs;
  std::unique_ptr<Reader> r;
  ASSERT_TRUE(Reader::Open("/direct.kv", ro, &r).ok());
  ASSERT_EQ(r->token_count(), 21u);
  Rows last(g, 16, 5);
  std::vector<uint8_t> codes(5 * 2 * 16);
  std::vector<float> scales(5 * 2);
  ASSERT_TRUE(r->ReadCodes(1, 0, 16, 21, codes.data(), scales.data()).ok());
  EXPECT_EQ(codes, last.data[3]);
  EXPECT_EQ(scales, last.scales[3]);
}

// A chunk written whole goes after what is on disk: not over staged tokens,
// and not longer than the writer's chunks.
TEST(DirectChunkTest, RefusesStagedTokensAndOversizedChunks) {
  const Geometry g = Mixed();
  FaultFs fs;
  auto w = Create(fs, "/a.kv", 8);
  DirectChunk dc;
  EXPECT_EQ(dc.Begin(*w, 9).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(dc.Begin(*w, 0).code(), Status::Code::kInvalidArgument);
  ASSERT_TRUE(w->Append(Rows(g, 0, 3).Batch(g)).ok());  // staged, not yet a chunk
  Status st = dc.Begin(*w, 4);
  EXPECT_EQ(st.code(), Status::Code::kFailed) << st.ToString();
  ASSERT_TRUE(w->Close().ok());
}

// A section write that fails (a full disk) stops the writer; the file keeps
// what the last sync made durable: the first chunk.
TEST(DirectChunkTest, FailedWriteStopsTheWriter) {
  const Geometry g = Mixed();
  FaultFs fs;
  auto w = Create(fs, "/a.kv", 8);
  ASSERT_TRUE(WriteDirect(*w, Rows(g, 0, 8), 8).ok());
  ASSERT_TRUE(w->Sync().ok());
  fs.FailOn(FsOp::kWrite, 2, ENOSPC, /*persistent=*/true);
  Status st = WriteDirect(*w, Rows(g, 8, 8), 8);
  EXPECT_EQ(st.code(), Status::Code::kIOError) << st.ToString();
  EXPECT_EQ(WriteDirect(*w, Rows(g, 8, 8), 8).code(), Status::Code::kFailed);
  EXPECT_FALSE(w->Close().ok());
  fs.ClearFaults();
  ReaderOptions ro;
  ro.fs = &fs;
  std::unique_ptr<Reader> r;
  ASSERT_TRUE(Reader::Open("/a.kv", ro, &r).ok());
  EXPECT_EQ(r->token_count(), 8u);
  EXPECT_EQ(std::vector<uint32_t>(r->tokens().begin(), r->tokens().end()), Rows(g, 0, 8).tokens);
}

// A file system whose queued writes happen only at WaitWrites, as
// io_uring's may: a buffer handed to SubmitWrite is read later.
class DeferringFs : public FaultFs {
 public:
  Status Open(const std::string& path, OpenMode mode, std::unique_ptr<File>* out) override {
    std::unique_ptr<File> base;
    KVFILE_RETURN_IF_ERROR(FaultFs::Open(path, mode, &base));
    *out = std::make_unique<Deferring>(std::move(base), this);
    return Status::OK();
  }
  size_t pending = 0;  // writes queued and not yet done, over every file

 private:
  class Deferring : public File {
   public:
    Deferring(std::unique_ptr<File> base, DeferringFs* fs) : base_(std::move(base)), fs_(fs) {}
    ~Deferring() override { fs_->pending -= queue_.size(); }
    Status ReadAt(uint64_t offset, void* buf, size_t n) override { return base_->ReadAt(offset, buf, n); }
    Status WriteAt(uint64_t offset, const void* buf, size_t n) override { return base_->WriteAt(offset, buf, n); }
    Status Sync() override { return base_->Sync(); }
    Status Truncate(uint64_t size) override { return base_->Truncate(size); }
    Status Size(uint64_t* size) override { return base_->Size(size); }
    Status LockExclusive() override { return base_->LockExclusive(); }
    Status Id(FileId* id) override { return base_->Id(id); }
    Status SubmitWrite(uint64_t offset, const void* buf, size_t n, bool sync_after) override {
      queue_.push_back({offset, buf, n, sync_after});
      ++fs_->pending;
      return Status::OK();
    }
    Status WaitWrites() override {
      Status first;
      for (const Queued& q : queue_) {
        Status st = base_->WriteAt(q.offset, q.buf, q.n);
        if (st.ok() && q.sync) st = base_->Sync();
        if (first.ok()) first = st;
      }
      fs_->pending -= queue_.size();
      queue_.clear();
      return first;
    }
    const char* backend() const override { return "deferring"; }
    const std::string& path() const override { return base_->path(); }

   private:
    struct Queued {
      uint64_t offset;
      const void* buf;
      size_t n;
      bool sync;
    };
    std::unique_ptr<File> base_;
    DeferringFs* fs_;
    std::vector<Queued> queue_;
  };
};

// Sections go in order; a chunk abandoned with a section still queued (an
// error on the caller's side) waits for it before its caller may free the
// buffer; the abandoned chunk does not count.
TEST(DirectChunkTest, AbandonedChunkWaitsForItsQueuedSections) {
  const Geometry g = Mixed();
  DeferringFs fs;
  WriterOptions wo;
  wo.fs = &fs;
  wo.chunk_tokens = 8;
  std::unique_ptr<Writer> w;
  ASSERT_TRUE(hooks::CreateWriter("/a.kv", g, {"test/direct", 7}, wo, &w).ok());
  ASSERT_TRUE(WriteDirect(*w, Rows(g, 0, 8), 8).ok());
  EXPECT_EQ(fs.pending, 0u);
  Rows rows(g, 8, 8);
  ChunkLayout layout;
  ASSERT_TRUE(format::ComputeChunkLayout(g, 8, &layout).ok());
  std::vector<uint8_t> s0 = rows.Section(layout, 0), s1 = rows.Section(layout, 1);
  {
    DirectChunk dc;  // destroyed before s0 and s1: their queued writes must be done by then
    ASSERT_TRUE(dc.Begin(*w, 8).ok());
    EXPECT_EQ(dc.WriteSection(1, s1.data()).code(), Status::Code::kInvalidArgument);
    ASSERT_TRUE(dc.WriteSection(0, s0.data()).ok());
    EXPECT_EQ(fs.pending, 1u);
  }
  EXPECT_EQ(fs.pending, 0u);
  EXPECT_EQ(w->token_count(), 8u);
  ASSERT_TRUE(w->Close().ok());
  ReaderOptions ro;
  ro.fs = &fs;
  std::unique_ptr<Reader> r;
  ASSERT_TRUE(Reader::Open("/a.kv", ro, &r).ok());
  EXPECT_EQ(r->token_count(), 8u);
}

// The descriptors this process holds open on `path`.
int OpenDescriptorsOn(const std::string& path) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    auto target = std::filesystem::read_symlink(e.path(), ec);
    if (!ec && target == std::filesystem::path(path)) ++n;
  }
  return n;
}

// WriteBehind keeps a descriptor only on the very file the writer has open;
// a path that names another file (here, the file was replaced) gets no hint.
// The file's bytes are not touched either way.
TEST(WriteBehindTest, HintsOnlyTheFileTheWriterHasOpen) {
  std::string dir = ::testing::TempDir() + "write_behind_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/f";
  FileSystem* fs = FileSystem::Default();
  std::unique_ptr<File> f;
  ASSERT_TRUE(fs->Open(path, OpenMode::kCreateExclusive, &f).ok());
  std::vector<uint8_t> bytes(1 << 16, 0x5A);
  ASSERT_TRUE(f->WriteAt(0, bytes.data(), bytes.size()).ok());
  {
    WriteBehind wb;
    wb.Start(*f, path, 0, bytes.size());
    EXPECT_EQ(OpenDescriptorsOn(std::filesystem::canonical(path)), 2);  // the File's and the hint's
    wb.Start(*f, path, 4096, 4096);
  }
  EXPECT_EQ(OpenDescriptorsOn(std::filesystem::canonical(path)), 1);
  // Another file now has the name: no hint, no descriptor kept.
  const std::string canonical = std::filesystem::canonical(path);
  std::filesystem::rename(path, dir + "/old");
  std::unique_ptr<File> other;
  ASSERT_TRUE(fs->Open(path, OpenMode::kCreateExclusive, &other).ok());
  {
    WriteBehind wb;
    wb.Start(*f, path, 0, bytes.size());
    EXPECT_EQ(OpenDescriptorsOn(canonical), 1);  // `other`'s only
  }
  std::vector<uint8_t> back(bytes.size());
  ASSERT_TRUE(f->ReadAt(0, back.data(), back.size()).ok());
  EXPECT_EQ(back, bytes);
  f.reset();
  other.reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvfile::internal
