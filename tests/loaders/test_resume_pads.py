"""A resume pads as the uninterrupted epoch did: ``__pad__`` rows repeat the epoch's start.

``remainder="pad"`` extends the last rank's block with repeats of the epoch's first stream
positions. A checkpoint leaves later positions to read, and padding with the first of
*those* gave a same-world resume other pad rows than the run it continues; the real rows
were always exact.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loader_helpers import commit_samples, keys_of, make_samples, open_test_shard
from simstore.loaders import SimDataLoader, SimDataset
from simstore.loaders._plan import advance, plan_epoch, samples_per_rank
from simstore.loaders._world import World

from simstore.errors import InvalidInputError


def rank_stream(remaining, length, world_size, rank, workers, batch):
    """One rank's ``(position, is_pad)`` in delivery order (its workers round-robin)."""
    per_worker = []
    for k in range(workers):
        plan = plan_epoch(remaining, World(rank=rank, world_size=world_size, worker=k,
                                           num_workers=workers),
                          batch_size=batch, remainder="pad", epoch_length=length)
        got = [x for pos, pad in plan.chunks(max_samples=5)
               for x in zip(pos.tolist(), pad.tolist(), strict=True)]
        assert len(got) == plan.worker_samples
        per_worker.append([got[i:i + batch] for i in range(0, len(got), batch)])
    out = []
    for j in itertools.count():
        k, i = j % workers, j // workers
        if i >= len(per_worker[k]):
            break
        out.extend(per_worker[k][i])
    return out


