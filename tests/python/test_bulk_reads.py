# SPDX-License-Identifier: Apache-2.0
# Bulk reads from Python (Reader.read_all, Reader.codes_all) against the
# per-layer reads, the out= buffers, their argument checks and failure
# contract; fp8_decode_table and the GPU decode rule (table[code] * scale in
# float32, clamp, round) computed with numpy against the library's decode;
# kvfile.__version__.
#
# Run by CTest (python.pytest) with PYTHONPATH=build/python.
import re
from pathlib import Path

import numpy as np
import pytest

import kvfile

ROOT = Path(__file__).resolve().parents[2]

MIXED = {"layers": 3, "streams": [
    {"name": "k", "rows_per_token": 2, "row_width": 16, "dtype": "e4m3"},
    {"name": "v", "rows_per_token": 1, "row_width": 8, "dtype": "e5m2"},
    {"name": "idx", "rows_per_token": 1, "row_width": 4, "dtype": "bf16"},
]}


def write_mixed(path, tokens=23, chunk_tokens=4, seed=3, scale=1.0):
    rng = np.random.default_rng(seed)
    data = {s["name"]: (rng.standard_normal((3, tokens, s["rows_per_token"], s["row_width"])) * scale)
            .astype(np.float32) for s in MIXED["streams"]}
    with kvfile.create(path, MIXED, model="m", chunk_tokens=chunk_tokens) as w:
        w.append(list(range(100, 100 + tokens)), data)
    return data


def per_layer(r, name, start, stop, dtype):
    return np.stack([r.read(name, layer, start=start, stop=stop, dtype=dtype) for layer in range(3)])


@pytest.mark.parametrize("dtype", [np.float32, np.float16, "bf16"])
@pytest.mark.parametrize("threads", [1, 3, 0])
@pytest.mark.parametrize("start,stop", [(0, None), (1, 3), (3, 22), (5, 5)])
def test_read_all_equals_reads_per_layer(tmp_path, dtype, threads, start, stop):
    write_mixed(tmp_path / "m.kv")
    with kvfile.open(tmp_path / "m.kv") as r:
        got = r.read_all(dtype=dtype, start=start, stop=stop, threads=threads)
        assert sorted(got) == ["idx", "k", "v"]
        for name, a in got.items():
            want = per_layer(r, name, start, stop, dtype)
            assert a.dtype == want.dtype and a.shape == want.shape
            assert a.tobytes() == want.tobytes()


@pytest.mark.parametrize("threads", [1, 4])
def test_codes_all_equals_codes_per_layer(tmp_path, threads):
    write_mixed(tmp_path / "m.kv")
    with kvfile.open(tmp_path / "m.kv") as r:
        got = r.codes_all(start=2, stop=19, threads=threads)
        assert sorted(got) == ["k", "v"]  # the fp8 streams; idx is raw
        for name, (codes, block_scales, scales) in got.items():
            want_codes, _, want_scales = r.codes(name, start=2, stop=19)
            assert block_scales is None
            assert codes.dtype == np.uint8 and scales.dtype == np.float32
            assert codes.shape == want_codes.shape and scales.shape == want_scales.shape
            assert codes.tobytes() == want_codes.tobytes()
            assert scales.tobytes() == want_scales.tobytes()
        with pytest.raises(kvfile.InvalidArgumentError, match="stream 'idx' is stored raw"):
            r.codes_all(streams=["idx"])


def test_layers_and_streams_select_a_part(tmp_path):
    write_mixed(tmp_path / "m.kv")
    with kvfile.open(tmp_path / "m.kv") as r:
        got = r.read_all(dtype="bf16", layers=(1, 3), streams=["v", 0])
        assert sorted(got) == ["k", "v"]
        assert got["v"].shape == (2, 23, 1, 8)
        assert got["k"].tobytes() == per_layer(r, "k", 0, None, "bf16")[1:].tobytes()
        codes = r.codes_all(layers=(2, 3), streams=["k"])["k"][0]
        assert codes.tobytes() == r.codes("k", 2)[0].tobytes()
        assert r.read_all(layers=(3, 3))["k"].shape == (0, 23, 2, 16)
        with pytest.raises(ValueError, match=re.escape("layers: (2, 4) is not a range inside [0, 3]")):
            r.read_all(layers=(2, 4))


def test_out_buffers_are_filled_in_place(tmp_path):
    write_mixed(tmp_path / "m.kv")
    with kvfile.open(tmp_path / "m.kv") as r:
        want = r.read_all(dtype=np.float16, start=4, stop=12)
        out = {name: np.full(a.shape, 7, np.float16) for name, a in want.items()}
        got = r.read_all(dtype=np.float16, start=4, stop=12, out=out)
        for name in want:
            assert got[name] is out[name]
            assert out[name].tobytes() == want[name].tobytes()
        # Any writable C-contiguous buffer of the right bytes and item size:
        # a bytearray-backed memoryview of 2-byte items for bf16.
        raw = bytearray(3 * 23 * 4 * 2)
        view = memoryview(raw).cast("H")
        r.read_all(dtype="bf16", streams=["idx"], out={"idx": view})
        assert bytes(raw) == r.read("idx", dtype="bf16").tobytes()
        want_codes = r.codes_all(streams=["v"])["v"]
        codes, scales = np.zeros((3, 23, 1, 8), np.uint8), np.zeros((3, 23, 1), np.float32)
        r.codes_all(streams=["v"], out={"v": (codes, scales)})
        assert codes.tobytes() == want_codes.codes.tobytes() and scales.tobytes() == want_codes.scales.tobytes()


