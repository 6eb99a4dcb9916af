"""N processes committing to one branch at once, on a local store and on S3: no commit lost.

Every commit must appear exactly once in the branch's history (a lost commit is missing,
a re-applied one appears twice), every sample it wrote must be in the head, and the key
all writers rewrite holds the newest commit's value. On S3 a share of the ref updates
also loses its response after landing, the case where the store sees its own write as a
conflict.

moto (the S3 stand-in) checks a conditional write and then performs it without a lock, so
two of its threads could both let a compare-and-swap through; S3 does not. The suite's
autouse fixture makes moto's writes atomic (rel_harness.atomic_moto_writes), and the last
test here checks that it does, with a pause forced between moto's check and its write.
"""

from __future__ import annotations

import threading
import time

import pytest
import rel_harness as h
from botocore.exceptions import ClientError

from simstore.catalog import Catalog
from simstore.testing.s3 import FAKE_ACCESS_KEY, FAKE_SECRET_KEY, make_s3_client

pytestmark = pytest.mark.multiprocess

WRITERS, COMMITS = 6, 4


def test_writers_on_a_local_store_lose_no_commit(tmp_path, forkserver):
    url = str(tmp_path / "store")
    Catalog.init(url)
    h.run_writers(forkserver, url, None, WRITERS, COMMITS, str(tmp_path))
    assert h.commit_problems(Catalog.open(url), WRITERS, COMMITS) == []


def _s3_options(endpoint):
    return {
        "endpoint_url": endpoint,
        "key": FAKE_ACCESS_KEY,
        "secret": FAKE_SECRET_KEY,
        "region_name": "us-east-1",
        "backoff_base_s": 0.01,
        "backoff_max_s": 0.1,
        "max_attempts": 10,
    }


@pytest.mark.s3
def test_writers_on_s3_lose_no_commit(tmp_path, forkserver, s3_bucket, moto_server):
    url = f"s3://{s3_bucket()}/store"
    options = _s3_options(moto_server)
    Catalog.init(url, storage_options=options)
    h.run_writers(forkserver, url, options, WRITERS, COMMITS, str(tmp_path))
    assert h.commit_problems(Catalog.open(url, storage_options=options), WRITERS, COMMITS) == []


@pytest.mark.s3
def test_writers_on_s3_with_lost_responses_lose_no_commit(
    tmp_path, forkserver, s3_bucket, fault_proxy
):
    url = f"s3://{s3_bucket()}/store"
    options = _s3_options(fault_proxy.endpoint_url)
    Catalog.init(url, storage_options=options)
    # a quarter of the ref updates land but their response is lost
    fault_proxy.fail_share(
        0.25, "drop_response", seed=11, methods=["PUT"], path_contains="/refs/heads/"
    )
    h.run_writers(forkserver, url, options, WRITERS, COMMITS, str(tmp_path))
    fault_proxy.clear()
    assert fault_proxy.count("drop_response") > 0
    assert h.commit_problems(Catalog.open(url, storage_options=options), WRITERS, COMMITS) == []


def _race(clients, bucket: str, expected: str, attempt: int) -> tuple[list[int], list[str]]:
    """Every client PUTs ``ref`` with ``If-Match: expected`` at once: winners, refusals."""
    wins: list[int] = []
    refusals: list[str] = []
    barrier = threading.Barrier(len(clients))

    def swap(i: int) -> None:
        barrier.wait()
        body = f"{attempt}-{i}".encode()
        try:
            clients[i].put_object(Bucket=bucket, Key="ref", Body=body, IfMatch=expected)
            wins.append(i)
        except ClientError as exc:
            refusals.append(exc.response["Error"]["Code"])

    threads = [threading.Thread(target=swap, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return wins, refusals


@pytest.mark.s3
def test_the_s3_stand_in_lets_one_conditional_write_through(s3_bucket, moto_server, monkeypatch):
    """4 threads PUT with the same If-Match at once, 20 times: exactly one wins each time."""
    from moto.s3.responses import S3Response

    checksum = S3Response._get_checksum

    def paused(self, *args, **kwargs):
        time.sleep(0.005)  # between moto's If-Match check and its write
        return checksum(self, *args, **kwargs)

    monkeypatch.setattr(S3Response, "_get_checksum", paused)
    bucket = s3_bucket()
    clients = [make_s3_client(moto_server) for _ in range(4)]
    etag = clients[0].put_object(Bucket=bucket, Key="ref", Body=b"start")["ETag"]
    for attempt in range(20):
        wins, refusals = _race(clients, bucket, etag, attempt)
        assert len(wins) == 1, (attempt, wins, refusals)
        assert refusals == ["PreconditionFailed"] * (len(clients) - 1), refusals
        etag = clients[0].head_object(Bucket=bucket, Key="ref")["ETag"]
