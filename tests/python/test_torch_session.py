# SPDX-License-Identifier: Apache-2.0
# Session persistence in kvfile.torch / kvfile.transformers (issue 32): the
# torch encoder against the library's CPU codec, appending a turn, the model
# fingerprint's refusals, load_into a paged cache. CPU paths run wherever
# torch (1.13 and later) is installed; the CUDA ones show "skipped: no CUDA".
#
#   PYTHONPATH=build/python python3 -m pytest -rs tests/python/test_torch_session.py
import types
import warnings

import numpy as np
import pytest

import kvfile

torch = pytest.importorskip("torch", reason="no torch")
import kvfile.torch as kvtorch  # noqa: E402
import kvfile.transformers as kvtf  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="skipped: no CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=cuda)]
KINDS = ["e4m3", "e5m2", "nvfp4"]


def hard_rows(seed=0):
    """[layers 2, tokens 64, rows 4, width 32] float32 rows that reach every
    branch of the codec: values over many binades with outliers, exact RNE
    ties of e4m3 and e5m2 (rows whose scale is a power of two), fp8
    subnormals and their ties, all-zero and signed-zero rows, rows whose
    scale is raised to FLT_MIN, rows near FLT_MAX, and nvfp4 blocks whose
    divisor is zero under an outlier."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((2, 64, 4, 32)) * np.exp(rng.uniform(-12, 12, (2, 64, 4, 1)))).astype(np.float32)
    x[:, ::7, :, 3] *= 1e4  # outliers
    for t in range(8, 24):  # ties: amax = 448 * 2^s, so x / scale is exact
        s = 2.0 ** int(rng.integers(-20, 20))
        j = rng.integers(0, 8, 31)
        e = rng.integers(-8, 8, 31)
        e4 = (8 + j + 0.5) * 2.0 ** (e - 3.0)  # halfway between e4m3 steps
        e5 = (4 + j % 4 + 0.5) * 2.0 ** (e - 2.0)  # halfway between e5m2 steps
        sub = (j + 0.5) * 2.0 ** -9  # e4m3 subnormal ties
        q = np.where(t % 3 == 0, e4, np.where(t % 3 == 1, e5, sub))
        x[:, t, :, 0] = 448 * s
        x[:, t, :, 1:] = (q * s * np.where(rng.random(31) < 0.5, -1, 1)).astype(np.float32)
    x[:, 30] = 0.0
    x[:, 31] = -0.0
    x[:, 31, :, ::2] = 0.0
    x[:, 32] = np.float32(2.0 ** -120) * rng.standard_normal((2, 4, 32)).astype(np.float32)  # FLT_MIN scale
    x[:, 32, :, 5] = np.float32(3 * 2.0 ** -133)
    x[:, 33] = np.float32(3e38) * np.sign(rng.standard_normal((2, 4, 32))).astype(np.float32)  # the clamp
    x[:, 34] = rng.standard_normal((2, 4, 32)).astype(np.float32)
    x[:, 34, 0, 0] = 1e30  # nvfp4: the other blocks of the token get a zero divisor
    x[:, 35, :, :16] = np.float32(1e-40)  # f32 subnormal inputs
    return torch.from_numpy(x)


def codes_of(path):
    with kvfile.open(path) as r:
        return {name: [np.asarray(a).tobytes() for a in arrays if a is not None]
                for name, arrays in r.codes_all().items()}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_torch_encoder_writes_the_library_codes(tmp_path, device, kind, dtype):
    """Codes, scales and block scales byte for byte: the same rows saved
    through the torch encoder (on `device`) and through the library's CPU codec."""
    x = hard_rows()
    if dtype == torch.float16:  # within f16's range (an Inf would be refused)
        x = x.clamp(-60000.0, 60000.0)
    x = x.to(dtype).to(device)
    ids = torch.arange(x.shape[1])
    kvtorch.save(tmp_path / "torch.kv", {"k": x}, ids, dtype=kind, encoder="torch")
    kvtorch.save(tmp_path / "lib.kv", {"k": x}, ids, dtype=kind, encoder="library")
    got, want = codes_of(tmp_path / "torch.kv"), codes_of(tmp_path / "lib.kv")
    assert len(got["k"]) == (3 if kind == "nvfp4" else 2)
    for i, (a, b) in enumerate(zip(got["k"], want["k"])):
        assert a == b, f"{kind} {dtype} part {i}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
