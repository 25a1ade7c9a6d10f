// SPDX-License-Identifier: Apache-2.0
// kvfile.Pack(path): a .kvpack's members, materialised as .kv files, and its
// whole check (spec/PACK.md, docs/packs.md).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "bindings.h"
#include "errors.h"
#include "kvfile/pack.h"

namespace py = pybind11;

namespace kvfile::python {

namespace {

class PyPack {
 public:
  explicit PyPack(const std::filesystem::path& path) {
    Status st;
    {
      py::gil_scoped_release release;
      st = PackReader::Open(path.string(), nullptr, &pack_);
    }
    ThrowIfError(st);
  }

  // [{name, tokens, model, fingerprint}] in name order.
  py::list Members() const {
    py::list out;
    for (const PackMember& m : pack_->members()) {
      const PackModel& model = pack_->models()[m.model];
      out.append(py::dict(py::arg("name") = m.name, py::arg("tokens") = m.token_count,
                          py::arg("model") = model.identity.model_id,
                          py::arg("fingerprint") = model.identity.fingerprint));
    }
    return out;
  }

  size_t Index(const std::string& member) const {
    std::optional<size_t> i = pack_->Find(member);
    if (!i) ThrowIfError(Status::NotFound(pack_->path() + ": no member '" + member + "'"));
    return *i;
  }

  void Materialize(const std::string& member, const std::filesystem::path& dest) {
    size_t i = Index(member);
    Status st;
    {
      py::gil_scoped_release release;
      st = pack_->Materialize(i, dest.string());
    }
    ThrowIfError(st);
  }

  py::dict Verify() {
    PackVerifyReport report;
    Status st;
    {
      py::gil_scoped_release release;
      st = pack_->Verify(&report);
    }
    ThrowIfError(st);
    return py::dict(py::arg("ok") = true, py::arg("members") = report.members, py::arg("chunks") = report.chunks,
                    py::arg("bytes") = pack_->file_bytes(), py::arg("payload_bytes") = report.payload_bytes);
  }

  size_t Size() const { return pack_->members().size(); }
  bool Contains(const std::string& member) const { return pack_->Find(member).has_value(); }

 private:
  std::unique_ptr<PackReader> pack_;
};

// kvfile.pack(dest, {member name: .kv path}): a new pack.
py::dict Pack(const std::filesystem::path& dest, const std::map<std::string, std::filesystem::path>& members,
              uint32_t chunk_tokens) {
  PackWriterOptions options;
  options.chunk_tokens = chunk_tokens;
  std::unique_ptr<PackWriter> w;
  Status st;
  {
    py::gil_scoped_release release;
    st = PackWriter::Begin(dest.string(), options, &w);
    for (auto it = members.begin(); st.ok() && it != members.end(); ++it) st = w->AddFile(it->first, it->second.string());
    if (st.ok()) st = w->Finish();
  }
  ThrowIfError(st);
  const PackWriteStats& s = w->stats();
  return py::dict(py::arg("members") = s.members, py::arg("tokens") = s.tokens,
                  py::arg("chunks_stored") = s.chunks_stored, py::arg("chunks_used") = s.chunks_referenced,
                  py::arg("bytes") = s.file_bytes);
}

}  // namespace

void BindPack(py::module_& m) {
  m.def("pack", &Pack, py::arg("dest"), py::arg("members"), py::kw_only(), py::arg("chunk_tokens") = 256,
        "Packs .kv files into a new .kvpack at dest (replaced atomically): members maps each member name (a "
        "relative path) to its .kv file. Returns {members, tokens, chunks_stored, chunks_used, bytes}.");
  py::class_<PyPack>(m, "Pack", "A .kvpack opened for reading: its tables checked (kvfile.Pack(path)).")
      .def(py::init<const std::filesystem::path&>(), py::arg("path"))
      .def("members", &PyPack::Members, "The members in name order: dicts of name, tokens, model, fingerprint.")
      .def("materialize", &PyPack::Materialize, py::arg("member"), py::arg("path"),
           "Writes the member as the .kv file `path` (replaced atomically) after checking its record and "
           "chunks; open it with kvfile.open(path). Raises CorruptionError on damage, NotFoundError for "
           "a missing member.")
      .def("verify", &PyPack::Verify,
           "Checks every member record and every stored chunk once; returns {ok, members, chunks, bytes, "
           "payload_bytes} or raises CorruptionError naming the damage.")
      .def("__len__", &PyPack::Size)
      .def("__contains__", &PyPack::Contains);
}

}  // namespace kvfile::python
