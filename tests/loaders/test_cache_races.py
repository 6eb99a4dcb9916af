"""The disk cache against its own concurrency: fills side by side, and copies replaced.

Fills running at once (threads here; processes share the same file locks) must make room
for each other, not each for itself; and a cache hit's check must hash the copy its
reader holds, not whatever file the copy's path names by the time the check runs.
"""

from __future__ import annotations

import contextlib
import os
import threading

import pytest
from blocks import holds_no_block_past_its_end
from simstore.loaders._cache import CacheConfig, ShardCache
from simstore.loaders._fetch import RateLimiter, ShardAccess, file_identity
from simstore.loaders._stats import Counters

from simstore.errors import IntegrityError
from simstore.hashing import hash_bytes
from simstore.storage import open_store

SIZE = 1000


def _blob(i: int) -> bytes:
    return bytes([i]) * SIZE


def _held(cache_dir: str) -> int:
    """Bytes of copies (``objects/``) and fills (``tmp/``), each object once: usage_bytes
    may count a fill that lands while it lists twice (on purpose: it must miss none)."""
    sizes: dict[str, int] = {}
    for sub in ("tmp", "objects"):
        for folder, _, names in os.walk(os.path.join(cache_dir, sub)):
            for name in names:
                with contextlib.suppress(FileNotFoundError):
                    size = os.lstat(os.path.join(folder, name)).st_size
                    oid = name.split(".")[0]
                    sizes[oid] = max(size, sizes.get(oid, 0))
    return sum(sizes.values())


