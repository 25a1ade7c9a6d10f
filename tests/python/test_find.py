# SPDX-License-Identifier: Apache-2.0
# Tests of kvfile.find and kvfile.index_directory (prefix lookup over a
# directory of .kv files, kvfile/prefix_index.h).
import numpy as np
import pytest

import kvfile

GEOMETRY = {"layers": 1, "streams": [{"name": "k", "rows_per_token": 1, "row_width": 4, "dtype": "bf16"}]}


def write(path, tokens, fingerprint):
    path.parent.mkdir(parents=True, exist_ok=True)
    with kvfile.create(path, GEOMETRY, model="org/m", fingerprint=fingerprint) as w:
        w.append(tokens, {"k": np.zeros((1, len(tokens), 1, 4), np.float32)})


def test_find_through_the_index(tmp_path):
    write(tmp_path / "a.kv", [1, 2, 3], 0x11)
    write(tmp_path / "sub" / "b.kv", [1, 2, 4, 5], 0x22)
    report = kvfile.index_directory(tmp_path)
    assert report == {"files": 2, "indexed": 2, "read": 2, "kept": 0, "skipped": 0, "written": True}
    assert (tmp_path / ".kvfile-index").read_bytes()[1:4] == b"KVI"
    m = kvfile.find(tmp_path, [1, 2, 4, 9])
    assert m == {"path": "sub/b.kv", "model": "org/m", "fingerprint": 0x22, "tokens": 4, "matched": 3}
    assert kvfile.find(tmp_path, [1, 2, 4, 9], model_fingerprint=0x11)["path"] == "a.kv"
    assert kvfile.find(tmp_path, [9, 1]) is None
    assert kvfile.find(tmp_path, [1], model_fingerprint=0x33) is None
    # A new file is picked up (the index refreshed on the way).
    write(tmp_path / "c.kv", [1, 2, 4, 9, 9], 0x11)
    assert kvfile.find(tmp_path, [1, 2, 4, 9])["path"] == "c.kv"
    assert kvfile.index_directory(tmp_path)["written"] is False


def test_find_errors(tmp_path):
    with pytest.raises(kvfile.NotFoundError):
        kvfile.find(tmp_path / "missing", [1])
    write(tmp_path / "a.kv", [1], 1)
    with pytest.raises(kvfile.CorruptionError, match="not a kvfile pack"):
        kvfile.find(tmp_path / "a.kv", [1])
    with pytest.raises(kvfile.InvalidArgumentError, match="not a directory"):
        kvfile.index_directory(tmp_path / "a.kv")
    with pytest.raises(TypeError):
        kvfile.find(tmp_path, ["x"])
