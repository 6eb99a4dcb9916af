"""SimDataLoader with ``persistent_workers=True``: workers kept from one iteration to the next.

Each later iteration (a new epoch, a resume loaded into the same loader, an iteration
started before the last one was read out) must read exactly what fresh workers would,
in the same order, with the same worker processes; workers stopped by an error are
replaced by the next iteration; buffers of batches a new iteration drops are released.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import signal
import time

import pytest
import torch
from loader_helpers import (
    commit_samples,
    flip_byte_keeping_times,
    keys_of,
    make_samples,
    open_test_shard,
    refused,
)
from simstore.loaders import SimDataLoader, SimDataset

from simstore.catalog import Catalog
from simstore.errors import IntegrityError, InvalidInputError
from tests.loaders.test_mapped_chunks import _aligned_store, _check

pytestmark = pytest.mark.multiprocess


def _loader(store, ref, *, persistent, workers=2, batch=4, context="fork", **kw):
    if ref != "d":  # the stores of the tests' own shard format
        kw["shard_opener"] = open_test_shard
    ds = SimDataset(store, ref, seed=5, **kw)
    return SimDataLoader(ds, batch_size=batch, num_workers=workers,
                         persistent_workers=persistent, multiprocessing_context=context)


def _epoch(loader, epoch):
    loader.set_epoch(epoch)
    return [k for b in loader for k, pad in zip(b["__key__"], b["__pad__"], strict=True) if not pad]


def _pids(loader):
    return [w.pid for w in loader._iterator._workers]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_each_epoch_is_what_fresh_workers_read_with_the_same_processes(small, context):
    store, ref, samples = small
    kept = _loader(store, ref, persistent=True, context=context)
    fresh = _loader(store, ref, persistent=False, context=context)
    pids = None
    for epoch in (0, 1, 2):
        got = _epoch(kept, epoch)
        assert got == _epoch(fresh, epoch)
        assert sorted(got) == sorted(samples)
        if pids is None:
            pids = _pids(kept)
        assert _pids(kept) == pids
    assert all(w.is_alive() for w in kept._iterator._workers)


def test_a_resume_loaded_into_the_same_loader_reads_exactly_the_rest(small):
    store, ref, samples = small
    kept = _loader(store, ref, persistent=True, batch=3)
    full = _epoch(_loader(store, ref, persistent=False, batch=3), 4)
    kept.set_epoch(4)
    head = keys_of(itertools.islice(kept, 3))
    state = kept.state_dict()
    # a new iteration with no state loaded reads the epoch from its start, as fresh
    # workers would; then back to the checkpoint
    middle = keys_of(itertools.islice(kept, 2))
    assert middle == full[:len(middle)]
    kept.load_state_dict(state)
    second = keys_of(itertools.islice(kept, 2))
    state2 = kept.state_dict()
    kept.load_state_dict(state2)  # resume twice in a row
    rest = keys_of(kept)
    assert head + second + rest == full
    assert kept.state_dict()["remaining"] == []


def test_single_samples_and_a_callers_collate(small):
    store, ref, samples = small
    for kw in ({"batch": None}, {"batch": 5, "collate_fn": list}):
        batch = kw.pop("batch")
        ds = SimDataset(store, ref, seed=5, shard_opener=open_test_shard)
        kept = SimDataLoader(ds, batch_size=batch, num_workers=2, persistent_workers=True,
                             multiprocessing_context="fork", **kw)
        ds2 = SimDataset(store, ref, seed=5, shard_opener=open_test_shard)
        fresh = SimDataLoader(ds2, batch_size=batch, num_workers=2,
                              multiprocessing_context="fork", **kw)
        for epoch in (0, 1):
            kept.set_epoch(epoch)
            fresh.set_epoch(epoch)
            flat = (lambda it: [s["__key__"] for s in it]) if batch is None else (
                lambda it: [s["__key__"] for b in it for s in b])
            got = flat(kept)
            assert got == flat(fresh) and sorted(got) == sorted(samples)


def test_an_iteration_started_again_before_it_was_read(small):
    store, ref, samples = small
    kept = _loader(store, ref, persistent=True)
    full = _epoch(_loader(store, ref, persistent=False), 0)
    iter(kept)  # its share goes unread: the workers pass over it
    iter(kept)
    assert keys_of(kept) == full
    # a new iteration while the last is half read: the rest of it is dropped
    it = iter(kept)
    next(it)
    assert keys_of(kept) == full


class _FailWhileMarked:
    """A transform that raises while its marker file exists (in any worker)."""

    def __init__(self, marker):
        self.marker = marker

    def __call__(self, sample):
        if os.path.exists(self.marker):
            raise ValueError("marked")
        return sample


def test_workers_stopped_by_an_error_are_replaced(small, tmp_path):
    store, ref, samples = small
    marker = tmp_path / "fail"
    marker.write_text("")
    kept = _loader(store, ref, persistent=True, transform=_FailWhileMarked(str(marker)))
    with pytest.raises(ValueError, match="marked"):
        list(kept)
    old = [w for w in kept._iterator._workers]
    marker.unlink()
    got = _epoch(kept, 0)
    assert sorted(got) == sorted(samples)
    assert {w.pid for w in kept._iterator._workers}.isdisjoint(w.pid for w in old)
    assert not any(w.is_alive() for w in old)


def test_persistent_workers_are_counted_as_fresh_ones_are(small):
    store, ref, _ = small

    def stats(persistent):
        loader = _loader(store, ref, persistent=persistent)
        for epoch in (0, 1):
            _epoch(loader, epoch)
        gc.collect()
        return loader.stats()

    kept, fresh = stats(True), stats(False)
    # each finished iteration's counters are folded into the totals, none left watched
    loader = _loader(store, ref, persistent=True)
    for epoch in range(4):
        _epoch(loader, epoch)
    assert len(loader.sim_dataset._metrics._earlier) <= 1
    assert kept["samples"] == fresh["samples"] == 2 * 60
    # fresh fork workers inherit the manifest rows of their first batches, which the main
    # process reads once per iteration; persistent workers, started once, read their own
    # from the second iteration on: each of the two reads every part its rows are in
    cat = Catalog.open(store)
    snap = cat.snapshot(cat.resolve(ref))
    parts, part_bytes = len(snap.parts), snap.manifest_bytes
    assert fresh["manifest_parts"] == 2 * parts
    assert fresh["manifest_bytes"] == 2 * part_bytes
    assert kept["manifest_parts"] == parts + 2 * parts
    assert kept["manifest_bytes"] == part_bytes + 2 * part_bytes
    # the bytes read vary from run to run with either kind of worker: which worker
    # hashes a shard for its siblings, and when, is a race (see VerifiedTable)
    assert kept["tiers"]["local"]["bytes"] > 0 and kept["tiers"]["local"]["requests"] > 0


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_fork_workers_inherit_the_manifest_rows_of_their_first_batches(small, context):
    """The main process loads the first batches' manifest rows once; fork workers inherit them.

    Spawned workers start from a pickle and read their own: each reads every part.
    """
    store, ref, samples = small
    cat = Catalog.open(store)
    parts = len(cat.snapshot(cat.resolve(ref)).parts)
    loader = _loader(store, ref, persistent=False, context=context, workers=2)
    assert sorted(_epoch(loader, 0)) == sorted(samples)
    assert loader.stats()["manifest_parts"] == (parts if context == "fork" else 2 * parts)
    # nothing is left behind in this process once the workers are forked
    from simstore.loaders._pipeline import FORKED_GROUPS

    assert FORKED_GROUPS == {}


def test_persistent_workers_need_workers_and_a_bool(small):
    store, ref, _ = small
    ds = SimDataset(store, ref, shard_opener=open_test_shard)
    refused("persistent_workers applies only with workers", SimDataLoader, ds,
            batch_size=2, persistent_workers=True)
    refused("persistent_workers", SimDataLoader, ds, batch_size=2, num_workers=1,
            persistent_workers="yes")


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """12 runs of a 1 MiB float32 field in uncompressed Zarr shards (pooled buffers)."""
    return _aligned_store(str(tmp_path_factory.mktemp("persistent")), 12)


@pytest.mark.parametrize("map_files", [True, False])
def test_batches_kept_from_earlier_epochs_keep_their_values(big, map_files):
    """A worker's pooled buffers outlive its iterations: none is rewritten while a batch
    of this or an earlier iteration holds it (one sample per chunk: many buffers reused)."""
    store, values = big
    kept = _loader(store, "d", persistent=True, batch=2, map_files=map_files,
                   prefetch={"chunk_samples": 1})
    for epoch in (0, 1):  # buffers sent and released
        kept.set_epoch(epoch)
        assert _check(list(kept), values) == len(values)
        gc.collect()
    held = []
    for epoch in (2, 3):
        kept.set_epoch(epoch)
        held.append(list(kept))
    for batches in held:
        assert _check(batches, values) == len(values)


def test_buffers_of_dropped_batches_are_released(big):
    store, values = big
    kept = _loader(store, "d", persistent=True, batch=2, map_files=False)
    it = iter(kept)
    first = next(it)
    workers = kept._iterator
    seen = []
    hook = workers._sim_dropped
    assert hook is not None

    def record(item):
        if hasattr(item, "tag"):
            seen.append((item.tag.worker, item.tag.marks))
        hook(item)

    workers._sim_dropped = record
    deadline = time.monotonic() + 30  # until a batch the new iteration will drop is there
    while workers._data_queue.qsize() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert workers._data_queue.qsize() > 0
    batches = list(kept)  # a new iteration drops what the last one left unread
    assert _check(batches, values) == len(values)
    assert seen and any(marks for _, marks in seen)
    del first, batches
    gc.collect()
    kept._tracker.poll()
    released = kept._tracker.released
    for worker, marks in seen:
        for slot, generation in marks:
            assert released[worker, slot] >= generation, (worker, slot)
    # and the pooled buffers are reused: later epochs still read every value
    for epoch in (1, 2):
        kept.set_epoch(epoch)
        assert _check(list(kept), values) == len(values)



def test_a_mixture_over_epochs_and_a_resume(store_path):
    a = make_samples(37, seed=1)
    b = [s.__class__(key="b/" + s.key, fields=s.fields) for s in make_samples(23, seed=2)]
    commit_samples(store_path, "a", a, per_shard=6)
    commit_samples(store_path, "b", b, per_shard=5)

    def mixed(persistent):
        parts = [SimDataset(store_path, name, seed=5 + i, shard_opener=open_test_shard)
                 for i, name in enumerate(("a", "b"))]
        ds = SimDataset.mix(parts, weights=[2, 1], seed=5)
        return SimDataLoader(ds, batch_size=4, num_workers=2, persistent_workers=persistent,
                             multiprocessing_context="fork")

    kept, fresh = mixed(True), mixed(False)
    for epoch in (0, 1):
        assert _epoch(kept, epoch) == _epoch(fresh, epoch)
    kept.set_epoch(2)
    head = keys_of(itertools.islice(kept, 4))
    state = kept.state_dict()
    kept.load_state_dict(state)
    assert head + keys_of(kept) == _epoch(fresh, 2)


class _WorkerId:
    """A transform that records which DataLoader worker read the sample."""

    def __call__(self, sample):
        sample["worker"] = torch.tensor(torch.utils.data.get_worker_info().id)
        return sample


@pytest.mark.parametrize("before", [1, 3])
def test_a_shard_damaged_between_epochs_is_an_error(store_path, before):
    """Shards a worker verified for itself in one epoch are verified again in a later one."""
    commit_samples(store_path, "d2", make_samples(32, seed=3), per_shard=4)
    cat = Catalog.open(store_path)
    snap = cat.snapshot(cat.resolve("d2"))
    shard_of = {k: s for t in cat.iter_parts(snap)
                for k, s in zip(t.column("key").to_pylist(), t.column("shard").to_pylist(),
                                strict=True)}
    ds = SimDataset(store_path, "d2", shuffle=False, shard_opener=open_test_shard,
                    transform=_WorkerId())
    kept = SimDataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True,
                         multiprocessing_context="fork")
    readers = {}
    for _ in range(before):  # after 3, the next iteration reuses the first one's table
        for batch in kept:
            for key, worker in zip(batch["__key__"], batch["worker"].tolist(), strict=True):
                readers.setdefault(shard_of[key], set()).add(worker)
    # the shards read only by a worker that does not own them (see VerifiedTable): that
    # worker hashed them itself and published them
    foreign = [s for s, ws in readers.items() if int(s[24:32], 16) % 2 not in ws]
    assert foreign, "no shard read by a non-owner alone: the case is not exercised"
    for shard in foreign:
        flip_byte_keeping_times(os.path.join(store_path, "objects", shard[:2], shard))
    with pytest.raises(IntegrityError, match="|".join(foreign)):
        list(kept)


def _kill(process):
    """SIGKILL a worker and wait for it to be gone.

    Torch's SIGCHLD check may raise in this thread from the kill on (reworded: "DataLoader
    worker 0 (pid X) exited unexpectedly: it was killed by SIGKILL"): the kill is inside
    the handled block.
    """
    deadline = time.monotonic() + 30
    killed = False
    while time.monotonic() < deadline:
        try:
            if not killed:
                killed = True
                os.kill(process.pid, signal.SIGKILL)
            if not process.is_alive():
                return
            time.sleep(0.01)
        except RuntimeError as exc:
            assert "killed by SIGKILL" in str(exc)  # torch's check, reworded
    raise AssertionError("the killed worker is still alive")


def test_a_worker_that_died_between_epochs_is_replaced(small):
    store, ref, samples = small
    kept = _loader(store, ref, persistent=True)
    _epoch(kept, 0)
    old = list(kept._iterator._workers)
    _kill(old[0])
    assert _epoch(kept, 1) == _epoch(_loader(store, ref, persistent=False), 1)
    assert {w.pid for w in kept._iterator._workers}.isdisjoint(w.pid for w in old)
    assert not any(w.is_alive() for w in old)


def test_workers_whose_reset_fails_are_stopped(small):
    """A worker found dead only by torch's wait for the reset's acknowledgements."""
    store, ref, samples = small
    kept = _loader(store, ref, persistent=True)
    _epoch(kept, 0)
    workers = kept._iterator
    victim = workers._workers[0]
    real = victim.is_alive
    answers = iter([True])  # alive to the loader's check, dead to torch's
    victim.is_alive = lambda: next(answers, None) or real()
    _kill(victim)
    answers = iter([True])
    with pytest.raises(RuntimeError, match=rf"DataLoader worker 0 \(pid {victim.pid}\) exited "
                                           "unexpectedly: it was killed by SIGKILL"):
        iter(kept)
    assert workers._shutdown
    assert sorted(_epoch(kept, 1)) == sorted(samples)


def _shared_memory_descriptors():
    """This process's open descriptors of torch's shared memory segments."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if "/torch_" in os.readlink(f"/proc/self/fd/{fd}"):
                out.append(fd)
    return out


