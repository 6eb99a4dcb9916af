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
def node_records(tmp_path, monkeypatch):
    """The node's records (hashes, manifest rows, page layouts) in a folder of this test's;
    files count as settled at once. Returns the folder."""
    from simstore import _verified

    folder = str(tmp_path / "verified")
    monkeypatch.setenv("SIMSTORE_VERIFIED_DIR", folder)
    monkeypatch.setattr(_verified, "SETTLED_S", 0.0)
    return folder


@pytest.fixture
def small(store_path):
    """60 samples in 6 shards of dataset 'sim'; returns (store, ref, samples by key)."""
    samples = make_samples(60)
    commit_samples(store_path, "sim", samples, per_shard=10)
    return store_path, "sim", {s.key: s for s in samples}


def pytest_collection_modifyitems(items):
    # Once a test has read Lance shards, lance warns at every later fork of this process.
    # The fork-worker tests here read only the test format, never Lance, so that warning
    # (an error under `filterwarnings = error`) is not about them.
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.filterwarnings("ignore:lance is not fork-safe:UserWarning"))