def test_out_buffers_are_checked_before_anything_is_read(tmp_path):
    write_mixed(tmp_path / "m.kv")
    with kvfile.open(tmp_path / "m.kv") as r:
        good = np.full((3, 23, 2, 16), 5, np.float32)
        with pytest.raises(ValueError, match=re.escape(
                "out['v']: the buffer holds 2204 bytes of 4-byte items; the read needs 2208 bytes of 4-byte items")):
            r.read_all(streams=["k", "v"], out={"k": good, "v": np.zeros(551, np.float32)})
        assert (good == 5).all()
        with pytest.raises(ValueError, match=re.escape(
                "out['k']: the buffer holds 4416 bytes of 4-byte items; the read needs 4416 bytes of 2-byte items")):
            r.read_all(dtype="bf16", streams=["k"], out={"k": np.zeros((3, 23, 2, 8), np.float32)})
        with pytest.raises(ValueError, match="out has no entry for stream 'v'"):
            r.read_all(out={"k": good})
        with pytest.raises(TypeError, match="writable C-contiguous buffer"):
            r.read_all(streams=["k"], out={"k": np.zeros((3, 23, 2, 32), np.float32)[..., ::2]})
        readonly = np.zeros((3, 23, 2, 16), np.float32)
        readonly.flags.writeable = False
        with pytest.raises(TypeError, match="writable C-contiguous buffer"):
            r.read_all(streams=["k"], out={"k": readonly})
        with pytest.raises(TypeError, match="out must be a dict"):
            r.read_all(out=[good])
        with pytest.raises(ValueError, match=re.escape("stop (2) is before start (3)")):
            r.read_all(start=3, stop=2)
        with pytest.raises(kvfile.InvalidArgumentError, match=re.escape("token range [0, 24) outside [0, 23)")):
            r.read_all(stop=24)


def test_a_damaged_chunk_fails_the_whole_read_and_zero_fills(tmp_path):
    # The tiny preset (streams k and v, both e4m3): every payload byte of a
    # chunk lies in a section that both bulk reads check.
    path = tmp_path / "t.kv"
    with kvfile.create(path, "tiny", chunk_tokens=4) as w:
        rng = np.random.default_rng(2)
        w.append(list(range(12)), {s: rng.standard_normal((2, 12, 2, 16), dtype=np.float32) for s in ("k", "v")})
    with kvfile.open(path) as r:
        chunk = r.chunks()[2]
        good = r.read_all(stop=8)  # chunks 0 and 1
    data = bytearray(path.read_bytes())
    data[chunk["offset"] + chunk["bytes"] - 1] ^= 0x10  # the last section of chunk 2 (layer 1, v)
    path.write_bytes(bytes(data))
    with kvfile.open(path) as r:
        assert all(a.tobytes() == good[n].tobytes() for n, a in r.read_all(stop=8, threads=2).items())
        full = {n: np.full((2, 12, 2, 16), 9, np.float32) for n in ("k", "v")}
        with pytest.raises(kvfile.CorruptionError, match="chunk 2"):
            r.read_all(threads=2, out=full)
        assert all((a == 0).all() for a in full.values())
        codes = {n: (np.full((2, 12, 2, 16), 9, np.uint8), np.full((2, 12, 2), 9, np.float32)) for n in ("k", "v")}
        with pytest.raises(kvfile.CorruptionError, match="layer 1 stream 'v'"):
            r.codes_all(out=codes)
        assert all((c == 0).all() and (s == 0).all() for c, s in codes.values())


def test_v1_file_codes_are_quantized_as_asked(tmp_path):
    path = tmp_path / "v1.kv"
    geometry = {"layers": 2, "streams": [{"name": n, "rows_per_token": 2, "row_width": 16, "dtype": "f32"}
                                         for n in ("k", "v")]}
    rng = np.random.default_rng(5)
    with kvfile.create(path, geometry, format=1, chunk_tokens=4) as w:
        w.append(list(range(9)), {n: rng.standard_normal((2, 9, 2, 16), dtype=np.float32) for n in ("k", "v")})
    with kvfile.open(path) as r:
        for kind in ("e4m3", "e5m2"):
            got = r.codes_all(v1_as=kind, threads=2, start=1)
            assert sorted(got) == ["k", "v"]
            for name in ("k", "v"):
                want = r.codes(name, v1_as=kind, start=1)
                assert got[name].codes.tobytes() == want.codes.tobytes()
                assert got[name].scales.tobytes() == want.scales.tobytes()


