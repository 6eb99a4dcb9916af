"""Shared fixtures: the S3 ones (moto server on 127.0.0.1, buckets, fault proxy)."""

import os
import signal

import pytest

pytest_plugins = ["simstore.testing.s3"]


@pytest.fixture(autouse=True)
def _sigpipe_ignored():
    """Keep Python's SIGPIPE disposition (ignored) for every test.

    gmsh.initialize, which some fixtures call in-process to write STEP files, resets
    SIGPIPE to terminate; a later write to a socket the fault proxy closed would then kill
    the whole test run instead of raising an error in the test.
    """
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    yield
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)


@pytest.fixture(autouse=True, scope="session")
def _botocore_model_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The S3 stores' parsed botocore files go to the run's temporary directory, not the
    user's cache (subprocesses inherit it)."""
    os.environ["SIMSTORE_MODEL_CACHE"] = str(tmp_path_factory.mktemp("botocore-models"))
