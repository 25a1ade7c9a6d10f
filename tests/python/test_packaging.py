# SPDX-License-Identifier: Apache-2.0
# The Python package as its users meet it: the type stubs of the extension
# (kvfile/_kvfile.pyi and py.typed, beside the module) name every function
# and class it has, with its parameters; the pure-Python modules annotate
# every public function and method, and their annotations resolve;
# kvfile.Codes, the one result type of Reader.codes and codes_all for every
# quantized dtype; pyproject.toml's license and metadata; and a missing build
# requirement named in one line by setup.py.
import ast
import importlib
import inspect
import os
import re
import signal
import subprocess
import sys
import textwrap
import tomllib
import typing
from pathlib import Path

import numpy as np
import pytest

import kvfile
from kvfile import _kvfile

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(kvfile.__file__).resolve().parent


def stub_tree():
    return ast.parse((PACKAGE / "_kvfile.pyi").read_text())


def doc_parameters(obj):
    """The parameter names pybind11 writes into the first line of a
    function's docstring: "name(a: int, *, b: bool = False) -> dict"."""
    first = obj.__doc__.splitlines()[0]
    inside = first[first.index("(") + 1:first.rindex(")")]
    names = []
    depth = 0
    part = ""
    for ch in inside + ",":
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            name = part.strip().split(":")[0].strip()
            if name and name != "*":
                names.append(name)
            part = ""
        else:
            part += ch
    return names


def stub_parameters(node):
    a = node.args
    return [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg != "self"]


def test_type_stubs_are_installed_beside_the_module():
    assert (PACKAGE / "py.typed").is_file()
    assert (PACKAGE / "_kvfile.pyi").is_file()


def test_type_stubs_name_every_function_and_class_with_its_parameters():
    tree = stub_tree()
    stubbed = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    public = {n for n in dir(_kvfile) if not n.startswith("__")}
    assert sorted(public - set(stubbed)) == []
    assert sorted(set(stubbed) - public) == []
    for name, node in stubbed.items():
        obj = getattr(_kvfile, name)
        if isinstance(node, ast.FunctionDef):
            assert stub_parameters(node) == doc_parameters(obj), name
            continue
        methods = {m.name: m for m in node.body if isinstance(m, ast.FunctionDef)}
        for method, m in methods.items():
            assert hasattr(obj, method), f"{name}.{method}"
            attr = getattr(obj, method)
            decorated = [d.id for d in m.decorator_list if isinstance(d, ast.Name)]
            if "property" in decorated or not callable(attr) or method.startswith("__") or name == "Codes":
                continue
            assert stub_parameters(m) == doc_parameters(attr)[1:], f"{name}.{method}"  # [0]: self
        own = {n for n in vars(obj) if not n.startswith("_")} if name not in ("Codes",) else set()
        if not issubclass(obj, BaseException):
            assert sorted(own - set(methods)) == [], name


# The pure-Python modules (py.typed covers them too), each with the fewest
# public functions and methods its walk must find: a walk that finds fewer
# (a rename of the module, a broken filter) would prove nothing.
PURE_MODULES = {"kvfile": 1, "kvfile._convert": 2, "kvfile.llama_server": 2, "kvfile._torch_codec": 5,
                "kvfile.torch": 8, "kvfile.transformers": 4}
# Those whose annotations name only what the module imports when it runs:
# typing.get_type_hints resolves them as it finds them. kvfile.torch,
# kvfile._torch_codec and kvfile.transformers name torch (and transformers)
# types, imported under `if TYPE_CHECKING:` only (importing them must not
# import torch), so theirs resolve in the module's namespace plus what that
# block imports.
RUNTIME_RESOLVED = {"kvfile", "kvfile._convert", "kvfile.llama_server"}


def defined_here(module):
    """{name: object} of the functions and classes the module's source
    defines (not those it imports: the extension names its exceptions'
    module "kvfile", so __module__ alone would take them in)."""
    tree = ast.parse(inspect.getsource(module))
    names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    return {n: getattr(module, n) for n in sorted(set(names))
            if getattr(getattr(module, n), "__module__", None) == module.__name__}


def public_functions(module):
    """[(name, function)]: the module's public functions and the public
    methods (and __init__) of its public classes, those defined in the module
    (the names it re-exports are checked where they are defined), with the
    overloads of each (typing.get_overloads)."""
    found = []
    for name, obj in defined_here(module).items():
        if name.startswith("_"):
            continue
        if inspect.isfunction(obj):
            found.append((name, obj))
        elif inspect.isclass(obj):
            for attr, member in sorted(vars(obj).items()):
                member = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
                if inspect.isfunction(member) and (not attr.startswith("_") or attr == "__init__"):
                    found.append((f"{name}.{attr}", member))
    return [(name, f) for name, fn in found for f in [fn] + list(typing.get_overloads(fn))]


