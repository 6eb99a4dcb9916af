"""Fixtures of the loader tests: small committed datasets in local stores."""

from __future__ import annotations

import os

import pytest
from loader_helpers import commit_samples, make_samples


@pytest.fixture
def store_path(tmp_path):
    path = os.path.join(str(tmp_path), "store")
    return path


@pytest.fixture
def small(store_path):
    """60 samples in 6 shards of dataset 'sim'; returns (store, ref, samples by key)."""
    samples = make_samples(60)
    commit_samples(store_path, "sim", samples, per_shard=10)
    return store_path, "sim", {s.key: s for s in samples}
