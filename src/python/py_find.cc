// SPDX-License-Identifier: Apache-2.0
// kvfile.find(path, tokens) and kvfile.index_directory(dir): prefix lookup
// over a directory of .kv files or a pack (kvfile/prefix_index.h); and
// kvfile.walk(dir), the files under a directory or an s3:// key prefix.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "errors.h"
#include "kvfile/file.h"
#include "kvfile/prefix_index.h"

namespace py = pybind11;

namespace kvfile::python {

namespace {

py::object Find(const std::filesystem::path& path, const std::vector<uint32_t>& tokens,
                std::optional<uint64_t> model_fingerprint, bool write_index) {
  PrefixFindOptions options;
  options.fingerprint = model_fingerprint;
  options.write_index = write_index;
  std::optional<PrefixMatch> m;
  Status st;
  {
    py::gil_scoped_release release;
    st = FindPrefix(path.string(), tokens, options, &m);
  }
  ThrowIfError(st);
  if (!m) return py::none();
  return py::dict(py::arg("path") = m->path, py::arg("model") = m->model_id,
                  py::arg("fingerprint") = m->fingerprint, py::arg("tokens") = m->tokens,
                  py::arg("matched") = m->matched);
}

py::dict Index(const std::filesystem::path& dir) {
  PrefixIndexReport r;
  Status st;
  {
    py::gil_scoped_release release;
    st = IndexDirectory(dir.string(), nullptr, &r);
  }
  ThrowIfError(st);
  return py::dict(py::arg("files") = r.files, py::arg("indexed") = r.indexed, py::arg("read") = r.reread,
                  py::arg("kept") = r.kept, py::arg("skipped") = r.skipped, py::arg("written") = r.written);
}

// kvfile.walk(dir, suffixes): WalkDirectory's files, sorted.
std::vector<std::string> Walk(const std::filesystem::path& dir, const std::vector<std::string>& suffixes) {
  std::vector<WalkEntry> entries;
  Status st;
  {
    py::gil_scoped_release release;
    st = WalkDirectory(dir.string(), suffixes, &entries);
  }
  ThrowIfError(st);
  std::vector<std::string> files;
  for (const WalkEntry& e : entries) {
    ThrowIfError(e.error);
    files.push_back(e.path);
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

void BindFind(py::module_& m) {
  m.def("find", &Find, py::arg("path"), py::arg("tokens"), py::kw_only(), py::arg("model_fingerprint") = py::none(),
        py::arg("write_index") = true,
        "The .kv file or pack member (PACK:MEMBER) under directory `path` (through DIR/.kvfile-index, "
        "refreshed when files changed), or the member of the pack `path` (through the index beside it when "
        "that lists the pack as it is), sharing the longest prefix with `tokens` (a sequence of ints). "
        "Returns a dict: path (relative path or member name), model, fingerprint, tokens, matched; or None "
        "when nothing shares the first token. Ties: smallest fingerprint, then token sequence, then path.");
  m.def("walk", &Walk, py::arg("dir"), py::arg("suffixes") = std::vector<std::string>{".kv", ".kvpack"},
        "The sorted paths of the files under `dir` (a directory, or an s3://bucket/prefix/ of keys) whose names end "
        "with one of `suffixes`, as the CLI's directory verbs walk it (docs/cli.md, \"Directories\"). An "
        "unreadable subdirectory raises its error.");
  m.def("index_directory", &Index, py::arg("dir"),
        "Writes or refreshes dir/.kvfile-index. Returns a dict: files, indexed, read, kept, skipped, written.");
}

}  // namespace kvfile::python
