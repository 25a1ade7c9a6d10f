# SPDX-License-Identifier: Apache-2.0
# The object store the S3 tests run against (tests/support/swift_store.py):
# Debian's awscli and boto3 talk to it with the credentials it states.
import filecmp
import os
import subprocess

import pytest

AWS = "/usr/bin/aws"  # Debian's awscli, not another one on PATH


def aws(store, *args, check=True):
    return subprocess.run([AWS, "--endpoint-url", store.endpoint, *args], env=store.env(),
                          capture_output=True, text=True, check=check)


def test_aws_and_boto3_see_each_others_objects(swift_store, s3_bucket, tmp_path):
    data = os.urandom(9 << 20)  # over awscli's 8 MiB multipart threshold
    (tmp_path / "up.bin").write_bytes(data)
    aws(swift_store, "s3", "cp", str(tmp_path / "up.bin"), "s3://%s/a/up.bin" % s3_bucket)
    s3 = swift_store.boto3()
    head = s3.head_object(Bucket=s3_bucket, Key="a/up.bin")
    assert head["ContentLength"] == len(data)
    assert head["ETag"].endswith('-2"')  # a multipart upload (an SLO in Swift): 8 MiB + 1 MiB
    assert s3.get_object(Bucket=s3_bucket, Key="a/up.bin", Range="bytes=8388600-8388615")["Body"].read() == \
        data[8388600:8388616]
    s3.put_object(Bucket=s3_bucket, Key="b/down.bin", Body=data[:1000])
    aws(swift_store, "s3", "cp", "s3://%s/b/down.bin" % s3_bucket, str(tmp_path / "down.bin"))
    assert (tmp_path / "down.bin").read_bytes() == data[:1000]


def test_wrong_secret_and_missing_bucket_are_refused(swift_store, s3_bucket):
    env = swift_store.env()
    env["AWS_SECRET_ACCESS_KEY"] = "wrong"
    r = subprocess.run([AWS, "--endpoint-url", swift_store.endpoint, "s3", "ls", "s3://%s/" % s3_bucket],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 254 and "SignatureDoesNotMatch" in r.stderr
    r = aws(swift_store, "s3", "ls", "s3://nobucket-here/", check=False)
    assert r.returncode == 254 and "NoSuchBucket" in r.stderr