def test_fills_side_by_side_make_room_for_each_other(tmp_path):
    limit = 3 * SIZE
    cache_dir = str(tmp_path / "c")
    cache = ShardCache(CacheConfig(directory=cache_dir, limit_bytes=limit), Counters())
    for old in (_blob(1), _blob(2)):  # two older copies, not pinned
        cache.acquire(hash_bytes(old), lambda: SIZE,
                      lambda out, b=old: out.write(b)).release()
    started = threading.Barrier(3)
    seen: list[int] = []
    errors: list[BaseException] = []

    def fill(i: int) -> None:
        blob = _blob(i)

        def download(out):
            started.wait(timeout=30)  # all three fills are in flight now
            seen.append(_held(cache_dir))
            out.write(blob)

        try:
            own = ShardCache(CacheConfig(directory=cache_dir, limit_bytes=limit), Counters())
            own.acquire(hash_bytes(blob), lambda: SIZE, download).release()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=fill, args=(i,)) for i in (3, 4, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    # each fill counted the others' whole size while all three were downloading: the two
    # old copies went, and the cache never held more than its limit
    assert len(seen) == 3 and max(seen) <= limit, seen
    assert cache.usage_bytes() <= limit
    assert sorted(cache.peek(hash_bytes(_blob(i))) is not None for i in (1, 2)) == [False, False]


def test_a_fill_cut_short_keeps_only_what_it_wrote(tmp_path):
    cache = ShardCache(CacheConfig(directory=str(tmp_path / "c"), limit_bytes=10 * SIZE),
                       Counters())
    blob = _blob(7)
    # the store said more bytes than it sent: the copy is what came, and its hash decides
    copy = cache.acquire(hash_bytes(blob), lambda: 2 * SIZE, lambda out: out.write(blob))
    try:
        with open(copy.path, "rb") as f:
            assert f.read() == blob
    finally:
        copy.release()


def test_a_fill_has_its_blocks_before_it_writes_and_none_past_what_came(tmp_path):
    cache = ShardCache(CacheConfig(directory=str(tmp_path / "c"), limit_bytes=1 << 30),
                       Counters())
    size = 4 << 20
    blob = bytes(range(256)) * (size // 512)  # half of what the store said
    allocated = []

    def download(out):
        allocated.append(os.fstat(out.raw.fileno()).st_blocks * 512)
        out.write(blob)

    copy = cache.acquire(hash_bytes(blob), lambda: size, download)
    try:
        assert allocated[0] >= size  # reserved before the first write
        st = os.stat(copy.path)
        assert st.st_size == len(blob)
        assert holds_no_block_past_its_end(copy.path)
    finally:
        copy.release()


def test_a_hit_is_checked_on_the_file_its_reader_holds(tmp_path):
    """Reader A holds a damaged copy; another process takes it out and fills a good one."""
    cache_dir = str(tmp_path / "c")
    blob = _blob(9)
    oid = hash_bytes(blob)
    cache = ShardCache(CacheConfig(directory=cache_dir, limit_bytes=10 * SIZE), Counters())
    cache.acquire(oid, lambda: SIZE, lambda out: out.write(blob)).release()
    path = cache.path_of(oid)
    with open(path, "r+b") as f:  # damaged on the node's disk since its fill
        f.write(b"\x00")
    held = cache.peek(oid)  # A: a hit, pinned
    assert held is not None
    try:
        # B meets the damage, takes the copy out; C fills a good copy at the same path
        os.unlink(path)
        cache.acquire(oid, lambda: SIZE, lambda out: out.write(blob)).release()
        access = ShardAccess(open_store("memory://cache-races"), counters=Counters(),
                             limiter=RateLimiter(None),
                             cache=CacheConfig(directory=cache_dir, limit_bytes=10 * SIZE),
                             verify=True)
        pinned = file_identity(os.fstat(held.fd))
        # A's check hashes no file but the one it pinned: that one is gone from the
        # cache, so A is not vouched for (its reader goes on checking pages)
        assert access.check_copy(oid, path, pinned) is False
        assert access.counters.snapshot()["shards_verified"] == 0
        with open(path, "rb") as f:  # C's good copy stays
            assert f.read() == blob
        # a copy still the pinned one is hashed: damage found, named, taken out
        with open(path, "r+b") as f:
            f.write(b"\x00")
        again = cache.peek(oid)
        assert again is not None
        try:
            with pytest.raises(IntegrityError, match=f"expected {oid}"):
                access.check_copy(oid, path, file_identity(os.fstat(again.fd)))
        finally:
            again.release()
        assert not os.path.exists(path)
    finally:
        held.release()



def test_a_fill_over_the_limit_is_counted_where_stats_and_the_report_show_it(tmp_path):
    # the counter was kept but neither stats() nor the run report gave it
    from simstore.loaders._stats import run_report, summarise

    counters = Counters()
    cache = ShardCache(CacheConfig(directory=str(tmp_path / "c"), limit_bytes=2 * SIZE),
                       counters)
    blobs = [_blob(1), _blob(2)]
    pinned = [cache.acquire(hash_bytes(b), lambda: SIZE, lambda out, b=b: out.write(b))
              for b in blobs]
    # both copies pinned (read by a reader): the third fill goes ahead over the limit
    cache.acquire(hash_bytes(_blob(3)), lambda: SIZE,
                  lambda out: out.write(_blob(3))).release()
    for copy in pinned:
        copy.release()
    snapshot = counters.snapshot()
    stats = summarise(snapshot, seconds=1.0, wait_s=0.0, busy_s=1.0, first_batch_s=None)
    assert stats["cache_over_limit"] == 1
    report = run_report(stats, snapshot, snapshots=["s"], epochs=[0], world_size=1,
                        num_workers=0)
    assert report["cache"]["over_limit"] == 1


def test_a_fill_that_lands_while_the_cache_is_listed_is_counted(tmp_path, monkeypatch):
    """A fill's rename into the cache is outside the eviction lock: a fill landing
    between the listing of copies and that of fills was counted by neither, and fills
    side by side took the cache a shard or two over its limit, uncounted."""
    cache_dir = str(tmp_path / "c")
    cache = ShardCache(CacheConfig(directory=cache_dir, limit_bytes=10 * SIZE), Counters())
    blob = _blob(7)
    oid = hash_bytes(blob)
    landing = os.path.join(cache._tmp, f"{oid}.fill")
    os.makedirs(cache._tmp, exist_ok=True)
    with open(landing, "wb") as f:  # a fill under way in another process
        f.write(blob)
    real = cache._entries

    def entries_then_landing():
        listed = real()
        if os.path.exists(landing):  # the fill lands right after the copies were listed
            dest = cache.path_of(oid)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            os.replace(landing, dest)
        return listed

    monkeypatch.setattr(cache, "_entries", entries_then_landing)
    assert cache.usage_bytes() >= SIZE  # counted (once as a fill), not missed
    assert cache.usage_bytes() == SIZE  # and once landed, as a copy


def test_a_fill_lands_under_the_eviction_lock(tmp_path, monkeypatch):
    """Room-making lists copies and fills under the eviction lock; a fill's rename into
    the cache takes it too, so the listing sees the fill on one side or the other."""
    import fcntl

    from simstore.loaders import _cache

    cache_dir = str(tmp_path / "c")
    cache = ShardCache(CacheConfig(directory=cache_dir, limit_bytes=10 * SIZE), Counters())
    held: list[bool] = []
    real = os.replace

    def replace(src, dst):
        fd = os.open(os.path.join(cache._locks, "evict"), os.O_RDWR)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.append(False)
                fcntl.flock(fd, fcntl.LOCK_UN)
            except BlockingIOError:
                held.append(True)
        finally:
            os.close(fd)
        return real(src, dst)

    monkeypatch.setattr(_cache.os, "replace", replace)
    blob = _blob(9)
    cache.acquire(hash_bytes(blob), lambda: SIZE, lambda out: out.write(blob)).release()
    assert held == [True]


class _SaysWhenItWaits(ShardCache):
    """A cache that tells when a call is about to wait for an object's fill lock."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.waiting = threading.Event()

    @contextlib.contextmanager
    def _lock(self, name, *, blocking=True):
        if blocking and not name.startswith("evict"):
            self.waiting.set()
        with super()._lock(name, blocking=blocking) as held:
            yield held


def _fill_fails_while_second_waits(first, second, blob, message, second_download):
    """``first`` fills ``blob``'s object and fails with ``message`` once ``second`` waits
    on its lock with ``second_download``; the errors by name, and the copies read."""
    from simstore.errors import StorageError

    in_fill, give_up = threading.Event(), threading.Event()

    def failing(out):
        in_fill.set()
        give_up.wait(60)  # a liveness bound
        raise StorageError(message)

    errors, got = {}, []

    def run(name, cache, download):
        try:
            copy = cache.acquire(hash_bytes(blob), lambda: len(blob), download)
            with open(copy.path, "rb") as f:
                got.append(f.read())
            copy.release()
        except StorageError as exc:
            errors[name] = str(exc)

    a = threading.Thread(target=run, args=("first", first, failing))
    a.start()
    assert in_fill.wait(60)
    b = threading.Thread(target=run, args=("second", second, second_download))
    b.start()
    assert second.waiting.wait(60)
    give_up.set()
    a.join(60)
    b.join(60)
    return errors, got


def test_a_fill_that_failed_while_others_waited_fails_them_too(tmp_path):
    # found by an audit: each process waiting on the fill lock ran a whole fill of its own
    # after the holder's failed, retry deadline and all (2 workers: the error came after
    # twice the deadline; every process queued on the lock added one)
    config = CacheConfig(directory=str(tmp_path / "c"), limit_bytes=1 << 20)
    blob = b"f" * 1000
    first = ShardCache(config, Counters())
    second = _SaysWhenItWaits(config, Counters())
    second_downloads = []
    errors, got = _fill_fails_while_second_waits(
        first, second, blob, "s3://b/objects/f: read failed after 5 attempts: SlowDown",
        lambda out: second_downloads.append(out.write(blob)))
    assert errors["first"] == "s3://b/objects/f: read failed after 5 attempts: SlowDown"
    assert errors["second"] == errors["first"]  # the one failure, not a second deadline
    assert second_downloads == []
    assert got == []
    # a later call tries again, and a good fill clears the failure
    copy = second.acquire(hash_bytes(blob), lambda: len(blob), lambda out: out.write(blob))
    copy.release()
    assert os.listdir(tmp_path / "c" / "tmp") == []


def test_a_fill_another_job_failed_is_tried_again_by_a_waiter(tmp_path, monkeypatch):
    # a job with other credentials or another endpoint on the same node: its failure
    # (AccessDenied, a dead endpoint) is not this job's, and used to fail its read too
    config = CacheConfig(directory=str(tmp_path / "c"), limit_bytes=1 << 20)
    blob = b"g" * 1000
    for name in ("MASTER_ADDR", "MASTER_PORT", "SLURM_STEP_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "101")
    first = ShardCache(config, Counters())
    monkeypatch.setenv("SLURM_JOB_ID", "102")
    second = _SaysWhenItWaits(config, Counters())
    errors, got = _fill_fails_while_second_waits(
        first, second, blob, "s3://b/objects/g: read failed: AccessDenied (HTTP 403)",
        lambda out: out.write(blob))
    assert errors == {"first": "s3://b/objects/g: read failed: AccessDenied (HTTP 403)"}
    assert got == [blob]
