"""The epoch plan: which stream positions each rank and worker reads, in which order. Pure.

An epoch is a *stream*: positions ``0 .. L-1``, each naming one sample (see
:mod:`simstore.loaders._order` for how positions map to samples). The stream does not
depend on the world size. A plan splits what remains of it between readers:

1. The remaining positions (all of them, or what a checkpoint left) are laid end to end,
   ``R`` of them. With ``remainder="pad"`` the sequence is extended to a multiple of the
   world size by repeating the epoch's first positions ``0, 1, ...`` (marked as padding),
   whatever a checkpoint left, so a resume in the same world pads exactly as the
   uninterrupted epoch; with ``"drop"`` it is cut to one. Each rank then reads the same
   number of samples, so DDP never waits on a rank with a shorter last batch.
2. Rank ``r`` takes the ``r``-th contiguous block, so each shard is read by about one rank.
3. The block is cut into batches of ``batch_size``; worker ``k`` of ``K`` takes batches
   ``k, k+K, k+2K, ...``. A DataLoader hands batches out round-robin, so a rank sees its
   block in order whatever its worker count.

Resuming needs only each worker's count of samples delivered: the same on every rank of a
synchronous job, which is why one rank's state describes the whole job. :func:`advance`
turns those counts into the positions still to read, and the next plan, for any world size
and worker count, splits exactly those: the elastic resume.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from simstore.loaders._world import World

from simstore.errors import InvalidInputError

__all__ = [
    "EpochPlan",
    "Interval",
    "Remainder",
    "advance",
    "intervals_total",
    "normalise_intervals",
    "plan_epoch",
    "subtract_intervals",
    "take_intervals",
]

Interval = tuple[int, int]
Remainder = Literal["pad", "drop"]


def normalise_intervals(intervals: Iterable[Sequence[int]]) -> tuple[Interval, ...]:
    """Sorted, merged, non-empty half-open intervals; raises on a negative bound."""
    items = sorted((int(a), int(b)) for a, b in intervals if int(b) > int(a))
    out: list[Interval] = []
    for a, b in items:
        if a < 0:
            raise InvalidInputError(f"invalid interval [{a}, {b}): negative position")
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return tuple(out)


def intervals_total(intervals: Sequence[Interval]) -> int:
    """How many positions the (normalised) intervals hold."""
    return sum(b - a for a, b in intervals)


def subtract_intervals(
    a: Sequence[Interval], b: Sequence[Interval]
) -> tuple[Interval, ...]:
    """Positions of ``a`` not in ``b`` (both normalised)."""
    out: list[Interval] = []
    j = 0
    for start, stop in a:
        cur = start
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < stop:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < stop:
            out.append((cur, stop))
    return tuple(out)


def take_intervals(intervals: Sequence[Interval], start: int, stop: int) -> tuple[Interval, ...]:
    """The real positions at places ``start .. stop-1`` of the intervals laid end to end."""
    out: list[Interval] = []
    offset = 0
    for a, b in intervals:
        n = b - a
        lo, hi = max(start - offset, 0), min(stop - offset, n)
        if lo < hi:
            out.append((a + lo, a + hi))
        offset += n
        if offset >= stop:
            break
    return tuple(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class EpochPlan:
    """What one worker of one rank reads this epoch; iterate :meth:`chunks`.

    ``samples_per_rank`` is equal for every rank; ``worker_samples`` is this worker's
    share. Positions at or past ``remaining_samples`` in the rank's block are padding
    and come out marked: they repeat the epoch's first positions (see
    :attr:`pad_offset` and :func:`plan_epoch`), or with ``epoch_length=0`` the ``i``-th
    pad repeats the ``i``-th remaining position.
    """

    remaining: tuple[Interval, ...]
    world: World
    batch_size: int
    remainder: Remainder
    remaining_samples: int
    samples_per_rank: int
    epoch_length: int = 0
    drop_last: bool = False
    """Whole batches only: a rank block's short last batch is never read (a loader with
    ``drop_last`` would read it only to drop it)."""

    @property
    def pad_offset(self) -> int:
        """Where this rank's pads start in the epoch's positions (with ``epoch_length``).

        A pad at slot ``v >= remaining_samples`` of the laid-out sequence repeats stream
        position ``(v - remaining_samples + pad_offset) mod epoch_length``. A whole epoch
        of ``N`` per rank pads its last ``P`` slots with positions ``0 .. P-1``. A plan
        of ``n`` per rank lines each rank's block up with the end of the rank's block of
        a whole epoch in this world (slot ``v`` is the whole epoch's slot ``v + (rank +
        1) * (N - n)``): where every pad slot lines up with a whole epoch's pad, it
        repeats that pad, so a resume in the same world (which has read the first
        ``N - n`` slots of every block) pads exactly as the uninterrupted epoch, even
        after it delivered some of its pads. Otherwise (an elastic resume) the pads
        repeat positions ``0, 1, ...`` in order.
        """
        if not self.epoch_length:
            return 0
        total, n = self.remaining_samples, self.samples_per_rank
        size = self.world.world_size
        if n == 0 or total >= n * size:
            return 0  # no padding
        whole = samples_per_rank(self.epoch_length, size, self.remainder)
        first = total + (total // n + 1) * (whole - n)  # the first pad's slot, lined up
        if first < self.epoch_length:
            return 0
        return total + (self.world.rank + 1) * (whole - n) - self.epoch_length

    @property
    def num_batches(self) -> int:
        """Batches in each rank's block (the last may be short)."""
        return -(-self.samples_per_rank // self.batch_size)

    @property
    def worker_samples(self) -> int:
        """Samples this worker delivers."""
        return worker_share(
            self.samples_per_rank, self.batch_size, self.world.worker, self.world.num_workers
        )

    def chunks(
        self, max_samples: int = 256, first_samples: int | None = None
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """This worker's positions in delivery order, as ``(positions, is_pad)`` arrays.

        Chunks hold whole batches where a batch fits ``max_samples`` (the first chunk
        ``first_samples``, when given), so a chunk is usually one contiguous run of the
        stream. How the stream is cut into chunks never changes the stream.
        """
        n = self.samples_per_rank
        # a batch larger than the rank's block is the one batch of the whole block: the
        # same positions as a batch of exactly n, without arrays of the batch's size
        bsize = min(self.batch_size, max(n, 1))
        k, nworkers = self.world.worker, self.world.num_workers
        per_chunk = max(1, max_samples // bsize)
        per_first = per_chunk if first_samples is None else max(1, first_samples // bsize)
        read = n // self.batch_size if self.drop_last else self.num_batches
        batches = range(k, read, nworkers)
        starts, cums = _layout(self.remaining)
        base = self.world.rank * n
        pad_offset = self.pad_offset
        i = 0
        while i < len(batches):
            take = per_first if i == 0 else per_chunk
            js = np.asarray(batches[i : i + take], dtype=np.int64)
            i += take
            offs = (js[:, None] * bsize + np.arange(bsize, dtype=np.int64)[None, :]).ravel()
            offs = offs[offs < n]
            for lo in range(0, len(offs), max_samples):
                virtual = base + offs[lo : lo + max_samples]
                yield _to_real(virtual, self.remaining_samples, starts, cums,
                               self.epoch_length, pad_offset)


def worker_share(samples_per_rank: int, batch_size: int, worker: int, num_workers: int) -> int:
    """Samples worker ``worker`` delivers from a block of ``samples_per_rank``."""
    nb = -(-samples_per_rank // batch_size)
    mine = len(range(worker, nb, num_workers))
    if mine == 0:
        return 0
    last = worker + (mine - 1) * num_workers
    return (mine - 1) * batch_size + min(batch_size, samples_per_rank - last * batch_size)


def _layout(remaining: Sequence[Interval]) -> tuple[np.ndarray, np.ndarray]:
    starts = np.asarray([a for a, _ in remaining], dtype=np.int64)
    lengths = np.asarray([b - a for a, b in remaining], dtype=np.int64)
    cums = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return starts, cums


def _to_real(
    virtual: np.ndarray, total: int, starts: np.ndarray, cums: np.ndarray,
    epoch_length: int = 0,
    pad_offset: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    is_pad = virtual >= total
    # without epoch_length a pad repeats a remaining position (mapped below with the
    # others); with it, an epoch position (see ``pad_offset``): a resume in the same
    # world pads as the whole epoch did
    v = np.where(is_pad, 0 if epoch_length > 0 else (virtual - total) % max(total, 1), virtual)
    idx = np.searchsorted(cums, v, side="right") - 1
    real = starts[idx] + (v - cums[idx])
    if epoch_length > 0:
        real = np.where(is_pad, (virtual - total + pad_offset) % epoch_length, real)
    return real, is_pad


def _check(world_size: int, num_workers: int, batch_size: int, remainder: str) -> None:
    if world_size < 1 or num_workers < 1 or batch_size < 1:
        raise InvalidInputError(
            f"world_size ({world_size}), num_workers ({num_workers}) and batch_size "
            f"({batch_size}) must be at least 1"
        )
    if remainder not in ("pad", "drop"):
        raise InvalidInputError(f"invalid remainder {remainder!r}: expected 'pad' or 'drop'")


def samples_per_rank(remaining_samples: int, world_size: int, remainder: Remainder) -> int:
    """Each rank's share of ``remaining_samples`` (rounded up to pad, down to drop)."""
    if remaining_samples == 0:
        return 0
    if remainder == "pad":
        return -(-remaining_samples // world_size)
    return remaining_samples // world_size


def plan_epoch(
    remaining: Sequence[Interval],
    world: World,
    *,
    batch_size: int = 1,
    remainder: Remainder = "pad",
    epoch_length: int | None = None,
    drop_last: bool = False,
) -> EpochPlan:
    """The plan of ``world``'s reader over the ``remaining`` stream positions.

    ``remaining`` is ``((0, L),)`` for a fresh epoch of ``L`` samples, or what
    :func:`advance` left after a checkpoint. ``epoch_length`` is ``L``: padding repeats
    the epoch's first positions, whatever was resumed. A whole epoch in this world pads
    its last ``P`` slots with positions ``0 .. P-1``; a resume in the same world pads
    each slot with what the uninterrupted epoch has there (byte-exact, pad rows
    included), and an elastic resume whose pads do not line up with a whole epoch's
    pads ``p`` slots with positions ``0 .. p-1`` (see :attr:`EpochPlan.pad_offset`).
    ``drop_last``: the block's short last batch is not read. The
    pad count, ``world_size`` times the rank's share minus ``R``, does not depend on
    ``L``. Without ``epoch_length`` padding repeats the first remaining positions. Pure:
    equal arguments give equal plans.
    """
    _check(world.world_size, world.num_workers, batch_size, remainder)
    rem = normalise_intervals(remaining)
    total = intervals_total(rem)
    if epoch_length is None:
        length = 0
    else:
        length = int(epoch_length)
        if length < (rem[-1][1] if rem else 0):
            raise InvalidInputError(
                f"epoch_length {length} is shorter than the remaining positions "
                f"(up to {rem[-1][1]})"
            )
    return EpochPlan(
        remaining=rem,
        world=world,
        batch_size=batch_size,
        remainder=remainder,
        remaining_samples=total,
        samples_per_rank=samples_per_rank(total, world.world_size, remainder),
        epoch_length=length,
        drop_last=bool(drop_last),
    )


def _worker_batches(
    count: int, worker: int, num_workers: int, bsize: int, n: int, first: int
) -> list[Interval]:
    """Block offsets of a worker's delivered samples from its ``first``-th batch on."""
    full, part = divmod(count, bsize)
    out = []
    for j in range(first, full):
        b = worker + j * num_workers
        out.append((b * bsize, min((b + 1) * bsize, n)))
    if part:
        start = (worker + full * num_workers) * bsize
        out.append((start, start + part))
    return out


def ranks_with_positions(total: int, per_rank: int, world_size: int) -> int:
    """How many of ``world_size`` ranks hold a position, each given ``per_rank`` in turn.

    The ranks after them get padding only (or nothing): a pass over the ranks visits
    these alone (over all of them, a ``state_dict()`` in a world of 2^31 ranks, which the
    loader accepts, took minutes).
    """
    return min(world_size, -(-total // per_rank)) if per_rank else 0


def advance(
    remaining: Sequence[Interval],
    *,
    world_size: int,
    num_workers: int,
    batch_size: int,
    remainder: Remainder,
    consumed: Sequence[int],
) -> tuple[Interval, ...]:
    """The positions still to read after each worker of every rank delivered ``consumed``.

    ``consumed[k]`` is how many samples worker ``k`` delivered, the same on every rank.
    Padding delivered is not a position; a position dropped by ``remainder="drop"`` and
    not delivered still remains. Raises :class:`InvalidInputError` when a count exceeds
    what the plan gives that worker.
    """
    _check(world_size, num_workers, batch_size, remainder)
    rem = normalise_intervals(remaining)
    total = intervals_total(rem)
    n = samples_per_rank(total, world_size, remainder)
    if len(consumed) != num_workers:
        raise InvalidInputError(
            f"progress has {len(consumed)} worker counts, expected {num_workers}"
        )
    offsets: list[Interval] = []
    full_batches = []
    for k, count in enumerate(consumed):
        share = worker_share(n, batch_size, k, num_workers)
        if not 0 <= count <= share:
            raise InvalidInputError(
                f"worker {k} delivered {count} samples, but its share of the epoch is {share}"
            )
        full_batches.append(count // batch_size)
    # Round-robin delivery keeps workers within a batch of each other, so the union is a
    # prefix of whole batches plus a few stragglers; list the prefix as one interval.
    lead = min(full_batches, default=0)
    offsets.append((0, min(lead * num_workers * batch_size, n)))
    for k, count in enumerate(consumed):
        offsets.extend(_worker_batches(count, k, num_workers, batch_size, n, lead))
    block = normalise_intervals(offsets)
    done: list[Interval] = []
    for r in range(ranks_with_positions(total, n, world_size)):
        base = r * n
        for a, b in block:
            lo, hi = base + a, min(base + b, total)
            if lo < hi:
                done.extend(take_intervals(rem, lo, hi))
    return subtract_intervals(rem, normalise_intervals(done))
