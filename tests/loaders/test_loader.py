"""SimDataLoader: batches, collate, worker processes and exact resume (golden tests)."""

from __future__ import annotations

import itertools
import os
import threading

import pytest
import torch
from loader_helpers import commit_samples, keys_of, make_samples, open_test_shard
from simstore.loaders import SimDataLoader, SimDataset

from simstore.errors import InvalidInputError


def build(store, refs, *, rank=0, world_size=1, seed=5, weights=None, **kw):
    kw.setdefault("shard_opener", open_test_shard)
    if isinstance(refs, str):
        return SimDataset(store, refs, seed=seed, rank=rank, world_size=world_size, **kw)
    parts = [SimDataset(store, r, seed=seed + i, rank=rank, world_size=world_size, **kw)
             for i, r in enumerate(refs)]
    return SimDataset.mix(parts, weights=weights, seed=seed)


def run_job(store, refs, *, world_size, workers, batch, epoch, steps=None, state=None,
            weights=None, context=None):
    """Every rank of a synchronous job reads `steps` batches (all when None).

    Returns (real keys delivered by all ranks, the state, batches per rank)."""
    delivered = []
    states = []
    counts = []
    for rank in range(world_size):
        ds = build(store, refs, rank=rank, world_size=world_size, weights=weights)
        if state is not None:
            ds.load_state_dict(state)
        ds.set_epoch(epoch)
        loader = SimDataLoader(ds, batch_size=batch, num_workers=workers,
                               multiprocessing_context=context)
        got = list(itertools.islice(loader, steps)) if steps is not None else list(loader)
        counts.append(len(got))
        delivered.extend(keys_of(got))
        states.append(loader.state_dict())
    assert all(s == states[0] for s in states), "ranks disagree on the progress"
    assert len(set(counts)) == 1, f"uneven batch counts {counts}"
    return delivered, states[0], counts[0]


@pytest.fixture
def two(store_path):
    a = make_samples(37, seed=1)
    b = [s.__class__(key="b/" + s.key, fields=s.fields) for s in make_samples(23, seed=2)]
    commit_samples(store_path, "a", a, per_shard=6)
    commit_samples(store_path, "b", b, per_shard=5)
    return store_path, {s.key for s in a}, {s.key for s in b}


def test_batches_are_collated(small):
    store, ref, _ = small
    loader = SimDataLoader(build(store, ref), batch_size=8)
    batch = next(iter(loader))
    assert batch["u"].shape == (8, 8) and batch["u"].dtype == torch.float32
    assert batch["v"].shape == (8, 3)
    assert batch["step"].shape == (8,)
    assert len(batch["__key__"]) == 8 and batch["__pad__"].dtype == torch.bool
    assert len(loader) == 8  # ceil(60 / 8)


@pytest.mark.parametrize("world_size,workers,new_world,new_workers", [
    (1, 0, 2, 0), (2, 0, 4, 0), (4, 0, 1, 0), (2, 0, 1, 0),
])
def test_resume_golden_in_process(small, world_size, workers, new_world, new_workers):
    store, ref, samples = small
    for epoch in (0, 3):
        first, state, _ = run_job(store, ref, world_size=world_size, workers=workers,
                                  batch=4, epoch=epoch, steps=2)
        second, state2, _ = run_job(store, ref, world_size=new_world, workers=new_workers,
                                    batch=3, epoch=epoch, steps=2, state=state)
        third, end, _ = run_job(store, ref, world_size=world_size, workers=workers, batch=5,
                                epoch=epoch, state=state2)
        seq = first + second + third
        assert len(seq) == len(set(seq)) and set(seq) == set(samples)
        assert end["remaining"] == []


@pytest.mark.multiprocess
@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_resume_with_worker_processes(small, context):
    store, ref, samples = small
    first, state, _ = run_job(store, ref, world_size=2, workers=2, batch=4, epoch=1,
                              steps=3, context=context)
    assert len(first) == 2 * 3 * 4
    second, state2, _ = run_job(store, ref, world_size=1, workers=1, batch=2, epoch=1,
                                steps=4, state=state, context=context)
    third, end, _ = run_job(store, ref, world_size=4, workers=0, batch=3, epoch=1,
                            state=state2)
    seq = first + second + third
    assert len(seq) == len(set(seq)) and set(seq) == set(samples)


@pytest.mark.multiprocess
def test_workers_do_not_change_the_rank_stream(small):
    store, ref, _ = small
    orders = []
    for workers in (0, 1, 2):
        loader = SimDataLoader(build(store, ref), batch_size=4, num_workers=workers,
                               multiprocessing_context="fork" if workers else None)
        orders.append([k for b in loader for k in b["__key__"]])
    assert orders[0] == orders[1] == orders[2]


