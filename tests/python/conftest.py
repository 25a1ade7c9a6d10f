# SPDX-License-Identifier: Apache-2.0
# Fixtures shared by the Python tests.
#
# swift_store: a real S3-compatible object store (OpenStack Swift with s3api
# on 127.0.0.1, tests/support/swift_store.py), started once per session on
# first use (about 5 s) and stopped at its end, its AWS variables set in
# this process for the rest of the session (the library reads them once per
# process, on its first s3:// path); s3_bucket: a fresh bucket of it per
# test.
import itertools
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import swift_store as _swift  # noqa: E402

_bucket_numbers = itertools.count()


@pytest.fixture(scope="session")
def swift_store(tmp_path_factory):
    if not os.path.exists("/usr/lib/python3/dist-packages/swift/__init__.py"):
        pytest.skip("OpenStack Swift (python3-swift) is not installed: no object store to test against")
    store = _swift.Harness(tmp_path_factory.mktemp("swift"))
    saved = dict(os.environ)
    os.environ.update({k: v for k, v in store.env({}).items() if k.startswith("AWS_")})
    for k in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3"):
        os.environ.pop(k, None)
    yield store
    store.stop()
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def s3_bucket(swift_store):
    return swift_store.bucket("kvtest%d" % next(_bucket_numbers))
