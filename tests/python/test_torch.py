# SPDX-License-Identifier: Apache-2.0
# kvfile.torch and kvfile.transformers. Needs torch (skipped, with the
# reason shown, when it is missing); the CUDA tests need a GPU ("skipped: no
# CUDA" on a machine without one, as in CI). docs/gpu.md records a GPU run.
#
#   PYTHONPATH=build/python python3 -m pytest -rs tests/python/test_torch.py
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kvfile

torch = pytest.importorskip("torch", reason="no torch")
import kvfile.torch as kvtorch  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="skipped: no CUDA")
HERE = Path(__file__).resolve().parent

GEOMETRY = {"layers": 5, "streams": [
    {"name": "k", "rows_per_token": 4, "row_width": 64, "dtype": "e4m3"},
    {"name": "v", "rows_per_token": 4, "row_width": 64, "dtype": "e5m2"},
    {"name": "idx", "rows_per_token": 1, "row_width": 32, "dtype": "bf16"},
]}
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
NUMPY_NAME = {torch.bfloat16: "bf16", torch.float16: np.float16, torch.float32: np.float32}


def write_file(path, tokens=300, scale=1.0, seed=0):
    """A mixed file: e4m3, e5m2, raw bf16; rows spread over many binades
    (scale 1e-38 reaches subnormal outputs, 1e34 the f16 clamp)."""
    rng = np.random.default_rng(seed)
    data = {}
    for s in GEOMETRY["streams"]:
        shape = (GEOMETRY["layers"], tokens, s["rows_per_token"], s["row_width"])
        data[s["name"]] = (rng.standard_normal(shape) * np.exp(rng.uniform(-8, 8, shape[:3] + (1,))) * scale
                           ).astype(np.float32)
    with kvfile.create(path, GEOMETRY, model="m", fingerprint=3, chunk_tokens=64) as w:
        w.append(np.arange(tokens) + 7, data)
    return data


def library_decode(path, dtype, start=0, stop=None):
    with kvfile.open(path) as r:
        return r.read_all(dtype=NUMPY_NAME[dtype], start=start, stop=stop)


def as_bits(t):
    t = t.detach().cpu().contiguous()
    return t.view(torch.int16).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
def test_load_cpu_is_the_library_decode(tmp_path, dtype):
    write_file(tmp_path / "s.kv")
    got = kvtorch.load(tmp_path / "s.kv", device="cpu", dtype=dtype, start=10, stop=250)
    want = library_decode(tmp_path / "s.kv", dtype, 10, 250)
    assert got["tokens"].dtype == torch.int64 and got["tokens"].tolist() == list(range(17, 257))
    for name, a in want.items():
        assert got[name].dtype == dtype and tuple(got[name].shape) == a.shape
        assert as_bits(got[name]) == a.tobytes()


@cuda
@pytest.mark.parametrize("scale", [1.0, 1e-38, 1e34])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("staging", [None, 1])
def test_load_cuda_is_bit_exact_with_the_cpu_decode(tmp_path, dtype, scale, staging):
    # staging=1: one layer per part, so five parts pass through the two
    # staging buffers (double buffering exercised).
    write_file(tmp_path / "s.kv", scale=scale)
    got = kvtorch.load(tmp_path / "s.kv", device="cuda", dtype=dtype, start=3, stop=299, staging_bytes=staging)
    want = library_decode(tmp_path / "s.kv", dtype, 3, 299)
    assert got["tokens"].device.type == "cuda"
    for name, a in want.items():
        assert got[name].device.type == "cuda" and got[name].dtype == dtype
        assert as_bits(got[name]) == a.tobytes(), name


@cuda
def test_dequantize_matches_every_code_and_the_clamp():
    # Every code with scales from tiny to huge, for both kinds and dtypes.
    codes = torch.arange(256, dtype=torch.uint8).repeat(64, 1).view(64, 1, 256)
    scales = torch.logspace(-40, 36, 64, dtype=torch.float64).to(torch.float32).view(64, 1)
    for kind in ("e4m3", "e5m2"):
        bad = {0x7F, 0xFF} if kind == "e4m3" else set(range(0x7C, 0x80)) | set(range(0xFC, 0x100))
        keep = torch.tensor([c not in bad for c in range(256)])
        table = kvfile.fp8_decode_table(kind)
        for dtype in DTYPES:
            got = kvtorch.dequantize(codes.cuda(), scales.cuda(), kind, dtype).cpu()[..., keep]
            with np.errstate(over="ignore"):  # the largest scales overflow: the clamp's case
                values = table[codes.numpy()] * scales.numpy()[..., None]
            if dtype == torch.float32:  # an overflowing product is clamped to FLT_MAX (spec/CODEC.md 7)
                lim = np.finfo(np.float32).max
                want = np.clip(values, -lim, lim)
            elif dtype == torch.float16:
                want = np.clip(values, -65504, 65504).astype(np.float16)
            else:
                lim = np.array([0x7F7F0000], np.uint32).view(np.float32)[0]
                u = np.clip(values, -lim, lim).view(np.uint32).astype(np.uint64)
                want = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
            assert as_bits(got) == np.ascontiguousarray(want[..., keep.numpy()]).tobytes(), (kind, dtype)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_save_and_append_round_trip(tmp_path, device):
    g = torch.Generator().manual_seed(1)
    k = torch.randn(3, 10, 2, 8, generator=g).to(torch.bfloat16).to(device)
    v = torch.randn(3, 10, 2, 8, generator=g).to(device)
    path = tmp_path / "t.kv"
    kvtorch.save(path, {"k": k[:, :6], "v": v[:, :6]}, torch.arange(6), model="m", fingerprint=9,
                 dtype={"k": "bf16", "v": "f32"})
    kvtorch.append(path, {"k": k[:, 6:], "v": v[:, 6:]}, list(range(6, 10)))
    got = kvtorch.load(path, device=device, dtype=torch.float32)
    assert got["tokens"].tolist() == list(range(10))
    assert torch.equal(got["k"], k.float()) and torch.equal(got["v"], v)
    with kvfile.open(path) as r:
        assert r.info()["model"] == "m" and r.info()["fingerprint"] == 9
    with pytest.raises(ValueError, match="stream 'k': 4 tokens, but 3 token ids"):
        kvtorch.append(path, {"k": k[:, 6:], "v": v[:, 6:]}, [1, 2, 3])
    assert len(kvfile.open(path)) == 10


