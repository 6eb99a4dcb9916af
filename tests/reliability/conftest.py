"""Fixtures of the reliability suite: a preloaded forkserver for killed children, sources.

Killed children are started from a ``forkserver`` whose process has already imported
numpy, pyarrow, zarr and simstore, so a trial costs a fork (milliseconds) rather than an
interpreter start and a second of imports; the child is still a separate process that the
kernel kills with SIGKILL, mid-write if it so happens.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import rel_harness  # noqa: E402


@pytest.fixture(scope="session")
def forkserver() -> Iterator[Any]:
    """A multiprocessing context whose children fork from a preloaded server."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(rel_harness.PRELOAD)
    yield ctx


@pytest.fixture
def trainserver() -> Iterator[Any]:
    """A forkserver for training loops (torch preloaded as well)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([*rel_harness.PRELOAD, "torch", "simstore.loaders"])
    yield ctx


@pytest.fixture(autouse=True)
def _atomic_moto_writes() -> Iterator[None]:
    """moto's conditional writes made atomic, as S3's are (see rel_harness)."""
    with rel_harness.atomic_moto_writes():
        yield
