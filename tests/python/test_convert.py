# SPDX-License-Identifier: Apache-2.0
# kvfile.walk, kvfile.convert and kvfile.convert_pack on local paths (their
# s3:// use: test_s3_reach.py, test_s3_fanout.py). kvfile.convert is the
# library's kvfile::Convert: every format, the dtype policy, salvage.
import numpy as np
import pytest

import kvfile


def write(path, ids, seed, dtype="e4m3"):
    """The tiny geometry (2 layers, streams k and v of 2 rows x 16) in `dtype`."""
    rng = np.random.default_rng(seed)
    block = {s: rng.standard_normal((2, len(ids), 2, 16)).astype(np.float32) for s in ("k", "v")}
    geometry = {"layers": 2, "streams": [{"name": s, "rows_per_token": 2, "row_width": 16, "dtype": dtype}
                                         for s in ("k", "v")]}
    with kvfile.create(str(path), geometry, model="test/tiny", fingerprint=7, chunk_tokens=4) as w:
        w.append(ids, block)
    return block


def test_walk_lists_kv_and_kvpack_files_sorted(tmp_path):
    (tmp_path / "sub").mkdir()
    for name in ("b.kv", "a.kvpack", "sub/c.kv", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    d = str(tmp_path) + "/"
    assert kvfile.walk(d) == [d + "a.kvpack", d + "b.kv", d + "sub/c.kv"]
    assert kvfile.walk(d, [".kvpack"]) == [d + "a.kvpack"]
    with pytest.raises(kvfile.NotFoundError):
        kvfile.walk(str(tmp_path / "nosuch"))


def test_convert_to_nvfp4_keeps_tokens_identity_and_values_within_nvfp4_error(tmp_path):
    ids = list(range(300))  # more than one block of 256 tokens
    write(tmp_path / "a.kv", ids, 1)
    out = kvfile.convert(str(tmp_path / "a.kv"), str(tmp_path / "b.kv"), "nvfp4")
    size = (tmp_path / "b.kv").stat().st_size
    assert out == {"from": "kv", "to": "kv", "tokens": 300, "bytes": size, "warnings": [], "notes": [],
                   "summary": f"300 tokens; k nvfp4, v nvfp4; 4 tokens per chunk; {size} bytes"}
    with kvfile.open(str(tmp_path / "a.kv")) as a, kvfile.open(str(tmp_path / "b.kv")) as b:
        assert [s["dtype"] for s in b.geometry["streams"]] == ["nvfp4", "nvfp4"]
        assert (b.info()["model"], b.info()["fingerprint"], b.info()["chunk_tokens"]) == ("test/tiny", 7, 4)
        assert np.array_equal(b.tokens, a.tokens)
        x, y = a.read_all()["k"], b.read_all()["k"]
        # nvfp4: 4-bit elements, a scale per 16: within a quarter of each block's largest value.
        block_max = np.abs(x).reshape(-1, 16).max(axis=1, keepdims=True)
        assert np.all(np.abs(x - y).reshape(-1, 16) <= 0.25 * block_max + 1e-6)
    before = (tmp_path / "b.kv").read_bytes()
    with pytest.raises(kvfile.InvalidArgumentError, match="b.kv: file exists; pass overwrite=True to replace it"):
        kvfile.convert(str(tmp_path / "a.kv"), str(tmp_path / "b.kv"), "e5m2")
    assert (tmp_path / "b.kv").read_bytes() == before
    assert kvfile.convert(str(tmp_path / "a.kv"), str(tmp_path / "b.kv"), "e5m2", overwrite=True)["tokens"] == 300
    with kvfile.open(str(tmp_path / "b.kv")) as b:
        assert [s["dtype"] for s in b.geometry["streams"]] == ["e5m2", "e5m2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.kv", "b.kv"]  # no temporary file left


def test_convert_pack_verifies_then_writes_every_member_converted(tmp_path):
    # bf16 to e4m3: packs hold bf16, f16, f32, e4m3 and e5m2 streams (not nvfp4: spec/PACK.md).
    write(tmp_path / "a.kv", list(range(10)), 1, "bf16")
    write(tmp_path / "b.kv", list(range(100, 106)), 2, "bf16")
    kvfile.pack(str(tmp_path / "in.kvpack"), {"a.kv": str(tmp_path / "a.kv"), "s/b.kv": str(tmp_path / "b.kv")},
                chunk_tokens=4)
    r = kvfile.convert_pack(str(tmp_path / "in.kvpack"), str(tmp_path / "out.kvpack"), "e4m3", chunk_tokens=4,
                            scratch=str(tmp_path))
    assert r == {"src": str(tmp_path / "in.kvpack"), "dst": str(tmp_path / "out.kvpack"), "members": 2, "tokens": 16,
                 "verified_bytes": (tmp_path / "in.kvpack").stat().st_size,
                 "bytes": (tmp_path / "out.kvpack").stat().st_size}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.kv", "b.kv", "in.kvpack", "out.kvpack"]
    # Each member is what kvfile.convert makes of it.
    kvfile.convert(str(tmp_path / "b.kv"), str(tmp_path / "b8.kv"), "e4m3")
    kvfile.Pack(str(tmp_path / "out.kvpack")).materialize("s/b.kv", str(tmp_path / "m.kv"))
    with kvfile.open(str(tmp_path / "m.kv")) as m, kvfile.open(str(tmp_path / "b8.kv")) as ref:
        assert [s["dtype"] for s in m.geometry["streams"]] == ["e4m3", "e4m3"]
        assert np.array_equal(m.tokens, ref.tokens)
        assert all(np.array_equal(m.read_all()[s], ref.read_all()[s]) for s in ("k", "v"))


def test_convert_pack_of_a_damaged_pack_writes_nothing(tmp_path):
    write(tmp_path / "a.kv", list(range(10)), 1)
    kvfile.pack(str(tmp_path / "in.kvpack"), {"a.kv": str(tmp_path / "a.kv")}, chunk_tokens=4)
    data = bytearray((tmp_path / "in.kvpack").read_bytes())
    data[200] ^= 0x10
    (tmp_path / "in.kvpack").write_bytes(bytes(data))
    with pytest.raises(kvfile.CorruptionError, match="checksum mismatch"):
        kvfile.convert_pack(str(tmp_path / "in.kvpack"), str(tmp_path / "out.kvpack"), "e4m3")
    assert not (tmp_path / "out.kvpack").exists()


def test_a_discarded_replacement_refuses_further_use(tmp_path):
    # kvfile._Replace (what convert writes through): after discard() its
    # temporary file is gone and every use raises, never a crash.
    from kvfile import _kvfile
    dest = tmp_path / "out.kv"
    r = _kvfile._Replace(dest)
    assert not r.existed
    with open(r.temp_path, "wb") as f:
        f.write(b"x")
    temp = r.temp_path
    r.discard()
    assert not (tmp_path / temp).exists() and not dest.exists()
    for use in (lambda: r.temp_path, lambda: r.existed, r.commit):
        with pytest.raises(ValueError, match="this replacement was discarded"):
            use()


def test_convert_kv_to_safetensors_and_back_keeps_tokens_identity_and_codes(tmp_path):
    ids = list(range(40, 70))
    write(tmp_path / "a.kv", ids, 3)
    st = kvfile.convert(tmp_path / "a.kv", tmp_path / "a.safetensors", codes=True)
    assert (st["from"], st["to"], st["tokens"], st["warnings"]) == ("kv", "safetensors", 30, [])
    assert st["summary"] == ("30 tokens; tokens I64, k.codes F8_E4M3, k.scales F32, v.codes F8_E4M3, v.scales F32; "
                             f"{st['bytes']} bytes")
    assert st["bytes"] == (tmp_path / "a.safetensors").stat().st_size
    back = kvfile.convert(tmp_path / "a.safetensors", tmp_path / "b.kv")
    assert (back["from"], back["to"], back["tokens"]) == ("safetensors", "kv", 30)
    with kvfile.open(str(tmp_path / "a.kv")) as a, kvfile.open(str(tmp_path / "b.kv")) as b:
        assert (b.info()["model"], b.info()["fingerprint"]) == ("test/tiny", 7)
        assert np.array_equal(b.tokens, a.tokens)
        for s in ("k", "v"):  # codes and scales exactly as stored
            assert all(np.array_equal(x, y) for x, y in zip(a.codes(s), b.codes(s)))


def test_convert_dtype_policy_every_stream_or_quantized_only(tmp_path):
    # A bf16 file: dtype e5m2 quantizes every stream by default (kvfile.convert's
    # dtype), and leaves raw streams raw with every_stream=False (kvfile convert --dtype).
    write(tmp_path / "a.kv", list(range(8)), 4, "bf16")
    kvfile.convert(tmp_path / "a.kv", tmp_path / "all.kv", "e5m2")
    kvfile.convert(tmp_path / "a.kv", tmp_path / "policy.kv", "e5m2", every_stream=False)
    kvfile.convert(tmp_path / "a.kv", tmp_path / "kept.kv", "e5m2", keep_raw=["v"])
    kvfile.convert(tmp_path / "all.kv", tmp_path / "f16.kv", "f16", every_stream=False)
    dtypes = {}
    for name in ("all", "policy", "kept", "f16"):
        with kvfile.open(str(tmp_path / f"{name}.kv")) as r:
            dtypes[name] = [s["dtype"] for s in r.geometry["streams"]]
    assert dtypes == {"all": ["e5m2", "e5m2"], "policy": ["bf16", "bf16"], "kept": ["e5m2", "bf16"],
                      "f16": ["f16", "f16"]}
    with pytest.raises(kvfile.InvalidArgumentError, match=r"a.kv: --keep-raw: no stream 'x' \(streams: k, v\)"):
        kvfile.convert(tmp_path / "a.kv", tmp_path / "x.kv", keep_raw=["x"])
    assert not (tmp_path / "x.kv").exists()


def test_convert_refuses_a_damaged_kv_unless_salvage(tmp_path):
    write(tmp_path / "a.kv", list(range(12)), 5)  # 3 chunks of 4 tokens
    with kvfile.open(str(tmp_path / "a.kv")) as r:
        chunk = r.chunks()[2]
    data = bytearray((tmp_path / "a.kv").read_bytes())
    data[chunk["offset"] + chunk["bytes"] - 1] ^= 0x10
    (tmp_path / "a.kv").write_bytes(bytes(data))
    with pytest.raises(kvfile.CorruptionError, match=r"not converted \(kvfile verify fails on it; --salvage converts "
                                                      r"the 8 tokens before the damage\)"):
        kvfile.convert(tmp_path / "a.kv", tmp_path / "b.safetensors")
    assert not (tmp_path / "b.safetensors").exists()
    r = kvfile.convert(tmp_path / "a.kv", tmp_path / "b.safetensors", salvage=True)
    assert r["tokens"] == 8 and len(r["warnings"]) == 1
    assert r["warnings"][0].startswith(str(tmp_path / "a.kv") + ": --salvage: converted the verified prefix of 8 "
                                       "tokens; 4 committed tokens were dropped (")
    back = kvfile.convert(tmp_path / "b.safetensors", tmp_path / "c.kv")
    assert back["tokens"] == 8


def test_convert_to_an_existing_output_without_overwrite_leaves_it_byte_identical(tmp_path):
    write(tmp_path / "a.kv", list(range(6)), 6)
    (tmp_path / "o.safetensors").write_bytes(b"precious")
    with pytest.raises(kvfile.InvalidArgumentError,
                       match="o.safetensors: file exists; pass overwrite=True to replace it"):
        kvfile.convert(tmp_path / "a.kv", tmp_path / "o.safetensors")
    assert (tmp_path / "o.safetensors").read_bytes() == b"precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.kv", "o.safetensors"]
    assert kvfile.convert(tmp_path / "a.kv", tmp_path / "o.safetensors", overwrite=True)["tokens"] == 6


