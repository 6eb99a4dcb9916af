"""Shared fixtures: the S3 ones (moto server on 127.0.0.1, buckets, fault proxy)."""

import signal

import pytest

pytest_plugins = ["simstore.testing.s3"]


@pytest.fixture(autouse=True)
def _no_node_hash_records(monkeypatch):
    """No test trusts a shard because an earlier test (or job) hashed a file like it.

    Loaders remember whole-shard hash matches for later jobs on the node (under
    ``SIMSTORE_VERIFIED_DIR``, default ``~/.cache``); tests that count hashes would
    depend on their order. The tests of those records set the variable themselves.
    """
    monkeypatch.setenv("SIMSTORE_VERIFIED_DIR", "")


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
