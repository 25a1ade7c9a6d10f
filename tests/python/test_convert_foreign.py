# SPDX-License-Identifier: Apache-2.0
# kvfile.convert (the library's kvfile::Convert) with the foreign formats,
# both ways: llama.cpp state files, Mooncake record directories and colibri
# sessions (and the variants: a llama.cpp session, COLIKV1, a .kv of
# format 1), on the fixtures the C++ tests use (tests/fixtures/llama,
# tests/fixtures/seeds), byte for byte where the format allows.
import json
from pathlib import Path

import pytest

import kvfile

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures"
LLAMA = FIXTURES / "llama"
SEEDS = FIXTURES / "seeds"


def test_llama_state_file_both_ways_is_llamas_file(tmp_path):
    src = LLAMA / "seq-f16-fa1.bin"
    kv = tmp_path / "slot.kv"
    report = kvfile.convert(str(src), str(kv), keep_raw=["k", "v"], head_size=64)
    assert report["from"] == "llama" and report["to"] == "kv" and report["tokens"] == 24
    assert report["summary"] == ("24 tokens; 2 layers; sequence state of f16/f16 cache; "
                                 "k 2 x 64 f16, v 2 x 64 f16; 40960 bytes")
    back = tmp_path / "slot.bin"
    report = kvfile.convert(str(kv), str(back), to="llama")
    assert report["to"] == "llama"
    assert report["summary"] == "24 tokens; 2 layers; llama.cpp sequence state, f16 cache; 25036 bytes"
    assert back.read_bytes() == src.read_bytes()


def test_llama_state_without_head_size_is_refused_and_nothing_written(tmp_path):
    src = LLAMA / "seq-f16-fa1.bin"
    with pytest.raises(kvfile.InvalidArgumentError, match="does not record the head size"):
        kvfile.convert(str(src), str(tmp_path / "a.kv"))
    assert not (tmp_path / "a.kv").exists()


def test_mooncake_directory_both_ways_keeps_codes(tmp_path):
    kv = tmp_path / "a.kv"
    kvfile.convert(str(SEEDS / "coli_v2.coli_kv"), str(kv))  # latent and rope, e4m3, 3 tokens
    mc = tmp_path / "mc"
    report = kvfile.convert(str(kv), str(mc), to="mooncake")
    assert report["to"] == "mooncake"
    assert report["summary"] == "4 Mooncake records (4 with codes and scales as stored, 0 requantized), 3 tokens"
    assert report["notes"] == [f"{mc}: raw streams not exported (Mooncake records are fp8): [\"indexer\"]"]
    manifest = json.loads((mc / "manifest.json").read_text())
    assert manifest["format"] == "kvfile-mooncake" and manifest["tokens"] == 3
    back = tmp_path / "b.kv"
    report = kvfile.convert(str(mc), str(back))
    assert report["from"] == "mooncake" and report["tokens"] == 3
    with kvfile.open(str(kv)) as a, kvfile.open(str(back)) as b:
        assert list(a.tokens) == list(b.tokens)
        for layer in range(2):
            for stream in ("latent", "rope"):
                ca, cb = a.codes(stream, layer=layer), b.codes(stream, layer=layer)
                assert ca.codes.tobytes() == cb.codes.tobytes()
                assert ca.scales.tobytes() == cb.scales.tobytes()


def test_mooncake_damage_is_one_line_and_nothing_written(tmp_path):
    kv = tmp_path / "a.kv"
    kvfile.convert(str(SEEDS / "coli_v2.coli_kv"), str(kv))
    mc = tmp_path / "mc"
    kvfile.convert(str(kv), str(mc), to="mooncake")
    victim = mc / json.loads((mc / "manifest.json").read_text())["records"][0]["file"]
    data = bytearray(victim.read_bytes())
    data[60] ^= 4
    victim.write_bytes(bytes(data))
    with pytest.raises(kvfile.CorruptionError) as e:
        kvfile.convert(str(mc), str(tmp_path / "b.kv"))
    assert str(e.value) == f"{victim}: CRC32 mismatch"
    assert not (tmp_path / "b.kv").exists()


def test_colibri_session_both_ways_is_the_fixture(tmp_path):
    src = SEEDS / "coli_v2.coli_kv"
    kv = tmp_path / "a.kv"
    report = kvfile.convert(str(src), str(kv))
    assert report["from"] == "coli" and report["tokens"] == 3
    assert report["summary"] == "COLIKV2, 3 tokens, 2 layers (latent 4, rope 2, indexer 3), vocab 100"
    assert report["notes"] == [f"{src}: 7 bytes past the record count ignored (an uncommitted append, "
                               "as colibri ignores it)"]
    out = tmp_path / "b.coli_kv"
    report = kvfile.convert(str(kv), str(out))  # the suffix says colibri
    assert report["to"] == "coli" and report["summary"] == "COLIKV2, 3 tokens"
    assert out.read_bytes() == src.read_bytes()[:-7]