def test_append_safetensors_creates_extends_and_refuses_a_mismatch_untouched(tmp_path):
    """kvfile.append_safetensors is `kvfile append` (kvfile::AppendSafetensors)."""
    block = write(tmp_path / "src.kv", list(range(100, 110)), 3, "bf16")
    kvfile.convert(str(tmp_path / "src.kv"), str(tmp_path / "turn.safetensors"))
    f, turn = str(tmp_path / "s.kv"), str(tmp_path / "turn.safetensors")
    assert kvfile.append_safetensors(f, turn) == {"created": True, "upgraded": False, "tokens_before": 0,
                                                  "tokens_appended": 10, "tokens": 10, "notes": []}
    assert kvfile.append_safetensors(f, turn)["tokens"] == 20
    with kvfile.open(f) as r:
        assert list(r.tokens) == list(range(100, 110)) * 2
        assert [s["dtype"] for s in r.geometry["streams"]] == ["e4m3", "e4m3"]
        k = r.read_all()["k"]
        # The codes and scales are what the library's quantizer makes of the same bf16 values.
        kvfile.convert(str(tmp_path / "src.kv"), str(tmp_path / "ref.kv"), "e4m3")
        with kvfile.open(str(tmp_path / "ref.kv")) as ref:
            for stream in ("k", "v"):
                got, want = r.codes(stream), ref.codes(stream)
                for part in ("codes", "scales"):
                    g, w = getattr(got, part), getattr(want, part)
                    assert np.array_equal(g[:, :10], w) and np.array_equal(g[:, 10:], w), (stream, part)
        # e4m3: 3 mantissa bits, a scale per row: within 1/16 of each row's largest value.
        row_max = np.abs(block["k"]).max(axis=-1, keepdims=True)
        assert np.all(np.abs(k[:, 10:] - block["k"]) <= row_max / 16 + 1e-6)
    before = (tmp_path / "s.kv").read_bytes()
    with pytest.raises(kvfile.MismatchError, match="model id: file has 'test/tiny', expected 'other/m'"):
        kvfile.append_safetensors(f, turn, model="other/m")
    assert (tmp_path / "s.kv").read_bytes() == before
    with pytest.raises(ValueError, match='sync must be "none", "chunk" or "close"'):
        kvfile.append_safetensors(f, turn, sync="sometimes")
    new = str(tmp_path / "n.kv")
    out = kvfile.append_safetensors(new, turn, dtype="nvfp4", keep_raw=["v"], chunk_tokens=3, model="m/x")
    assert out["created"] and out["tokens"] == 10
    with kvfile.open(new) as r:
        assert [s["dtype"] for s in r.geometry["streams"]] == ["nvfp4", "bf16"]
        assert (r.info()["model"], r.info()["chunk_tokens"]) == ("m/x", 3)
