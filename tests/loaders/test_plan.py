"""Property tests of the pure epoch plan, stream order and mixture composition."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from simstore.loaders._order import Mixture, _sort_by, group_order, permutation, source_layout
from simstore.loaders._plan import (
    advance,
    intervals_total,
    normalise_intervals,
    plan_epoch,
    samples_per_rank,
    subtract_intervals,
    take_intervals,
)
from simstore.loaders._source import GroupKeys
from simstore.loaders._world import World

from simstore.errors import InvalidInputError

intervals = st.lists(
    st.tuples(st.integers(0, 300), st.integers(0, 40)).map(lambda t: (t[0], t[0] + t[1])),
    max_size=6,
).map(normalise_intervals)


def positions_of(iv):
    return [p for a, b in iv for p in range(a, b)]


def read_all(remaining, world_size, workers, batch, remainder):
    """{(rank, worker): [(position, is_pad), ...]} for every reader of a job."""
    out = {}
    for r in range(world_size):
        for k in range(workers):
            plan = plan_epoch(
                remaining,
                World(rank=r, world_size=world_size, worker=k, num_workers=workers),
                batch_size=batch,
                remainder=remainder,
            )
            got = []
            for pos, pad in plan.chunks(max_samples=7):
                got.extend(zip(pos.tolist(), pad.tolist(), strict=True))
            assert len(got) == plan.worker_samples
            out[r, k] = got
    return out


@settings(max_examples=100, deadline=None)
@given(
    remaining=intervals,
    workers=st.integers(1, 3),
    batch=st.integers(1, 6),
    max_samples=st.integers(1, 20),
    first=st.integers(1, 12),
)
def test_a_smaller_first_chunk_cuts_the_same_stream(remaining, workers, batch, max_samples,
                                                   first):
    for k in range(workers):
        plan = plan_epoch(remaining, World(rank=0, world_size=1, worker=k, num_workers=workers),
                          batch_size=batch, remainder="pad")
        plain = list(plan.chunks(max_samples))
        cut = list(plan.chunks(max_samples, first_samples=first))
        assert np.concatenate([p for p, _ in cut] or [np.zeros(0)]).tolist() == np.concatenate(
            [p for p, _ in plain] or [np.zeros(0)]).tolist()
        assert [x for _, pad in cut for x in pad.tolist()] == [
            x for _, pad in plain for x in pad.tolist()]
        if cut:  # whole batches, at least one, and no more than max_samples per chunk
            want = min(max(1, first // batch) * batch, max_samples, plan.worker_samples)
            assert len(cut[0][0]) == want


@settings(max_examples=150, deadline=None)
@given(
    remaining=intervals,
    world_size=st.integers(1, 5),
    workers=st.integers(1, 4),
    batch=st.integers(1, 6),
    remainder=st.sampled_from(["pad", "drop"]),
)
def test_plan_covers_every_remaining_sample_exactly_once(
    remaining, world_size, workers, batch, remainder
):
    reads = read_all(remaining, world_size, workers, batch, remainder)
    real = [p for got in reads.values() for p, pad in got if not pad]
    total = intervals_total(remaining)
    assert len(real) == len(set(real))
    assert set(real) <= set(positions_of(remaining))
    if remainder == "pad":
        assert sorted(real) == positions_of(remaining)
    else:
        assert len(real) == total - total % world_size
    per_rank = Counter()
    for (r, _k), got in reads.items():
        per_rank[r] += len(got)
    assert len(set(per_rank.values())) <= 1  # equal counts on every rank
    pads = [p for got in reads.values() for p, pad in got if pad]
    assert set(pads) <= set(positions_of(remaining))


@settings(max_examples=60, deadline=None)
@given(remaining=intervals, world_size=st.integers(1, 4), workers=st.integers(1, 3))
def test_equal_arguments_give_equal_plans(remaining, world_size, workers):
    a = read_all(remaining, world_size, workers, 3, "pad")
    b = read_all(remaining, world_size, workers, 3, "pad")
    assert a == b


@settings(max_examples=150, deadline=None)
@given(
    remaining=intervals,
    world_size=st.integers(1, 4),
    workers=st.integers(1, 3),
    batch=st.integers(1, 5),
    remainder=st.sampled_from(["pad", "drop"]),
    steps=st.integers(0, 30),
    new_world=st.integers(1, 4),
    new_workers=st.integers(1, 3),
    new_batch=st.integers(1, 5),
)
def test_advance_then_replan_reads_exactly_the_rest(
    remaining, world_size, workers, batch, remainder, steps, new_world, new_workers, new_batch
):
    """A checkpoint after some round-robin batches, resumed elastically, misses nothing."""
    reads = read_all(remaining, world_size, workers, batch, remainder)
    # a DataLoader hands out batches round-robin over workers that still have data
    counts = [0] * workers
    per_worker_batches = [
        [got[i : i + batch] for i in range(0, len(got), batch)] for got in
        (reads[0, k] for k in range(workers))
    ]
    delivered = set()
    served = 0
    cursor = [0] * workers
    k = 0
    while served < steps and any(cursor[j] < len(per_worker_batches[j]) for j in range(workers)):
        if cursor[k] < len(per_worker_batches[k]):
            for r in range(world_size):
                b = [reads[r, k][i] for i in range(cursor[k] * batch, min((cursor[k] + 1) * batch, len(reads[r, k])))]
                delivered.update(p for p, pad in b if not pad)
            counts[k] += len(per_worker_batches[k][cursor[k]])
            cursor[k] += 1
            served += 1
        k = (k + 1) % workers
    rest = advance(
        remaining, world_size=world_size, num_workers=workers, batch_size=batch,
        remainder=remainder, consumed=counts,
    )
    assert set(positions_of(rest)) == set(positions_of(remaining)) - delivered
    again = read_all(rest, new_world, new_workers, new_batch, "pad")
    real = [p for got in again.values() for p, pad in got if not pad]
    assert sorted(real) == positions_of(rest)


@pytest.mark.parametrize("remainder", ["pad", "drop"])
def test_advance_in_a_world_of_2_31_ranks_visits_only_ranks_with_positions(remainder):
    # found by an audit: advance looped over every rank, so a state_dict() in a world of
    # 2^31 ranks (which the loader accepts) took about ten minutes; only the first 37
    # ranks hold a position of 37 samples with padding, none without
    from simstore.loaders._plan import ranks_with_positions

    n = samples_per_rank(37, 2**31, remainder)
    assert ranks_with_positions(37, n, 2**31) == (37 if remainder == "pad" else 0)
    assert ranks_with_positions(37, 10, 4) == 4 and ranks_with_positions(37, 10, 9) == 4
    rest = advance([(0, 37)], world_size=2**31, num_workers=1, batch_size=1,
                   remainder=remainder, consumed=[1 if remainder == "pad" else 0])
    assert rest == (() if remainder == "pad" else ((0, 37),))


def test_advance_refuses_counts_beyond_a_share():
    with pytest.raises(InvalidInputError, match="share"):
        advance([(0, 10)], world_size=2, num_workers=1, batch_size=1, remainder="pad", consumed=[6])


@given(a=intervals, b=intervals)
def test_interval_algebra(a, b):
    assert positions_of(subtract_intervals(a, b)) == sorted(set(positions_of(a)) - set(positions_of(b)))
    n = intervals_total(a)
    assert positions_of(take_intervals(a, 0, n)) == positions_of(a)
    assert positions_of(take_intervals(a, 1, max(1, n - 1))) == positions_of(a)[1 : max(1, n - 1)]


@settings(deadline=None)
@given(
    rows=st.lists(st.integers(1, 50), min_size=1, max_size=12),
    group_parts=st.integers(1, 4),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 5),
)
def test_source_layout_is_a_deterministic_cover(rows, group_parts, seed, epoch):
    kw = dict(snapshot_id="ab" * 16, seed=seed, epoch=epoch, shuffle=True, group_parts=group_parts)
    lay = source_layout(rows, **kw)
    again = source_layout(rows, **kw)
    assert np.array_equal(lay.part_order, again.part_order)
    assert sorted(lay.part_order.tolist()) == list(range(len(rows)))
    assert lay.group_starts[-1] == sum(rows)
    for g in range(lay.num_groups):
        parts = lay.parts_of(g)
        assert lay.group_starts[g + 1] - lay.group_starts[g] == sum(rows[p] for p in parts)


@settings(deadline=None)
@given(codes=st.lists(st.integers(0, 9), max_size=200), window=st.integers(1, 5), seed=st.integers(0, 99))
def test_group_order_shuffles_within_windows_of_shards(codes, window, seed):
    codes = np.asarray(codes, dtype=np.int64)
    kw = dict(window_shards=window, seed=seed, epoch=1, snapshot_id="cd" * 16, group=3)
    order = group_order(codes, **kw)
    assert sorted(order.tolist()) == list(range(len(codes)))
    assert np.array_equal(order, group_order(codes, **kw))
    # each window's rows are contiguous in the stream: at most `window` shards per stretch
    seen_windows = []
    shards = codes[order]
    window_of = {}
    for s in shards.tolist():
        if s not in window_of:
            if not seen_windows or len(seen_windows[-1]) == window:
                seen_windows.append(set())
            seen_windows[-1].add(s)
            window_of[s] = len(seen_windows) - 1
    assert [window_of[s] for s in shards.tolist()] == sorted(window_of[s] for s in shards.tolist())


@settings(deadline=None)
@given(
    shards=st.lists(st.integers(1, 60), min_size=1, max_size=8),
    window=st.integers(1, 4),
    buffer_blocks=st.integers(1, 4),
    block_rows=st.integers(1, 7),
    seed=st.integers(0, 99),
)
def test_group_order_keeps_blocks_in_buffers(shards, window, buffer_blocks, block_rows, seed):
    # rows of equal size, so a block is `block_rows` consecutive rows of a shard
    codes = np.concatenate([np.full(n, i) for i, n in enumerate(shards)]).astype(np.int64)
    positions = np.concatenate([np.arange(n) for n in shards]).astype(np.int64)
    sizes = np.full(len(codes), 10, dtype=np.int64)
    kw = dict(window_shards=window, seed=seed, epoch=0, snapshot_id="cd" * 16, group=0,
              positions=positions, sizes=sizes, block_bytes=10 * block_rows,
              buffer_blocks=buffer_blocks)
    order = group_order(codes, **kw)
    assert sorted(order.tolist()) == list(range(len(codes)))
    assert np.array_equal(order, group_order(codes, **kw))
    block = [(int(c), int(p) // block_rows) for c, p in zip(codes[order], positions[order], strict=True)]
    sizes_of = {b: sum(1 for x in block if x == b) for b in set(block)}
    # a block, once started, is finished before more than `buffer_blocks` multi-row
    # blocks are open at once: the reader's decoded working set is bounded
    open_blocks: set = set()
    left = dict(sizes_of)
    for b in block:
        open_blocks.add(b)
        left[b] -= 1
        if left[b] == 0:
            open_blocks.discard(b)
        assert sum(1 for x in open_blocks if sizes_of[x] > 1) <= buffer_blocks


def test_block_order_bounds_row_group_decodes_of_a_large_window():
    # 8 shards of 64 blocks: the old order (a uniform shuffle of the window) interleaves
    # all 512 blocks; the block order has at most 16 open at a time
    codes = np.repeat(np.arange(8), 64 * 50)
    positions = np.tile(np.arange(64 * 50), 8)
    sizes = np.full(len(codes), 1000)
    order = group_order(codes, window_shards=8, seed=1, epoch=0, snapshot_id="ab" * 16,
                        group=0, positions=positions, sizes=sizes, block_bytes=50_000,
                        buffer_blocks=16)
    blocks = codes[order] * 64 + positions[order] // 50
    first = blocks[:256]
    assert len(np.unique(first)) <= 16
    # and neighbours still come from different shards most of the time
    same_shard = np.mean(codes[order][1:] == codes[order][:-1])
    assert same_shard < 0.3


@settings(deadline=None)
@given(
    keys=st.lists(st.integers(0, 2**20), max_size=300),
    spread=st.sampled_from([1, 3, 2**64 - 1]),
    key_range=st.sampled_from([1, 5, 2**16, 2**20]),
    seed=st.integers(0, 2**32),
)
def test_sort_by_is_lexsort(keys, spread, key_range, seed):
    # a narrow spread of words forces equal words (the lexsort fallback); keys of 16 bits
    # and more take both stable sorts
    key = np.asarray(keys, dtype=np.int64) % key_range
    words = np.random.default_rng(seed).integers(0, spread, len(key), dtype=np.uint64,
                                                 endpoint=True)
    got = _sort_by(key, words)
    assert got.dtype == np.int64
    assert np.array_equal(got, np.lexsort((words, key)))


def test_group_order_is_the_same_as_in_earlier_versions():
    # a checkpoint taken with one version resumes with another: the order of a (snapshot,
    # seed, epoch) must not change. Digests of orders made by the version that wrote them.
    import hashlib

    rng = np.random.default_rng(5)

    def digest(n: int, shards: int, rows_per_block: int) -> str:
        codes = rng.integers(0, shards, n).astype(np.int64)
        positions = np.zeros(n, np.int64)
        for c in range(shards):
            sel = codes == c
            positions[sel] = np.arange(sel.sum())
        order = group_order(codes, window_shards=8, seed=3, epoch=2, snapshot_id="ab" * 16,
                            group=1, positions=positions, sizes=np.full(n, 1000),
                            block_bytes=1000 * rows_per_block, buffer_blocks=16)
        return hashlib.sha256(order.astype("<i8").tobytes()).hexdigest()[:16]

    assert [digest(5000, 20, 50), digest(3000, 40, 1), digest(70000, 3, 2)] == [
        "38c1db6f4be3d002", "3ea7cc614bb89b33", "085e80b73f747b6b"]


def test_different_epochs_give_different_orders():
    assert not np.array_equal(permutation(100, 0, 1, "ab" * 16), permutation(100, 0, 2, "ab" * 16))


@settings(deadline=None)
@given(
    weights=st.lists(st.floats(0.05, 10), min_size=1, max_size=4),
    start=st.integers(0, 5000),
    length=st.integers(1, 3000),
    shuffle=st.booleans(),
)
def test_mixture_slots_are_exact_and_contiguous_per_source(weights, start, length, shuffle):
    mix = Mixture.of(weights, seed=7, shuffle=shuffle)
    pos = np.arange(start, start + length)
    src, q = mix.locate(pos)
    for i in range(len(weights)):
        qi = q[src == i]
        # a stretch of the mixture reads a contiguous stretch of each source, in order
        assert np.array_equal(qi, np.arange(qi[0], qi[0] + len(qi))) if len(qi) else True
    # over whole blocks the share is the weight's, to within one slot per block
    blocks = 4
    src, _ = mix.locate(np.arange(blocks * mix.block))
    share = np.bincount(src, minlength=len(weights)) / (blocks * mix.block)
    expect = np.asarray(weights) / sum(weights)
    assert np.all(np.abs(share - expect) <= len(weights) / mix.block + 1e-6)


@settings(deadline=None, max_examples=40)
@given(
    weights=st.lists(st.floats(0.05, 10), min_size=2, max_size=40),
    block=st.integers(0, 3),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_mixture_positions_are_each_sources_slots_counted_in_order(weights, block, shuffle,
                                                                   seed):
    """``q`` of a position is how many slots of its source come before it, from the
    quota of the blocks before: the definition, counted here slot by slot."""
    mix = Mixture.of(weights, seed=seed, shuffle=shuffle)
    slots = mix.block_slots(block)
    seen = list(mix.quota(block * mix.block))
    expected = []
    for s in slots.tolist():
        expected.append(seen[s])
        seen[s] += 1
    pos = np.arange(block * mix.block, (block + 1) * mix.block)
    rng = np.random.default_rng(seed)
    for chunk in (pos, rng.permutation(pos)[:64], pos[-5:]):  # whole, a shuffled chunk, a tail
        src, q = mix.locate(chunk)
        off = chunk - block * mix.block
        assert np.array_equal(src, slots[off]) and np.array_equal(q, np.asarray(expected)[off])


def test_mixture_rejects_bad_weights():
    with pytest.raises(InvalidInputError):
        Mixture.of([1.0, 0.0], seed=0, shuffle=True)


def test_mixture_weights_whose_sum_overflows_keep_their_proportions():
    # each weight finite, their sum not: the shares are still the weights'
    huge = Mixture.of([1e308, 1e308, 1.0], seed=0, shuffle=True)
    assert huge.weights == (1 << 19, 1 << 19, 1)
    assert Mixture.of([1.5e308, 0.5e308], seed=0, shuffle=True).weights == (786432, 262144)
    # and weights whose sum is finite keep the integer weights they had
    assert Mixture.of([1.0, 3.0], seed=0, shuffle=True).weights == (262144, 786432)


def test_group_keys_give_the_keys_of_stream_rows_before_and_after_converting_all():
    keys = [f"run{i:03d}/t{i % 7}/\u00e9\u6d41{'x' * (i % 5)}" for i in range(500)]
    encoded = [k.encode() for k in keys]
    offsets = np.concatenate([[0], np.cumsum([len(k) for k in encoded])]).astype(np.int64)
    order = np.random.default_rng(1).permutation(500).astype(np.int64)
    expected = np.asarray(keys, dtype=object)[order]
    group = GroupKeys(offsets, b"".join(encoded), order)
    assert len(group) == 500
    for idx in (np.arange(3, 40), np.arange(0, 500, 7), np.asarray([499, 0, 250]),
                np.arange(500)):
        assert group.take(idx) == expected[idx].tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-3, 12), min_size=1, max_size=60))
def test_dense_codes_rank_as_np_unique_does(values):
    from simstore.loaders._order import _dense

    codes = np.asarray(values, dtype=np.int64)
    uniq, inverse = np.unique(codes, return_inverse=True)
    ranks, m = _dense(codes)
    assert m == len(uniq)
    assert np.array_equal(ranks, inverse.reshape(-1))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 30), st.integers(0, 900)),
                min_size=1, max_size=50, unique_by=lambda r: r[:2]),
       st.integers(1, 2000), st.randoms(use_true_random=False))
def test_blocks_of_rows_in_shard_order_equal_those_of_the_same_rows_shuffled(
        rows, block_bytes, rnd):
    from simstore.loaders._order import _blocks

    rows = sorted(rows)  # (shard, position) order: the sort is skipped
    codes, pos, sizes = (np.asarray(c, dtype=np.int64) for c in zip(*rows, strict=True))
    ids, block_of = _blocks(codes, pos, sizes, block_bytes)
    shuffled = list(range(len(rows)))
    rnd.shuffle(shuffled)
    p = np.asarray(shuffled)
    ids_s, block_of_s = _blocks(codes[p], pos[p], sizes[p], block_bytes)
    assert np.array_equal(ids, ids_s)
    assert np.array_equal(block_of[p], block_of_s)
