"""SimDataLoader where code written for torch's DataLoader expects DataLoader behaviour.

``collate_fn`` without batching, ``len(loader.dataset)``, ``shuffle=False``, a
``timeout`` without workers, an iteration that fails to start, and the loop's wait for
its first batch counting the workers' start.
"""

from __future__ import annotations

import os
import time

import pytest
import torch
from loader_helpers import commit_samples, make_samples, open_test_shard
from simstore.loaders import SimDataLoader, SimDataset

from simstore.errors import InvalidInputError


@pytest.fixture
def ds(store_path):
    commit_samples(store_path, "sim", make_samples(37), per_shard=10)
    return _dataset(store_path)


def _dataset(store_path):
    return SimDataset(store_path, "sim", shard_opener=open_test_shard, seed=1)


def _workers(n):
    return {"num_workers": n, **({"multiprocessing_context": "fork"} if n else {})}


@pytest.mark.parametrize("workers", [0, 2])
def test_collate_fn_takes_each_sample_without_batching_as_torch_calls_it(ds, workers):
    def convert(sample):
        return {"key": sample["__key__"], "converted": True}

    got = list(SimDataLoader(ds, batch_size=None, collate_fn=convert, **_workers(workers)))
    assert len(got) == 37 and all(b["converted"] for b in got)
    assert sorted(b["key"] for b in got) == sorted(s.key for s in make_samples(37))
    plain = next(iter(SimDataLoader(ds, batch_size=None, **_workers(workers))))
    assert "__key__" in plain  # no collate_fn: the sample as it is


def test_the_loaders_dataset_answers_as_the_simdataset(ds):
    loader = SimDataLoader(ds, batch_size=4, num_workers=0)
    assert len(loader.dataset) == len(ds) == 37  # torch's len(loader.dataset) idiom
    loader.dataset.set_epoch(3)
    assert ds.epoch == 3 and loader.dataset.epoch == 3
    assert sum(len(b["__key__"]) for b in loader) == 37
    ds.set_epoch(5)
    assert loader.dataset.epoch == 5 and loader.dataset.world == ds.world
    # the stream's own attributes never shadow the SimDataset's public ones
    public = {n for n in dir(ds) if not n.startswith("_")}
    assert not set(vars(loader.dataset)) & public
    assert loader.dataset.snapshot_id == ds.snapshot_id
    with pytest.raises(AttributeError):
        loader.dataset.no_such_attribute  # noqa: B018


def test_shuffle_false_is_taken_as_torch_takes_it(ds):
    loader = SimDataLoader(ds, batch_size=4, shuffle=False)
    assert sum(len(b["__key__"]) for b in loader) == 37
    with pytest.raises(InvalidInputError, match="shuffle= does not apply"):
        SimDataLoader(ds, batch_size=4, shuffle=True)


def test_a_timeout_without_workers_is_refused_when_made(ds):
    with pytest.raises(InvalidInputError, match="timeout applies only with workers"):
        SimDataLoader(ds, batch_size=4, num_workers=0, timeout=5)
    SimDataLoader(ds, batch_size=4, num_workers=0, timeout=0)  # torch's default: fine


def test_an_iteration_that_fails_to_start_keeps_the_loaded_resume(ds, store_path,
                                                                   monkeypatch):
    seen, state = _three_batches_and_state(ds)
    ds2 = _dataset(store_path)
    loader = SimDataLoader(ds2, batch_size=4)
    loader.load_state_dict(state)
    real = torch.utils.data.DataLoader.__iter__
    calls = []

    def failing(self):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the workers could not start")
        return real(self)

    monkeypatch.setattr(torch.utils.data.DataLoader, "__iter__", failing)
    with pytest.raises(RuntimeError, match="could not start"):
        iter(loader)
    _the_rest_completes_the_epoch(seen, loader)


@pytest.mark.parametrize("workers", [0, 2])
def test_an_iteration_never_read_from_keeps_the_loaded_resume(ds, store_path, workers):
    # found by an audit: iter() took the loaded resume and a later iter() read the whole
    # epoch, while state_dict() still said it resumed (12 samples twice)
    seen, state = _three_batches_and_state(ds)
    loader = SimDataLoader(_dataset(store_path), batch_size=4, **_workers(workers))
    loader.load_state_dict(state)
    unread = iter(loader)
    assert loader.state_dict()["remaining"] == state["remaining"]
    del unread
    _the_rest_completes_the_epoch(seen, loader)
    again = SimDataset(store_path, "sim", shard_opener=open_test_shard, seed=1)
    again.load_state_dict(state)
    iter(again)  # the same, iterating the dataset itself
    assert again.state_dict()["remaining"] == state["remaining"]
    rest = [s["__key__"] for s in again]
    assert sorted(seen + rest) == sorted(s.key for s in make_samples(37))


def _three_batches_and_state(ds):
    """The keys of a loader's first three batches of 4, and its state after them."""
    first = SimDataLoader(ds, batch_size=4)
    it = iter(first)
    seen = [k for _ in range(3) for k in next(it)["__key__"]]
    state = first.state_dict()
    del it
    return seen, state


def _the_rest_completes_the_epoch(seen, loader):
    rest = [k for b in loader for k in b["__key__"]]
    assert len(seen) == 12 and len(rest) == 25
    assert sorted(seen + rest) == sorted(s.key for s in make_samples(37))


def _init_that_may_fail(worker_id):
    if os.environ.get("SIMSTORE_TEST_INIT_FAILS"):  # read in fork and spawn workers alike
        raise RuntimeError(f"worker {worker_id} could not initialise")


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_whose_init_fails_use_up_no_loaded_resume(ds, store_path, context,
                                                          monkeypatch):
    # found by an audit: worker_init_fn raising fails the first next(), after iter() had
    # taken the loaded resume; state_dict() still said it resumed, and the next iteration
    # read the whole epoch again (20 of 203 samples twice)
    seen, state = _three_batches_and_state(ds)
    loader = SimDataLoader(_dataset(store_path), batch_size=4, num_workers=2,
                           multiprocessing_context=context, worker_init_fn=_init_that_may_fail)
    loader.load_state_dict(state)
    monkeypatch.setenv("SIMSTORE_TEST_INIT_FAILS", "1")
    with pytest.raises(Exception, match="could not initialise"):
        next(iter(loader))
    monkeypatch.delenv("SIMSTORE_TEST_INIT_FAILS")
    assert loader.state_dict()["remaining"] == state["remaining"]
    _the_rest_completes_the_epoch(seen, loader)


def test_the_first_wait_counts_the_workers_start(ds, monkeypatch):
    """Workers start in ``iter()``; the loop waits for them as for any batch (a clock
    that moves only while the DataLoader starts its iteration: 5 s there, none elsewhere)."""
    now = [100.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    real = torch.utils.data.DataLoader.__iter__

    def slow_start(self):
        now[0] += 5.0  # a slow worker start
        return real(self)

    monkeypatch.setattr(torch.utils.data.DataLoader, "__iter__", slow_start)
    loader = SimDataLoader(ds, batch_size=4)
    for _ in loader:
        pass
    stats = ds.stats()
    assert stats["time_to_first_batch_s"] == 5.0
    assert stats["wait_s"] == 5.0 and stats["seconds"] == 5.0
    assert stats["data_stall"] == 1.0