def test_mixture_epoch_is_weighted_and_exact(two):
    store, a_keys, b_keys = two
    ds = build(store, ["a", "b"], weights=[3, 1])
    assert ds.num_samples == 60
    got = [s["__key__"] for s in ds]
    assert len(got) == 60
    from_b = sum(k.startswith("b/") for k in got)
    assert 14 <= from_b <= 16  # a quarter of 60
    # a's 37 samples do not fit 45 slots: a starts its second epoch, no repeat before that
    from_a = [k for k in got if not k.startswith("b/")]
    assert set(from_a) == a_keys and len(from_a) - len(set(from_a)) == 45 - 37


@pytest.mark.parametrize("epoch", [0, 2])
def test_mixture_resume_golden(two, epoch):
    store, *_ = two
    full, _, _ = run_job(store, ["a", "b"], world_size=1, workers=0, batch=1, epoch=epoch,
                         weights=[2, 1])
    first, state, _ = run_job(store, ["a", "b"], world_size=2, workers=0, batch=4,
                              epoch=epoch, steps=3, weights=[2, 1])
    second, state2, _ = run_job(store, ["a", "b"], world_size=4, workers=0, batch=2,
                                epoch=epoch, steps=2, state=state, weights=[2, 1])
    third, _, _ = run_job(store, ["a", "b"], world_size=1, workers=0, batch=3, epoch=epoch,
                          state=state2, weights=[2, 1])
    assert sorted(first + second + third) == sorted(full)


@pytest.mark.multiprocess
def test_mixture_resume_with_workers(two):
    store, *_ = two
    full, _, _ = run_job(store, ["a", "b"], world_size=1, workers=0, batch=1, epoch=1)
    first, state, _ = run_job(store, ["a", "b"], world_size=2, workers=2, batch=4, epoch=1,
                              steps=3, context="fork")
    second, _, _ = run_job(store, ["a", "b"], world_size=1, workers=2, batch=4, epoch=1,
                           state=state, context="fork")
    assert sorted(first + second) == sorted(full)


def test_mixture_refuses_bad_input(two):
    store, *_ = two
    a, b = build(store, "a"), build(store, "b")
    with pytest.raises(InvalidInputError):
        SimDataset.mix([a, b], weights=[1])
    with pytest.raises(InvalidInputError):
        SimDataset.mix([a, b], weights=[1, -1])
    with pytest.raises(InvalidInputError, match="plain datasets"):
        SimDataset.mix([SimDataset.mix([a, b]), b])


def test_a_mixture_state_resumes_only_its_own_interleaving(two):
    """``mix(shuffle=...)`` decides how the sources interleave: a state of the other
    setting would repeat some samples and skip others, so it is refused."""
    store, *_ = two

    def mix(shuffle):
        parts = [build(store, r) for r in ("a", "b")]
        return SimDataset.mix(parts, weights=[2, 5], seed=9, shuffle=shuffle)

    loader = SimDataLoader(mix(True), batch_size=4)
    first = [k for b in itertools.islice(loader, 5) for k in b["__key__"]]
    state = loader.state_dict()
    assert state["mix_shuffle"] is True
    with pytest.raises(InvalidInputError, match="mix_shuffle"):
        mix(False).load_state_dict(state)
    older = {k: v for k, v in state.items() if k != "mix_shuffle"}
    with pytest.raises(InvalidInputError, match="before 2026-12-02") as info:
        mix(True).load_state_dict(older)
    # the error's advice, for a state from before the field: say the setting it had
    assert "set state['mix_shuffle'] = True and load it again" in str(info.value)
    again = mix(True)
    again.load_state_dict({**older, "mix_shuffle": True})  # the same interleaving: exact
    rest = [k for b in SimDataLoader(again, batch_size=4) for k in b["__key__"]]
    whole = [k for b in SimDataLoader(mix(True), batch_size=4) for k in b["__key__"]]
    assert first + rest == whole
    plain = build(store, "a")  # one source: no interleaving to check
    plain.load_state_dict({k: v for k, v in plain.state_dict().items() if k != "mix_shuffle"})


def test_a_dataset_and_its_one_source_mixture_share_their_states(two):
    """"One dataset is the mixture of one source": the two streams are one, so each
    resumes from the other's state (a lone source's order ignores the mixture's seed)."""
    store, *_ = two
    plain = build(store, "a", seed=3)
    mixed = SimDataset.mix([build(store, "a", seed=3)])
    assert plain.state_dict()["mix_seed"] != mixed.state_dict()["mix_seed"]
    loader = SimDataLoader(plain, batch_size=4)
    first = [k for b in itertools.islice(loader, 3) for k in b["__key__"]]
    mixed.load_state_dict(loader.state_dict())
    rest = [k for b in SimDataLoader(mixed, batch_size=4) for k in b["__key__"]]
    assert first + rest == [k for b in SimDataLoader(build(store, "a", seed=3), batch_size=4)
                            for k in b["__key__"]]


