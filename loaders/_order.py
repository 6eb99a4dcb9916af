"""The order of an epoch's stream: shuffle and mixture. Pure.

**One dataset.** A snapshot lists its manifest parts and their row counts, so the order is
built in two levels, and a reader needs only the parts its stretch of the stream covers:

1. *Parts.* The parts are permuted with a generator seeded by ``(seed, epoch, snapshot
   id)`` and cut into *groups* of ``group_parts`` consecutive parts; the stream lays the
   groups end to end, so the start of every group is known from the snapshot alone.
2. *Shards within a group.* The group's rows are sorted into *pieces* by shard. The pieces
   are permuted and cut into *windows* of ``window_shards`` consecutive pieces. A stretch
   of the stream thus touches a window of shards at a time (locality: a shard is read by
   about one reader).
3. *Blocks within a window.* Each shard's rows, in shard order, are cut into *blocks* of
   about ``block_bytes`` (the writers' row-group size: the unit a columnar reader decodes).
   The window's blocks are permuted and cut into *buffers* of ``buffer_blocks`` blocks
   that hold more than one row (a block of one row costs nothing to interleave: it is
   decoded when read), and the rows of each buffer are shuffled uniformly. A reader thus
   needs at most one buffer's blocks decoded at a time, whatever the shard size, and the
   first batch of an epoch waits for one buffer, not a whole window; neighbours in the
   stream come from different shards with probability about ``1 - 1/window_shards`` when
   a buffer's blocks span the window. A window of few blocks is one buffer: its rows are
   shuffled uniformly.

Without shuffling the stream is the manifest: parts in key order, rows in key order.

**Several datasets.** A mixture is an endless stream cut into blocks of ``block`` positions.
Source ``i`` owns ``Q_i(P)`` of the first ``P`` positions, ``Q_i(P) = floor(P a_i / A)`` for
integer weights ``a_i`` (``A`` their sum; the heaviest source takes the rest). That is exact
at every block boundary, so each block holds each source's share, and within a block the
sources are evenly interleaved (slot ``j`` of source ``i`` at ``(j + phase_i) / count_i``,
with phases drawn from ``(seed, block)``), so any stretch of the stream holds each source's
share to within a slot or two. The ``q``-th slot of source ``i`` reads
position ``q mod N_i`` of that source's epoch ``q div N_i``. One dataset is the mixture of
one source with ``L = N``: position ``p`` of epoch ``E`` is its own epoch ``E``, position ``p``.

Random choices use PCG64 seeded through ``SeedSequence`` and draw only raw 64-bit words,
whose values NumPy keeps stable across versions, so a (snapshot, seed) gives the same
order on every machine.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.ma  # noqa: F401  (np.unique imports it on first use: 10 ms of the first batch)
import numpy.random  # noqa: F401

from simstore.errors import InvalidInputError

__all__ = [
    "Mixture",
    "SourceLayout",
    "group_order",
    "permutation",
    "random_words",
    "source_layout",
]

_WEIGHT_SCALE = 1 << 20
BLOCK_BYTES = 4 << 20
"""Rows of a shard decoded together: the writers' default row-group size."""
BUFFER_BLOCKS = 16
"""Multi-row blocks shuffled together: 64 MiB of decoded rows with the default blocks."""


def _entropy(seed: int, *words: int | str) -> list[int]:
    out = [int(seed)]
    for w in words:
        out.append(int(w, 16) if isinstance(w, str) else int(w))
    if any(x < 0 for x in out):
        raise InvalidInputError(f"seeds and epochs must be non-negative, got {out[:2]}")
    return out


def random_words(n: int, seed: int, *words: int | str) -> np.ndarray:
    """``n`` raw 64-bit random words from ``(seed, *words)`` (hex strings count as ints)."""
    ss = np.random.SeedSequence(_entropy(seed, *words))
    return np.random.PCG64(ss).random_raw(n).astype(np.uint64)


