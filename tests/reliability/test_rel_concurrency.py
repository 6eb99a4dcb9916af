"""N processes committing to one branch at once, on a local store and on S3: no commit lost.

Every commit must appear exactly once in the branch's history (a lost commit is missing,
a re-applied one appears twice), every sample it wrote must be in the head, and the key
all writers rewrite holds the newest commit's value. On S3 a share of the ref updates
also loses its response after landing, the case where the store sees its own write as a
conflict.
"""

from __future__ import annotations

import pytest
import rel_harness as h

from simstore.catalog import Catalog
from simstore.testing.s3 import FAKE_ACCESS_KEY, FAKE_SECRET_KEY

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