def unannotated(fn):
    """The parameters of fn without an annotation (self, cls, *args and
    **kwargs aside), and "return" when it has no return annotation."""
    sig = inspect.signature(fn)
    missing = [p.name for p in sig.parameters.values()
               if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               and p.annotation is p.empty]
    return missing + (["return"] if sig.return_annotation is sig.empty else [])


def self_attributes(cls):
    """The names a class's methods assign as self.name."""
    names = set()
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(cls)))):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    names.add(t.attr)
    return names


@pytest.mark.parametrize("name", sorted(PURE_MODULES))
def test_pure_python_modules_annotate_every_public_function(name):
    """Every parameter and the return of every public function and method
    is annotated, and every public attribute a public class's methods set is
    declared in the class. (kvfile.torch and kvfile.transformers import
    without torch: they import it when a function is called.)"""
    module = importlib.import_module(name)
    functions = public_functions(module)
    assert len({n for n, _ in functions}) >= PURE_MODULES[name], [n for n, _ in functions]
    assert {n: unannotated(f) for n, f in functions if unannotated(f)} == {}
    for cls_name, cls in defined_here(module).items():
        if inspect.isclass(cls) and not cls_name.startswith("_"):
            public = {a for a in self_attributes(cls) if not a.startswith("_")}
            assert sorted(public - set(inspect.get_annotations(cls))) == [], cls_name


