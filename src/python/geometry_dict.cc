// SPDX-License-Identifier: Apache-2.0
// Geometry <-> Python dict, presets by name, and stream lookup.
#include "geometry_dict.h"

#include <string>

#include "arrays.h"
#include "errors.h"
#include "kvfile/dtype.h"
#include "kvfile/presets.h"

namespace py = pybind11;

namespace kvfile::python {

namespace {

// Refuses keys outside `known`: a misspelt key would otherwise be ignored.
void CheckKeys(const py::dict& d, std::initializer_list<const char*> known, const std::string& what) {
  for (auto item : d) {
    const auto key = py::str(item.first).cast<std::string>();
    bool found = false;
    for (const char* k : known) found = found || key == k;
    if (!found) {
      std::string list;
      for (const char* k : known) list += (list.empty() ? "" : ", ") + std::string(k);
      throw py::value_error(what + ": unknown key '" + key + "' (known: " + list + ")");
    }
  }
}

template <typename T>
T Required(const py::dict& d, const char* key, const std::string& what) {
  if (!d.contains(key)) throw py::value_error(what + ": missing key '" + key + "'");
  try {
    return d[key].cast<T>();
  } catch (const py::cast_error&) {
    throw py::type_error(what + ": '" + key + "' has the wrong type");
  }
}

std::string StreamNames(const Geometry& g) {
  std::string names;
  for (const StreamSpec& s : g.streams) names += (names.empty() ? "" : ", ") + s.name;
  return names;
}

}  // namespace

Geometry GeometryFrom(py::handle spec, Dtype fp8_dtype) {
  Geometry g;
  if (py::isinstance<py::str>(spec)) {
    ThrowIfError(GetPreset(spec.cast<std::string>(), fp8_dtype, &g));
    return g;
  }
  if (!py::isinstance<py::dict>(spec))
    throw py::type_error("geometry: expected a preset name or a dict with 'layers' and 'streams'");
  auto d = py::reinterpret_borrow<py::dict>(spec);
  CheckKeys(d, {"layers", "streams"}, "geometry");
  g.layers = Required<uint32_t>(d, "layers", "geometry");
  for (py::handle item : Required<py::list>(d, "streams", "geometry")) {
    const std::string what = "geometry stream " + std::to_string(g.streams.size());
    if (!py::isinstance<py::dict>(item)) throw py::type_error(what + ": expected a dict");
    auto s = py::reinterpret_borrow<py::dict>(item);
    CheckKeys(s, {"name", "rows_per_token", "row_width", "dtype", "layers"}, what);
    StreamSpec stream;
    stream.name = Required<std::string>(s, "name", what);
    stream.rows_per_token = Required<uint32_t>(s, "rows_per_token", what);
    stream.row_width = Required<uint32_t>(s, "row_width", what);
    stream.dtype = s.contains("dtype") ? DtypeByName(Required<std::string>(s, "dtype", what)) : fp8_dtype;
    // The layers a stream is in, where not every one (spec/FORMAT.md 3.2).
    if (s.contains("layers")) stream.layers = Required<std::vector<uint32_t>>(s, "layers", what);
    g.streams.push_back(std::move(stream));
  }
  return g;
}

py::dict GeometryDict(const Geometry& geometry) {
  py::list streams;
  for (const StreamSpec& s : geometry.streams) {
    py::dict d(py::arg("name") = s.name, py::arg("rows_per_token") = s.rows_per_token,
               py::arg("row_width") = s.row_width, py::arg("dtype") = DtypeName(s.dtype));
    if (!s.layers.empty()) d["layers"] = py::cast(s.layers);  // only a stream in some layers has the key
    streams.append(d);
  }
  return py::dict(py::arg("layers") = geometry.layers, py::arg("streams") = streams);
}

uint32_t StreamIndex(const Geometry& geometry, py::handle stream) {
  if (py::isinstance<py::str>(stream)) {
    const auto name = stream.cast<std::string>();
    if (auto index = geometry.FindStream(name)) return *index;
    ThrowIfError(Status::InvalidArgument("no stream '" + name + "' (streams: " + StreamNames(geometry) + ")"));
  }
  if (!py::isinstance<py::int_>(stream))
    throw py::type_error("stream: expected a name or an index");
  const auto index = stream.cast<int64_t>();
  if (index < 0 || static_cast<uint64_t>(index) >= geometry.streams.size())
    ThrowIfError(Status::InvalidArgument("no stream " + std::to_string(index) + ": the file has " +
                                         std::to_string(geometry.streams.size()) + " (" + StreamNames(geometry) +
                                         ")"));
  return static_cast<uint32_t>(index);
}

}  // namespace kvfile::python
