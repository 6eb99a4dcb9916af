"""An S3 endpoint that throttles, resets, loses responses, stalls or cuts bodies short.

Through :class:`~simstore.testing.s3.FaultProxy`, for a share of requests: ingest and
commit, an epoch streamed with and without a disk cache, gc and verify. With a moderate
share (20 %) every step must finish and give exactly the clean result; with most
requests failing a step may fail, but only with a StorageError naming the store, the key
and the attempts, and checked afterwards through a clean endpoint the store verifies and
the branch holds the old or the new content, never a mix. A sample the loader yields is
always the right one.
"""

from __future__ import annotations

import numpy as np
import pytest
import rel_harness as h

from simstore.catalog import Catalog, gc, verify
from simstore.errors import SimstoreError, StorageError
from simstore.ingest import ingest
from simstore.testing.s3 import FAKE_ACCESS_KEY, FAKE_SECRET_KEY, fast_retry_options

pytestmark = pytest.mark.s3

FAULTS = ["slowdown", "drop", "drop_response", "stall", "truncate"]


def _options(endpoint, attempts):
    return fast_retry_options(endpoint, attempts, read_timeout_s=0.5, connect_timeout_s=0.5)


def _sources(tmp_path, count=8, version=0):
    src = tmp_path / "src"
    h.write_sources(str(src), version, count=count, seed=9)
    expected = {}
    for path in sorted(src.iterdir()):
        with np.load(path, allow_pickle=False) as z:
            expected[path.stem] = z["u"].copy()
    return src, expected


def _epoch(url, options, cache_dir=None):
    from simstore.loaders import SimDataset

    ds = SimDataset(url, "ds", shuffle=False, storage_options=options, cache_dir=cache_dir)
    return {s["__key__"]: s["u"].numpy().copy() for s in ds}


def _same(data, expected):
    assert data.keys() == expected.keys()
    for key, value in expected.items():
        np.testing.assert_array_equal(data[key], value)


@pytest.mark.parametrize("fault", FAULTS)
def test_a_share_of_faults_is_survived_exactly(
    tmp_path, s3_bucket, moto_server, fault_proxy, fault
):
    url = f"s3://{s3_bucket()}/store"
    clean = _options(moto_server, 8)
    faulty = _options(fault_proxy.endpoint_url, 8)
    fault_proxy.stall_s = 1.0
    Catalog.init(url, storage_options=clean)
    src, expected = _sources(tmp_path)
    fault_proxy.fail_share(0.2, fault, seed=FAULTS.index(fault))
    ingest(
        [str(src)],
        dataset="ds",
        store=Catalog.open(url, storage_options=faulty),
        snapshot=True,
        message="through faults",
    )
    _same(_epoch(url, faulty), expected)
    _same(_epoch(url, faulty, cache_dir=str(tmp_path / "cache")), expected)
    cat = Catalog.open(url, storage_options=faulty)
    gc(cat, grace_s=0)
    assert verify(cat, "ds", deep=True).ok
    fault_proxy.clear()
    assert fault_proxy.count(fault) > 0
    cat = Catalog.open(url, storage_options=clean)
    assert h.store_problems(cat) == []
    _same(_epoch(url, clean), expected)


@pytest.mark.parametrize("fault", ["slowdown", "drop_response", "truncate"])
def test_mostly_failing_endpoint_fails_clearly_and_corrupts_nothing(
    tmp_path, s3_bucket, moto_server, fault_proxy, fault
):
    url = f"s3://{s3_bucket()}/store"
    clean = _options(moto_server, 8)
    faulty = _options(fault_proxy.endpoint_url, 2)
    Catalog.init(url, storage_options=clean)
    src, expected = _sources(tmp_path)
    ingest(
        [str(src)],
        dataset="ds",
        store=Catalog.open(url, storage_options=clean),
        snapshot=True,
        message="v0",
    )
    before = h.content(Catalog.open(url, storage_options=clean), "ds")
    _, expected_v1 = _sources(tmp_path, version=1)  # an upsert: v0 keys stay
    expected_v1 = {**expected, **expected_v1}
    fault_proxy.fail_share(0.7, fault, seed=3)
    errors = []
    try:
        ingest(
            [str(src)],
            dataset="ds",
            store=Catalog.open(url, storage_options=faulty),
            snapshot=True,
            message="v1",
        )
    except SimstoreError as exc:
        errors.append(exc)
    try:
        data = _epoch(url, faulty)
    except SimstoreError as exc:
        errors.append(exc)
    else:  # what it yields is exactly v0 or v1 (the head when the dataset was opened)
        want = expected_v1 if data.keys() == expected_v1.keys() else expected
        _same(data, want)
    fault_proxy.clear()
    assert errors, "nothing failed with most requests failing"
    for exc in errors:
        text = str(exc)
        assert isinstance(exc, StorageError), repr(exc)
        assert url in text and "attempt" in text, text
        assert FAKE_SECRET_KEY not in text and FAKE_ACCESS_KEY not in text
    cat = Catalog.open(url, storage_options=clean)
    assert h.store_problems(cat) == []
    now = h.content(cat, "ds")
    assert now == before or set(now) == set(before) | {"extra001"}
