# SPDX-License-Identifier: Apache-2.0
"""kvfile.convert and kvfile.convert_pack: a .kv file, or every member of a
pack, rewritten with another dtype, local or s3:// (docs/object-storage.md).

The rows are decoded to float32 by the Reader and quantized by the Writer,
as `kvfile convert --dtype` does for a change of dtype: this module only
moves the blocks. convert_pack is the unit of work of a fan-out: one pack in,
one pack out, no state shared, so an engine (Dask, docs/object-storage.md)
maps it over the packs of a prefix.
"""

import os
import tempfile

from ._kvfile import InvalidArgumentError, Pack, _Replace, create, open_reader, pack

# Tokens decoded and appended at a time: bounds the float32 rows in memory
# (a block of 256 llama-3.1-8b tokens is 256 MiB of float32).
_BLOCK_TOKENS = 256


def convert(src, dst, dtype, *, chunk_tokens=None, overwrite=False):
    """Writes the .kv file `src` as the new .kv file `dst` with every stream
    in `dtype` ("e4m3", "e5m2", "nvfp4", "bf16", ...): same tokens, model,
    fingerprint and geometry. chunk_tokens defaults to src's. dst is
    written whole under a temporary name (an s3:// key: staged locally,
    then uploaded) and replaces what was there (overwrite=True) only when
    complete; an existing dst without overwrite raises
    InvalidArgumentError. Returns {tokens, bytes}."""
    replace = _Replace(dst)
    try:
        if replace.existed and not overwrite:
            raise InvalidArgumentError(f"{dst}: file exists; pass overwrite=True to replace it")
        _convert_to(src, replace.temp_path, dtype, chunk_tokens)
        with open_reader(replace.temp_path) as out:
            result = {"tokens": len(out), "bytes": out.info()["bytes"]}
        replace.commit()
        return result
    finally:
        replace.discard()


def _convert_to(src, dst, dtype, chunk_tokens):
    with open_reader(src) as r:
        info = r.info()
        geometry = {"layers": info["geometry"]["layers"],
                    "streams": [dict(s, dtype=dtype) for s in info["geometry"]["streams"]]}
        n = len(r)
        ids = r.tokens
        with create(dst, geometry, model=info["model"], fingerprint=info["fingerprint"],
                    chunk_tokens=chunk_tokens or info["chunk_tokens"]) as w:
            for start in range(0, n, _BLOCK_TOKENS):
                stop = min(n, start + _BLOCK_TOKENS)
                w.append(ids[start:stop], r.read_all(start=start, stop=stop))


def convert_pack(src, dst, dtype, *, chunk_tokens=256, scratch=None):
    """Checks the pack `src` whole (Pack.verify: every member, every
    chunk), then writes every member converted to `dtype` into the new pack
    `dst` (an s3:// key is uploaded when the pack is complete). The members
    pass through a temporary directory under `scratch` (default $TMPDIR),
    removed after. Returns {"src", "dst", "members", "tokens", "verified_bytes",
    "bytes"}."""
    p = Pack(src)
    report = p.verify()
    with tempfile.TemporaryDirectory(prefix="kvfile-convert-", dir=scratch) as tmp:
        members = {}
        for i, m in enumerate(p.members()):
            plain = os.path.join(tmp, "%d.kv" % i)
            p.materialize(m["name"], plain)
            members[m["name"]] = os.path.join(tmp, "%d.%s.kv" % (i, dtype))
            convert(plain, members[m["name"]], dtype)
            os.remove(plain)
        stats = pack(dst, members, chunk_tokens=chunk_tokens)
    return {"src": src, "dst": dst, "members": stats["members"], "tokens": stats["tokens"],
            "verified_bytes": report["bytes"], "bytes": stats["bytes"]}
