# SPDX-License-Identifier: Apache-2.0
# Tests of the Python module against the library's documented behaviour:
# exact round trips, fp8 codes known from spec/CODEC.md, reads across chunk
# boundaries, rewind, prefixes, info, verify of a damaged file, argument
# checks, errors, the golden fixtures, and the documented example (docs/api.md, README.md).
#
# Run by CTest (`ctest -L unit`) with PYTHONPATH set to build/python, or by
# hand: PYTHONPATH=build/python /usr/bin/python3 -m pytest tests/python
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import kvfile

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
EXAMPLE = ROOT / "src" / "python" / "examples" / "example.py"

TINY = {"layers": 2, "streams": [
    {"name": "k", "rows_per_token": 2, "row_width": 16, "dtype": "e4m3"},
    {"name": "v", "rows_per_token": 2, "row_width": 16, "dtype": "e4m3"},
]}


def rows(rng, layers, tokens, r, w, scale=1.0):
    return (rng.standard_normal((layers, tokens, r, w)) * scale).astype(np.float32)


def tiny_rows(rng, tokens):
    return {"k": rows(rng, 2, tokens, 2, 16), "v": rows(rng, 2, tokens, 2, 16, 3.0)}


def fp8_decode(codes, kind):
    """The fp8 element values, computed here from the bit layout
    (spec/CODEC.md), independently of the library."""
    c = codes.astype(np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    if kind == "e4m3":
        exp, man, man_bits, bias = (c >> 3) & 0xF, c & 0x7, 3, 7
    else:
        exp, man, man_bits, bias = (c >> 2) & 0x1F, c & 0x3, 2, 15
    frac = man / float(1 << man_bits)
    value = np.where(exp == 0, frac * 2.0 ** (1 - bias), (1 + frac) * 2.0 ** (exp - bias))
    return (sign * value).astype(np.float32)


def write_tiny(path, token_batches, seed=1, chunk_tokens=4):
    """Creates a tiny-preset file from batches of token ids; returns the ids
    and the float32 rows appended, per stream, as [layers, tokens, 2, 16]."""
    rng = np.random.default_rng(seed)
    all_tokens, data = [], {"k": [], "v": []}
    with kvfile.create(path, "tiny", model="test/tiny", fingerprint=7, chunk_tokens=chunk_tokens) as w:
        for batch in token_batches:
            block = tiny_rows(rng, len(batch))
            w.append(batch, block)
            all_tokens += list(batch)
            for s in data:
                data[s].append(block[s])
    return all_tokens, {s: np.concatenate(data[s], axis=1) for s in data}


# ---- round trips ------------------------------------------------------------

@pytest.mark.parametrize("stored,given,read_as", [
    ("f32", np.float32, np.float32),
    ("f16", np.float16, np.float16),
    ("bf16", np.uint16, "bf16"),
])
def test_raw_streams_round_trip_exactly(tmp_path, stored, given, read_as):
    geometry = {"layers": 3, "streams": [{"name": "x", "rows_per_token": 2, "row_width": 8, "dtype": stored}]}
    rng = np.random.default_rng(3)
    values = rows(rng, 3, 5, 2, 8)
    # bf16 bits of values that bf16 holds exactly: the top half of an f32.
    data = (values.view(np.uint32) >> 16).astype(np.uint16) if given is np.uint16 else values.astype(given)
    path = tmp_path / "raw.kv"
    with kvfile.create(path, geometry, chunk_tokens=2) as w:
        w.append([1, 2, 3, 4, 5], {"x": data})
    with kvfile.open(path) as r:
        back = r.read("x", dtype=read_as)
        assert back.dtype == data.dtype and back.shape == data.shape
        assert np.array_equal(back.view(np.uint8), data.view(np.uint8))  # bit for bit, signed zeros too
        assert np.array_equal(r.read(0, layer=2, start=1, stop=4, dtype=read_as), data[2, 1:4])


def test_fp8_codes_are_the_codecs(tmp_path):
    # spec/CODEC.md 10.1 and 10.2 for e4m3 and e5m2, and rows whose amax is the
    # largest finite value (scale exactly 1, so every code is known by hand).
    geometry = {"layers": 1, "streams": [
        {"name": "a", "rows_per_token": 1, "row_width": 4, "dtype": "e4m3"},
        {"name": "b", "rows_per_token": 1, "row_width": 4, "dtype": "e5m2"}]}
    x = np.array([
        [7.0, -0.3, 0.06640625, 3 * 2.0 ** -15],  # 10.1
        [1.0, -0.3, 0.0078125, -0.0],            # 10.2
        [448.0, 1.0, -2.0, 2.0 ** -9],            # e4m3: max, one, minus two, smallest subnormal
    ], dtype=np.float32)
    y = x.copy()
    y[2] = [57344.0, 1.0, -2.0, 2.0 ** -16]       # e5m2: the same kinds of values
    path = tmp_path / "codes.kv"
    with kvfile.create(path, geometry) as w:
        w.append([10, 11, 12], {"a": x[None, :, None, :], "b": y[None, :, None, :]})
    with kvfile.open(path) as r:
        codes, _, scales = r.codes("a", layer=0)
        assert codes.dtype == np.uint8 and codes.shape == (3, 1, 4)
        assert scales.dtype == np.float32 and scales.shape == (3, 1)
        assert codes[:, 0].tolist() == [[0x7E, 0xDA, 0x48, 0x03], [0x7E, 0xF0, 0x46, 0x80], [0x7E, 0x38, 0xC0, 0x01]]
        assert scales[:, 0].view(np.uint32).tolist() == [0x3C800000, 0x3B124925, 0x3F800000]
        codes, _, scales = r.codes("b", layer=0)
        assert codes[:, 0].tolist() == [[0x7B, 0xE9, 0x60, 0x3A], [0x7B, 0xF4, 0x5F, 0x80], [0x7B, 0x3C, 0xC0, 0x01]]
        assert scales[:, 0].view(np.uint32).tolist() == [0x39000000, 0x37924925, 0x3F800000]
        # 10.1 decodes exactly to these; scale 1 gives the inputs back.
        assert r.read("a", 0, 0, 1)[0, 0].tolist() == [7.0, -0.3125, 0.0625, 3 * 2.0 ** -15]
        assert r.read("a", 0, 2, 3)[0, 0].tolist() == x[2].tolist()
        assert r.read("b", 0, 2, 3)[0, 0].tolist() == y[2].tolist()
        # 10.2 to bf16 and f16 bits.
        assert r.read("a", 0, 1, 2, dtype="bf16")[0, 0].tolist() == [0x3F80, 0xBE92, 0x3C00, 0x8000]
        assert r.read("a", 0, 1, 2, dtype=np.float16)[0, 0].view(np.uint16).tolist() == [0x3C00, 0xB492, 0x2000, 0x8000]


def test_format_1_is_written_raw_and_quantized_on_read(tmp_path):
    geometry = {"layers": 1, "streams": [{"name": "x", "rows_per_token": 1, "row_width": 4, "dtype": "f32"}]}
    row = np.array([57344.0, 1.0, -2.0, 2.0 ** -16], np.float32)
    path = tmp_path / "v1.kv"
    with kvfile.create(path, geometry, format=1) as w:
        w.append([4], {"x": row.reshape(1, 1, 1, 4)})
    with kvfile.open(path) as r:
        assert r.info()["version"] == "1.0"
        assert r.read("x", 0)[0, 0].tolist() == row.tolist()
        codes, _, scales = r.codes("x", 0, v1_as="e5m2")  # e5m2's max: scale 1, codes known by hand
        assert codes[0, 0].tolist() == [0x7B, 0x3C, 0xC0, 0x01] and scales.tolist() == [[1.0]]
        with pytest.raises(ValueError, match="unknown dtype 'e6m1'"):
            r.codes("x", 0, v1_as="e6m1")


@pytest.mark.parametrize("given", [np.float32, np.float16, np.uint16])
def test_each_input_dtype_gives_the_codes_of_its_values(tmp_path, given):
    # The same values (exact in bf16 and f16) given in each input dtype must
    # be stored as the same codes: the input dtype is taken as declared.
    rng = np.random.default_rng(5)
    values = np.round(rows(rng, 2, 3, 2, 16) * 8) / 8
    data = (values.view(np.uint32) >> 16).astype(np.uint16) if given is np.uint16 else values.astype(given)
    path = tmp_path / "in.kv"
    with kvfile.create(path, "tiny") as w:
        w.append([1, 2, 3], {"k": data, "v": values})
    with kvfile.open(path) as r:
        assert np.array_equal(r.codes("k").codes, r.codes("v").codes)
        assert np.array_equal(r.codes("k").scales, r.codes("v").scales)


def test_reads_across_chunk_boundaries(tmp_path):
    path = tmp_path / "chunks.kv"
    tokens, data = write_tiny(path, [[1, 2, 3], [4, 5, 6, 7], [8, 9, 10]], chunk_tokens=4)
    with kvfile.open(path) as r:
        assert [c["first_token"] for c in r.chunks()] == [0, 4, 8]
        assert r.tokens.tolist() == tokens and r.tokens.dtype == np.uint32
        for stream in ("k", "v"):
            whole = r.read(stream)
            assert whole.shape == (2, 10, 2, 16) and whole.dtype == np.float32
            codes, _, scales = r.codes(stream)
            assert codes.shape == (2, 10, 2, 16) and scales.shape == (2, 10, 2)
            # Every value is its code decoded (computed here) times its row's scale...
            assert np.array_equal(whole, fp8_decode(codes, "e4m3") * scales[..., None])
            # ...within half an e4m3 step of the input (3 mantissa bits; subnormal step 2^-9).
            error = np.abs(whole - data[stream])
            assert np.all(error <= np.abs(data[stream]) / 16 + scales[..., None] * 2.0 ** -10)
            for start, stop in [(0, 10), (2, 9), (3, 5), (4, 8), (7, 10), (5, 5), (9, 10)]:
                for layer in (0, 1):
                    assert np.array_equal(r.read(stream, layer, start, stop), whole[layer, start:stop])
                    part_codes, _, part_scales = r.codes(stream, layer, start, stop)
                    assert np.array_equal(part_codes, codes[layer, start:stop])
                    assert np.array_equal(part_scales, scales[layer, start:stop])


def test_concurrent_reads_match_sequential_ones(tmp_path):
    path = tmp_path / "threads.kv"
    write_tiny(path, [list(range(40))], chunk_tokens=8)
    with kvfile.open(path) as r:
        want = [r.read("k", layer % 2, layer, 40 - layer) for layer in range(8)]
        got = [None] * 8

        def work(i):
            for _ in range(20):
                got[i] = r.read("k", i % 2, i, 40 - i)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(np.array_equal(g, w) for g, w in zip(got, want))


def test_appends_from_several_threads_are_serialized(tmp_path):
    # Each thread appends its own ids one token at a time while another reads
    # w.tokens; every append must land whole, in some order.
    path = tmp_path / "appends.kv"
    one = tiny_rows(np.random.default_rng(4), 1)
    seen_lengths = []
    with kvfile.create(path, "tiny", chunk_tokens=8) as w:
        def append(base):
            for i in range(40):
                w.append([base + i], one)

        def watch():
            for _ in range(200):
                seen_lengths.append(len(w.tokens))

        threads = [threading.Thread(target=append, args=(base,)) for base in (1000, 2000, 3000)]
        threads.append(threading.Thread(target=watch))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(w) == 120
    assert seen_lengths == sorted(seen_lengths)
    with kvfile.open(path) as r:
        ids = r.tokens.tolist()
        for base in (1000, 2000, 3000):
            assert [t for t in ids if base <= t < base + 40] == list(range(base, base + 40))
        codes = r.codes("k")[0]
        assert all(np.array_equal(codes[:, i], codes[:, 0]) for i in range(120))
    assert kvfile.verify(path)["ok"]


# ---- writer operations ---------------------------------------------------------

def test_rewind_then_append(tmp_path):
    path = tmp_path / "rewind.kv"
    tokens, _ = write_tiny(path, [list(range(100, 110))])
    with kvfile.open(path) as r:
        before = {s: r.codes(s) for s in ("k", "v")}
    more = tiny_rows(np.random.default_rng(9), 2)
    with kvfile.open(path, "a") as w:
        w.rewind(6)
        assert len(w) == 6 and w.tokens.tolist() == tokens[:6]
        w.append([500, 501], more)
        assert len(w) == 8
    reference = tmp_path / "reference.kv"
    with kvfile.create(reference, "tiny") as w:
        w.append([500, 501], more)
    with kvfile.open(path) as r, kvfile.open(reference) as ref:
        assert r.tokens.tolist() == tokens[:6] + [500, 501]
        for s in ("k", "v"):
            codes, _, scales = r.codes(s)
            assert codes.shape == (2, 8, 2, 16)
            assert np.array_equal(codes[:, :6], before[s].codes[:, :6])
            assert np.array_equal(scales[:, :6], before[s].scales[:, :6])
            assert np.array_equal(codes[:, 6:], ref.codes(s).codes)
            assert np.array_equal(scales[:, 6:], ref.codes(s).scales)


def test_rewind_beyond_the_end_is_refused(tmp_path):
    path = tmp_path / "short.kv"
    write_tiny(path, [[1, 2, 3]])
    with kvfile.open(path, "a") as w:
        with pytest.raises(kvfile.InvalidArgumentError):
            w.rewind(4)
        assert len(w) == 3


def test_longest_common_prefix(tmp_path):
    path = tmp_path / "prefix.kv"
    tokens, _ = write_tiny(path, [[5, 6, 7, 8], [9, 10, 11]])
    with kvfile.open(path) as r:
        assert r.longest_common_prefix(tokens) == 7
        assert r.longest_common_prefix(tokens + [12, 13]) == 7
        assert r.longest_common_prefix([5, 6, 7, 99, 9]) == 3
        assert r.longest_common_prefix(np.array([6], dtype=np.int64)) == 0
        assert r.longest_common_prefix([]) == 0
    with kvfile.open(path, "a") as w:
        assert w.longest_common_prefix([5, 6, 7, 8, 9, 0]) == 5


def test_info(tmp_path):
    path = tmp_path / "info.kv"
    write_tiny(path, [list(range(10))], chunk_tokens=4)
    with kvfile.open(path) as r:
        info = r.info()
    assert info["version"] == "2.1" and (info["major_version"], info["minor_version"]) == (2, 1)
    assert info["model"] == "test/tiny" and info["fingerprint"] == 7
    assert info["fingerprint_hex"] == "0000000000000007"
    assert info["geometry"] == TINY
    assert (info["tokens"], info["chunks"], info["chunk_tokens"]) == (10, 3, 4)
    assert info["bytes"] == os.path.getsize(path) and info["torn_tail_bytes"] == 0
    assert info["io_backend"] in ("io_uring", "posix")
    assert info["path"] == str(path)
    assert info["damage_before_end"] is False and info["committed_data_missing"] is False
    assert (info["committed_tokens_missing"], info["committed_bytes_missing"]) == (0, 0)
    # Cut 100 bytes into the second chunk: the first chunk's 4 tokens are
    # read, and the info says what the commit record vouched for is gone.
    size = os.path.getsize(path)
    os.truncate(path, 12288 + 4096 + 100)
    with kvfile.open(path) as r:
        info = r.info()
    assert (info["tokens"], info["chunks"]) == (4, 1)
    assert info["committed_data_missing"] is True
    assert info["committed_tokens_missing"] == 6
    assert info["committed_bytes_missing"] == size - (12288 + 4096 + 100)


def test_dtype_table_states_every_dtype_and_its_parts():
    """The library's dtype table (spec/FORMAT.md 2.1), as Python sees it."""
    rows = [(d["name"], d["value"], d["quantization"], d["element_bits"], d["block_elements"], d["parts"])
            for d in kvfile.dtype_table()]
    assert rows == [
        ("e4m3", 1, "row", 8, 0, ("codes", "scales")),
        ("e5m2", 2, "row", 8, 0, ("codes", "scales")),
        ("bf16", 3, "none", 16, 0, ("codes",)),
        ("f16", 4, "none", 16, 0, ("codes",)),
        ("f32", 5, "none", 32, 0, ("codes",)),
        ("nvfp4", 6, "token", 4, 16, ("codes", "block_scales", "scales")),
    ]


def test_geometry_dict_and_presets(tmp_path):
    assert "tiny" in kvfile.presets() and "llama-3.1-8b" in kvfile.presets()
    path = tmp_path / "g.kv"
    with kvfile.create(path, "tiny", dtype="e5m2") as w:
        assert [s["dtype"] for s in w.geometry["streams"]] == ["e5m2", "e5m2"]
    # info()["geometry"] goes back into create() as it is.
    with kvfile.open(path) as r:
        geometry = r.info()["geometry"]
    copy = tmp_path / "copy.kv"
    kvfile.create(copy, geometry).close()
    with kvfile.open(copy) as c:
        assert c.geometry == geometry and geometry["streams"][0]["dtype"] == "e5m2"
    with pytest.raises(ValueError, match="unknown key 'rows'"):
        kvfile.create(tmp_path / "bad.kv", {"layers": 1, "streams": [{"name": "k", "rows": 1, "row_width": 4}]})
    with pytest.raises(kvfile.InvalidArgumentError, match="unknown preset 'nope'"):
        kvfile.create(tmp_path / "bad.kv", "nope")
    with pytest.raises(ValueError, match="unknown dtype 'e3m4'"):
        kvfile.create(tmp_path / "bad.kv", "tiny", dtype="e3m4")
    assert not (tmp_path / "bad.kv").exists()


def test_create_refuses_an_existing_file_unless_overwrite(tmp_path):
    path = tmp_path / "exists.kv"
    write_tiny(path, [[1]])
    with pytest.raises(kvfile.InvalidArgumentError) as e:
        kvfile.create(path, "tiny")
    assert str(e.value) == f"{path}: file exists; pass overwrite=True to replace it"
    kvfile.create(path, "tiny", overwrite=True).close()
    with kvfile.open(path) as r:
        assert len(r) == 0 and r.tokens.tolist() == []
        assert r.read("k").shape == (2, 0, 2, 16)
        assert r.codes("v", layer=1).scales.shape == (0, 2)


def test_closed_objects_raise_failed_error(tmp_path):
    path = tmp_path / "closed.kv"
    w = kvfile.create(path, "tiny")
    w.close()
    w.close()  # idempotent
    with pytest.raises(kvfile.FailedError, match="closed"):
        w.append([1], tiny_rows(np.random.default_rng(0), 1))
    r = kvfile.open(path)
    r.close()
    with pytest.raises(kvfile.FailedError, match="reader is closed"):
        r.read("k")


def test_a_second_writer_is_busy(tmp_path):
    path = tmp_path / "busy.kv"
    with kvfile.create(path, "tiny") as w:
        with pytest.raises(kvfile.BusyError) as e:
            kvfile.open(path, "a")
        assert e.value.code == "busy"
        w.append([1], tiny_rows(np.random.default_rng(0), 1))


# ---- verify and damage ----------------------------------------------------------

def test_verify_reports_a_damaged_payload_and_read_raises(tmp_path):
    path = tmp_path / "good.kv"
    write_tiny(path, [list(range(12))], chunk_tokens=4)
    report = kvfile.verify(path)
    assert report["ok"] and report["findings"] == [] and report["tokens"] == 12 and report["chunks"] == 3
    with kvfile.open(path) as r:
        chunk1 = r.chunks()[1]
    damaged = tmp_path / "damaged.kv"
    shutil.copyfile(path, damaged)
    # Byte 200 of a 4-token tiny chunk: past its 128-byte head, inside the
    # codes of layer 0, stream k (spec/FORMAT.md, chunk layout).
    with open(damaged, "r+b") as f:
        f.seek(chunk1["offset"] + 200)
        byte = f.read(1)[0]
        f.seek(chunk1["offset"] + 200)
        f.write(bytes([byte ^ 0x01]))
    report = kvfile.verify(damaged)
    assert not report["ok"]
    errors = [f for f in report["findings"] if f["error"]]
    assert errors and errors[0]["chunk"] == 1
    assert chunk1["offset"] <= errors[0]["offset"] < chunk1["offset"] + chunk1["bytes"]
    with kvfile.open(damaged) as r:
        assert np.array_equal(r.read("k", 0, 0, 4), kvfile.open(path).read("k", 0, 0, 4))  # chunk 0 is intact
        with pytest.raises(kvfile.CorruptionError) as e:
            r.read("k", 0, 2, 6)
        assert e.value.code == "corruption" and isinstance(e.value, kvfile.Error)
        assert str(damaged) in str(e.value) and "chunk 1" in str(e.value) and "layer 0 stream 'k'" in str(e.value)


def test_verify_warns_about_a_torn_tail(tmp_path):
    path = tmp_path / "torn.kv"
    write_tiny(path, [[1, 2, 3]])
    with open(path, "ab") as f:
        f.write(bytes(3000))
    report = kvfile.verify(path)
    assert report["ok"] and report["torn_tail_bytes"] == 3000
    assert [f["error"] for f in report["findings"]] == [False]
    assert "torn tail" in report["findings"][0]["message"]


def test_missing_file(tmp_path):
    missing = tmp_path / "missing.kv"
    for call in (lambda: kvfile.open(missing), lambda: kvfile.open(missing, "a"), lambda: kvfile.verify(missing)):
        with pytest.raises(kvfile.NotFoundError) as e:
            call()
        assert isinstance(e.value, FileNotFoundError) and isinstance(e.value, kvfile.Error)
        assert e.value.code == "not_found" and str(missing) in str(e.value)


def test_not_a_kvfile(tmp_path):
    path = tmp_path / "text.kv"
    path.write_bytes(b"hello, world\n" * 1000)
    with pytest.raises(kvfile.CorruptionError):
        kvfile.open(path)


# ---- argument checks ------------------------------------------------------------

def test_append_checks_arrays_before_writing(tmp_path):
    path = tmp_path / "args.kv"
    rng = np.random.default_rng(2)
    with kvfile.create(path, "tiny") as w:
        good = tiny_rows(rng, 3)
        with pytest.raises(TypeError, match="float64"):
            w.append([1, 2, 3], {"k": good["k"].astype(np.float64), "v": good["v"]})
        with pytest.raises(TypeError, match="numpy array"):
            w.append([1, 2, 3], {"k": good["k"].tolist(), "v": good["v"]})
        with pytest.raises(TypeError, match="int32"):
            w.append([1, 2, 3], {"k": good["k"].astype(np.int32), "v": good["v"]})
        with pytest.raises(TypeError, match="float32"):  # byte-swapped float32
            w.append([1, 2, 3], {"k": good["k"].astype(">f4"), "v": good["v"]})
        with pytest.raises(ValueError, match=re.escape("expected [layers=2, tokens=3, rows_per_token=2, row_width=16]")):
            w.append([1, 2, 3], {"k": good["k"][:, :2], "v": good["v"]})
        with pytest.raises(ValueError, match="shape \\(2, 3, 32\\)"):
            w.append([1, 2, 3], {"k": good["k"].reshape(2, 3, 32), "v": good["v"]})
        with pytest.raises(ValueError, match="no array for stream 'v'"):
            w.append([1, 2, 3], {"k": good["k"]})
        with pytest.raises(kvfile.InvalidArgumentError, match="no stream 'q'"):
            w.append([1, 2, 3], {**good, "q": good["k"]})
        with pytest.raises(ValueError, match="2\\*\\*32"):
            w.append([1, -2, 3], good)
        with pytest.raises(ValueError, match="2\\*\\*32"):
            w.append([1, 2**32, 3], good)
        with pytest.raises(TypeError, match="integers"):
            w.append([1.0, 2.0, 3.0], good)
        with pytest.raises(ValueError, match="1-D"):
            w.append([[1, 2, 3]], good)
        nan = {"k": good["k"].copy(), "v": good["v"]}
        nan["k"][1, 2, 0, 5] = np.nan
        with pytest.raises(kvfile.NonFiniteError) as e:
            w.append([1, 2, 3], nan)
        assert isinstance(e.value, ValueError) and "layer 1" in str(e.value)
        assert len(w) == 0
        # A non-contiguous view is accepted (copied).
        w.append([1, 2, 3], {"k": np.ascontiguousarray(good["k"][:, :, :, ::-1])[:, :, :, ::-1], "v": good["v"]})
        assert len(w) == 3
    with kvfile.open(path) as r:
        assert r.tokens.tolist() == [1, 2, 3]
        direct = tmp_path / "direct.kv"
        with kvfile.create(direct, "tiny") as w2:
            w2.append([1, 2, 3], good)
        with kvfile.open(direct) as d:
            assert np.array_equal(r.codes("k")[0], d.codes("k")[0])


def test_read_checks_its_arguments(tmp_path):
    path = tmp_path / "read.kv"
    write_tiny(path, [[1, 2, 3]])
    with kvfile.open(path) as r:
        with pytest.raises(TypeError, match="dtype"):
            r.read("k", dtype=np.float64)
        with pytest.raises(TypeError, match="dtype"):
            r.read("k", dtype="e4m3")
        # An unknown stream is the same error class as a bad layer.
        with pytest.raises(kvfile.InvalidArgumentError, match="no stream 'q' \\(streams: k, v\\)"):
            r.read("q")
        with pytest.raises(kvfile.InvalidArgumentError, match="no stream 2"):
            r.read(2)
        with pytest.raises(kvfile.InvalidArgumentError):
            r.read("k", layer=2)
        with pytest.raises(kvfile.InvalidArgumentError):
            r.read("k", 0, 0, 4)
        with pytest.raises(ValueError, match="before start"):
            r.read("k", 0, 2, 1)
        assert r.read("k", dtype="float16").dtype == np.float16
        assert r.read("k", dtype=np.uint16).dtype == np.uint16


def test_codes_of_a_raw_stream_are_refused(tmp_path):
    geometry = {"layers": 1, "streams": [{"name": "x", "rows_per_token": 1, "row_width": 4, "dtype": "bf16"}]}
    path = tmp_path / "raw.kv"
    with kvfile.create(path, geometry) as w:
        w.append([1], {"x": np.ones((1, 1, 1, 4), np.float32)})
    with kvfile.open(path) as r:
        with pytest.raises(kvfile.InvalidArgumentError, match="stored raw"):
            r.codes("x")


def test_open_mode(tmp_path):
    with pytest.raises(ValueError, match="mode"):
        kvfile.open(tmp_path / "x.kv", "w")
    with pytest.raises(TypeError):
        kvfile.open(tmp_path / "x.kv", sync="none")


# ---- the golden fixtures ------------------------------------------------------

# spec/FORMAT.md's worked example: k = [1, -2, 0.5, 448] and [0, 0, 0, -0];
# idx = bf16 1.5, -3, 0.25, 100.
EXAMPLE_K = [[1.0, -2.0, 0.5, 448.0], [0.0, 0.0, 0.0, -0.0]]
EXAMPLE_K_CODES = [[0x38, 0xC0, 0x30, 0x7E], [0x00, 0x00, 0x00, 0x80]]
EXAMPLE_IDX_BITS = [[0x3FC0, 0xC040], [0x3E80, 0x42C8]]


@pytest.mark.parametrize("name,version,k_dtype", [("example_v2.kv", "2.1", "e4m3"), ("example_v2_0.kv", "2.0", "e4m3"),
                                                  ("example_v1.kv", "1.0", "f32")])
def test_fixtures_read_back(name, version, k_dtype):
    with kvfile.open(FIXTURES / name) as r:
        info = r.info()
        assert info["version"] == version
        assert info["model"] == "example/tiny" and info["fingerprint"] == 0x0123456789ABCDEF
        assert info["geometry"] == {"layers": 1, "streams": [
            {"name": "k", "rows_per_token": 1, "row_width": 4, "dtype": k_dtype},
            {"name": "idx", "rows_per_token": 1, "row_width": 2, "dtype": "bf16"}]}
        assert r.tokens.tolist() == [101, 202]
        k = r.read("k", 0)
        assert k[:, 0].tolist() == EXAMPLE_K and np.signbit(k[1, 0, 3])
        codes, _, scales = r.codes("k", 0)  # v1: quantized on the fly, as an upgrade would
        assert codes[:, 0].tolist() == EXAMPLE_K_CODES and scales.tolist() == [[1.0], [1.0]]
        assert r.read("idx", 0, dtype="bf16")[:, 0].tolist() == EXAMPLE_IDX_BITS
    assert kvfile.verify(FIXTURES / name)["ok"]


def test_appending_to_a_v1_file_upgrades_it(tmp_path):
    path = tmp_path / "v1.kv"
    shutil.copyfile(FIXTURES / "example_v1.kv", path)
    with kvfile.open(path, "a", keep_raw=["idx"]) as w:
        assert w.recovery["upgraded_from_v1"]
        w.append([303], {"k": np.full((1, 1, 1, 4), 2.0, np.float32), "idx": np.zeros((1, 1, 1, 2), np.uint16)})
    with kvfile.open(path) as r:
        assert r.info()["version"] == "2.1"
        assert [s["dtype"] for s in r.geometry["streams"]] == ["e4m3", "bf16"]
        assert r.tokens.tolist() == [101, 202, 303]
        assert r.codes("k", 0)[0][:, 0].tolist() == EXAMPLE_K_CODES + [[0x7E] * 4]


# ---- the documented example (docs/api.md whole, README.md an excerpt) -----------

def doc_block(doc, marker, language):
    """The fenced block that follows `marker` in `doc` (a path under the source root)."""
    text = (ROOT / doc).read_text()
    block = re.search(re.escape(marker) + r"\s*```" + language + r"\n(.*?)```", text, re.S)
    assert block, f"{doc} must have a ```{language} block after {marker}"
    return block.group(1)


def test_docs_example_is_the_example_file():
    assert doc_block("docs/api.md", "<!-- example: src/python/examples/example.py -->", "python") == EXAMPLE.read_text()


def test_readme_excerpt_is_whole_lines_of_the_example_file():
    excerpt = doc_block("README.md", "<!-- excerpt: src/python/examples/example.py -->", "python")
    assert excerpt and "\n" + excerpt in "\n" + EXAMPLE.read_text()


def test_example_runs_and_prints_what_the_docs_show(tmp_path):
    # The kvfile this test imported, whatever the caller's PYTHONPATH was relative to.
    env = dict(os.environ, PYTHONPATH=str(Path(kvfile.__file__).resolve().parents[1]))
    out = subprocess.run([sys.executable, str(EXAMPLE)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    for doc in ("docs/api.md", "README.md"):
        assert out.stdout == doc_block(doc, "<!-- output: src/python/examples/example.py -->", "")


def test_torch_submodules_are_attributes_without_importing_torch(tmp_path):
    """`import kvfile; kvfile.torch.load(...)` as the docs write it: kvfile.torch
    and kvfile.transformers are reachable as attributes after a plain `import
    kvfile`, and neither that nor naming them imports torch or transformers
    (stand-ins on the path that exit 3 if imported prove it, torch installed or not)."""
    for name in ("torch", "transformers"):
        (tmp_path / f"{name}.py").write_text(f"raise SystemExit('imported {name}')\n")
    script = (
        "import sys, kvfile\n"
        "assert 'torch' not in sys.modules and 'kvfile.torch' not in sys.modules\n"
        "print(kvfile.torch.__name__, callable(kvfile.torch.load))\n"
        "print(kvfile.transformers.__name__, callable(kvfile.transformers.load_cache))\n"
        "print('torch' in sys.modules, 'transformers' in sys.modules, 'torch' in dir(kvfile), 'os' in dir(kvfile))\n"
        "try:\n"
        "    kvfile.no_such_name\n"
        "except AttributeError as e:\n"
        "    print(e)\n")
    package_dir = str(Path(kvfile.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), package_dir]))
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, env=env)
    assert (out.returncode, out.stderr) == (0, "")
    assert out.stdout == ("kvfile.torch True\n"
                          "kvfile.transformers True\n"
                          "False False True False\n"
                          "module 'kvfile' has no attribute 'no_such_name'\n")


