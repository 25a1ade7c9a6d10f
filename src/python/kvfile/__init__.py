# SPDX-License-Identifier: Apache-2.0
"""kvfile: LLM KV caches on disk, from Python.

A thin layer over the C++ library's binding (the extension kvfile._kvfile):

    kvfile.create(path, geometry, model=..., ...) -> Writer
    kvfile.open(path)                             -> Reader
    kvfile.open(path, "a", sync=...)              -> Writer appending to the file
    kvfile.verify(path)                           -> dict of findings
    kvfile.repair(path, force=..., dry_run=...)   -> dict: what the repair did (or would do)
    kvfile.find(dir_or_pack, tokens)              -> longest-prefix match (dict) or None
    kvfile.walk(dir_or_prefix)                    -> the .kv and .kvpack paths under it
    kvfile.convert(src, dst, dtype, **options)    -> report: src in dst's format (.kv, safetensors, ...)
    kvfile.convert_pack(src, dst, dtype)          -> dst: src checked, every member converted
    kvfile.append_safetensors(file, input, ...)   -> dict: input's tokens appended, as `kvfile append`
    Reader.read_all(...) / Reader.codes_all(...)  -> every stream at once (bulk)

kvfile.torch (torch tensors, CUDA loads), kvfile.transformers (a
DynamicCache to and from a file) and kvfile.llama_server (llama-server slots
kept in .kv files) are attributes of the package, imported on first use (`import kvfile; kvfile.torch.load(...)` works); they import torch
only when one of their functions is called, so `import kvfile` never does.

Arrays: a stream's rows are shaped [layers, tokens, rows_per_token,
row_width] for Writer.append and for Reader.read(stream) of every layer;
Reader.read(stream, layer) drops the layer axis. Paths: a local path, or "s3://bucket/key" (a str: pathlib would fold the
"//") wherever a file is read or written, read with ranged GETs and checked
as a local file is, written by a multipart upload that completes only with
the whole file (docs/object-storage.md). Row data is float32,
float16, or uint16 holding bf16 bit patterns ("bf16" where a dtype is asked
for). Library failures raise kvfile.Error subclasses carrying the library's
message; bad arguments raise TypeError or ValueError. See docs/api.md,
section "Python".
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, overload

from ._kvfile import (  # noqa: F401  (re-exported)
    BusyError,
    Codes,
    CorruptionError,
    Error,
    FailedError,
    InvalidArgumentError,
    IoError,
    MismatchError,
    NonFiniteError,
    NotFoundError,
    Pack,
    Reader,
    UnsupportedError,
    Writer,
    __version__,
    append_safetensors,
    coli_export,
    coli_import,
    create,
    dtype_table,
    find,
    fp8_decode_table,
    index_directory,
    mooncake_decode,
    mooncake_encode,
    open_reader,
    open_writer,
    pack,
    presets,
    repair,
    verify,
    walk,
)
from ._convert import convert, convert_pack  # noqa: F401  (re-exported)

if TYPE_CHECKING:  # the lazy submodules below, as type checkers should see them
    from . import llama_server as llama_server, torch as torch, transformers as transformers  # noqa: F401


# open: the module's entry point, like io.open (noqa: A001). The overloads
# give type checkers the mode's result: a Reader for "r", a Writer for "a".
@overload
def open(path: str | os.PathLike[str], mode: Literal["r"] = "r") -> Reader: ...  # noqa: A001
@overload
def open(path: str | os.PathLike[str], mode: Literal["a"], *, sync: str = ..., upgrade_dtype: str = ...,  # noqa: A001
         keep_raw: Sequence[str] = ...) -> Writer: ...
def open(path: str | os.PathLike[str], mode: str = "r", **options: Any) -> Reader | Writer:  # noqa: A001
    """Opens a .kv file: mode "r" returns a Reader, mode "a" a Writer that
    appends to it (keyword options as open_writer: sync, upgrade_dtype,
    keep_raw)."""
    if mode == "r":
        if options:
            raise TypeError(f"open(mode='r') takes no options, got {sorted(options)}")
        return open_reader(path)
    if mode == "a":
        return open_writer(path, **options)
    raise ValueError(f"mode must be 'r' or 'a', not {mode!r}")


# The submodules that need torch, imported when first named: `import kvfile`
# stays free of them (and of torch), and `kvfile.torch.load(...)` still works
# without an `import kvfile.torch` first. Importing a submodule binds it on
# the package, so this runs once for each.
_LAZY_SUBMODULES: tuple[str, ...] = ("torch", "transformers", "llama_server")


def __getattr__(name: str) -> ModuleType:
    if name in _LAZY_SUBMODULES:
        import importlib  # noqa: PLC0415

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Imported for the annotations above (typing.get_type_hints resolves them
# in this module), not part of the API: dir(kvfile) leaves them out.
_ANNOTATION_NAMES: frozenset[str] = frozenset(
    {"annotations", "os", "Sequence", "ModuleType", "TYPE_CHECKING", "Any", "Literal", "overload"})


def __dir__() -> list[str]:
    return sorted((set(globals()) - _ANNOTATION_NAMES) | set(_LAZY_SUBMODULES))