def test_a_non_finite_row_is_refused_naming_the_row(tmp_path, device, kind):
    x = hard_rows()[:, :40].to(device)
    path = tmp_path / "s.kv"
    kvtorch.save(path, {"k": x[:, :20]}, torch.arange(20), dtype=kind, encoder="torch")
    bad = x[:, 20:].clone()
    bad[1, 7, 2, 5] = float("inf") if kind == "e5m2" else float("nan")
    with pytest.raises(kvfile.NonFiniteError) as e:
        kvtorch.append(path, {"k": bad}, torch.arange(20, 40), encoder="torch")
    assert str(e.value) == "non-finite value in layer 1, stream 'k', token 27, row 2"
    assert len(kvfile.open(path)) == 20


def test_writer_append_checks_encoded_codes(tmp_path):
    """Writer.append's (codes, scales) form: checked like rows, then by the library as a reader would."""
    geometry = {"layers": 1, "streams": [{"name": "k", "rows_per_token": 2, "row_width": 4, "dtype": "e4m3"},
                                         {"name": "r", "rows_per_token": 1, "row_width": 4, "dtype": "bf16"}]}
    codes = np.full((1, 3, 2, 4), 0x38, np.uint8)
    scales = np.ones((1, 3, 2), np.float32)
    rows = np.zeros((1, 3, 1, 4), np.uint16)
    with kvfile.create(tmp_path / "c.kv", geometry) as w:
        with pytest.raises(TypeError, match=r"^stream 'k' scales: dtype float64, expected float32$"):
            w.append([1, 2, 3], {"k": (codes, scales.astype(np.float64)), "r": rows})
        with pytest.raises(ValueError, match=r"^stream 'k' codes: shape \(1, 3, 8\), expected \[1, 3, 2, 4\]$"):
            w.append([1, 2, 3], {"k": (codes.reshape(1, 3, 8), scales), "r": rows})
        with pytest.raises(TypeError, match=r"^stream 'r': the stream is bf16, so it takes rows \(an array\), not codes$"):
            w.append([1, 2, 3], {"k": (codes, scales), "r": (rows, scales)})
        bad = scales.copy()
        bad[0, 2, 1] = 0.0
        with pytest.raises(kvfile.NonFiniteError, match=r"^invalid scale in layer 0, stream 'k', token 2, row 1$"):
            w.append([1, 2, 3], {"k": (codes, bad), "r": rows})
        assert len(w) == 0
        w.append([1, 2, 3], {"k": (codes, scales), "r": rows})
    with kvfile.open(tmp_path / "c.kv") as r:
        got_codes, _, got_scales = r.codes_all()["k"]
        assert got_codes.tobytes() == codes.tobytes() and got_scales.tobytes() == scales.tobytes()


@pytest.mark.parametrize("device", DEVICES)
def test_raw_streams_travel_as_they_are(tmp_path, device):
    x = hard_rows()[:, :36]
    k = x.to(torch.bfloat16).to(device)
    kvtorch.save(tmp_path / "r.kv", {"k": k, "v": x.to(device)}, torch.arange(36),
                 dtype={"k": "bf16", "v": "f32"}, encoder="torch")
    got = kvtorch.load(tmp_path / "r.kv", device="cpu", dtype=torch.float32)
    assert torch.equal(got["k"], k.cpu().float()) and torch.equal(got["v"], x)


def session(tokens, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"k": torch.randn(3, tokens, 2, 16, generator=g), "v": torch.randn(3, tokens, 2, 16, generator=g)}


@pytest.mark.parametrize("device", DEVICES)
def test_append_turn_appends_only_the_new_tokens(tmp_path, device):
    path = tmp_path / "s.kv"
    rows = {n: t.to(device) for n, t in session(30).items()}
    kvtorch.save(path, {n: t[:, :20] for n, t in rows.items()}, torch.arange(20), dtype="bf16")
    # The rows the file already holds are never read: NaN there changes nothing.
    poisoned = {n: t.clone() for n, t in rows.items()}
    for t in poisoned.values():
        t[:, :20] = float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        done = kvtorch.append_turn(path, poisoned, torch.arange(30))
    assert done == {"kept": 20, "dropped": 0, "appended": 10}
    got = kvtorch.load(path, device="cpu", dtype=torch.float32)
    assert got["tokens"].tolist() == list(range(30))
    assert torch.equal(got["k"], rows["k"].cpu().to(torch.bfloat16).float())


