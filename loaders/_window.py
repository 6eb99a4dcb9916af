"""Crops and windows of array fields: which region of each sample's array to read. Pure.

- ``crop={field: region}``: the same region of every sample. A region is a ``slice`` or
  ``(start, stop)`` pair for the first dimension, or a sequence of them (``None``: the
  whole dimension) for the leading dimensions; later dimensions are whole.
- ``window={field: sizes}``: a region of the given size (an int for the first dimension,
  or one size or ``None`` per leading dimension) at an offset drawn per sample from
  ``(seed, epoch, sample key)``, so a resumed run draws the same windows.

Readers that support it (the Zarr shard reader's ``read_slices``) read only the chunks a
region overlaps.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from simstore.loaders._checks import is_int, shown
from simstore.loaders._order import random_words

from simstore.errors import InvalidInputError
from simstore.hashing import hash_bytes
from simstore.sample import Schema

__all__ = ["Regions", "parse_regions"]

Box = tuple[slice, ...]


def _int_or_none(value: Any, what: str) -> int | None:
    """None, or a Python or NumPy integer (not a bool) as an int; ``what`` names it."""
    if value is None:
        return None
    if not is_int(value):
        raise InvalidInputError(f"{what} must be an integer or None, got {shown(value)}")
    return int(value)


def _bound(value: Any, field: str) -> int | None:
    """A crop's start or stop."""
    return _int_or_none(value, f"crop of {field!r}: a start or stop")


def _as_slice(item: Any, field: str) -> slice:
    if item is None:
        return slice(None)
    if isinstance(item, slice):
        if item.step is not None and not (is_int(item.step) and item.step == 1):
            raise InvalidInputError(f"crop of {field!r}: steps are not supported")
        return _nonempty(slice(_bound(item.start, field), _bound(item.stop, field)), field)
    if isinstance(item, Sequence) and not isinstance(item, str | bytes) and len(item) == 2:
        return _nonempty(slice(*(_bound(b, field) for b in item)), field)
    raise InvalidInputError(
        f"crop of {field!r}: give a slice, a (start, stop) pair or None per dimension, "
        f"got {shown(item)}"
    )


def _nonempty(part: slice, field: str) -> slice:
    """``part``, refused when it keeps nothing whatever the array's size.

    A reversed pair read as an empty tensor; bounds of both signs are checked per sample.
    """
    a, b = part.start, part.stop
    if a is not None and b is not None and (a >= 0) == (b >= 0) and a >= b:
        raise InvalidInputError(
            f"crop of {field!r} ({_show(part)}) keeps nothing: its start must come "
            "before its stop"
        )
    return part


def _size(value: Any, field: str) -> int | None:
    """A window size."""
    return _int_or_none(value, f"window of {field!r}: a size")


def _within(part: slice, size: int) -> bool:
    """Whether a crop's explicit bounds lie inside a dimension of ``size``."""
    return all(b is None or (-size <= b <= size if i else -size <= b < size)
               for i, b in enumerate((part.start, part.stop)))


def _show(part: slice) -> str:
    return f"{'' if part.start is None else part.start}:{'' if part.stop is None else part.stop}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Regions:
    """Parsed crops and window sizes, by field."""

    crops: Mapping[str, Box]
    windows: Mapping[str, tuple[int | None, ...]]

    @property
    def fields(self) -> set[str]:
        """Fields read by region."""
        return set(self.crops) | set(self.windows)

    def box(self, field: str, shape: Sequence[int], *, seed: int, epoch: int, key: str) -> Box:
        """The region of ``field`` (an array of ``shape``) to read for sample ``key``."""
        if field in self.crops:
            crop = self.crops[field]
            if len(crop) > len(shape):
                raise InvalidInputError(
                    f"crop of {field!r} has {len(crop)} dimensions, the array has shape "
                    f"{tuple(shape)}"
                )
            for d, part in enumerate(crop):
                if not _within(part, shape[d]):
                    raise InvalidInputError(
                        f"crop of {field!r} ({_show(part)} along dimension {d}) runs past "
                        f"the array of sample {key!r} (shape {tuple(shape)})"
                    )
                start, stop, _ = part.indices(shape[d])
                if stop <= start and shape[d] > 0:
                    raise InvalidInputError(
                        f"crop of {field!r} ({_show(part)} along dimension {d}) keeps "
                        f"nothing of the array of sample {key!r} (shape {tuple(shape)})"
                    )
            return crop
        sizes = self.windows[field]
        if len(sizes) > len(shape):
            raise InvalidInputError(
                f"window of {field!r} has {len(sizes)} dimensions, the array has shape "
                f"{tuple(shape)}"
            )
        draws = random_words(len(sizes), seed, epoch, hash_bytes(key.encode()), 5)
        box = []
        for d, size in enumerate(sizes):
            if size is None:
                box.append(slice(None))
                continue
            if size > shape[d]:
                raise InvalidInputError(
                    f"window of {size} along dimension {d} of {field!r} is larger than the "
                    f"array of sample {key!r} (shape {tuple(shape)})"
                )
            start = int(draws[d] % (shape[d] - size + 1))
            box.append(slice(start, start + size))
        return tuple(box)


def parse_regions(
    crop: Mapping[str, Any] | None, window: Mapping[str, Any] | None, schema: Schema
) -> Regions:
    """Check ``crop``/``window`` against the snapshot's schema and parse them."""
    specs = {s.name: s for s in schema}
    crops: dict[str, Box] = {}
    windows: dict[str, tuple[int | None, ...]] = {}
    for what, given in (("crop", crop), ("window", window)):
        if given is None:
            continue
        if not isinstance(given, Mapping):
            # ``[]``, ``0`` and ``False`` too, which were read as no crop at all
            raise InvalidInputError(f"{what}= takes a mapping of field name to region, "
                                    f"got {shown(given)}")
        for name, value in given.items():
            spec = specs.get(name)
            if spec is None or spec.kind != "tensor":
                raise InvalidInputError(f"{what}= names {name!r}, which is not an array field")
            if name in crops or name in windows:
                raise InvalidInputError(f"field {name!r} has both a crop and a window")
            pair = (
                what == "crop" and isinstance(value, Sequence) and len(value) == 2
                and all(v is None or isinstance(v, numbers.Real) for v in value)
                and any(v is not None for v in value)
            )  # no number is a region of one dimension: with None, they make a pair
            if pair or not isinstance(value, Sequence) or isinstance(value, str | bytes):
                items: Sequence[Any] = (value,)
            else:
                items = value
            if not items:  # read as the whole field: a mistake, or nothing to ask for
                raise InvalidInputError(
                    f"{what} of {name!r} names no dimension (an empty sequence); give a "
                    f"region of one or more dimensions, or leave the field out of {what}="
                )
            if len(items) > spec.ndim:
                raise InvalidInputError(
                    f"{what} of {name!r} has {len(items)} dimensions, the field has {spec.ndim}"
                )
            if what == "crop":
                crops[name] = tuple(_as_slice(i, name) for i in items)
            else:
                sizes = tuple(_size(i, name) for i in items)
                if any(s is not None and s < 1 for s in sizes):
                    raise InvalidInputError(f"window of {name!r}: sizes must be positive")
                windows[name] = sizes
    return Regions(crops=crops, windows=windows)