def permutation(n: int, seed: int, *words: int | str) -> np.ndarray:
    """A permutation of ``range(n)`` determined by ``(seed, *words)``."""
    return np.argsort(random_words(n, seed, *words), kind="stable").astype(np.int64)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class SourceLayout:
    """Parts of one source in stream order, cut into groups.

    ``group_starts[g]`` is the first stream position of group ``g`` (one extra entry holds
    the total), and group ``g`` holds parts ``part_order[group_parts*g : group_parts*(g+1)]``.
    """

    part_order: np.ndarray
    group_parts: int
    group_starts: np.ndarray

    @property
    def num_groups(self) -> int:
        """How many groups."""
        return len(self.group_starts) - 1

    def parts_of(self, group: int) -> np.ndarray:
        """Indices (into the snapshot's parts) of a group's parts, in stream order."""
        return self.part_order[self.group_parts * group : self.group_parts * (group + 1)]

    def group_of(self, positions: np.ndarray) -> np.ndarray:
        """The group holding each stream position."""
        return np.searchsorted(self.group_starts, positions, side="right") - 1


def source_layout(
    part_rows: Sequence[int] | np.ndarray,
    *,
    snapshot_id: str,
    seed: int,
    epoch: int,
    shuffle: bool,
    group_parts: int,
) -> SourceLayout:
    """The part order and groups of one epoch of one source."""
    if group_parts < 1:
        raise InvalidInputError(f"group_parts must be at least 1, got {group_parts}")
    rows = np.asarray(part_rows, dtype=np.int64)
    n = len(rows)
    order = (
        permutation(n, seed, epoch, snapshot_id, 1) if shuffle else np.arange(n, dtype=np.int64)
    )
    per_group = np.add.reduceat(rows[order], np.arange(0, n, group_parts)) if n else rows[:0]
    starts = np.concatenate([[0], np.cumsum(per_group)]).astype(np.int64)
    return SourceLayout(part_order=order, group_parts=group_parts, group_starts=starts)


def group_order(
    shard_codes: np.ndarray,
    *,
    window_shards: int,
    seed: int,
    epoch: int,
    snapshot_id: str,
    group: int,
    positions: np.ndarray | None = None,
    sizes: np.ndarray | None = None,
    block_bytes: int = BLOCK_BYTES,
    buffer_blocks: int = BUFFER_BLOCKS,
) -> np.ndarray:
    """The stream order of a group's rows: a permutation of ``range(len(shard_codes))``.

    ``shard_codes[i]`` numbers the shard of row ``i``, ``positions[i]`` is its row in that
    shard and ``sizes[i]`` its bytes (without them every row is its own block). Pieces
    (rows of one shard) are permuted and cut into windows of ``window_shards`` pieces;
    each window's blocks are permuted and cut into buffers of ``buffer_blocks`` blocks of
    more than one row, and each buffer's rows are shuffled uniformly (see the module doc).
    """
    if window_shards < 1:
        raise InvalidInputError(f"window_shards must be at least 1, got {window_shards}")
    if block_bytes < 1 or buffer_blocks < 1:
        raise InvalidInputError(
            f"block_bytes and buffer_blocks must be at least 1, got {block_bytes} and "
            f"{buffer_blocks}"
        )
    n = len(shard_codes)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    codes, m = _dense(np.asarray(shard_codes, dtype=np.int64))
    piece_rank = np.empty(m, dtype=np.int64)
    piece_rank[permutation(m, seed, epoch, snapshot_id, 2, group)] = np.arange(m)
    window = piece_rank[codes] // window_shards
    blocks, block_of = _blocks(codes, positions, sizes, block_bytes)
    # each block's window, and a random rank of the block within it
    nblocks = len(blocks)
    block_window = np.empty(nblocks, dtype=np.int64)
    block_window[block_of] = window
    rows_in = np.bincount(block_of, minlength=nblocks)
    draw = random_words(nblocks, seed, epoch, snapshot_id, 5, group)
    by_window = _sort_by(block_window, draw)
    # buffers: consecutive blocks (in that order) of one window, counting multi-row blocks
    counted = (rows_in[by_window] > 1).astype(np.int64)
    win = block_window[by_window]
    starts = np.flatnonzero(np.r_[True, win[1:] != win[:-1]])
    before = np.cumsum(counted) - counted
    before -= np.repeat(before[starts], np.diff(np.r_[starts, nblocks]))
    buffer = np.empty(nblocks, dtype=np.int64)
    buffer[by_window] = before // buffer_blocks
    ties = random_words(n, seed, epoch, snapshot_id, 3, group)
    # (window, buffer) as one key: window * (buffers + 1) + buffer, below n * n
    return _sort_by(window * (int(buffer.max()) + 1) + buffer[block_of], ties)


