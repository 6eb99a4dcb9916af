"""A loader state: what ``SimDataset.state_dict`` saves, and the checks on loading one.

A state resumes only the stream it came from: the same snapshots, seeds, weights, epoch
length and order options.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from simstore.loaders._checks import check_int, shown, to_list
from simstore.loaders._plan import Interval, normalise_intervals
from simstore.loaders._source import Source

from simstore.errors import InvalidInputError

__all__ = [
    "ORDER_ALGORITHM",
    "STATE_FORMAT_VERSION",
    "LoaderState",
    "check_state",
    "order_params",
    "state_intervals",
]

STATE_FORMAT_VERSION = 1


_FINISH_ELSEWHERE = (
    "finish the epoch with the simstore that saved the state, or start the next epoch "
    "(set_epoch) without loading it"
)


class LoaderState(TypedDict):
    """``state_dict()``: what pins the stream, and the positions of the epoch still to read."""

    format_version: int
    kind: str
    snapshots: list[str]
    seeds: list[int]
    weights: list[int]
    mix_seed: int
    mix_shuffle: bool
    epoch: int
    epoch_length: int
    remaining: list[list[int]]
    delivered: int
    order: list[dict[str, Any]]


ORDER_ALGORITHM = "blocks-v2"
"""The shuffle of loaders/_order.py; a state resumes only a stream of the same algorithm."""


def order_params(source: Source) -> dict[str, Any]:
    """What, beyond snapshot and seed, decides a source's order (kept in the state)."""
    return {
        "algorithm": ORDER_ALGORITHM,
        "shuffle": source.shuffle,
        "window_shards": source.window_shards,
        "group_parts": source.group_parts,
        "block_bytes": source.block_bytes,
        "buffer_blocks": source.buffer_blocks,
    }


def check_state(
    state: object, mine: Mapping[str, Any], *, mixed: bool, mix_shuffle: bool
) -> Mapping[str, Any]:
    """``state``, once it pins the stream ``mine`` (this dataset's ``state_dict()``) pins.

    ``mixed``: the dataset interleaves several sources, so how it interleaves them
    (``mix_seed``, ``mix_shuffle``) is checked too. Anything else (not a mapping, another
    kind or format version, a state of another stream, no ``epoch`` or ``remaining``) is an
    :class:`InvalidInputError` naming what differs; ``epoch`` and ``remaining`` are the
    caller's to check.
    """
    if not isinstance(state, Mapping):
        raise InvalidInputError(
            f"a loader state is the mapping state_dict() returns, got {shown(state)}"
        )
    if state.get("kind") != "simstore-loader-state":
        raise InvalidInputError("not a simstore loader state")
    version = state.get("format_version")
    if type(version) is not int or version != STATE_FORMAT_VERSION:
        raise InvalidInputError(
            f"loader state format_version {state.get('format_version')!r}, this "
            f"simstore reads {STATE_FORMAT_VERSION}"
        )
    names = ["snapshots", "seeds", "weights", "epoch_length", "order"]
    if mixed:  # interleaves sources: one source's order ignores them
        names += ["mix_seed", "mix_shuffle"]
    for name in names:
        if name == "order" and name not in state:
            raise InvalidInputError(
                "loader state has no 'order' (it was saved by a simstore before "
                "2026-11-30, whose shuffle differs): it cannot resume this stream "
                f"exactly; {_FINISH_ELSEWHERE}"
            )
        if name == "mix_shuffle" and name not in state:
            raise InvalidInputError(
                "loader state has no 'mix_shuffle' (it was saved by a simstore before "
                "2026-12-02, which did not record how the mixture interleaves its "
                "datasets): if that mixture was made with the same shuffle= as this one "
                f"({mix_shuffle}), set state['mix_shuffle'] = "
                f"{mix_shuffle} and load it again; else {_FINISH_ELSEWHERE}"
            )
        if name == "order" and state.get(name) != mine[name]:
            differ = _order_differences(state.get(name), mine[name])
            if differ is not None:
                was, now = differ
                sep = ";" if len(was) > 1 else ","
                raise InvalidInputError(
                    f"loader state has another order: it was saved with "
                    f"{', '.join(was)}{sep} this dataset has {', '.join(now)} (a state "
                    "resumes only the stream it came from)"
                )
        if not _same_value(state.get(name), mine[name]):
            raise InvalidInputError(
                f"loader state has {name} {state.get(name)!r}, but this dataset reads "
                f"{mine[name]!r}: a state resumes only the stream it came from"
            )
    for name in ("epoch", "remaining"):
        if name not in state:
            raise InvalidInputError(f"loader state has no {name!r}")
    return state


def _order_differences(saved: object, current: Sequence[Mapping[str, Any]]
                       ) -> tuple[list[str], list[str]] | None:
    """The order options that differ, as ``(["k=saved", ...], ["k=current", ...])``.

    Each source's order is compared key by key (a mixture's are prefixed ``source i:``);
    a key one side lacks shows as ``k=<none>``. None when ``saved`` is not a list of one
    mapping per source, for the caller's general message.
    """
    if (isinstance(saved, str | bytes) or not isinstance(saved, Sequence)
            or len(saved) != len(current)
            or not all(isinstance(o, Mapping) for o in saved)):
        return None
    old: list[str] = []
    new: list[str] = []
    for i, (was, now) in enumerate(zip(saved, current, strict=True)):
        prefix = f"source {i}: " if len(current) > 1 else ""
        keys = [*now, *sorted((k for k in was if k not in now), key=str)]
        for key in keys:
            a, b = was.get(key, _ABSENT), now.get(key, _ABSENT)
            if a != b:
                name = _shown_option(key)
                old.append(f"{prefix}{name}={_shown_option(a)}")
                new.append(f"{prefix}{name}={_shown_option(b)}")
    return (old, new) if old else None


_ABSENT = object()


def _shown_option(value: object) -> str:
    """An order option's value for a one-line message."""
    if value is _ABSENT:
        return "<none>"
    text = value if isinstance(value, str) else repr(value)
    text = " ".join(str(text).split())
    return text if len(text) <= 40 else text[:37] + "..."


def state_intervals(value: object, epoch_length: int) -> tuple[Interval, ...]:
    """A state's ``remaining``: ``[start, stop]`` pairs of positions within the epoch."""
    what = "loader state field 'remaining'"
    pairs = to_list(value, what, "[start, stop] pairs of positions")
    out = []
    for i, pair in enumerate(pairs):
        if isinstance(pair, str | bytes) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise InvalidInputError(
                f"{what}: item {i} must be a [start, stop] pair, got {shown(pair)}"
            )
        a = check_int(pair[0], f"{what}: item {i} start", minimum=0)
        b = check_int(pair[1], f"{what}: item {i} stop", maximum=epoch_length)
        if a >= b:
            raise InvalidInputError(f"{what}: item {i} [{a}, {b}] holds no position")
        out.append((a, b))
    ordered = sorted(out)
    for (a0, b0), (a1, b1) in zip(ordered, ordered[1:], strict=False):
        if a1 < b0:
            raise InvalidInputError(
                f"{what}: [{a0}, {b0}] and [{a1}, {b1}] overlap (a state lists each "
                "remaining position once)"
            )
    return normalise_intervals(out)


def _same_value(a: object, b: object) -> bool:
    """Equal, and of the same JSON types: 200.0 is not the epoch length 200, True not 1."""
    try:
        return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    except (TypeError, ValueError):
        return False