def test_nvfp4_stream_codes_and_decoded_rows(tmp_path):
    """An nvfp4 stream (format 2.2): token 0 is the worked example of
    spec/CODEC.md 14.7, whose codes and scales are known; every decoded value
    is DEC(code) * (DEC_e4m3(block scale) * row scale), computed here."""
    path = str(tmp_path / "nv.kv")
    geometry = {"layers": 1, "streams": [{"name": "k", "rows_per_token": 2, "row_width": 16, "dtype": "nvfp4"}]}
    rng = np.random.default_rng(5)
    x = rows(rng, 1, 5, 2, 16)
    x[0, 0] = 0.0
    x[0, 0, 0, :4] = [12.0, -6.0, 1.0, -0.0]
    x[0, 0, 1, :3] = [0.75, -0.375, 0.1]
    with kvfile.create(path, geometry, chunk_tokens=2) as w:
        w.append([1, 2, 3, 4, 5], {"k": x})
    with kvfile.open(path) as r:
        assert r.info()["version"] == "2.2"
        codes, blocks, scales = r.codes("k", layer=0)
        assert codes.shape == (5, 16) and codes.dtype == np.uint8
        assert blocks.shape == (5, 2) and blocks.dtype == np.uint8
        assert scales.shape == (5,) and scales.dtype == np.float32
        assert list(codes[0, :2]) == [0xD7, 0x81]
        assert list(blocks[0]) == [0x7E, 0x5E]
        assert scales[0] == np.float32(12.0) / np.float32(2688.0)
        all_codes, _, _ = r.codes("k")
        assert all_codes.shape == (1, 5, 16)
        got = r.read("k", layer=0)
    nibbles = np.stack([codes & 15, codes >> 4], axis=-1).reshape(5, 32).astype(np.int64)
    e2m1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)
    divisor = (fp8_decode(blocks, "e4m3") * scales[:, None]).astype(np.float32)  # [5, 2], f32 product
    want = (e2m1[nibbles] * np.repeat(divisor, 16, axis=1)).astype(np.float32)
    assert np.array_equal(got.reshape(5, 32).view(np.uint32), want.view(np.uint32))
