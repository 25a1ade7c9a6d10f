// SPDX-License-Identifier: Apache-2.0
// FaultFs and the crash-state enumeration (see fault_fs.h).
#include "fault_fs.h"

#include <cerrno>
#include <cstring>

namespace kvfile::testing {

// ---- The live file system -------------------------------------------------------

class FaultFile final : public File {
 public:
  FaultFile(FaultFs* fs, std::string path, std::shared_ptr<FaultFs::Node> node, bool writable)
      : fs_(fs), path_(std::move(path)), node_(std::move(node)), writable_(writable) {}
  ~FaultFile() override {
    if (node_->lock_owner == this) node_->lock_owner = nullptr;
  }

  Status ReadAt(uint64_t offset, void* buf, size_t n) override {
    if (offset > node_->data.size() || node_->data.size() - offset < n)
      return Status::Corruption(path_ + ": unexpected end of file at offset " + std::to_string(offset));
    if (n > 0) std::memcpy(buf, node_->data.data() + offset, n);
    return Status::OK();
  }
  Status WriteAt(uint64_t offset, const void* buf, size_t n) override {
    if (!writable_) return ErrnoStatus(path_ + ": write", EBADF);
    KVFILE_RETURN_IF_ERROR(fs_->MaybeFail(FsOp::kWrite, path_ + ": write at offset " + std::to_string(offset)));
    auto& d = node_->data;
    if (d.size() < offset + n) d.resize(offset + n, 0);
    if (n != 0) std::memcpy(d.data() + offset, buf, n);  // buf may be null when n is 0
    FsOp op{FsOp::kWrite, path_, "", offset, {}, 0, node_->id};
    op.data.assign(static_cast<const uint8_t*>(buf), static_cast<const uint8_t*>(buf) + n);
    fs_->Record(std::move(op));
    return Status::OK();
  }
  Status Sync() override {
    KVFILE_RETURN_IF_ERROR(fs_->MaybeFail(FsOp::kSync, path_ + ": fdatasync"));
    fs_->Record({FsOp::kSync, path_, "", 0, {}, 0, node_->id});
    return Status::OK();
  }
  Status Truncate(uint64_t size) override {
    KVFILE_RETURN_IF_ERROR(fs_->MaybeFail(FsOp::kTruncate, path_ + ": truncate"));
    node_->data.resize(size, 0);
    fs_->Record({FsOp::kTruncate, path_, "", 0, {}, size, node_->id});
    return Status::OK();
  }
  Status Size(uint64_t* size) override {
    *size = node_->data.size();
    return Status::OK();
  }
  Status LockExclusive() override {
    if (node_->lock_owner != nullptr && node_->lock_owner != this)
      return Status::Busy(path_ + ": another writer has the file open");
    node_->lock_owner = this;
    return Status::OK();
  }
  Status Id(FileId* id) override {
    *id = {1, node_->id};
    return Status::OK();
  }
  const char* backend() const override { return "memory"; }
  const std::string& path() const override { return path_; }