def test_colibri_cut_inside_its_records_is_refused(tmp_path):
    cut = tmp_path / "cut.coli_kv"
    cut.write_bytes((SEEDS / "coli_v2.coli_kv").read_bytes()[:100])
    with pytest.raises(kvfile.CorruptionError) as e:
        kvfile.convert(str(cut), str(tmp_path / "a.kv"))
    assert str(e.value) == (f"{cut}: the file ends inside record 1 of 3 (56 bytes each): "
                            "the committed records are not all there")
    assert not (tmp_path / "a.kv").exists()


def test_llama_session_both_ways_is_llamas_file(tmp_path):
    src = LLAMA / "session-f16-fa0.bin"
    kv = tmp_path / "s.kv"
    report = kvfile.convert(str(src), str(kv), keep_raw=["k", "v"], head_size=64)
    assert report["summary"] == ("24 tokens; 2 layers; session of f16/f16 cache (V transposed); "
                                 "k 2 x 64 f16, v 2 x 64 f16; 40960 bytes")
    back = tmp_path / "s.bin"
    report = kvfile.convert(str(kv), str(back), to="llama", session=True, cache_type="f16")
    assert report["summary"] == "24 tokens; 2 layers; llama.cpp session, f16 cache (V transposed); 25045 bytes"
    assert back.read_bytes() == src.read_bytes()
    # The same cache as a sequence state without the transposed V, then back
    # as a session: llama.cpp's session again.
    seq = tmp_path / "s.seq"
    report = kvfile.convert(str(kv), str(seq), to="llama", v_trans=False, n_stream=1)
    assert report["summary"] == "24 tokens; 2 layers; llama.cpp sequence state, f16 cache; 25036 bytes"
    kv2 = tmp_path / "s2.kv"
    kvfile.convert(str(seq), str(kv2), keep_raw=["k", "v"], head_size=64)
    again = tmp_path / "again.bin"
    kvfile.convert(str(kv2), str(again), to="llama", session=True, v_trans=True, arch="llama")
    assert again.read_bytes() == src.read_bytes()


def test_colibri_v1_export_and_partial_indexer_both_ways(tmp_path):
    kv = tmp_path / "a.kv"
    kvfile.convert(str(SEEDS / "coli_v2.coli_kv"), str(kv))
    v1 = tmp_path / "a.coli_kv"
    report = kvfile.convert(str(kv), str(v1), coli_v1=True)
    assert report["summary"] == "COLIKV1, 3 tokens"
    assert v1.read_bytes() == (SEEDS / "coli_v2_as_v1.coli_kv").read_bytes()
    glm = SEEDS / "coli_glm_partial.coli_kv"
    with pytest.raises(kvfile.InvalidArgumentError, match="the indexer is in 21 of 78 layers"):
        kvfile.convert(str(glm), str(tmp_path / "g.kv"))
    assert not (tmp_path / "g.kv").exists()
    layers = ",".join(str(i) for i in range(0, 77, 4)) + ",77"
    kvfile.convert(str(glm), str(tmp_path / "g.kv"), indexer_layers=layers)
    kvfile.convert(str(tmp_path / "g.kv"), str(tmp_path / "g.coli_kv"))
    assert (tmp_path / "g.coli_kv").read_bytes() == glm.read_bytes()


def test_kv_format_1_both_ways_keeps_every_value(tmp_path):
    coli = tmp_path / "coli.kv"
    kvfile.convert(str(SEEDS / "coli_v2.coli_kv"), str(coli))
    a = tmp_path / "a.kv"
    kvfile.convert(str(coli), str(a), "bf16")  # every stream raw: what format 1 holds
    v1 = tmp_path / "v1.kv"
    kvfile.convert(str(a), str(v1), kv_major=1)
    back = tmp_path / "back.kv"
    kvfile.convert(str(v1), str(back))  # format 2's default for a format 1 file: the upgrade's e4m3
    with kvfile.open(str(back)) as z:
        assert z.info()["geometry"]["streams"][0]["dtype"] == "e4m3"
    kvfile.convert(str(v1), str(back), "bf16", overwrite=True)
    with kvfile.open(str(a)) as x, kvfile.open(str(v1)) as y, kvfile.open(str(back)) as z:
        assert y.info()["major_version"] == 1 and z.info()["major_version"] == 2
        assert list(x.tokens) == list(y.tokens) == list(z.tokens)
        for layer in range(2):
            for stream in ("latent", "rope", "indexer"):
                want = x.read(stream, layer=layer).tobytes()
                assert y.read(stream, layer=layer).tobytes() == want
                assert z.read(stream, layer=layer).tobytes() == want
