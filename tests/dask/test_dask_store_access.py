"""Dask workers that cannot reach the store: the run fails, naming the worker, whatever
``on_error`` says (a worker without the store is no bad file to skip)."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from simstore.catalog import Catalog
from simstore.errors import InvalidInputError
from simstore.ingest import ingest

pytestmark = [pytest.mark.dask, pytest.mark.s3]

AWS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
)


@pytest.fixture
def no_credentials_cluster(monkeypatch, s3_env):
    """A one-worker LocalCluster whose worker process has no AWS credentials.

    The worker is spawned while this process's environment lacks them (as on a cluster
    whose nodes have no instance role); the driver, this process, has them again after.
    """
    import distributed
    with monkeypatch.context() as m:
        for name in AWS:
            m.delenv(name, raising=False)
        cluster = distributed.LocalCluster(
            host="127.0.0.1",
            n_workers=1,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
        )
    assert os.environ["AWS_ACCESS_KEY_ID"]  # the driver has them
    try:
        yield cluster.scheduler_address
    finally:
        cluster.close()


@pytest.fixture
def sources(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    rng = np.random.default_rng(3)
    for i in range(3):
        np.savez(root / f"run{i}.npz", u=rng.random((8, 8)).astype(np.float32))
    return root


def test_workers_without_credentials_fail_the_run_even_under_skip(
    no_credentials_cluster, sources, s3_bucket
):
    url = f"s3://{s3_bucket()}/store"
    cat = Catalog.init(url)
    for on_error in ("skip", "fail"):
        with pytest.raises(InvalidInputError) as info:
            ingest(
                [sources],
                dataset="d",
                store=cat,
                engine="dask",
                address=no_credentials_cluster,
                on_error=on_error,
            )
        message = str(info.value)
        assert re.match(
            rf"dask worker tcp://127\.0\.0\.1:\d+ cannot see the store {re.escape(url)}: ",
            message,
        ), message
        assert "NoCredentialsError" in message and "\n" not in message
    assert cat.staged("d") == []


def test_the_command_line_says_so_in_one_line_and_fails(no_credentials_cluster, sources, s3_bucket):
    url = f"s3://{s3_bucket()}/store"
    Catalog.init(url)
    cli = os.path.join(os.path.dirname(sys.executable), "simstore")
    p = subprocess.run(
        [cli, "--store", url, "ingest", str(sources), "--dataset", "d", "--engine", "dask",
         "--address", no_credentials_cluster, "--on-error", "skip", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stdout == ""
    (line,) = p.stderr.splitlines()
    assert line.startswith("error: dask worker tcp://127.0.0.1:"), line
    assert f"cannot see the store {url}: " in line and "NoCredentialsError" in line
