# SPDX-License-Identifier: Apache-2.0
"""kvfile.Pack: members, materialise, verify, and the errors of a missing
member and a damaged pack."""
import numpy as np
import pytest

import kvfile


def write(path, ids, seed):
    rng = np.random.default_rng(seed)
    block = {s: rng.standard_normal((2, len(ids), 2, 16)).astype(np.float32) for s in ("k", "v")}
    with kvfile.create(str(path), "tiny", model="test/tiny", fingerprint=7, chunk_tokens=4) as w:
        w.append(ids, block)


def test_pack_members_materialize_verify(tmp_path):
    write(tmp_path / "a.kv", list(range(10)), 1)
    write(tmp_path / "b.kv", list(range(100, 106)), 2)
    stats = kvfile.pack(str(tmp_path / "c.kvpack"), {"sub/b.kv": str(tmp_path / "b.kv"), "a.kv": str(tmp_path / "a.kv")},
                        chunk_tokens=4)
    assert stats["members"] == 2 and stats["tokens"] == 16
    p = kvfile.Pack(str(tmp_path / "c.kvpack"))
    assert len(p) == 2 and "sub/b.kv" in p and "b.kv" not in p
    assert [(m["name"], m["tokens"], m["model"], m["fingerprint"]) for m in p.members()] == [
        ("a.kv", 10, "test/tiny", 7), ("sub/b.kv", 6, "test/tiny", 7)]
    v = p.verify()
    assert v["ok"] and v["members"] == 2 and v["bytes"] == (tmp_path / "c.kvpack").stat().st_size
    p.materialize("a.kv", str(tmp_path / "out.kv"))
    with kvfile.open(str(tmp_path / "out.kv")) as r, kvfile.open(str(tmp_path / "a.kv")) as s:
        assert list(r.tokens) == list(range(10))
        assert np.array_equal(r.read_all()["k"], s.read_all()["k"])
    with pytest.raises(kvfile.NotFoundError, match="no member 'nosuch.kv'"):
        p.materialize("nosuch.kv", str(tmp_path / "x.kv"))

    data = bytearray((tmp_path / "c.kvpack").read_bytes())
    data[200] ^= 0x10
    (tmp_path / "bad.kvpack").write_bytes(bytes(data))
    bad = kvfile.Pack(str(tmp_path / "bad.kvpack"))
    with pytest.raises(kvfile.CorruptionError, match="checksum mismatch"):
        bad.verify()
    with pytest.raises(kvfile.CorruptionError):
        bad.materialize("a.kv", str(tmp_path / "y.kv"))  # its first chunk lies at 128
    assert not (tmp_path / "y.kv").exists()
    with pytest.raises(kvfile.NotFoundError):
        kvfile.Pack(str(tmp_path / "nosuch.kvpack"))