def test_loaders_dropped_before_their_workers_began_leave_no_descriptors(small):
    store, ref, _ = small

    def cycle():
        loader = _loader(store, ref, persistent=True)
        it = iter(loader)
        del it, loader
        gc.collect()

    cycle()
    before = len(_shared_memory_descriptors())
    for _ in range(8):
        cycle()
    assert len(_shared_memory_descriptors()) <= before


def test_an_iterator_superseded_by_a_later_one_is_an_error(small):
    store, ref, samples = small
    kept = _loader(store, ref, persistent=True)
    kept.set_epoch(0)
    first = iter(kept)
    next(first)
    kept.set_epoch(1)
    second = iter(kept)
    head = keys_of([next(second)])
    with pytest.raises(InvalidInputError, match="superseded"):
        next(first)
    assert head + keys_of(second) == _epoch(_loader(store, ref, persistent=False), 1)


@pytest.mark.parametrize("persistent", [True, False])
def test_the_run_report_keeps_the_worker_count_after_set_epoch(small, persistent):
    store, ref, _ = small
    loader = _loader(store, ref, persistent=persistent)
    _epoch(loader, 0)
    loader.set_epoch(1)
    assert loader.report()["num_workers"] == 2


class _Iter:
    """What ``_workers_stopped`` reads of a persistent worker set's iterator."""

    finished = False

    def __init__(self, number, status, task_info):
        self._sim_number, self._workers_status, self._task_info = number, status, task_info