@settings(max_examples=150, deadline=None)
@given(
    length=st.integers(1, 60),
    world_size=st.integers(1, 5),
    workers=st.integers(1, 3),
    new_workers=st.integers(1, 3),
    batch=st.integers(1, 6),
    steps=st.integers(0, 20),
)
def test_a_same_world_resume_gives_the_uninterrupted_pads(
    length, world_size, workers, new_workers, batch, steps
):
    full = [rank_stream([(0, length)], length, world_size, r, workers, batch)
            for r in range(world_size)]
    n = samples_per_rank(length, world_size, "pad")
    pads = [p for got in full for p, pad in got if pad]
    # the padding: the epoch's first positions, as many as the world needs
    assert pads == [i % length for i in range(world_size * n - length)]
    # every rank has received `steps` batches (round-robin over its workers)
    done = min(steps, -(-n // batch))
    counts = [0] * workers
    for j in range(done):
        counts[j % workers] += min(batch, n - j * batch)
    rest = advance([(0, length)], world_size=world_size, num_workers=workers,
                   batch_size=batch, remainder="pad", consumed=counts)
    for r in range(world_size):
        resumed = rank_stream(rest, length, world_size, r, new_workers, batch)
        assert resumed == full[r][done * batch:]  # real and pad rows alike


@settings(max_examples=200, deadline=None)
@given(
    length=st.integers(1, 60),
    cut=st.lists(st.tuples(st.integers(0, 59), st.integers(1, 10)), max_size=4),
    world_size=st.integers(1, 5),
    batch=st.integers(1, 6),
)
def test_any_resume_pads_with_the_epochs_first_positions(length, cut, world_size, batch):
    """An elastic resume pads what its own world needs, with the epoch's first samples."""
    taken = {p for a, n in cut for p in range(a, min(a + n, length))}
    left = [p for p in range(length) if p not in taken]
    remaining = [(p, p + 1) for p in left]
    got = [x for r in range(world_size)
           for x in rank_stream(remaining, length, world_size, r, 1, batch)]
    assert sorted(p for p, pad in got if not pad) == left
    n = samples_per_rank(len(left), world_size, "pad")
    pads = [p for p, pad in got if pad]
    assert len(got) == world_size * n  # equal counts per rank
    assert len(pads) == world_size * n - len(left)  # the pad count is unchanged
    whole = world_size * samples_per_rank(length, world_size, "pad") - length
    # the epoch's first positions: those a whole epoch in this world pads with, or as
    # many as this world needs
    assert set(pads) <= {i % length for i in range(max(whole, len(pads)))}


def test_plan_refuses_an_epoch_shorter_than_its_positions():
    with pytest.raises(InvalidInputError, match="epoch_length 5"):
        plan_epoch([(0, 8)], World(), epoch_length=5)


def rows(batch):
    """A batch's rows, pad rows included: key, pad flag and every field's values."""
    out = []
    for i, key in enumerate(batch["__key__"]):
        out.append((key, bool(batch["__pad__"][i]), batch["u"][i].tolist(),
                    batch["v"][i].tolist(), int(batch["step"][i]), batch["name"][i]))
    return out


@pytest.fixture
def odd(store_path):
    # 43 samples: 3 ranks of 15 need 2 pad rows on the last rank
    commit_samples(store_path, "odd", make_samples(43), per_shard=7)
    return store_path, "odd"


def loader_of(store, ref, rank, world_size, workers, state=None, epoch=1):
    ds = SimDataset(store, ref, seed=9, rank=rank, world_size=world_size,
                    shard_opener=open_test_shard)
    if state is not None:
        ds.load_state_dict(state)
    ds.set_epoch(epoch)
    return SimDataLoader(ds, batch_size=7, num_workers=workers,
                         multiprocessing_context="fork" if workers else None)


def check_resume_matches(store, ref, world_size, workers, new_workers, steps):
    states = []
    for rank in range(world_size):
        full = [rows(b) for b in loader_of(store, ref, rank, world_size, workers)]
        killed = loader_of(store, ref, rank, world_size, workers)
        head = [rows(b) for b in itertools.islice(killed, steps)]
        state = killed.state_dict()
        states.append(state)
        resumed = [rows(b) for b in loader_of(store, ref, rank, world_size, new_workers,
                                              state=state)]
        assert head == full[:steps]
        # batch by batch, pad rows (key, flag and content) included
        assert resumed == full[steps:], f"rank {rank}"
        if rank == world_size - 1:
            assert any(pad for b in resumed for _, pad, *_ in b), "no pad row after the resume"
    assert all(s == states[0] for s in states)


@pytest.mark.parametrize("steps", [1, 2])
def test_a_same_world_resume_repeats_the_uninterrupted_batches(odd, steps):
    store, ref = odd
    check_resume_matches(store, ref, 3, 0, 0, steps)


@pytest.mark.multiprocess
def test_a_same_world_resume_with_workers_repeats_the_uninterrupted_batches(odd):
    store, ref = odd
    check_resume_matches(store, ref, 3, 2, 2, 1)
    check_resume_matches(store, ref, 3, 2, 0, 1)  # another worker count, the same world


@pytest.mark.parametrize(("world_size", "pads"), [
    # 22 samples left, 4 ranks of 6: 2 pads where a whole epoch of 4 ranks has 1: the
    # epoch's first two positions
    (4, [0, 1]),
    # 6 ranks of 4: 2 pads in the slots where a whole epoch of 6 ranks (5 pads) has
    # its last two
    (6, [3, 4]),
])
def test_elastic_resume_pads_with_what_a_whole_epoch_pads(odd, world_size, pads):
    store, ref = odd
    first = [loader_of(store, ref, r, 3, 0) for r in range(3)]
    before = [k for loader in first for k in keys_of(itertools.islice(loader, 1))]
    state = first[0].state_dict()
    # the epoch's stream in order: one process, one rank
    stream = [k for b in loader_of(store, ref, 0, 1, 0) for k in b["__key__"]]
    got = [b for r in range(world_size)
           for b in loader_of(store, ref, r, world_size, 0, state=state)]
    pad_keys = [k for b in got for k, p in zip(b["__key__"], b["__pad__"].tolist(),
                                                 strict=True) if p]
    assert pad_keys == [stream[p] for p in pads]
    assert sum(len(b["__key__"]) for b in got) == 22 + len(pads)
    after = keys_of(got)
    assert len(before) == 21 and sorted(before + after) == sorted(stream)