def test_append_turn_rewinds_to_the_common_prefix_and_says_so(tmp_path):
    path = tmp_path / "s.kv"
    rows = session(30)
    kvtorch.save(path, {n: t[:, :20] for n, t in rows.items()}, torch.arange(20), dtype="f32")
    other = session(25, seed=1)
    ids = list(range(12)) + [900 + i for i in range(13)]  # diverges at token 12
    with pytest.warns(RuntimeWarning, match=r"s\.kv: the file's tokens diverge from the session's at token 12; "
                                            r"rewound from 20 to 12 tokens before appending"):
        done = kvtorch.append_turn(path, other, ids)
    assert done == {"kept": 12, "dropped": 8, "appended": 13}
    got = kvtorch.load(path, device="cpu", dtype=torch.float32)
    assert got["tokens"].tolist() == ids
    assert torch.equal(got["k"][:, :12], rows["k"][:, :12]) and torch.equal(got["k"][:, 12:], other["k"][:, 12:])
    # A session that is a prefix of the file: rewound, nothing appended.
    with pytest.warns(RuntimeWarning, match="rewound from 25 to 5 tokens"):
        assert kvtorch.append_turn(path, other, ids[:5]) == {"kept": 5, "dropped": 20, "appended": 0}
    assert len(kvfile.open(path)) == 5


LLAMA = {"architectures": ["LlamaForCausalLM"], "_name_or_path": "meta-llama/Llama-3.1-8B", "num_hidden_layers": 3,
         "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64, "head_dim": 16,
         "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                  "high_freq_factor": 4.0,
                                                  "original_max_position_embeddings": 8192},
         "sliding_window": None, "torch_dtype": "bfloat16"}


def fake_cache(rows):
    """A transformers-5-shaped cache ([1, heads, tokens, dim] per layer) without transformers."""
    return types.SimpleNamespace(layers=[types.SimpleNamespace(keys=rows["k"][i].transpose(0, 1)[None],
                                                               values=rows["v"][i].transpose(0, 1)[None])
                                         for i in range(rows["k"].shape[0])])


def changed(**fields):
    config = {k: (dict(v) if isinstance(v, dict) else v) for k, v in LLAMA.items()}
    for k, v in fields.items():
        if k == "factor":
            config["rope_scaling"]["factor"] = v
        else:
            config[k] = v
    return types.SimpleNamespace(**config)


def test_model_identity_names_the_config_fields():
    model_id, fingerprint = kvtf.model_identity(types.SimpleNamespace(**LLAMA))
    assert model_id == ("hf:arch=LlamaForCausalLM layers=3 heads=4 kv_heads=2 head_dim=16 hidden=64 rope=llama3 "
                        "theta=500000 scaling=factor:8,hff:4,lff:1,ompe:8192 window=- dtype=bfloat16 weights=- "
                        "rev=- name=meta-llama/Llama-3.1-8B")
    assert fingerprint == kvtf.model_identity(dict(LLAMA))[1] != 0
    # A long name is cut in the id (255 bytes), not in the fingerprint.
    long_id, long_fp = kvtf.model_identity(dict(LLAMA, _name_or_path="x" * 300))
    assert len(long_id) == 255 and long_id.endswith(" name=" + "x" * (255 - len(model_id) + 23))
    assert long_fp != kvtf.model_identity(dict(LLAMA, _name_or_path="x" * 299))[1]


@pytest.mark.parametrize("change, field, was, now", [
    ({"rope_theta": 10000.0}, "theta", "500000", "10000"),
    ({"factor": 16.0}, "scaling", "factor:8,", "factor:16,"),
    ({"num_hidden_layers": 4}, "layers", "3", "4"),
    ({"num_key_value_heads": 4}, "kv_heads", "2", "4"),
    ({"torch_dtype": "float16"}, "dtype", "bfloat16", "float16"),
])
def test_a_file_of_another_model_is_refused_naming_what_differs(tmp_path, change, field, was, now):
    path = tmp_path / "s.kv"
    rows = session(12)
    kvtf.save_cache(fake_cache({n: t[:, :8] for n, t in rows.items()}), path, list(range(8)),
                    model=types.SimpleNamespace(**LLAMA))
    other = changed(**change)
    for call in (lambda: kvtf.append_cache(fake_cache(rows), path, list(range(12)), model=other),
                 lambda: kvtf.load_cache(path, device="cpu", model=other)):
        with pytest.raises(kvfile.MismatchError) as e:
            call()
        message = str(e.value)
        assert message.startswith(f"{path}: written for another model: {field}: {was}"), message
        assert f"in the file, {now}" in message and message.count(" in the file, ") == 1, message
    assert len(kvfile.open(path)) == 8
    # The same config is accepted, and the turn appended.
    assert kvtf.append_cache(fake_cache(rows), path, list(range(12)), model=types.SimpleNamespace(**LLAMA)) == \
        {"kept": 8, "dropped": 0, "appended": 4}