 private:
  FaultFs* fs_;
  std::string path_;
  std::shared_ptr<FaultFs::Node> node_;
  bool writable_;
};

FaultFs::FaultFs(const DiskImage& image) {
  for (const auto& [name, data] : image) {
    auto n = std::make_shared<Node>();
    n->id = next_inode_++;
    n->data = data;
    names_[name] = n;
  }
}

Status FaultFs::MaybeFail(FsOp::Kind kind, const std::string& what) {
  for (Fault& f : faults_) {
    if (f.kind != kind || f.spent) continue;
    if (f.remaining > 0) {
      --f.remaining;
      continue;
    }
    if (!f.persistent) f.spent = true;
    return ErrnoStatus(what, f.err);
  }
  return Status::OK();
}

void FaultFs::FailOn(FsOp::Kind kind, int nth, int err, bool persistent) {
  faults_.push_back({kind, nth, err, persistent, false});
}

Status FaultFs::Open(const std::string& path, OpenMode mode, std::unique_ptr<File>* out) {
  auto it = names_.find(path);
  if (mode == OpenMode::kCreateExclusive) {
    if (it != names_.end()) return ErrnoStatus(path, EEXIST);
    KVFILE_RETURN_IF_ERROR(MaybeFail(FsOp::kCreate, path + ": create"));
    auto node = std::make_shared<Node>();
    node->id = next_inode_++;
    it = names_.emplace(path, node).first;
    Record({FsOp::kCreate, path, "", 0, {}, 0, node->id});
  } else if (it == names_.end()) {
    return ErrnoStatus(path, ENOENT);
  }
  *out = std::make_unique<FaultFile>(this, path, it->second, mode != OpenMode::kRead);
  return Status::OK();
}

Status FaultFs::Rename(const std::string& from, const std::string& to, bool replace) {
  auto it = names_.find(from);
  if (it == names_.end()) return ErrnoStatus("rename " + from, ENOENT);
  if (!replace && names_.count(to)) return ErrnoStatus("rename " + from + " -> " + to, EEXIST);
  KVFILE_RETURN_IF_ERROR(MaybeFail(FsOp::kRename, "rename " + from + " -> " + to));
  names_[to] = it->second;
  names_.erase(from);
  Record({FsOp::kRename, from, to, 0, {}, 0});
  return Status::OK();
}

Status FaultFs::Remove(const std::string& path) {
  if (!names_.erase(path)) return ErrnoStatus(path + ": remove", ENOENT);
  Record({FsOp::kRemove, path, "", 0, {}, 0});
  return Status::OK();
}

Status FaultFs::SyncDir(const std::string& dir) {
  KVFILE_RETURN_IF_ERROR(MaybeFail(FsOp::kSyncDir, dir + ": fsync directory"));
  Record({FsOp::kSyncDir, dir, "", 0, {}, 0});
  return Status::OK();
}

Status FaultFs::Exists(const std::string& path, bool* exists) {
  *exists = names_.count(path) > 0;
  return Status::OK();
}

Status FaultFs::PathId(const std::string& path, FileId* id) {
  auto it = names_.find(path);
  if (it == names_.end()) return ErrnoStatus(path, ENOENT);
  *id = {1, it->second->id};
  return Status::OK();
}

DiskImage FaultFs::Image() const {
  DiskImage img;
  for (const auto& [name, node] : names_) img[name] = node->data;
  return img;
}

// ---- Crash states ---------------------------------------------------------------

namespace {

struct Pending {
  bool is_write;
  uint64_t offset;
  std::vector<uint8_t> data;  // write
  uint64_t size;              // truncate
};

struct Inode {
  std::vector<uint8_t> durable;
  std::vector<Pending> pending;
};

void Apply(std::vector<uint8_t>& d, const Pending& p) {
  if (!p.is_write) {
    d.resize(p.size, 0);
    return;
  }
  if (d.size() < p.offset + p.data.size()) d.resize(p.offset + p.data.size(), 0);
  std::memcpy(d.data() + p.offset, p.data.data(), p.data.size());
}

std::vector<uint8_t> Garbage(size_t n, uint64_t seed) {
  std::vector<uint8_t> g(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& b : g) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<uint8_t>(x);
  }
  return g;
}

// One way the pending operations of an inode may have reached the disk.
struct DataVariant {
  std::vector<uint8_t> bytes;
  std::string description;
};

std::vector<DataVariant> Variants(const Inode& ino) {
  std::vector<DataVariant> out;
  const auto& P = ino.pending;
  auto with = [&](const std::function<bool(size_t)>& keep,
                  const std::function<void(size_t, Pending&)>& alter) {
    std::vector<uint8_t> d = ino.durable;
    for (size_t i = 0; i < P.size(); ++i) {
      if (!keep(i)) continue;
      Pending p = P[i];
      alter(i, p);
      Apply(d, p);
    }
    return d;
  };
  auto none = [](size_t, Pending&) {};
  out.push_back({with([](size_t) { return true; }, none), "all unsynced kept"});
  if (P.empty()) return out;
  out.push_back({ino.durable, "all unsynced dropped"});
  for (size_t j = 1; j < P.size(); ++j)
    out.push_back({with([j](size_t i) { return i < j; }, none),
                   "first " + std::to_string(j) + " unsynced kept"});
  if (P.size() > 1)
    for (size_t j = 0; j < P.size(); ++j)
      out.push_back({with([j](size_t i) { return i != j; }, none),
                     "unsynced op " + std::to_string(j) + " dropped"});
  for (size_t j = 0; j < P.size(); ++j) {
    if (!P[j].is_write) continue;
    out.push_back({with([](size_t) { return true; },
                        [j](size_t i, Pending& p) {
                          if (i == j) std::fill(p.data.begin(), p.data.end(), 0);
                        }),
                   "unsynced write " + std::to_string(j) + " zeroed"});
    out.push_back({with([](size_t) { return true; },
                        [j](size_t i, Pending& p) {
                          if (i == j) p.data = Garbage(p.data.size(), i + 1);
                        }),
                   "unsynced write " + std::to_string(j) + " garbage"});
  }
  // The last write torn at each 512-byte boundary: its first part new, the
  // rest zeros, garbage or what was there before.
  size_t last = P.size();
  while (last > 0 && !P[last - 1].is_write) --last;
  if (last > 0) {
    const Pending& w = P[last - 1];
    std::vector<uint8_t> before = with([last](size_t i) { return i + 1 < last; }, none);
    for (uint64_t b = (w.offset / 512 + 1) * 512; b < w.offset + w.data.size(); b += 512) {
      size_t cut = static_cast<size_t>(b - w.offset);
      for (int mode = 0; mode < 3; ++mode) {
        std::vector<uint8_t> d = before;
        if (d.size() < w.offset + w.data.size()) d.resize(w.offset + w.data.size(), 0);
        std::memcpy(d.data() + w.offset, w.data.data(), cut);
        size_t rest = w.data.size() - cut;
        if (mode == 0) std::memset(d.data() + b, 0, rest);
        if (mode == 1) {
          auto g = Garbage(rest, b);
          std::memcpy(d.data() + b, g.data(), rest);
        }
        // mode 2: the old bytes stay (zeros where the file had none)
        if (mode == 2 && before.size() < w.offset + w.data.size()) {
          size_t old_end = std::max<size_t>(before.size(), b);
          std::memset(d.data() + old_end, 0, w.offset + w.data.size() - old_end);
        }
        // Later non-write ops (a truncate) still apply after the torn write.
        for (size_t i = last; i < P.size(); ++i) Apply(d, P[i]);
        static const char* kRest[] = {"zeros", "garbage", "old bytes"};
        out.push_back({std::move(d), "last unsynced write torn at offset " + std::to_string(b) +
                                         ", rest " + kRest[mode]});
      }
    }
  }
  return out;
}

}  // namespace

