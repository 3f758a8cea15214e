"""An S3-compatible object store for the test run (moto's server, real HTTP on 127.0.0.1), and a
fresh bucket per test.

    from tests.object_store_fixture import object_store_fixture, tier_bucket_fixture  # noqa: F401

(each fixture function is named ``*_fixture`` and registered under the name before it, so a test
module imports the functions and asks for ``object_store`` and ``tier_bucket``)

- ``object_store`` (session): one ``LocalObjectStore`` (data_plane/local_object_store.py) on a
  free port, its log under a temporary directory.
- ``tier_bucket`` (function): ``(endpoint_url, bucket_name)``, a new bucket. For the test's own
  process the environment holds the store's credentials and nothing else of AWS
  (``credential_environment``), so code under test finds them through the AWS chain; a broker
  the test starts gets ``object_store.environment()``. A test may take the store down:
  afterwards a paused store is resumed and a stopped one started again (empty, same port), and
  the bucket is deleted with its objects.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator

import pytest

from data_plane.local_object_store import LocalObjectStore, credential_environment


@pytest.fixture(scope="session", name="object_store")
def object_store_fixture() -> Iterator[LocalObjectStore]:
    log_dir = tempfile.mkdtemp(prefix="orbit-s3-")
    store = LocalObjectStore(os.path.join(log_dir, "object-store.log"))
    try:
        store.start()
        yield store
    finally:
        store.stop()
        shutil.rmtree(log_dir, ignore_errors=True)


@pytest.fixture(name="tier_bucket")
def tier_bucket_fixture(object_store: LocalObjectStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    for key, value in credential_environment(object_store.region).items():
        monkeypatch.setenv(key, value)
    bucket = f"t-{uuid.uuid4().hex[:20]}"
    object_store.create_bucket(bucket)
    try:
        yield object_store.endpoint_url, bucket
    finally:
        object_store.resume()
        if not object_store.running:
            object_store.start()
        object_store.delete_bucket(bucket)  # (gone already when the test restarted the store)
