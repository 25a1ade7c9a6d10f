# SPDX-License-Identifier: Apache-2.0
"""kvfile.convert and kvfile.convert_pack: a file converted between the
formats kvfile reads and writes (.kv, safetensors, llama.cpp state,
Mooncake records, colibri sessions), or every member of a pack rewritten
with another dtype, local or s3:// (docs/object-storage.md).

kvfile.convert is the library's kvfile::Convert (kvfile/convert.h), the
conversion `kvfile convert` does: one transaction, a damaged .kv refused
unless salvage=True. convert_pack is the unit of work of a fan-out: one pack
in, one pack out, no state shared, so an engine (Dask,
docs/object-storage.md) maps it over the packs of a prefix.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from ._kvfile import InvalidArgumentError, Pack, convert_file, open_reader, pack


def convert(src: str | os.PathLike[str], dst: str | os.PathLike[str], dtype: str | None = None, *,
            overwrite: bool = False, every_stream: bool = True, **options: Any) -> dict[str, Any]:
    """Converts `src` to `dst`, each in the format its content or name says
    (to="kv"|"safetensors"|"llama"|"mooncake"|"coli" names dst's). `dtype`
    ("e4m3", "e5m2", "nvfp4", "bf16", "f16", "f32"): every stream of a .kv
    dst in that dtype (every_stream=False: the policy of `kvfile convert
    --dtype`, where a quantized dtype leaves raw streams raw); a safetensors
    dst's values. Other options, as the flags of `kvfile convert`: kv_major
    (1 or 2), keep_raw (stream names), codes, chunk_tokens, salvage; for a
    llama.cpp src head_size, model, rotated, unrotate, for a llama.cpp dst
    session (a session file, not a sequence state), cache_type ("f16",
    "q8_0", ... or "K,V"; --dtype of the command), v_trans, arch, n_stream,
    rotated; group_size (Mooncake); vocab, coli_v1 (a COLIKV1 dst),
    indexer_layers (a colibri src, "0..20" or "0,4,8"). dst is written
    whole under a temporary name (an s3:// key: staged locally, then
    uploaded) and replaces what was there
    (overwrite=True) only when complete; an existing dst without overwrite
    raises InvalidArgumentError and stays as it was. Returns the report: a
    dict of from, to, tokens, summary, warnings, notes, and bytes (a .kv
    dst's size, else a local file's, else None)."""
    try:
        report = convert_file(str(src), str(dst), dtype=dtype, every_stream=every_stream,
                              force=bool(overwrite or options.pop("force", False)), **options)
    except InvalidArgumentError as e:
        message = str(e)
        if message.endswith(": file exists; use --force to replace it"):
            raise InvalidArgumentError(message.replace("use --force", "pass overwrite=True")) from None
        raise
    if report["to"] == "kv":
        with open_reader(str(dst)) as out:
            report["bytes"] = out.info()["bytes"]
    else:
        report["bytes"] = os.path.getsize(dst) if os.path.isfile(dst) else None
    return report


def convert_pack(src: str | os.PathLike[str], dst: str | os.PathLike[str], dtype: str, *, chunk_tokens: int = 256,
                 scratch: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Checks the pack `src` whole (Pack.verify: every member, every
    chunk), then writes every member converted to `dtype` into the new pack
    `dst` (an s3:// key is uploaded when the pack is complete). The members
    pass through a temporary directory under `scratch` (default $TMPDIR),
    removed after. Returns {"src", "dst", "members", "tokens", "verified_bytes",
    "bytes"}."""
    p = Pack(src)
    report = p.verify()
    with tempfile.TemporaryDirectory(prefix="kvfile-convert-", dir=scratch) as tmp:
        members: dict[str, str] = {}
        for i, m in enumerate(p.members()):
            plain = os.path.join(tmp, "%d.kv" % i)
            p.materialize(m["name"], plain)
            members[m["name"]] = os.path.join(tmp, "%d.%s.kv" % (i, dtype))
            convert(plain, members[m["name"]], dtype)
            os.remove(plain)
        stats = pack(dst, members, chunk_tokens=chunk_tokens)
    return {"src": src, "dst": dst, "members": stats["members"], "tokens": stats["tokens"],
            "verified_bytes": report["bytes"], "bytes": stats["bytes"]}