@cuda
def test_transformers_generation_resumes_from_a_file(tmp_path):
    """A small random-weight Llama: process 1 runs the prompt, saves its cache
    (bf16, e4m3, e5m2) and continues greedily; process 2 loads each file and
    continues. bf16: identical tokens and logits; fp8: agreement reported."""
    pytest.importorskip("transformers", reason="no transformers")
    script = HERE / "resume_check.py"
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    subprocess.run([sys.executable, str(script), "save", str(tmp_path)], check=True, env=env)
    done = subprocess.run([sys.executable, str(script), "resume", str(tmp_path)], check=True, env=env,
                          capture_output=True, text=True)
    print(done.stdout)
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    assert lines["bf16"].startswith("identical tokens and logits"), done.stdout


NVFP4_GEOMETRY = {"layers": 2, "streams": [
    {"name": "k", "rows_per_token": 2, "row_width": 32, "dtype": "nvfp4"},
    {"name": "v", "rows_per_token": 2, "row_width": 32, "dtype": "e4m3"},
]}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_load_of_nvfp4_streams_is_the_library_decode(tmp_path, dtype, device):
    # On CUDA nvfp4 streams travel as codes and scales and are decoded on the GPU.
    rng = np.random.default_rng(3)
    data = {s["name"]: rng.standard_normal((2, 40, 2, 32)).astype(np.float32) for s in NVFP4_GEOMETRY["streams"]}
    with kvfile.create(tmp_path / "n.kv", NVFP4_GEOMETRY, chunk_tokens=16) as w:
        w.append(np.arange(40), data)
    got = kvtorch.load(tmp_path / "n.kv", device=device, dtype=dtype)
    with kvfile.open(tmp_path / "n.kv") as r:
        want = r.read_all(dtype=NUMPY_NAME[dtype])
    for name, a in want.items():
        assert got[name].dtype == dtype and tuple(got[name].shape) == a.shape
        assert as_bits(got[name]) == a.tobytes()


# Rows imported from a llama.cpp quantized cache may be Hadamard-rotated
# (docs/llama.md, "The Hadamard trap"): load and load_into say so where the
# model id records rotated=yes, or rotated=unknown with a quantized type,
# and stay quiet for float caches and un-rotated imports.
@pytest.mark.parametrize("model,warns", [
    ("llama.cpp:seq3 k=q8_0 v=q8_0 v_trans=0 stream=0/1 seq=0 pos=0 rotated=yes", "are Hadamard-rotated"),
    ("llama.cpp:seq3 k=q8_0 v=f16 v_trans=0 stream=0/1 seq=0 pos=0 rotated=unknown", "may be Hadamard-rotated"),
    ("llama.cpp:seq3 k=q8_0 v=q8_0 v_trans=0 stream=0/1 seq=0 pos=0 rotated=no", None),
    ("llama.cpp:seq3 k=f16 v=f16 v_trans=0 stream=0/1 seq=0 pos=0 rotated=no", None),
    ("m", None),
])
def test_load_warns_of_rows_llama_cpp_may_have_rotated(tmp_path, model, warns):
    import warnings
    path = tmp_path / "r.kv"
    k = torch.randn(2, 3, 2, 64)
    kvtorch.save(path, {"k": k, "v": k.clone()}, torch.arange(3), model=model, dtype="f32")
    dest = [torch.zeros(2, 4, 2, 2, 64) for _ in range(2)]  # vLLM layout: [2, blocks, block_size, heads, dim]
    for call in (lambda: kvtorch.load(path, device="cpu"),
                 lambda: kvtorch.load_into(path, dest, block_ids=[0, 1], layout="vllm")):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        texts = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        if warns is None:
            assert texts == []
        else:
            assert len(texts) == 1 and warns in texts[0] and "--unrotate" in texts[0], texts
