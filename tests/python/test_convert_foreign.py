# SPDX-License-Identifier: Apache-2.0
# kvfile.convert (the library's kvfile::Convert) with the foreign formats,
# both ways: llama.cpp state files, Mooncake record directories and colibri
# sessions, on the fixtures the C++ tests use (tests/fixtures/llama,
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
