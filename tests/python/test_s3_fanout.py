# SPDX-License-Identifier: Apache-2.0
# The Dask fan-out recipe (src/python/examples/dask_fanout.py, shown whole in
# docs/object-storage.md): every pack under an s3:// prefix verified and
# converted bf16 -> e4m3 on a LocalCluster of 2 worker processes.
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

import kvfile
from test_convert import write

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "src" / "python" / "examples" / "dask_fanout.py"


def recipe_env():
    """This process's environment (the store's AWS variables, set by the
    swift_store fixture, and under the ASan pass the preloaded runtime the
    module needs) with the kvfile this test imported."""
    return dict(os.environ, PYTHONPATH=str(Path(kvfile.__file__).resolve().parents[1]))


def test_docs_show_the_recipe_file_whole():
    text = (ROOT / "docs" / "object-storage.md").read_text()
    block = re.search(re.escape("<!-- example: src/python/examples/dask_fanout.py -->") + r"\s*```python\n(.*?)```",
                      text, re.S)
    assert block and block.group(1) == RECIPE.read_text()


def test_recipe_verifies_and_converts_every_pack_on_two_workers(swift_store, s3_bucket, tmp_path):
    s3 = swift_store.boto3()
    for p in range(3):
        members = {}
        for m in range(2):
            write(tmp_path / f"{p}_{m}.kv", [p, m] + list(range(20 + p)), 10 * p + m, "bf16")
            members[f"s{m}.kv"] = str(tmp_path / f"{p}_{m}.kv")
        kvfile.pack(str(tmp_path / f"p{p}.kvpack"), members, chunk_tokens=4)
        s3.upload_file(str(tmp_path / f"p{p}.kvpack"), s3_bucket, f"bf16/sub{p % 2}/p{p}.kvpack")
    env = recipe_env()
    src, dst = f"s3://{s3_bucket}/bf16/", f"s3://{s3_bucket}/e4m3/"
    out = subprocess.run([sys.executable, str(RECIPE), src, dst, "--dtype", "e4m3", "--workers", "2"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"{src}sub0/p0.kvpack -> {dst}sub0/p0.kvpack: 2 members, 44 tokens verified and converted",
        f"{src}sub0/p2.kvpack -> {dst}sub0/p2.kvpack: 2 members, 48 tokens verified and converted",
        f"{src}sub1/p1.kvpack -> {dst}sub1/p1.kvpack: 2 members, 46 tokens verified and converted"]
    for p in range(3):
        out_pack = kvfile.Pack(f"{dst}sub{p % 2}/p{p}.kvpack")
        assert out_pack.verify()["members"] == 2
        out_pack.materialize("s1.kv", str(tmp_path / "m.kv"))
        kvfile.convert(str(tmp_path / f"{p}_1.kv"), str(tmp_path / "ref.kv"), "e4m3", overwrite=True)
        with kvfile.open(str(tmp_path / "m.kv")) as m, kvfile.open(str(tmp_path / "ref.kv")) as ref:
            assert [s["dtype"] for s in m.geometry["streams"]] == ["e4m3", "e4m3"]
            assert np.array_equal(m.tokens, ref.tokens)
            assert all(np.array_equal(m.read_all()[s], ref.read_all()[s]) for s in ("k", "v"))


def test_recipe_fails_on_a_damaged_pack_and_writes_no_object_for_it(swift_store, s3_bucket, tmp_path):
    write(tmp_path / "a.kv", list(range(10)), 1, "bf16")
    kvfile.pack(str(tmp_path / "ok.kvpack"), {"a.kv": str(tmp_path / "a.kv")}, chunk_tokens=4)
    data = bytearray((tmp_path / "ok.kvpack").read_bytes())
    data[200] ^= 0x10
    s3 = swift_store.boto3()
    s3.put_object(Bucket=s3_bucket, Key="in/bad.kvpack", Body=bytes(data))
    env = recipe_env()
    out = subprocess.run([sys.executable, str(RECIPE), f"s3://{s3_bucket}/in/", f"s3://{s3_bucket}/out/",
                          "--workers", "2"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1
    assert "CorruptionError" in out.stderr and "checksum mismatch" in out.stderr
    assert "Contents" not in s3.list_objects_v2(Bucket=s3_bucket, Prefix="out/")