def test_an_iteration_is_stopped_only_once_its_batches_are_delivered():
    from simstore.loaders._workers import _workers_stopped

    def stopped(it, number=4):
        return _workers_stopped(lambda: it, number)

    assert not stopped(_Iter(4, [True, False], {}))
    # both streams ended, but a batch that came out of order still waits in torch
    assert not stopped(_Iter(4, [False, False], {7: (1, "batch")}))
    assert stopped(_Iter(4, [False, False], {7: (1,)}))
    assert not stopped(_Iter(5, [True, True], {}))  # n + 1 may still close n's stream
    assert stopped(_Iter(6, [True, True], {}))


_EXIT_SCRIPT = """
import sys
from simstore.loaders import SimDataLoader, SimDataset
ds = SimDataset(sys.argv[1], "d", seed=1)
loader = SimDataLoader(ds, batch_size=2, num_workers=2, persistent_workers=True,
                       multiprocessing_context="spawn")
for epoch in (0, 1):
    loader.set_epoch(epoch)
    assert sum(len(b["__key__"]) for b in loader) == 12
"""


def test_spawned_persistent_workers_exit_cleanly_with_the_process(big, tmp_path):
    """Stopped at exit as an epoch's end stops them, not terminated: a spawned worker
    that shared its batches' memory by descriptor removes its listener's folder."""
    import subprocess
    import sys

    store, _ = big
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "TMPDIR": str(scratch),
           "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT, store], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in scratch.iterdir() if p.name.startswith("pymp-")) == []