NVFP4_MIXED = {"layers": 3, "streams": [
    {"name": "k", "rows_per_token": 2, "row_width": 16, "dtype": "nvfp4"},
    {"name": "v", "rows_per_token": 1, "row_width": 8, "dtype": "e4m3"},
    {"name": "idx", "rows_per_token": 1, "row_width": 4, "dtype": "bf16"},
]}


@pytest.mark.parametrize("threads", [1, 3])
def test_codes_all_of_nvfp4_streams_equals_codes(tmp_path, threads):
    """codes_all gives an nvfp4 stream's (codes, block_scales, scales) as
    codes() does, layer after layer; out= takes three buffers for it."""
    path = tmp_path / "n.kv"
    rng = np.random.default_rng(11)
    with kvfile.create(path, NVFP4_MIXED, chunk_tokens=4) as w:
        w.append(list(range(19)), {s["name"]: (rng.standard_normal((3, 19, s["rows_per_token"], s["row_width"])) *
                                              (i + 1) * 3).astype(np.float32)
                                   for i, s in enumerate(NVFP4_MIXED["streams"])})
    with kvfile.open(path) as r:
        got = r.codes_all(start=3, stop=17, threads=threads)
        assert sorted(got) == ["k", "v"]  # the quantized streams
        codes, blocks, scales = got["k"]
        assert codes.shape == (3, 14, 16) and codes.dtype == np.uint8
        assert blocks.shape == (3, 14, 2) and blocks.dtype == np.uint8
        assert scales.shape == (3, 14) and scales.dtype == np.float32
        want = r.codes("k", start=3, stop=17)
        for a, b in zip(got["k"], want):
            assert a.tobytes() == b.tobytes()
        assert got["v"][0].tobytes() == r.codes("v", start=3, stop=17)[0].tobytes()
        assert len(np.unique(blocks)) > 4 and (codes != 0).any()  # real data, not zeros
        layer2 = r.codes_all(layers=(2, 3), streams=["k"])["k"]
        for a, b in zip(layer2, r.codes("k", layer=2)):
            assert a[0].tobytes() == b.tobytes()
        out = (np.full((3, 19, 16), 9, np.uint8), np.full((3, 19, 2), 9, np.uint8), np.full((3, 19), 9, np.float32))
        returned = r.codes_all(streams=["k"], out={"k": out})["k"]
        assert all(a is b for a, b in zip(returned, out))
        for a, b in zip(out, r.codes("k")):
            assert a.tobytes() == b.tobytes()
        with pytest.raises(TypeError, match=re.escape("out['k'] must be (codes, block_scales, scales)")):
            r.codes_all(streams=["k"], out={"k": out[:2]})
        with pytest.raises(ValueError, match=re.escape("out['k'][1]: the buffer holds 57 bytes")):
            r.codes_all(streams=["k"], out={"k": (out[0], np.zeros(57, np.uint8), out[2])})


def bf16_rne(x):
    """float32 -> bf16 bits, round to nearest even (x finite)."""
    u = x.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


@pytest.mark.parametrize("scale", [1.0, 1e-38, 3e37])
def test_the_gpu_decode_rule_equals_the_library_decode(tmp_path, scale):
    """kvfile.torch decodes on the GPU as table[code] * scale in float32,
    clamped to the output's finite range, then rounded: here the same
    arithmetic in numpy gives the library's bytes, subnormal and overflowing
    (clamped) results included."""
    write_mixed(tmp_path / "m.kv", scale=scale)
    bf16_max = np.array([0x7F7F0000], np.uint32).view(np.float32)[0]
    with kvfile.open(tmp_path / "m.kv") as r:
        codes = r.codes_all()
        for name, kind in (("k", "e4m3"), ("v", "e5m2")):
            c, _, s = codes[name]
            values = kvfile.fp8_decode_table(kind)[c] * s[..., None]
            assert values.dtype == np.float32
            assert values.tobytes() == r.read_all(streams=[name])[name].tobytes()
            assert np.clip(values, -65504, 65504).astype(np.float16).tobytes() == \
                r.read_all(dtype=np.float16, streams=[name])[name].tobytes()
            assert bf16_rne(np.clip(values, -bf16_max, bf16_max)).tobytes() == \
                r.read_all(dtype="bf16", streams=[name])[name].tobytes()


def test_fp8_decode_table():
    e4m3, e5m2 = kvfile.fp8_decode_table("e4m3"), kvfile.fp8_decode_table("e5m2")
    assert e4m3.dtype == np.float32 and e4m3.shape == (256,)
    assert e4m3[0x7E] == 448 and e4m3[0x01] == 2.0 ** -9 and e4m3[0xB8] == -1.0
    assert np.isnan(e4m3[0x7F]) and np.isnan(e4m3[0xFF])
    assert e5m2[0x7B] == 57344 and e5m2[0x01] == 2.0 ** -16 and np.isinf(e5m2[0x7C])
    with pytest.raises(ValueError):
        kvfile.fp8_decode_table("bf16")


def test_version_is_the_cmake_project_version():
    text = (ROOT / "CMakeLists.txt").read_text()
    assert kvfile.__version__ == re.search(r"project\(kvfile VERSION ([0-9.]+)", text).group(1)