def paged(layout, layers, blocks, block_size, heads, dim, dtype, device):
    shape = {"vllm": (2, blocks, block_size, heads, dim), "nhd": (blocks, 2, block_size, heads, dim),
             "hnd": (blocks, 2, heads, block_size, dim)}[layout]
    return [torch.full(shape, -7.0, dtype=dtype, device=device) for _ in range(layers)]


def gather(layout, d, which, blk, off):
    if layout == "vllm":
        return d[which, blk, off]
    if layout == "nhd":
        return d[blk, which, off]
    return d[blk, which, :, off]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["vllm", "nhd", "hnd"])
@pytest.mark.parametrize("kind", ["e4m3", "nvfp4", "bf16"])
@pytest.mark.parametrize("block_size", [16, 5])
def test_load_into_a_paged_cache(tmp_path, device, layout, kind, block_size):
    path = tmp_path / "s.kv"
    rows = session(37)
    kvtorch.save(path, rows, torch.arange(37), dtype=kind)
    want = kvtorch.load(path, device="cpu", dtype=torch.bfloat16)
    blocks = (37 + block_size - 1) // block_size
    block_ids = torch.randperm(blocks + 3)[:blocks]  # any blocks of a larger pool, in any order
    t = torch.arange(37)
    blk, off = block_ids[t // block_size], t % block_size
    # Two tensor-parallel ranks, each with its own head, on one device.
    for rank in range(2):
        dest = paged(layout, 3, blocks + 3, block_size, 1, 16, torch.bfloat16, device)
        seen = []
        how = {"block_ids": block_ids} if rank == 0 else {"slot_mapping": blk * block_size + off}
        events = kvtorch.load_into(path, dest, layout=layout, heads=(rank, rank + 1),
                                   on_layer=lambda layer, event: seen.append(layer), **how)
        assert seen == [0, 1, 2] and len(events) == 3
        for layer in range(3):
            for which, name in enumerate(("k", "v")):
                got = gather(layout, dest[layer].cpu(), which, blk, off)
                assert as_bits(got) == as_bits(want[name][layer, :, rank:rank + 1]), (layer, name)
        # Slots no token maps to are untouched.
        assert int((dest[0] == -7.0).sum()) == dest[0].numel() - 2 * 37 * 16


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["e4m3", "nvfp4", "bf16"])
def test_load_into_takes_an_open_reader_and_leaves_it_open(tmp_path, device, kind):
    """load_into(reader) fills the destination with the bytes load_into(path)
    gives, call after call on the same reader (its threads kept), in the
    background too; the reader stays open for the caller, and a closed one is
    refused with the library's error."""
    path = tmp_path / "s.kv"
    kvtorch.save(path, session(203, seed=5), torch.arange(203), dtype=kind, chunk_tokens=16)
    block_ids = torch.randperm(16, generator=torch.Generator().manual_seed(6))[:13]
    want = paged("vllm", 3, 16, 16, 2, 16, torch.bfloat16, device)
    kvtorch.load_into(path, want, block_ids=block_ids, threads=4)
    with kvfile.open(path) as reader:
        for call in range(3):
            got = paged("vllm", 3, 16, 16, 2, 16, torch.bfloat16, device)
            if call < 2:
                events = kvtorch.load_into(reader, got, block_ids=block_ids, threads=4)
            else:
                events = kvtorch.load_into(reader, got, block_ids=block_ids, threads=4, background=True).result()
            assert len(events) == 3
            assert [as_bits(x) for x in got] == [as_bits(x) for x in want], call
        assert len(reader) == 203 and reader.path == str(path)  # still open
    loaded = kvtorch.load(path, device="cpu", dtype=torch.bfloat16)
    t = torch.arange(203)
    blk, off = block_ids[t // 16], t % 16
    for layer in range(3):
        for which, name in enumerate(("k", "v")):
            assert as_bits(gather("vllm", got[layer].cpu(), which, blk, off)) == as_bits(loaded[name][layer])
    with pytest.raises(kvfile.FailedError, match="reader is closed"):
        kvtorch.load_into(reader, paged("vllm", 3, 16, 16, 2, 16, torch.bfloat16, device), block_ids=block_ids)


def as_bits(t):
    t = t.detach().cpu().contiguous()
    return t.view(torch.int16).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()


def test_layer_0_is_read_first_in_slices_that_end_on_chunk_boundaries():
    # 1,000 tokens from 10 of a file of 64-token chunks, 4 slices: each ends
    # on a chunk boundary (multiples of 64), then parts of 3 layers.
    assert kvtorch._parts(8, 3, 10, 1010, 64, 4) == [
        (0, 1, 10, 256), (0, 1, 256, 512), (0, 1, 512, 768), (0, 1, 768, 1010),
        (1, 4, 10, 1010), (4, 7, 10, 1010), (7, 8, 10, 1010)]
    # Fewer chunks than slices: one slice a chunk; a one-layer file is all slices.
    assert kvtorch._parts(1, 3, 0, 100, 64, 4) == [(0, 1, 0, 64), (0, 1, 64, 100)]
    # No slicing (load): parts of 3 layers from layer 0, every token each.
    assert kvtorch._parts(4, 3, 5, 9, 256, 0) == [(0, 3, 5, 9), (3, 4, 5, 9)]


@cuda
@pytest.mark.parametrize("kind", ["e4m3", "nvfp4", "bf16"])
@pytest.mark.parametrize("staging", [None, 4096])
@pytest.mark.parametrize("slices", [1, 2, 4])
def test_load_into_reads_layer_0_in_slices_and_the_rest_in_parts(tmp_path, monkeypatch, kind, staging, slices):
    """Layer 0 alone, whole or in token slices, of a many-chunk file from a
    start inside a chunk, then the other layers in parts (one layer a part
    with 4 KiB of staging): every token lands in its slot, bit for bit the
    CPU decode."""
    monkeypatch.setattr(kvtorch, "FIRST_LAYER_SLICES", slices)
    path = tmp_path / "s.kv"
    rows = session(203, seed=3)
    kvtorch.save(path, rows, torch.arange(203), dtype=kind, chunk_tokens=16)
    want = kvtorch.load(path, device="cpu", dtype=torch.bfloat16, start=7)
    tokens, block_size = 196, 16
    blocks = (tokens + block_size - 1) // block_size
    block_ids = torch.randperm(blocks + 2, generator=torch.Generator().manual_seed(4))[:blocks]
    t = torch.arange(tokens)
    blk, off = block_ids[t // block_size], t % block_size
    dest = paged("vllm", 3, blocks + 2, block_size, 2, 16, torch.bfloat16, "cuda")
    seen = []
    events = kvtorch.load_into(path, dest, block_ids=block_ids, start=7, staging_bytes=staging,
                               on_layer=lambda layer, event: seen.append(layer))
    assert seen == [0, 1, 2] and len(events) == 3
    for layer in range(3):
        for which, name in enumerate(("k", "v")):
            got = gather("vllm", dest[layer].cpu(), which, blk, off)
            assert as_bits(got) == as_bits(want[name][layer]), (layer, name)
    assert int((dest[0] == -7.0).sum()) == dest[0].numel() - 2 * tokens * 2 * 16


@cuda
def test_load_into_in_the_background_signals_each_layer(tmp_path):
    path = tmp_path / "s.kv"
    rows = session(64)
    kvtorch.save(path, rows, torch.arange(64), dtype="e4m3")
    want = kvtorch.load(path, device="cuda")
    dest = paged("vllm", 3, 4, 16, 2, 16, torch.bfloat16, "cuda")
    job = kvtorch.load_into(path, dest, block_ids=[3, 2, 1, 0], background=True)
    for layer in range(3):
        job.wait_for_layer(layer)
        got = dest[layer][0, [3, 2, 1, 0]].reshape(64, 2, 16)
        assert torch.equal(got, want["k"][layer])
    assert len(job.result()) == 3


@cuda
def test_a_session_appended_every_turn_resumes_in_another_process(tmp_path):
    """session_check.py: a random-weight Llama appends its cache after each of
    4 turns (bf16, e4m3, e5m2, nvfp4); a fresh process resumes: bf16 gives the
    reference's tokens and logits; five changed configs are refused."""
    pytest.importorskip("transformers", reason="no transformers")
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent / "session_check.py"
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    saved = subprocess.run([sys.executable, str(script), "save", str(tmp_path)], check=True, env=env,
                           capture_output=True, text=True)
    done = subprocess.run([sys.executable, str(script), "resume", str(tmp_path)], check=True, env=env,
                          capture_output=True, text=True)
    print(saved.stdout + done.stdout)
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    assert lines["bf16"].startswith("identical tokens and logits"), done.stdout
    for field in ("rope_theta", "rope_scaling_factor", "num_hidden_layers", "num_key_value_heads", "dtype"):
        assert "written for another model" in lines[f"refused {field}"], done.stdout
    assert "accepted" in done.stdout
