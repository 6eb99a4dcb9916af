"""With several fork workers on a local store, the others wait for worker 0's first batch.

Events are ordered with ``time.monotonic()`` (one clock for every process of the machine)
in a file the worker processes append to; nothing here asserts a duration.
"""

import functools
import time

import simstore.loaders._loader as loader_mod
import torch.utils.data
from loader_helpers import RemoteLikeStore, commit_samples, keys_of, make_samples, open_test_shard
from simstore.loaders import SimDataLoader, SimDataset


def _note(log: str, what: str) -> None:
    info = torch.utils.data.get_worker_info()
    worker = info.id if info is not None else -1
    with open(log, "a") as f:
        f.write(f"{what} {worker} {time.monotonic()!r}\n")


def _slow_opener(log: str, slow_s: float, source):  # type: ignore[no-untyped-def]
    """The test format's opener, noting each open; worker 0's opens take ``slow_s``."""
    _note(log, "open")
    info = torch.utils.data.get_worker_info()
    if info is not None and info.id == 0:
        time.sleep(slow_s)
    return open_test_shard(source)


def _events(log: str) -> dict[tuple[str, int], float]:
    """The first time of each (event, worker)."""
    first: dict[tuple[str, int], float] = {}
    with open(log) as f:
        for line in f:
            what, worker, at = line.split()
            first.setdefault((what, int(worker)), float(at))
    return first


def _read(monkeypatch, tmp_path, store, ref, slow_s):  # type: ignore[no-untyped-def]
    log = str(tmp_path / "events.log")
    plain = loader_mod._Tagged.__reduce__

    def noted(self):  # type: ignore[no-untyped-def]
        _note(log, "sent")
        return plain(self)

    monkeypatch.setattr(loader_mod._Tagged, "__reduce__", noted)
    # a generous bound: the test orders events, it does not race the bound
    monkeypatch.setattr(loader_mod, "FIRST_ALONE_WAIT_S", 120.0)
    ds = SimDataset(store, ref, shuffle=True, seed=1,
                    shard_opener=functools.partial(_slow_opener, log, slow_s))
    loader = SimDataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork")
    batches = list(loader)
    return _events(log), batches


def test_the_second_worker_reads_once_the_first_batch_has_left(monkeypatch, tmp_path,
                                                               store_path):
    samples = make_samples(48)
    commit_samples(store_path, "sim", samples, per_shard=6)
    events, batches = _read(monkeypatch, tmp_path, store_path, "sim", 0.2)
    # worker 0 takes 0.2 s per shard it opens; worker 1 opens nothing before worker 0's
    # first batch is on its way
    assert events[("open", 1)] > events[("sent", 0)]
    assert events[("open", 0)] < events[("sent", 0)]
    assert sorted(keys_of(batches)) == sorted(s.key for s in samples)


def test_workers_of_a_remote_store_read_side_by_side(monkeypatch, tmp_path, store_path):
    samples = make_samples(48)
    commit_samples(store_path, "sim", samples, per_shard=6)
    store = RemoteLikeStore(store_path)
    # a fetch waits on the network: worker 1 fetches while worker 0's first batch is slow
    events, batches = _read(monkeypatch, tmp_path, store, "sim", 0.5)
    assert events[("open", 1)] < events[("sent", 0)]
    assert sorted(keys_of(batches)) == sorted(s.key for s in samples)


def test_a_first_worker_with_nothing_to_read_releases_the_others(monkeypatch, tmp_path,
                                                                 store_path):
    # one sample, two ranks, remainder dropped: this rank reads nothing, and worker 1
    # learns so from worker 0 ending its epoch, not from the end of its wait
    commit_samples(store_path, "sim", make_samples(1), per_shard=1)
    log = str(tmp_path / "events.log")
    plain = loader_mod._wait_first

    def noted(gate):  # type: ignore[no-untyped-def]
        released = plain(gate)
        _note(log, "released" if released else "timed-out")
        return released

    monkeypatch.setattr(loader_mod, "_wait_first", noted)
    monkeypatch.setattr(loader_mod, "FIRST_ALONE_WAIT_S", 30.0)
    ds = SimDataset(store_path, "sim", rank=0, world_size=2, remainder="drop",
                    shard_opener=open_test_shard)
    loader = SimDataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork")
    assert list(loader) == []
    assert set(_events(log)) == {("released", 1)}