def type_checking_namespace(module):
    """The module's namespace plus what its `if TYPE_CHECKING:` blocks
    import, each import run here. A `from M import names` whose M is not
    installed (transformers, on a machine without it) binds each name to a
    class of its own: its annotations still resolve, every name they use
    bound by the module or its block; a plain `import M` of a missing module
    skips the test."""
    ns = dict(vars(module))
    for node in ast.parse(inspect.getsource(module)).body:
        if not (isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")):
            continue
        for stmt in node.body:
            try:
                exec(compile(ast.Module([stmt], []), module.__file__, "exec"), ns)  # noqa: S102
            except ImportError as e:
                if not isinstance(stmt, ast.ImportFrom) or stmt.level:
                    pytest.skip(f"{module.__name__}: {ast.unparse(stmt)}: {e}")
                ns.update({a.asname or a.name: type(a.name, (), {}) for a in stmt.names})
    return ns


@pytest.mark.parametrize("name", sorted(PURE_MODULES))
def test_pure_python_annotations_resolve(name):
    """typing.get_type_hints evaluates every annotation of the module (its
    variables, every function and method, public or not, their overloads,
    its classes' attributes): a typo or a name nothing imports fails. The
    modules of RUNTIME_RESOLVED resolve with no help (as a user's
    get_type_hints sees them); the others in type_checking_namespace."""
    module = importlib.import_module(name)
    ns = type_checking_namespace(module)
    globalns = None if name in RUNTIME_RESOLVED else ns
    typing.get_type_hints(module, globalns)
    checked = 0
    for obj in defined_here(module).values():
        members = [obj]
        if inspect.isclass(obj):
            typing.get_type_hints(obj, globalns)
            members = [getattr(m, "__func__", m) for m in vars(obj).values()]
        for fn in members:
            if inspect.isfunction(fn):
                for f in [fn] + list(typing.get_overloads(fn)):
                    typing.get_type_hints(f, globalns)
                checked += 1
    assert checked >= PURE_MODULES[name]


GEOMETRY = {"layers": 2, "streams": [
    {"name": "k", "rows_per_token": 2, "row_width": 16, "dtype": "e4m3"},
    {"name": "n", "rows_per_token": 2, "row_width": 16, "dtype": "nvfp4"},
]}


def test_codes_are_one_named_tuple_for_every_dtype(tmp_path):
    rng = np.random.default_rng(3)
    rows = {s: rng.standard_normal((2, 5, 2, 16)).astype(np.float32) for s in ("k", "n")}
    with kvfile.create(tmp_path / "a.kv", GEOMETRY) as w:
        w.append([1, 2, 3, 4, 5], rows)
    with kvfile.open(tmp_path / "a.kv") as r:
        fp8, nvfp4 = r.codes("k"), r.codes("n")
        bulk = r.codes_all()
    assert type(fp8) is kvfile.Codes and type(nvfp4) is kvfile.Codes
    assert kvfile.Codes._fields == ("codes", "block_scales", "scales")
    assert fp8.block_scales is None
    assert fp8.codes.shape == (2, 5, 2, 16) and fp8.scales.shape == (2, 5, 2)
    assert nvfp4.codes.shape == (2, 5, 16) and nvfp4.block_scales.shape == (2, 5, 2)
    assert nvfp4.scales.shape == (2, 5)
    # Tuple unpacking: three fields for every dtype.
    codes, block_scales, scales = fp8
    assert block_scales is None and codes is fp8.codes and scales is fp8.scales
    assert all(type(v) is kvfile.Codes for v in bulk.values())
    assert bulk["k"].block_scales is None
    for name, one in (("k", fp8), ("n", nvfp4)):
        for a, b in zip(bulk[name], one):
            assert (a is None and b is None) or a.tobytes() == b.tobytes()
    # A Codes goes back into Writer.append as the stream's codes, exactly.
    with kvfile.create(tmp_path / "b.kv", GEOMETRY) as w:
        w.append([1, 2, 3, 4, 5], {"k": fp8, "n": nvfp4})
    with kvfile.open(tmp_path / "b.kv") as r:
        assert r.codes("k").codes.tobytes() == fp8.codes.tobytes()
        assert r.codes("n").block_scales.tobytes() == nvfp4.block_scales.tobytes()
    # And codes_all reads into a Codes of buffers.
    out = kvfile.Codes(np.zeros((2, 5, 2, 16), np.uint8), None, np.zeros((2, 5, 2), np.float32))
    with kvfile.open(tmp_path / "a.kv") as r:
        got = r.codes_all(streams=["k"], out={"k": out})["k"]
    assert got.codes is out.codes and got.scales is out.scales
    assert out.codes.tobytes() == fp8.codes.tobytes()
    with kvfile.create(tmp_path / "c.kv", GEOMETRY) as w:
        with pytest.raises(ValueError, match=re.escape(
                "stream 'n': codes of an nvfp4 stream are a tuple (codes, block_scales, scales), got "
                "block_scales None")):
            w.append([1, 2, 3, 4, 5], {"k": fp8, "n": nvfp4._replace(block_scales=None)})


def test_pyproject_names_the_license_and_metadata():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == {"text": "Apache-2.0"}
    assert "License :: OSI Approved :: Apache Software License" in project["classifiers"]
    assert "Typing :: Typed" in project["classifiers"]
    assert project["authors"] and project["keywords"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()


def build_ext(tmp_path, env):
    """setup.py build_ext run from the source tree into tmp_path; its exit
    status and its last stderr line. Each case stops at the configure: a
    run that went on to compile would be ended (the whole process group)
    and fail the test."""
    p = subprocess.Popen([sys.executable, str(ROOT / "setup.py"), "-q", "build_ext", "--build-temp",
                          str(tmp_path / "temp"), "--build-lib", str(tmp_path / "lib")],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        _, err = p.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail("setup.py went past the configure")
    lines = err.strip().splitlines()
    return p.returncode, lines[-1] if lines else ""


def test_missing_cmake_is_named_in_one_line(tmp_path):
    (tmp_path / "bin").mkdir()
    code, last = build_ext(tmp_path, dict(os.environ, PATH=str(tmp_path / "bin")))
    assert (code, last) == (1, "kvfile: missing build requirement: cmake (Debian: cmake; or pip install cmake)")


def test_missing_compiler_is_named_in_one_line(tmp_path):
    code, last = build_ext(tmp_path, dict(os.environ, CXX="/nonexistent/g++"))
    assert (code, last) == (1, "kvfile: missing build requirement: the C++ compiler CXX=/nonexistent/g++ "
                               "(Debian: g++)")


def test_missing_library_is_named_in_one_line(tmp_path):
    """pkg-config finds no library (an empty search path): CMake stops at
    libxxhash, the first the library needs, and setup.py ends with its line."""
    (tmp_path / "pc").mkdir()
    env = dict(os.environ, PKG_CONFIG_LIBDIR=str(tmp_path / "pc"), PKG_CONFIG_PATH="")
    code, last = build_ext(tmp_path, env)
    assert (code, last) == (1, "kvfile: missing build requirement: libxxhash (Debian: libxxhash-dev)")


def test_missing_pybind11_is_named_in_one_line(tmp_path):
    env = dict(os.environ, CMAKE_ARGS="-DCMAKE_DISABLE_FIND_PACKAGE_pybind11=ON")
    code, last = build_ext(tmp_path, env)
    assert (code, last) == (1, "kvfile: missing build requirement: pybind11 (Debian: pybind11-dev; or pip install "
                               "pybind11)")
