# SPDX-License-Identifier: Apache-2.0
# Tests of the seeds' formats from Python: the Mooncake golden record both
# ways, a refused record, and a colibri session imported and exported byte
# for byte (fixtures: tests/fixtures/seeds, written by make_fixtures.py).
from pathlib import Path

import numpy as np
import pytest

import kvfile

SEEDS = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "seeds"


def test_mooncake_golden_both_ways():
    golden = (SEEDS / "mooncake_golden_fp16.mckv").read_bytes()
    values = np.array([448, -448, 1, -0.0], dtype=np.float16)
    assert kvfile.mooncake_encode(values, group_size=4) == golden
    d = kvfile.mooncake_decode(golden)
    assert d["dtype"] == "fp16" and d["group_size"] == 4 and d["shape"] == (4,)
    assert d["values"].dtype == np.float16
    assert d["values"].view(np.uint16).tolist() == [0x5F00, 0xDF00, 0x3C00, 0x8000]
    assert d["codes"].tolist() == [0x7E, 0xFE, 0x38, 0x80]
    assert d["scales"].tolist() == [1.0]


def test_mooncake_bf16_groups_across_rows():
    bf16 = np.array([[0x4040, 0xBFC0, 0x3E80], [0x40C0, 0x3F80, 0x0000]], dtype=np.uint16)  # 3 -1.5 .25 | 6 1 0
    rec = kvfile.mooncake_encode(bf16, group_size=4)
    d = kvfile.mooncake_decode(rec)
    assert d["dtype"] == "bf16" and d["shape"] == (2, 3)
    assert d["scales"].tolist() == [np.float32(6.0) / np.float32(448.0), np.float32(1.0) / np.float32(448.0)]
    assert d["codes"][1].tolist()[0] == 0x7E  # element 3 (6.0) is the first group's amax


def test_mooncake_refusals():
    golden = bytearray((SEEDS / "mooncake_golden_fp16.mckv").read_bytes())
    golden[46] = 0x7F
    with pytest.raises(kvfile.CorruptionError, match="^CRC32 mismatch$"):
        kvfile.mooncake_decode(bytes(golden))
    with pytest.raises(kvfile.NonFiniteError, match="element 1 is not finite"):
        kvfile.mooncake_encode(np.array([1, np.inf], dtype=np.float16), group_size=2)
    with pytest.raises(TypeError):
        kvfile.mooncake_encode(np.zeros(4, dtype=np.float32), group_size=4)
    with pytest.raises(TypeError, match="in native byte order, not >f2$"):  # would be read byte-swapped
        kvfile.mooncake_encode(np.array([1, 2], dtype=">f2"), group_size=2)


def test_coli_round_trip(tmp_path):
    info = kvfile.coli_import(SEEDS / "coli_v2.coli_kv", tmp_path / "a.kv")
    assert info == {"version": 2, "tokens": 3, "layers": 2, "vocab": 100, "ignored_bytes": 7}
    with kvfile.open(tmp_path / "a.kv") as r:
        assert r.tokens.tolist() == [5, 17, 99]
    assert kvfile.coli_export(tmp_path / "a.kv", tmp_path / "b.coli_kv") == 3
    assert (tmp_path / "b.coli_kv").read_bytes() == (SEEDS / "coli_v2.coli_kv").read_bytes()[:-7]
    with pytest.raises(kvfile.InvalidArgumentError, match="file exists"):
        kvfile.coli_export(tmp_path / "a.kv", tmp_path / "b.coli_kv")
    cut = tmp_path / "cut.coli_kv"
    cut.write_bytes((SEEDS / "coli_v2.coli_kv").read_bytes()[:100])
    with pytest.raises(kvfile.CorruptionError, match="ends inside record 1 of 3"):
        kvfile.coli_import(cut, tmp_path / "c.kv")
    assert not (tmp_path / "c.kv").exists()
