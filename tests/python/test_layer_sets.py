# SPDX-License-Identifier: Apache-2.0
# A stream present in some layers only (spec/FORMAT.md 3.2): the geometry
# dict carries its "layers", Writer.append takes that stream's arrays with
# its own layer count, Reader.read / read_all return them, and
# kvfile.torch.load returns the stream with its own layer count and says
# which layers ("<name>.layers").
#
#   PYTHONPATH=build/python python3 -m pytest -rs tests/python/test_layer_sets.py
import numpy as np
import pytest

import kvfile

GEOMETRY = {"layers": 6, "streams": [
    {"name": "latent", "rows_per_token": 1, "row_width": 16, "dtype": "e4m3"},
    {"name": "indexer", "rows_per_token": 1, "row_width": 8, "dtype": "bf16", "layers": [0, 4, 5]},
]}


def write(path, tokens=7):
    rng = np.random.default_rng(3)
    latent = rng.standard_normal((6, tokens, 1, 16)).astype(np.float32)
    indexer = rng.standard_normal((3, tokens, 1, 8)).astype(np.float32)
    with kvfile.create(str(path), GEOMETRY, chunk_tokens=4) as w:
        w.append(np.arange(tokens, dtype=np.uint32), {"latent": latent, "indexer": indexer})
    return latent, indexer


def test_reader_and_writer_keep_a_streams_own_layers(tmp_path):
    _, indexer = write(tmp_path / "a.kv")
    with kvfile.open_reader(str(tmp_path / "a.kv")) as r:
        assert r.geometry == GEOMETRY
        assert r.info()["minor_version"] == 3
        idx = r.read("indexer", dtype="f32")
        assert idx.shape == (3, 7, 1, 8)
        # bf16 storage: the f32 input rounded to bf16, exactly.
        bits = indexer.view(np.uint32)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).view(np.float32)
        np.testing.assert_array_equal(idx, rounded)
        np.testing.assert_array_equal(r.read("indexer", layer=4, dtype="f32"), rounded[1])
        with pytest.raises(kvfile.InvalidArgumentError, match="stream 'indexer' is not in layer 1 "
                                                              r"\(it is in layers 0,4,5\)"):
            r.read("indexer", layer=1)
        every = r.read_all(dtype="f32")
        assert every["latent"].shape == (6, 7, 1, 16)
        np.testing.assert_array_equal(every["indexer"], rounded)


def test_append_wants_the_streams_own_layer_count(tmp_path):
    with kvfile.create(str(tmp_path / "b.kv"), GEOMETRY) as w:
        with pytest.raises(ValueError, match=r"stream 'indexer': shape \(6, 2, 1, 8\), expected \[layers=3, tokens=2, rows_per_token=1, row_width=8\]$"):
            w.append(np.arange(2, dtype=np.uint32), {"latent": np.zeros((6, 2, 1, 16), np.float32),
                                                       "indexer": np.zeros((6, 2, 1, 8), np.float32)})


def test_torch_load_returns_the_stream_with_its_layers(tmp_path):
    torch = pytest.importorskip("torch", reason="no torch")
    import kvfile.torch as kvtorch
    write(tmp_path / "c.kv")
    out = kvtorch.load(tmp_path / "c.kv", device="cpu", dtype=torch.float32)
    assert out["indexer"].shape == (3, 7, 1, 8)
    assert out["indexer.layers"] == [0, 4, 5]
    assert out["latent"].shape == (6, 7, 1, 16)
    assert "latent.layers" not in out
    with kvfile.open_reader(str(tmp_path / "c.kv")) as r:
        np.testing.assert_array_equal(out["indexer"].numpy(), r.read("indexer", dtype="f32"))


def test_codes_all_of_an_nvfp4_stream_in_some_layers(tmp_path):
    """codes_all reads an nvfp4 stream in its own layers, as codes() does
    layer by layer (it once asked for every layer and was refused)."""
    geometry = {"layers": 4, "streams": [
        {"name": "k", "rows_per_token": 1, "row_width": 16, "dtype": "e4m3"},
        {"name": "nv", "rows_per_token": 2, "row_width": 16, "dtype": "nvfp4", "layers": [1, 3]}]}
    rng = np.random.default_rng(1)
    path = str(tmp_path / "nv.kv")
    with kvfile.create(path, geometry, chunk_tokens=4) as w:
        w.append(np.arange(5, dtype=np.uint32), {"k": rng.standard_normal((4, 5, 1, 16)).astype(np.float32),
                                                  "nv": rng.standard_normal((2, 5, 2, 16)).astype(np.float32)})
    with kvfile.open_reader(path) as r:
        got = r.codes_all(threads=2)
        assert [a.shape for a in got["nv"]] == [(2, 5, 16), (2, 5, 2), (2, 5)]
        for part, want in zip(got["nv"], zip(*(r.codes("nv", layer=layer) for layer in (1, 3)))):
            np.testing.assert_array_equal(part, np.stack(want))
        assert (got["k"].codes.shape, got["k"].block_scales, got["k"].scales.shape) == ((4, 5, 1, 16), None, (4, 5, 1))
        with pytest.raises(TypeError, match=r"out\['nv'\] must be \(codes, block_scales, scales\): the stream is nvfp4"):
            r.codes_all(streams=["nv"], out={"nv": (got["nv"][0], got["nv"][2])})
