"""Fixtures of the S3 tests that read one store directly and through the fault proxy.

Each module that uses them gives its store options as its module-level ``FAST`` (its
retries' backoff and timeouts, sized for what it plays).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from simstore.storage._s3 import S3Store
from simstore.testing.s3 import FaultProxy


@pytest.fixture
def store(request: pytest.FixtureRequest, s3_bucket: Callable[[], str]) -> Iterator[S3Store]:
    """A store in a fresh bucket, with the requesting module's ``FAST`` options."""
    s = S3Store(f"s3://{s3_bucket()}/root", storage_options=dict(request.module.FAST))
    yield s
    s.close()


@pytest.fixture
def proxied(request: pytest.FixtureRequest, store: S3Store,
            fault_proxy: FaultProxy) -> Iterator[S3Store]:
    """The same bucket as ``store``, every request through the fault proxy."""
    s = S3Store(store.url, storage_options={**request.module.FAST,
                                            "endpoint_url": fault_proxy.endpoint_url})
    yield s
    s.close()
