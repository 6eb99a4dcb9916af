"""The run's time figures and epochs: what a loop that stops early or resumes reports.

The loop's time between batches is its own (``busy_s``), time inside ``next()`` a wait
(``wait_s``): the data stall is the waits' share. A run report's epochs are those it
delivered batches of, and ``epochs_read`` what the cost accounting divides by.
"""

from __future__ import annotations

import json
from itertools import islice

import pytest
from loader_helpers import open_test_shard
from simstore.loaders import SimDataset
from simstore.loaders._metrics import Metrics, timed

from simstore.cost import parse_run_report


class _Clock:
    """A clock the test moves: waits of 1 s in ``next()``, loop bodies of 2 s."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def items(self, n: int):
        for i in range(n):
            self.now += 1.0
            yield i


def test_a_loop_read_to_its_end_counts_each_body_once():
    clock, metrics = _Clock(), Metrics()
    metrics.start(0)
    for _ in timed(clock.items(5), metrics, clock=clock):
        clock.now += 2.0
    assert metrics.wait_s == 5.0
    assert metrics.busy_s == 10.0
    assert metrics.stats()["data_stall"] == pytest.approx(5 / 15)


def test_the_periodic_line_counts_its_interval_across_epochs(caplog):
    # found by an audit: each iteration started the interval afresh, so a job whose
    # epochs each took less than log_every_s never logged a line (10 epochs of 3 s, a
    # line asked for every 10 s: none)
    clock, metrics = _Clock(), Metrics()
    with caplog.at_level("INFO", logger="simstore.loaders"):
        for epoch in range(10):
            metrics.start(epoch)
            for _ in timed(clock.items(1), metrics, log_every_s=10.0, clock=clock):
                clock.now += 2.0
    assert clock.now == 30.0
    lines = [r for r in caplog.records if "samples/s" in r.getMessage()]
    assert len(lines) == 2  # at 10 s and 20 s of the loop's 30, not 0


def test_a_loop_left_by_break_counts_its_last_body():
    clock, metrics = _Clock(), Metrics()
    metrics.start(0)
    it = timed(clock.items(5), metrics, clock=clock)
    for i in it:
        clock.now += 2.0
        if i == 2:
            break
    it.close()  # what dropping the loop's iterator does
    assert metrics.wait_s == 3.0
    assert metrics.busy_s == 6.0  # three bodies, the last one's included
    assert metrics.stats()["data_stall"] == pytest.approx(3 / 9)


def test_a_loop_left_by_an_error_counts_its_last_body():
    clock, metrics = _Clock(), Metrics()
    metrics.start(0)
    it = timed(clock.items(5), metrics, clock=clock)
    with pytest.raises(ZeroDivisionError):
        for i in it:
            clock.now += 2.0
            if i == 1:
                raise ZeroDivisionError
    it.close()
    assert (metrics.wait_s, metrics.busy_s) == (2.0, 4.0)


def test_an_iteration_that_delivers_nothing_reads_no_epoch():
    clock, metrics = _Clock(), Metrics()
    metrics.start(0)
    assert list(timed(clock.items(0), metrics, clock=clock)) == []
    metrics.start(1)
    assert list(timed(clock.items(2), metrics, clock=clock)) == [0, 1]
    assert metrics.epochs == [1]


def _ds(store: str) -> SimDataset:
    return SimDataset(store, "sim", shuffle=True, seed=3, shard_opener=open_test_shard)


def test_a_job_resumed_at_the_end_of_an_epoch_reports_the_epochs_it_read(small):
    store, _, samples = small
    first = _ds(store)
    first.set_epoch(0)
    assert len(list(first)) == len(samples) == 60
    state = first.state_dict()
    assert state["epoch"] == 0 and state["remaining"] == []

    # the next job, in the loop loader.md shows, from the checkpoint's epoch
    second = _ds(store)
    second.load_state_dict(state)
    got = {}
    for epoch in (0, 1):
        second.set_epoch(epoch)
        got[epoch] = len(list(second))
    assert got == {0: 0, 1: 60}
    report = json.loads(json.dumps(second.report()))
    assert report["epochs"] == [1]
    assert report["epochs_read"] == 1.0
    assert parse_run_report(report).epochs == 1.0


def test_a_job_resumed_mid_epoch_reads_a_part_of_one(small):
    store, _, _ = small
    first = _ds(store)
    first.set_epoch(0)
    it = iter(first)
    head = list(islice(it, 21))
    state = first.state_dict()
    it.close()
    assert len(head) == 21

    second = _ds(store)
    second.load_state_dict(state)
    second.set_epoch(0)
    assert len(list(second)) == 39
    report = json.loads(json.dumps(second.report()))
    assert report["epochs"] == [0]
    assert report["epochs_read"] == pytest.approx(39 / 60, abs=1e-6)
    usage = parse_run_report(report)
    assert usage.epochs == pytest.approx(0.65, abs=1e-6)
    first_report = first.report()
    assert first_report["epochs_read"] == pytest.approx(21 / 60, abs=1e-6)


@pytest.mark.parametrize("remainder", ["pad", "drop"])
def test_a_whole_epoch_is_one_whatever_the_world_size(small, remainder):
    """60 samples over 7 ranks: 9 positions a rank padded, 8 dropped; an epoch is 1.0."""
    store, _, _ = small
    for rank in (0, 6):
        ds = SimDataset(store, "sim", rank=rank, world_size=7, remainder=remainder,
                        shard_opener=open_test_shard)
        got = len(list(ds))
        assert got == len(ds) == (9 if remainder == "pad" else 8)
        assert ds.report()["epochs_read"] == 1.0


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("remainder", ["pad", "drop"])
def test_a_whole_epoch_with_drop_last_is_one(small, remainder, workers):
    # found by an audit: epochs_read divided by the rank's samples, which a loader that
    # drops a short last batch never delivers (8 positions, batches of 5: 0.625 of an
    # epoch for a whole one, so cost --run priced each epoch 1.6 times over); here 20
    # positions a rank, batches of 6
    from simstore.loaders import SimDataLoader

    store, ref, _ = small
    ds = SimDataset(store, ref, shard_opener=open_test_shard, rank=0, world_size=3,
                    remainder=remainder)
    loader = SimDataLoader(ds, batch_size=6, num_workers=workers, drop_last=True)
    for epoch in range(2):
        loader.set_epoch(epoch)
        delivered = sum(len(b["__key__"]) for b in loader)
        assert delivered == len(loader) * 6 < len(ds)
    assert ds.report()["epochs_read"] == pytest.approx(2.0)


def test_epochs_read_follows_the_loader_that_read_not_the_last_one_made(small):
    # found by an audit: the loader set its drop_last on the dataset when it was made, so
    # another loader made over the dataset afterwards changed the first one's report
    from simstore.loaders import SimDataLoader

    store, ref, _ = small
    ds = SimDataset(store, ref, shard_opener=open_test_shard)
    loader = SimDataLoader(ds, batch_size=8, drop_last=True)  # 60 samples: 56 a whole epoch
    assert sum(len(b["__key__"]) for b in loader) == 56
    assert ds.report()["epochs_read"] == pytest.approx(1.0)
    SimDataLoader(ds, batch_size=8)  # made, never read
    assert loader.report()["epochs_read"] == pytest.approx(1.0)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_report_names_each_tier_even_when_nothing_was_read(small, workers, node_records):
    # found by an audit: workers that delivered no batch (drop_last, a batch larger than
    # the epoch) left the report's tiers empty, which the cost accounting priced at $0
    from simstore.loaders import SimDataLoader

    store, ref, _ = small
    for _ in SimDataset(store, ref, shard_opener=open_test_shard):
        pass  # an earlier job: the manifest's rows are kept on the node, read no more
    ds = SimDataset(store, ref, shard_opener=open_test_shard)
    loader = SimDataLoader(ds, batch_size=100, drop_last=True, num_workers=workers)
    assert list(loader) == []
    report = ds.report()
    assert set(report["tiers"]) == {"local"}  # (the manifest's reads, if any, are in it)
    assert report["epochs_read"] is None  # a whole epoch delivers nothing
    assert parse_run_report(json.loads(json.dumps(report))).tiers[0].tier == "local"


def _read_twice(small, workers):
    """``(dataset, what iterates it, samples, keys of an item)``: the dataset alone
    (``workers`` None) or a SimDataLoader with ``workers``."""
    from simstore.loaders import SimDataLoader

    store, ref, samples = small
    ds = SimDataset(store, ref, shard_opener=open_test_shard)
    source = ds if workers is None else SimDataLoader(ds, batch_size=4, num_workers=workers)

    def keys(item):
        return [item["__key__"]] if workers is None else list(item["__key__"])

    return ds, source, samples, keys


@pytest.mark.parametrize("workers", [None, 0, 2])
def test_an_earlier_iteration_still_read_counts_its_samples(small, workers):
    # found by an audit: with no workers, an iteration still read after a later one had
    # started lost its later samples from stats() and the run report (37 of 74 counted)
    ds, source, samples, keys = _read_twice(small, workers)
    first = iter(source)
    got = keys(next(first))
    got += [k for item in source for k in keys(item)]  # a whole second iteration
    got += [k for item in first for k in keys(item)]  # then the rest of the first
    assert len(got) == 2 * len(samples)
    assert ds.stats()["samples"] == 2 * len(samples)
    assert ds.report()["samples"] == 2 * len(samples)


def test_a_report_names_its_node_cache_the_same_for_every_rank_that_shares_it(small,
                                                                           tmp_path):
    # the cost accounting merges ranks' reports: those of one node's cache may count one
    # warm copy once each, so a report says which cache it read (no path in it)
    from simstore.cost import merge_run_usage, parse_run_report

    store, ref, _ = small

    def node(cache_dir, rank=0):
        ds = SimDataset(store, ref, shard_opener=open_test_shard, cache_dir=cache_dir,
                        rank=rank, world_size=2)
        list(ds)
        return ds.report()["cache"]["node"]

    shared = str(tmp_path / "node-cache")
    first, second = node(shared, 0), node(shared + "/", 1)
    assert first == second and len(first) == 16 and int(first, 16) >= 0
    assert shared not in first and node(str(tmp_path / "other")) != first
    assert node(None) is None
    report = SimDataset(store, ref, shard_opener=open_test_shard).report()
    assert not merge_run_usage([parse_run_report(report)] * 2).warm_shared


@pytest.mark.parametrize("workers", [None, 0, 2])
def test_an_iterator_made_before_a_later_one_and_read_after_it_counts_once(small, workers):
    # found by a review: with no workers, an iterator first read after a later iter()
    # counted into the later iteration's counters, and each sample was summed twice
    ds, source, samples, keys = _read_twice(small, workers)

    def count(items):
        return sum(len(keys(item)) for item in items)

    first = iter(source)  # made, not read yet
    delivered = count(iter(source)) + count(first)
    assert delivered == 2 * len(samples)
    assert ds.stats()["samples"] == delivered
    assert ds.report()["samples"] == delivered
