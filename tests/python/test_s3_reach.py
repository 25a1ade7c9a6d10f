# SPDX-License-Identifier: Apache-2.0
# The Python API on s3:// paths, against a real store (the swift_store
# fixture, conftest.py), and interop with Debian's awscli and boto3 both
# ways: what they upload kvfile reads as it reads the local file; what
# kvfile uploads they download byte-identical, and it verifies.
import subprocess

import numpy as np
import pytest

import kvfile
from test_convert import write

AWS = "/usr/bin/aws"  # Debian's awscli, not another one on PATH


def corpus(tmp_path):
    write(tmp_path / "a.kv", list(range(10)), 1)
    write(tmp_path / "b.kv", [1, 2, 3, 50, 51], 2)
    members = {"a.kv": str(tmp_path / "a.kv"), "s/b.kv": str(tmp_path / "b.kv")}
    kvfile.pack(str(tmp_path / "c.kvpack"), members, chunk_tokens=4)
    return members


def same_session(a, b):
    """Same tokens, identity, geometry and rows (not bytes: each file has its own salt)."""
    with kvfile.open(str(a)) as x, kvfile.open(str(b)) as y:
        return (np.array_equal(x.tokens, y.tokens) and x.geometry == y.geometry
                and (x.info()["model"], x.info()["fingerprint"]) == (y.info()["model"], y.info()["fingerprint"])
                and all(np.array_equal(x.read_all()[s], y.read_all()[s]) for s in ("k", "v")))


def aws(store, *args):
    return subprocess.run([AWS, "--endpoint-url", store.endpoint, *args], env=store.env(), capture_output=True,
                          text=True, check=True)


def test_reads_what_awscli_uploaded_as_the_local_files(swift_store, s3_bucket, tmp_path):
    corpus(tmp_path)
    for name in ("a.kv", "c.kvpack"):
        aws(swift_store, "s3", "cp", str(tmp_path / name), f"s3://{s3_bucket}/up/{name}")
    url = f"s3://{s3_bucket}/up/"
    assert kvfile.walk(url) == [url + "a.kv", url + "c.kvpack"]
    assert same_session(url + "a.kv", tmp_path / "a.kv")
    with kvfile.open(url + "a.kv") as r:
        assert r.info()["bytes"] == (tmp_path / "a.kv").stat().st_size
    p = kvfile.Pack(url + "c.kvpack")
    assert p.members() == kvfile.Pack(str(tmp_path / "c.kvpack")).members()
    assert p.verify()["bytes"] == (tmp_path / "c.kvpack").stat().st_size
    p.materialize("s/b.kv", str(tmp_path / "remote_b.kv"))
    kvfile.Pack(str(tmp_path / "c.kvpack")).materialize("s/b.kv", str(tmp_path / "local_b.kv"))
    assert same_session(tmp_path / "remote_b.kv", tmp_path / "local_b.kv")
    assert kvfile.verify(url + "a.kv")["ok"]
    assert kvfile.find(url + "c.kvpack", [1, 2, 3, 50, 99]) == \
        {"path": "s/b.kv", "model": "test/tiny", "fingerprint": 7, "tokens": 5, "matched": 4}


def test_find_on_a_remote_pack_costs_at_most_3_requests(swift_store, s3_bucket, tmp_path):
    corpus(tmp_path)
    swift_store.boto3().upload_file(str(tmp_path / "c.kvpack"), s3_bucket, "c.kvpack")
    before = swift_store.requests()
    assert kvfile.find(f"s3://{s3_bucket}/c.kvpack", list(range(12)))["path"] == "a.kv"
    after = swift_store.requests()
    assert 1 <= after["total"] - before["total"] <= 3


def test_uploads_awscli_and_boto3_download_byte_identical(swift_store, s3_bucket, tmp_path):
    """What kvfile uploads, both clients download as the same bytes, of the
    size kvfile reported, and the download verifies (a pack's bytes are not
    compared with a local pack's: each file has its own salt)."""
    members = corpus(tmp_path)
    url = f"s3://{s3_bucket}/w/c.kvpack"
    stats = kvfile.pack(url, members, chunk_tokens=4)
    assert stats["bytes"] == (tmp_path / "c.kvpack").stat().st_size
    aws(swift_store, "s3", "cp", url, str(tmp_path / "aws.kvpack"))
    body = swift_store.boto3().get_object(Bucket=s3_bucket, Key="w/c.kvpack")["Body"].read()
    assert body == (tmp_path / "aws.kvpack").read_bytes() and len(body) == stats["bytes"]
    assert kvfile.Pack(str(tmp_path / "aws.kvpack")).verify()["members"] == 2
    # A .kv written by convert to an s3:// key, likewise.
    r = kvfile.convert(str(tmp_path / "a.kv"), f"s3://{s3_bucket}/w/a4.kv", "nvfp4")
    aws(swift_store, "s3", "cp", f"s3://{s3_bucket}/w/a4.kv", str(tmp_path / "aws_a4.kv"))
    body = swift_store.boto3().get_object(Bucket=s3_bucket, Key="w/a4.kv")["Body"].read()
    assert body == (tmp_path / "aws_a4.kv").read_bytes() and len(body) == r["bytes"]
    assert kvfile.verify(str(tmp_path / "aws_a4.kv"))["ok"]
    kvfile.convert(str(tmp_path / "a.kv"), str(tmp_path / "a4.kv"), "nvfp4")
    assert same_session(tmp_path / "aws_a4.kv", tmp_path / "a4.kv")


def test_a_missing_key_and_an_existing_one_raise(swift_store, s3_bucket, tmp_path):
    members = corpus(tmp_path)
    with pytest.raises(kvfile.NotFoundError, match=f"s3://{s3_bucket}/nosuch.kv"):
        kvfile.open(f"s3://{s3_bucket}/nosuch.kv")
    kvfile.pack(f"s3://{s3_bucket}/x.kvpack", members)
    with pytest.raises(kvfile.InvalidArgumentError, match=f"s3://{s3_bucket}/x.kvpack: file exists"):
        kvfile.convert(str(tmp_path / "a.kv"), f"s3://{s3_bucket}/x.kvpack", "nvfp4")
    assert kvfile.Pack(f"s3://{s3_bucket}/x.kvpack").members()[0]["name"] == "a.kv"  # untouched
    # An object is written whole, never opened for writing.
    with pytest.raises(kvfile.UnsupportedError, match="objects are written whole"):
        kvfile.create(f"s3://{s3_bucket}/new.kv", "tiny")


def test_torch_load_of_a_remote_file_equals_the_local_load(swift_store, s3_bucket, tmp_path):
    torch = pytest.importorskip("torch")
    corpus(tmp_path)
    swift_store.boto3().upload_file(str(tmp_path / "a.kv"), s3_bucket, "a.kv")
    remote = kvfile.torch.load(f"s3://{s3_bucket}/a.kv", device="cpu")
    local = kvfile.torch.load(str(tmp_path / "a.kv"), device="cpu")
    assert remote.keys() == local.keys()
    assert all(torch.equal(remote[k], local[k]) for k in local if isinstance(local[k], torch.Tensor))
