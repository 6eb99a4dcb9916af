"""Shared fixtures: the S3 ones (moto server on 127.0.0.1, buckets, fault proxy)."""

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
