"""Fixtures of the dask engine tests: one LocalCluster on 127.0.0.1, sources, a test adapter.

The cluster is session-scoped (two worker processes, one thread each, no dashboard) and
closed cleanly at the end, so distributed has nothing to warn about at shutdown. Its
workers are spawned from this process after this folder is on ``sys.path``, so they can
import ``dask_adapters`` when a task's pickled adapter refers to it.
"""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

from simstore.catalog import Catalog  # noqa: E402
from simstore.testing.adapters import add_adapters  # noqa: E402
from simstore.testing.s3 import moto_server, s3_bucket, s3_env  # noqa: E402

__all__ = ["moto_server", "s3_bucket", "s3_env"]

TEST_ADAPTER = "testvals"


@pytest.fixture(scope="session")
def dask_address():
    """The scheduler address of a 2-worker LocalCluster bound to 127.0.0.1."""
    import distributed
    with distributed.LocalCluster(
        host="127.0.0.1",
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},  # health routes only, loopback
    ) as cluster:
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
        yield cluster.scheduler_address


@pytest.fixture
def catalog_at(tmp_path):
    """Make an initialised local store under tmp_path by name."""

    def make(name):
        return Catalog.init(str(tmp_path / name))

    return make


@pytest.fixture
def npz_dir(tmp_path):
    """Nine .npz runs of different sizes (three in a subfolder) and a file no adapter reads."""
    root = tmp_path / "npz"
    (root / "sub").mkdir(parents=True)
    rng = np.random.default_rng(7)
    for i in range(9):
        rel = f"sub/run{i}" if i >= 6 else f"run{i}"
        np.savez(
            root / f"{rel}.npz",
            pressure=rng.standard_normal((8 + i, 16)).astype(np.float32),
            ids=np.arange(i + 2, dtype=np.int64),
        )
    (root / "notes.txt").write_text("not data")
    return root


@pytest.fixture
def test_adapter(monkeypatch):
    """Register ``dask_adapters``' ``ValuesAdapter`` as ``testvals`` and
    ``WholeValuesAdapter`` as ``testvals-whole`` (driver side).

    The driver loads it by entry point and pickles it into each task, so workers need
    only to import its module, not to see the entry point.
    """
    add_adapters(monkeypatch, {TEST_ADAPTER: "dask_adapters:ValuesAdapter",
                               "testvals-whole": "dask_adapters:WholeValuesAdapter"})
    return TEST_ADAPTER
