# SPDX-License-Identifier: Apache-2.0
# Tests of kvfile.repair (the library's Repair, kvfile/repair.h) and of the
# kinds kvfile.verify gives its findings: a healthy file, a torn tail (a
# dry run keeps every byte; the repair leaves exactly the valid file),
# damage in a committed chunk refused with force or without (the exception
# carries the report), a file cut inside its committed data cut only with
# force.
import numpy as np
import pytest

import kvfile


def write_tiny(path, tokens=12, chunk_tokens=4):
    rng = np.random.default_rng(5)
    block = {s: rng.uniform(-1, 1, size=(2, tokens, 2, 16)).astype(np.float32) for s in ("k", "v")}
    with kvfile.create(path, "tiny", model="test/tiny", chunk_tokens=chunk_tokens) as w:
        w.append(list(range(tokens)), block)


def chunk(path, i):
    with kvfile.open(path) as r:
        return r.chunks()[i]


def test_healthy_file(tmp_path):
    path = tmp_path / "a.kv"
    write_tiny(path)
    before = path.read_bytes()
    report = kvfile.repair(path)
    assert report["healthy"] and not report["repaired"] and report["tokens"] == 12
    assert report["findings"] == [] and report["cut"] is None and report["refused"] is None
    assert path.read_bytes() == before


def test_torn_tail_dry_run_then_repair(tmp_path):
    path = tmp_path / "a.kv"
    write_tiny(path)
    healthy = path.read_bytes()
    with open(path, "ab") as f:
        f.write(bytes(300))
    torn = path.read_bytes()
    assert [f["kind"] for f in kvfile.verify(path)["findings"]] == ["torn tail"]
    dry = kvfile.repair(path, dry_run=True)
    assert dry["dry_run"] and not dry["repaired"]
    assert dry["cut"] == "torn tail" and dry["cut_offset"] == len(healthy) and dry["cut_bytes"] == 300
    assert path.read_bytes() == torn
    report = kvfile.repair(path)
    assert report["repaired"] and report["cut"] == "torn tail" and report["cut_bytes"] == 300
    assert report["tokens"] == 12
    assert path.read_bytes() == healthy


@pytest.mark.parametrize("force", [False, True])
def test_damaged_chunk_is_refused(tmp_path, force):
    path = tmp_path / "a.kv"
    write_tiny(path)
    chunk1 = chunk(path, 1)
    with open(path, "r+b") as f:
        f.seek(chunk1["offset"] + 200)
        byte = f.read(1)[0]
        f.seek(chunk1["offset"] + 200)
        f.write(bytes([byte ^ 0x01]))
    damaged = path.read_bytes()
    with pytest.raises(kvfile.CorruptionError) as e:
        kvfile.repair(path, force=force)
    finding = kvfile.verify(path)["findings"][0]
    assert finding["kind"] == "damaged chunk"
    assert str(e.value) == f"{path}: {finding['message']}; not repaired (damage, not a crash's leftovers)"
    assert e.value.report["refused"] == "damaged chunk" and not e.value.report["repaired"]
    assert path.read_bytes() == damaged


def test_committed_data_missing_needs_force(tmp_path):
    path = tmp_path / "a.kv"
    write_tiny(path)
    chunk2 = chunk(path, 2)
    with open(path, "r+b") as f:
        f.truncate(chunk2["offset"] + 100)
    cut = path.read_bytes()
    with pytest.raises(kvfile.CorruptionError) as e:
        kvfile.repair(path)
    assert e.value.report["refused"] == "committed data missing"
    assert "use --force to cut the file at offset %d and commit the 8 tokens before it" % chunk2["offset"] in str(
        e.value)
    assert path.read_bytes() == cut
    dry = kvfile.repair(path, force=True, dry_run=True)
    assert dry["cut"] == "committed data missing" and dry["committed_tokens_lost"] == 4
    assert path.read_bytes() == cut
    report = kvfile.repair(path, force=True)
    assert report["repaired"] and report["tokens"] == 8 and report["committed_tokens_lost"] == 4
    assert path.stat().st_size == chunk2["offset"]
    assert kvfile.verify(path)["findings"] == []


def test_missing_file(tmp_path):
    with pytest.raises(kvfile.NotFoundError):
        kvfile.repair(tmp_path / "missing.kv")
