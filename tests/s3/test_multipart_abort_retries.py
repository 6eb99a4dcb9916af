"""A failed multipart upload is aborted with the store's retries, not one best-effort try.

The upload's own error is the one raised; the abort (AbortMultipartUpload, a DELETE with
``uploadId``) is retried like any request within ``max_attempts`` and the deadline, and
a final failure of it is swallowed. Against moto on 127.0.0.1 through the fault proxy.
"""

from __future__ import annotations

import os

import pytest

from simstore.errors import StorageError
from simstore.storage._s3 import S3Store
from simstore.testing.s3 import make_s3_client

pytestmark = pytest.mark.s3

MiB = 1024 * 1024
MAX_ATTEMPTS = 3
OPTIONS = {
    "backoff_base_s": 0.001,
    "backoff_max_s": 0.005,
    "max_attempts": MAX_ATTEMPTS,
    "multipart_threshold_bytes": 5 * MiB,
    "multipart_part_bytes": 5 * MiB,  # moto enforces S3's 5 MiB parts
}


def _failing_upload(bucket, fault_proxy, tmp_path):
    """A store through the proxy and a 2-part file whose second part always gets 503."""
    store = S3Store(
        f"s3://{bucket}/root", storage_options={**OPTIONS, "endpoint_url": fault_proxy.endpoint_url}
    )
    path = tmp_path / "big.bin"
    path.write_bytes(os.urandom(6 * MiB))
    fault_proxy.fail_share(1.0, "slowdown", seed=0, methods=["PUT"], path_contains="partNumber=2")
    return store, str(path)


def _open_uploads(bucket, endpoint):
    client = make_s3_client(endpoint)
    try:
        return client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    finally:
        client.close()


def _aborts(fault_proxy):
    return [r for r in fault_proxy.records if r.method == "DELETE" and "uploadId=" in r.path]


def test_an_abort_that_fails_once_is_retried_and_leaves_no_upload(
    s3_bucket, s3_env, fault_proxy, tmp_path
):
    bucket = s3_bucket()
    store, path = _failing_upload(bucket, fault_proxy, tmp_path)
    fault_proxy.fail_next("slowdown", methods=["DELETE"])  # the first abort attempt
    with pytest.raises(StorageError, match=f"objects/big: upload failed after {MAX_ATTEMPTS}"):
        store.put_file("objects/big", path)
    assert [r.fault for r in _aborts(fault_proxy)] == ["slowdown", None]
    assert _open_uploads(bucket, s3_env) == []
    assert not store.exists("objects/big")


def test_an_abort_that_keeps_failing_gives_way_to_the_uploads_error(
    s3_bucket, s3_env, fault_proxy, tmp_path
):
    bucket = s3_bucket()
    store, path = _failing_upload(bucket, fault_proxy, tmp_path)
    fault_proxy.fail_next(*["drop"] * MAX_ATTEMPTS, methods=["DELETE"])
    with pytest.raises(StorageError, match=f"objects/big: upload failed after {MAX_ATTEMPTS}"):
        store.put_file("objects/big", path)
    # tried as often as any request, then given up: the upload is left to the bucket's
    # AbortIncompleteMultipartUpload lifecycle rule
    assert [r.fault for r in _aborts(fault_proxy)] == ["drop"] * MAX_ATTEMPTS
    assert len(_open_uploads(bucket, s3_env)) == 1
