"""A dask worker's task threads, as an ingest task counts them (its writer thread and
chunk encoders take a share of the cores by them), on real workers."""

from __future__ import annotations

import distributed
import pytest

from simstore.ingest._dask import _worker_threads

pytestmark = pytest.mark.dask


def test_a_dask_worker_counts_its_task_threads(dask_address):
    assert _worker_threads() == 1  # outside a worker
    with distributed.Client(dask_address, set_as_default=False) as client:
        assert client.submit(_worker_threads, pure=False).result(timeout=60) == 1
    with (
        # in this process: scheduler and worker talk in memory; their HTTP routes on
        # the loopback only
        distributed.LocalCluster(n_workers=1, threads_per_worker=3, processes=False,
                                 dashboard_address=None,
                                 scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
                                 worker_dashboard_address="127.0.0.1:0") as cluster,
        distributed.Client(cluster, set_as_default=False) as client,
    ):
        assert client.submit(_worker_threads, pure=False).result(timeout=60) == 3
