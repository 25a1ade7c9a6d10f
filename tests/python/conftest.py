# SPDX-License-Identifier: Apache-2.0
# Fixtures shared by the Python tests.
#
# swift_store: a real S3-compatible object store (OpenStack Swift with s3api
# on 127.0.0.1, tests/support/swift_store.py), started once per session on
# first use (about 5 s) and stopped at its end; s3_bucket: a fresh bucket
# of it per test.
import itertools
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import swift_store as _swift  # noqa: E402

_bucket_numbers = itertools.count()


@pytest.fixture(scope="session")
def swift_store(tmp_path_factory):
    store = _swift.Harness(tmp_path_factory.mktemp("swift"))
    yield store
    store.stop()


@pytest.fixture
def s3_bucket(swift_store):
    return swift_store.bucket("kvtest%d" % next(_bucket_numbers))
