"""Shared fixtures: the S3 ones (moto server on 127.0.0.1, buckets, fault proxy)."""

import signal
import subprocess
import sys
from typing import Any

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
def _no_kept_shard_indexes():
    """No test reads a shard through the index a reader of an earlier test left.

    A loader keeps what a trusted shard's reader parsed, by the shard's id, for the next
    reader in the process (``loaders._indexes``); tests that count reads or damage a
    file's metadata would depend on their order. Tests of it read several epochs.
    """
    kept = sys.modules.get("simstore.loaders._indexes")
    if kept is not None:
        kept.INDEXES.clear()  # type: ignore[attr-defined]


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


class PacedLimiters:
    """The loader's rate limiters on a clock that moves only when they sleep.

    Each limiter a reader makes is kept, with the bytes it was asked for and the seconds
    it made the reader wait: a test then checks the pacing from what passed through it,
    whatever the machine's speed (no test waits for real).
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import threading

        from simstore.loaders import _fetch, _reading

        self.made: list[Any] = []
        outer = self

        class Limiter(_fetch.RateLimiter):
            def __init__(self, rate: float | None) -> None:
                self.now = 0.0
                self.taken = 0
                self.waited = 0.0
                self._count = threading.Lock()
                super().__init__(rate, clock=lambda: self.now, sleep=self._sleep)
                outer.made.append(self)

            def _sleep(self, seconds: float) -> None:
                with self._count:
                    self.now += seconds

            def take(self, nbytes: int) -> float:
                waited = super().take(nbytes)
                with self._count:
                    self.taken += max(nbytes, 0) if self.rate else 0
                    self.waited += waited
                return waited

        monkeypatch.setattr(_reading, "RateLimiter", Limiter)

    @property
    def taken(self) -> int:
        return sum(lim.taken for lim in self.made)

    @property
    def waited(self) -> float:
        return sum(lim.waited for lim in self.made)


@pytest.fixture
def paced_limiters(monkeypatch):
    """:class:`PacedLimiters` in place of the readers' own (in this process)."""
    return PacedLimiters(monkeypatch)


@pytest.fixture
def open_dir():
    """A new folder any user may traverse, for tests that read as an unprivileged user."""
    from permissions import traversable_folder

    with traversable_folder() as d:
        yield d


@pytest.fixture
def small_fs(tmp_path):
    """Mount a tmpfs of a given size at a fresh folder; unmount after the test."""
    mounted = []

    def mount(size: str) -> str:
        path = tmp_path / f"fs{len(mounted)}"
        path.mkdir()
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            pytest.skip(
                f"cannot mount a tmpfs here ({proc.stderr.strip() or 'not root'}); "
                "the QuotaStore and /dev/full tests stand in"
            )
        mounted.append(path)
        return str(path)

    def grow(path: str, size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", path], check=True)

    mount.grow = grow  # type: ignore[attr-defined]
    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)