def _dense(codes: np.ndarray) -> tuple[np.ndarray, int]:
    """``(each code's rank among the distinct codes, how many there are)``.

    ``np.unique(codes, return_inverse=True)``'s inverse; codes that are already
    ``0..m-1``, every one used (a group's, as ``load_group`` numbers them), are their own
    ranks, found without a sort (a fresh process's first ``np.unique`` of 12,288 codes:
    0.3 ms).
    """
    if int(codes.min()) == 0:
        counts = np.bincount(codes)
        if bool(counts.all()):
            return codes, len(counts)
    uniq, ranks = np.unique(codes, return_inverse=True)
    return ranks.reshape(-1), len(uniq)


def _sort_by(key: np.ndarray, words: np.ndarray) -> np.ndarray:
    """``np.lexsort((words, key))``: by ``key`` (non-negative ints), then ``words``, then index.

    The same permutation, found faster for a group of many rows: an unstable sort of the
    random ``words`` (any order of distinct words is the stable one), then a stable sort
    of the keys in that order, which NumPy does by radix when they fit in 16 bits (a
    group of 131,072 rows: 10 ms against 26). Equal words, which a 64-bit draw makes
    vanishingly rare, take the lexsort itself.
    """
    key = np.asarray(key, dtype=np.int64)
    if len(key) < 2:
        return np.arange(len(key), dtype=np.int64)
    by_word = np.argsort(words)
    drawn = words[by_word]
    if bool((drawn[1:] == drawn[:-1]).any()):
        return np.lexsort((words, key)).astype(np.int64)
    ranked = key[by_word]
    if int(ranked.max()) < 1 << 16:
        ranked = ranked.astype(np.uint16)
    return np.asarray(by_word[np.argsort(ranked, kind="stable")], dtype=np.int64)


def _blocks(
    codes: np.ndarray, positions: np.ndarray | None, sizes: np.ndarray | None, block_bytes: int
) -> tuple[np.ndarray, np.ndarray]:
    """(block ids, block of each row): runs of a shard's rows of about ``block_bytes``."""
    n = len(codes)
    if positions is None or sizes is None:
        return np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64)
    pos = np.asarray(positions, dtype=np.int64)
    size = np.maximum(np.asarray(sizes, dtype=np.int64), 0)
    later = codes[1:] > codes[:-1]
    if bool((later | ((codes[1:] == codes[:-1]) & (pos[1:] > pos[:-1]))).all()):
        # in (shard, position) order already, as a part of whole shards is: the sort's
        # permutation is the identity (no two rows share a shard and position)
        by_shard, sc, sorted_size = None, codes, size
    else:
        by_shard = np.lexsort((pos, codes))
        sc, sorted_size = codes[by_shard], size[by_shard]
    cum = np.cumsum(sorted_size) - sorted_size
    first = np.flatnonzero(np.r_[True, sc[1:] != sc[:-1]])
    cum -= np.repeat(cum[first], np.diff(np.r_[first, n]))
    local = cum // block_bytes
    # number the (shard, local block) pairs in shard order
    new = np.r_[True, (sc[1:] != sc[:-1]) | (local[1:] != local[:-1])]
    ids_sorted = np.cumsum(new) - 1
    if by_shard is None:
        block_of = ids_sorted
    else:
        block_of = np.empty(n, dtype=np.int64)
        block_of[by_shard] = ids_sorted
    return np.arange(int(ids_sorted[-1]) + 1, dtype=np.int64), block_of


def _integer_weights(weights: Sequence[float]) -> tuple[int, ...]:
    if not weights:
        raise InvalidInputError("a mixture needs at least one weight")
    values = [float(w) for w in weights]
    if any(not np.isfinite(w) or w <= 0 for w in values):
        raise InvalidInputError(f"mixture weights must be positive and finite, got {values}")
    total = sum(values)
    if not np.isfinite(total):
        # finite weights whose sum overflows (near float's largest): relative to the largest
        # first, or every share would be w / inf = 0 and every source weigh the same; only
        # then, so weights whose sum is finite keep the integer weights they always had
        top = max(values)
        values = [w / top for w in values]
        total = sum(values)
    return tuple(max(1, round(w / total * _WEIGHT_SCALE)) for w in values)