def test_per_sample_mode_without_batching(small):
    store, ref, samples = small
    loader = SimDataLoader(build(store, ref), batch_size=None)
    it = iter(loader)
    got = [next(it)["__key__"] for _ in range(10)]
    state = loader.state_dict()
    it.close()
    assert state["delivered"] == 10
    loader2 = SimDataLoader(build(store, ref), batch_size=None)
    loader2.load_state_dict(state)
    rest = [s["__key__"] for s in loader2]
    assert sorted(got + rest) == sorted(samples)


def _record_frozen(out, worker_id: int) -> None:
    import gc

    out.value = gc.get_freeze_count()


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_freeze_what_they_start_with_out_of_the_collectors_sight(store_path, context):
    """A worker's full collections would walk every object it inherited (or imported):
    by the time the caller's init runs they are in the permanent generation."""
    import functools
    import gc
    import multiprocessing

    commit_samples(store_path, "sim", make_samples(8), per_shard=4)
    frozen = multiprocessing.get_context(context).Value("q", -1)
    ds = SimDataset(store_path, "sim", shard_opener=open_test_shard)
    loader = SimDataLoader(ds, batch_size=2, num_workers=1, multiprocessing_context=context,
                           worker_init_fn=functools.partial(_record_frozen, frozen))
    assert len(list(loader)) == 4
    assert gc.get_freeze_count() == 0  # this process collects as before
    assert frozen.value > 10_000, frozen.value


def _exit_slowly(pids, release, worker_id: int) -> None:
    """Record this worker's pid; make its exit wait until ``release`` is set."""
    import multiprocessing.util

    pids[worker_id] = os.getpid()
    multiprocessing.util.Finalize(None, release.wait, args=(60,), exitpriority=100)


def _state_of(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_an_epoch_read_to_its_end_does_not_wait_for_the_workers_to_exit(store_path):
    """The last batch ends the epoch; the workers' exits are joined on a thread."""
    import functools
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    commit_samples(store_path, "sim", make_samples(12), per_shard=4)
    pids = ctx.Array("q", 2)
    release = ctx.Event()
    ds = SimDataset(store_path, "sim", shard_opener=open_test_shard)
    loader = SimDataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="fork",
                           worker_init_fn=functools.partial(_exit_slowly, pids, release))
    it = iter(loader)
    assert len(list(it)) == 6
    # both workers are still in their exit (torch would have joined them, waited 5 s
    # and killed them)
    assert all(p > 0 for p in pids)
    assert [_state_of(p) for p in pids] != ["Z", "Z"]
    assert ds.state_dict()["delivered"] == 12
    release.set()
    # the reaper joins them: they end by themselves, and the next epoch reads them all
    reapers = [t for t in threading.enumerate()
               if t.name == "simstore-reap-workers"]
    assert reapers
    for t in reapers:
        t.join(30)
    for p in pids:
        with pytest.raises(FileNotFoundError):
            _state_of(p)
    assert len(list(loader)) == 6


def test_an_epoch_cut_short_stops_its_workers_before_the_next(store_path):
    """A loop that breaks off leaves no worker running once its iterator is gone."""
    import gc

    commit_samples(store_path, "sim", make_samples(24), per_shard=4)
    ds = SimDataset(store_path, "sim", shard_opener=open_test_shard)
    loader = SimDataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="fork")
    it = iter(loader)
    first = next(it)
    assert first["__key__"]
    assert ds.state_dict()["delivered"] == 2
    del it
    gc.collect()
    assert not [t for t in threading.enumerate()
                if t.name == "simstore-reap-workers"]
    assert sum(len(b["__key__"]) for b in loader) == 24


def test_an_iterator_read_after_a_later_one_began_counts_for_its_own_iteration(small):
    """Two loaders over one dataset, interleaved: the later iteration's progress is the
    dataset's state; the earlier one's batches go on counting for the earlier one."""
    store, ref, samples = small
    ds = build(store, ref)
    with_workers = SimDataLoader(ds, batch_size=4, num_workers=2,
                                 multiprocessing_context="fork")
    early = iter(with_workers)
    head = keys_of([next(early)])
    assert sorted(keys_of(SimDataLoader(ds, batch_size=4))) == sorted(samples)
    assert sorted(head + keys_of(early)) == sorted(samples)
    assert ds.state_dict()["remaining"] == []
    assert ds.stats()["samples"] == 2 * len(samples)