size_t EnumerateCrashStates(const std::vector<FsOp>& log, size_t prefix,
                            const std::function<void(const CrashState&)>& visit) {
  std::map<uint64_t, Inode> inodes;
  std::map<std::string, uint64_t> live, durable;
  for (size_t k = 0; k < prefix && k < log.size(); ++k) {
    const FsOp& op = log[k];
    switch (op.kind) {
      case FsOp::kCreate:
        inodes[op.inode] = {};
        live[op.path] = op.inode;
        break;
      case FsOp::kWrite:
        inodes.at(op.inode).pending.push_back({true, op.offset, op.data, 0});
        break;
      case FsOp::kTruncate:
        inodes.at(op.inode).pending.push_back({false, 0, {}, op.size});
        break;
      case FsOp::kSync: {
        Inode& ino = inodes.at(op.inode);
        for (const Pending& p : ino.pending) Apply(ino.durable, p);
        ino.pending.clear();
        break;
      }
      case FsOp::kRename:
        live[op.path2] = live.at(op.path);
        live.erase(op.path);
        break;
      case FsOp::kRemove:
        live.erase(op.path);
        break;
      case FsOp::kSyncDir:
        durable = live;
        break;
    }
  }
  std::vector<const std::map<std::string, uint64_t>*> name_views = {&durable};
  if (live != durable) name_views.push_back(&live);
  size_t visited = 0;
  for (size_t v = 0; v < name_views.size(); ++v) {
    const auto& names = *name_views[v];
    std::string names_desc = v == 0 ? "directory as last synced" : "directory changes kept";
    // Vary one inode at a time; the others keep all their unsynced writes.
    std::map<uint64_t, std::vector<uint8_t>> base;
    for (const auto& [name, id] : names) base[id] = Variants(inodes[id]).front().bytes;
    bool any_pending = false;
    for (const auto& [name, id] : names) {
      if (inodes[id].pending.empty()) continue;
      any_pending = true;
      for (DataVariant& dv : Variants(inodes[id])) {
        CrashState s;
        for (const auto& [n2, id2] : names) s.image[n2] = id2 == id ? dv.bytes : base[id2];
        s.description = names_desc + "; " + name + ": " + dv.description;
        visit(s);
        ++visited;
      }
    }
    if (!any_pending) {
      CrashState s;
      for (const auto& [n2, id2] : names) s.image[n2] = base[id2];
      s.description = names_desc + "; nothing unsynced";
      visit(s);
      ++visited;
    }
  }
  return visited;
}

}  // namespace kvfile::testing
