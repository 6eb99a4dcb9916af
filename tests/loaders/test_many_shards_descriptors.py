"""A warm disk cache in front of a snapshot of many small shards stays within the
limit on open files.

Each cache copy prepared for a reader is pinned by an open descriptor (a shared flock)
until the reader opens it, and a chunk of small shards names up to one shard per sample:
a warm epoch prepared every shard of a chunk at once, 2,487 descriptors for 2,500
one-sample shards, and failed under the common limit of 1,024 with "Too many open files"
(a raw pyarrow error, or healthy shards skipped as corrupt with ``on_corrupt="skip"``).
At most ``prefetch.shards`` shards are prepared ahead of their readers at once now.
"""

import errno
import io
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
from simstore.loaders._corrupt import CorruptShards
from simstore.loaders._fetch import ShardHandle
from simstore.loaders._readers import ReaderPool
from simstore.loaders._stats import Counters

import simstore
from simstore.catalog import Catalog
from simstore.errors import FormatError, IntegrityError

_SCRIPT = textwrap.dedent(
    """
    import resource, sys
    sys.path.insert(0, sys.argv[3])
    from loader_helpers import RemoteLikeStore
    from simstore.loaders import SimDataset

    store, cache = sys.argv[1], sys.argv[2]
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))
    ds = SimDataset(RemoteLikeStore(store, read_only=True), "d", cache_dir=cache,
                    on_corrupt="skip")
    for epoch in range(2):  # the first fills the cache, the second reads it warm
        ds.set_epoch(epoch)
        values = sorted(int(s["data"][0]) for s in ds)
        assert values == list(range(300)), (epoch, len(values))
    print(ds.stats()["cache_hits"], ds.stats()["cache_misses"])
    """
)


def test_a_warm_epoch_over_300_one_sample_shards_under_a_limit_of_128(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(300):
        np.save(src / f"f{i:03d}.npy", np.full(4, i, dtype=np.int32))
    store = str(tmp_path / "store")
    r = simstore.ingest([src], dataset="d", store=Catalog.init(store), snapshot=True,
                        shard_size=64)
    assert r.shards == 300  # one sample per shard
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, store, str(tmp_path / "cache"),
         os.path.dirname(__file__)],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "skipping" not in done.stderr  # no healthy shard taken for a corrupt one
    hits, misses = map(int, done.stdout.split())
    assert (hits, misses) == (300, 300)


class _Access:
    """A cache-backed shard source that records what it prepared (no store behind it)."""

    verify = False

    class store:  # noqa: N801 (what ReaderPool reads of it)
        url = "fake://"

    def __init__(self):
        self.counters = Counters()
        self.prepared = []

    def mode(self, sid):
        return "cache"

    def prepare(self, sid):
        self.prepared.append(sid)
        return ShardHandle(io.BytesIO(b"x"), lambda: None, trusted=True)

    def open(self, sid, handle, verified=True):
        return handle or ShardHandle(io.BytesIO(b"x"), lambda: None, trusted=True)

    def downloads(self, sid):
        return False

    def close(self):
        pass


class _Reader:
    def __init__(self, source):
        pass

    def close(self):
        pass


def test_shards_scheduled_but_never_read_give_their_places_back_when_forgotten():
    # on_corrupt="skip" reads no shard it knows is corrupt; later chunks still schedule
    # them: held for ever, 24 of them stopped every later shard's prefetch
    access = _Access()
    pool = ReaderPool([access], _Reader, max_open=16, referenced_by=["s"], max_prepared=4)
    with ThreadPoolExecutor(2) as io_pool:
        bad = [(0, f"bad{i}") for i in range(4)]
        good = [(0, f"good{i}") for i in range(10)]
        for key in bad + good:
            pool.schedule(key, io_pool)
        assert all(pool.is_pending(k) for k in bad + good)  # deferred ones count as pending
        for key in bad:
            pool.forget(key)
        for key in good:
            with pool.reader(key):
                pass
        before = list(access.prepared)
        for key in bad:  # later chunks name them again: not prepared (downloaded) again
            pool.schedule(key, io_pool)
        assert not any(pool.is_pending(k) for k in bad)
    assert access.prepared == before
    pool.close()
    # the healthy shards were prepared ahead of their readers as places came free, and
    # no forgotten shard holds one
    assert sum(s.startswith("good") for s in access.prepared) >= len(good) - 4
    assert not pool.is_pending((0, "good0")) and not any(pool.is_pending(k) for k in bad)


def _wrapped(error: BaseException) -> FormatError:
    try:
        raise error
    except BaseException as exc:
        try:
            raise FormatError(f"cannot read the shard's first and last bytes: {exc}") from exc
        except FormatError as wrapped:
            return wrapped


def test_what_counts_as_the_processs_own_limit_and_what_as_the_shards_damage():
    environmental = CorruptShards.environmental
    assert environmental(_wrapped(OSError(errno.EMFILE, "Too many open files")))
    assert environmental(_wrapped(OSError("Detail: [errno 24] Too many open files")))
    assert environmental(_wrapped(OSError(errno.EACCES, "Permission denied")))
    # simstore's own text names paths and URLs: a word in them is not a cause
    assert not environmental(FormatError("s3://b/Permission denied/x: bad page [Errno 24]"))
    # a wrong hash is the shard's, whatever failed before it
    damaged = IntegrityError("hash mismatch")
    damaged.__cause__ = OSError(errno.EMFILE, "Too many open files")
    assert not environmental(damaged)
    # an EACCES handled earlier (implicit context) is not this error's cause
    try:
        try:
            raise OSError(errno.EACCES, "Permission denied")
        except OSError:
            raise FormatError("truncated row group") from None
    except FormatError as exc:
        assert not environmental(exc)
    assert not environmental(_wrapped(MemoryError("Unable to allocate 4 EiB")))
    # Arrow's decode pool could not start a thread (ulimit -v): intact shards were skipped
    assert environmental(_wrapped(pa.ArrowException("Failed to launch worker thread")))
    assert not environmental(FormatError("s3://b/failed to launch worker thread/x: bad"))


def test_a_cache_folder_listed_out_of_descriptors_is_a_storage_error_naming_it(tmp_path):
    """Found by an audit: under a low open-file limit, a job with no workers failed with a
    bare ``OSError: [Errno 24] Too many open files: '.../cache/tmp'``, a traceback that
    named neither simstore's error nor the limit to raise. The real limit, reached."""
    folder = tmp_path / "cache" / "tmp"
    folder.mkdir(parents=True)
    script = textwrap.dedent(
        """
        import resource, sys
        from simstore.errors import StorageError
        from simstore.loaders._cache import _listdir
        from simstore.loaders._corrupt import resource_error

        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        held = []
        try:
            while True:
                held.append(open(sys.argv[1] + "/../held", "a"))
        except OSError:
            pass
        try:
            _listdir(sys.argv[1])
        except StorageError as exc:
            print(exc)
            print(resource_error(exc, "shard x"))
        """
    )
    done = subprocess.run([sys.executable, "-c", script, str(folder)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    said, short = done.stdout.strip().splitlines()
    assert said == f"cache folder {folder}: cannot be listed: Too many open files"
    assert short.startswith("shard x: the read failed for want of file descriptors")