@dataclass(frozen=True, slots=True, kw_only=True)
class Mixture:
    """How an endless stream is shared between sources by weight (see the module doc)."""

    weights: tuple[int, ...]
    seed: int
    shuffle: bool
    block: int

    @classmethod
    def of(cls, weights: Sequence[float], *, seed: int, shuffle: bool) -> Mixture:
        """A mixture of sources with these (positive) weights."""
        ints = _integer_weights(weights)
        m = len(ints)
        # A block must hold at least one slot for the heaviest source whatever the
        # others' rounding; m * m positions guarantee it (see ``_quota``).
        return cls(weights=ints, seed=seed, shuffle=shuffle, block=max(1024, m * m))

    def quota(self, position: int) -> list[int]:
        """How many of the first ``position`` slots (a multiple of ``block``) each source owns."""
        a, total = self.weights, sum(self.weights)
        heavy = int(np.argmax(a))
        q = [position * w // total for w in a]
        q[heavy] = position - sum(x for i, x in enumerate(q) if i != heavy)
        return q

    def block_slots(self, block: int) -> np.ndarray:
        """The source of each slot of block ``block``, in order."""
        lo, hi = self.quota(block * self.block), self.quota((block + 1) * self.block)
        counts = np.asarray([h - low for low, h in zip(lo, hi, strict=True)], dtype=np.int64)
        slots = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        if len(counts) == 1:
            return slots
        # Evenly interleaved, so every stretch of the stream holds each source's share to
        # within a slot: slot j of source i sits at (j + phase_i) / count_i; with shuffling
        # the phases are drawn per block, else they are all one half.
        if self.shuffle:
            words = random_words(len(counts), self.seed, 4, block)
            phase = (words >> np.uint64(11)).astype(np.float64) / float(1 << 53)
        else:
            phase = np.full(len(counts), 0.5)
        within = np.concatenate([np.arange(c) for c in counts])
        keys = (within + phase[slots]) / np.maximum(counts, 1)[slots]
        return np.asarray(slots[np.lexsort((slots, keys))], dtype=np.int64)

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(source, q)`` of each endless-stream position.

        ``source`` is the slot's source and ``q`` the slot's index among that source's slots.
        """
        pos = np.asarray(positions, dtype=np.int64)
        src = np.zeros(len(pos), dtype=np.int64)
        q = np.zeros(len(pos), dtype=np.int64)
        if len(self.weights) == 1:
            return src, pos.copy()
        blocks = pos // self.block
        for b in np.unique(blocks):
            sel = blocks == b
            slots, rank = _block_layout(self, int(b))
            off = pos[sel] - int(b) * self.block
            src[sel] = slots[off]
            q[sel] = rank[off]
        return src, q


@functools.lru_cache(maxsize=2)
def _block_layout(mixture: Mixture, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Block ``block``'s slots: each one's source, and its index among that source's slots.

    Kept for the next chunks of the same block: a block holds ``m * m`` positions for
    ``m`` sources, and laying one out for every chunk of 64 samples cost 0.02 s at 300
    sources and 0.66 s at 1,000. The index is counted in one stable sort, not a pass
    over the block per source. Two blocks are kept (a chunk may straddle two), 16 bytes
    per slot each: 32 MB at 1,000 sources, nothing to speak of at tens. Read-only:
    callers index these arrays.
    """
    slots = mixture.block_slots(block)
    base = np.asarray(mixture.quota(block * mixture.block), dtype=np.int64)
    order = np.argsort(slots, kind="stable")
    counts = np.bincount(slots, minlength=len(mixture.weights))
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.empty(len(slots), dtype=np.int64)
    rank[order] = np.arange(len(slots), dtype=np.int64) - starts[slots[order]]
    rank += base[slots]
    slots.flags.writeable = False
    rank.flags.writeable = False
    return slots, rank
