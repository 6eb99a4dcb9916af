"""What ingest holds an adapter to: its exceptions, its samples' values, its array sources.

An adapter is a plugin's code (docs/adapters.md, "Writing an adapter"). Whatever it does
wrong while it reads a file makes that file a bad file (a :class:`SourceError` naming it,
skipped under ``--on-error skip``), never a traceback that ends the run, and never values
in a shard other than those it yielded:

- its exceptions, of any class and whatever their ``str`` does, become one line
  (:func:`adapter_failure`); only Ctrl-C (``KeyboardInterrupt``) passes through;
- the arrays of a sample are copied when it is yielded (:func:`owned_sample`), unless the
  adapter declares ``fresh_arrays = True``: a shard writer keeps them until the shard is
  written, so an adapter reading every sample into one reused buffer, or changing an array
  after yielding it, would otherwise store its later values under the first one's hash;
- a lazy field (an :class:`~simstore.ingest.ArraySource`) is read through
  :class:`CheckedSource`, which refuses a read whose shape or dtype is not what the source
  declares (a shard would hold other values than the sample's hash and statistics).
"""

from __future__ import annotations

import copy
import math
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from simstore.errors import InvalidInputError, SimstoreError, SourceError, one_line
from simstore.ingest._arrays import is_array_source
from simstore.sample import Sample

__all__ = [
    "MESSAGE_CHARS",
    "CheckedSource",
    "adapter_failure",
    "as_bad_file",
    "check_options_of",
    "claims",
    "owned_sample",
    "passes_through",
]

MESSAGE_CHARS = 2000
"""An adapter's message is cut to this many characters (a 10 MB one is a file's dump)."""

_OWN = "simstore."
"""How the modules of simstore's own adapters and array sources begin."""


def passes_through(exc: BaseException) -> bool:
    """Whether an adapter's exception is the user's or the interpreter's, not the file's."""
    return isinstance(exc, KeyboardInterrupt | GeneratorExit)


def as_bad_file(exc: BaseException, path: str) -> BaseException:
    """What an exception an adapter raised on file ``path`` is raised as.

    A :class:`SourceError` and Ctrl-C as they are; simstore's other errors and anything
    else as a :class:`SourceError` naming the file (a bad file, skippable).
    """
    if isinstance(exc, SourceError) or passes_through(exc):
        return exc
    if isinstance(exc, SimstoreError):
        return SourceError(f"{path}: {exc}")
    return SourceError(f"{path}: {adapter_failure(exc)}")


def adapter_failure(exc: BaseException) -> str:
    """``Class: message`` of an exception an adapter raised, on one line.

    A message that cannot be formatted (its ``__str__`` raises) is said to be so; a long
    one is cut.
    """
    try:
        text = str(exc)
    except Exception as inner:  # the adapter's own __str__
        text = f"(its message could not be formatted: {type(inner).__name__})"
    text = one_line(text)
    if len(text) > MESSAGE_CHARS:
        text = f"{text[:MESSAGE_CHARS]}... ({len(text):,} characters)"
    name = type(exc).__name__
    return f"{name}: {text}" if text else name


def _frozen(array: np.ndarray) -> bool:
    """Whether nothing can write ``array``'s values: read-only down to its memory.

    A read-only view of a writable array (or buffer) can still change through it; a
    read-only mapping of a file (``np.load(..., mmap_mode="r")``), or an array over
    ``bytes``, cannot (but for the file itself, which ingest checks as it does every
    source's). Such arrays are not copied: a mapped field larger than memory ingests as
    it did.
    """
    base: Any = array
    while isinstance(base, np.ndarray):
        if base.flags.writeable:
            return False
        if base.base is None:
            return False  # its own memory, which its owner may make writable again
        base = base.base
    try:
        with memoryview(base) as view:
            return bool(view.readonly)
    except (TypeError, ValueError):
        return False


def _own(value: object) -> Any:
    if isinstance(value, np.ndarray):
        return value if _frozen(value) else np.array(value, copy=True, order="K")
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, dict):
        return copy.deepcopy(value)
    return value


def owned_sample(sample: Sample, path: str, fresh: bool) -> Sample:
    """``sample`` with values the adapter cannot change any more, lazy fields checked.

    ``fresh``: the adapter declares its arrays are never written after they are yielded
    (``fresh_arrays = True``), so they are not copied.
    """
    if not isinstance(sample.fields, Mapping):
        raise SourceError(
            f"{path}: sample {sample.key!r}: the adapter gave fields as a "
            f"{type(sample.fields).__name__}, not a mapping of names to values"
        )
    fields: dict[str, Any] = {}
    changed = False
    masked = sys.modules.get("numpy.ma")  # none without it: not imported for the check
    for name, value in sample.fields.items():
        if masked is not None and isinstance(value, masked.MaskedArray):
            raise SourceError(
                f"{path}: sample {sample.key!r}: field {name!r}: a masked array (its mask "
                "would be dropped): fill the masked values (NaN, or a fill value) or give "
                "the mask as a field of its own"
            )
        if is_array_source(value):
            new = value if type(value).__module__.startswith(_OWN) else CheckedSource(
                value, path, sample.key, name)
        else:
            new = value if fresh else _own(value)
        changed = changed or new is not value
        fields[name] = new
    return Sample(sample.key, fields) if changed else sample


def _read_shape(box: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape a read of ``box`` (slices, one per axis, the rest whole) gives."""
    if not shape:
        return ()
    parts = box if isinstance(box, tuple) else (box,)
    out = []
    for i, n in enumerate(shape):
        part = parts[i] if i < len(parts) else slice(None)
        start, stop, _ = part.indices(n)
        out.append(max(0, stop - start))
    return tuple(out)


class CheckedSource:
    """An adapter's :class:`~simstore.ingest.ArraySource`, each read checked.

    A read that raises is a :class:`SourceError` naming the file, the sample and the
    field (simstore's own errors pass as they are: a ``StorageError`` is the
    environment's, which a dask cluster retries); so is one that gives another shape
    than the box asked for, or another dtype than the source declares (a byte-order
    difference alone is converted).
    """

    def __init__(self, source: Any, path: str, key: str, field: str) -> None:
        self._source = source
        self._where = f"{path}: sample {key!r}: field {field!r}"
        try:
            self.shape: tuple[int, ...] = tuple(int(n) for n in source.shape)
            self.dtype: np.dtype[Any] = np.dtype(source.dtype)
        except SimstoreError:
            raise
        except Exception as exc:
            raise SourceError(f"{self._where}: its shape or dtype: {adapter_failure(exc)}") \
                from exc
        if any(n < 0 for n in self.shape):
            raise SourceError(f"{self._where}: a negative extent in its shape {self.shape}")

    @property
    def nbytes(self) -> int:
        """Size of the values in bytes."""
        return math.prod(self.shape) * self.dtype.itemsize

    def __getitem__(self, box: Any) -> np.ndarray:
        """The values in ``box``, as the source declares them."""
        try:
            data = np.asarray(self._source[box])
        except SimstoreError:
            raise  # a bad file already, or the environment's (a store's StorageError)
        except BaseException as exc:
            if passes_through(exc):
                raise
            raise SourceError(f"{self._where}: read failed: {adapter_failure(exc)}") from exc
        want = _read_shape(box, self.shape)
        if data.shape != want or data.dtype.newbyteorder("=") != self.dtype.newbyteorder("="):
            raise SourceError(
                f"{self._where}: a read gave {data.dtype.name}{list(data.shape)} where the "
                f"source declares {self.dtype.name}{list(want)} (its shape and dtype must "
                "describe what its reads return)"
            )
        if data.dtype != self.dtype:
            data = data.astype(self.dtype)
        return data


def _name(adapter: Any) -> str:
    try:
        return repr(str(adapter.name))
    except Exception:
        return repr(type(adapter).__name__)


def claims(adapter: Any, path: str, head: bytes) -> bool:
    """``adapter.can_read(path, head)``; one that raises is a SourceError naming both.

    ``can_read`` must never raise (docs/adapters.md): one that does on some file would
    otherwise end the whole run, whichever adapter the file was meant for.
    """
    try:
        return bool(adapter.can_read(path, head))
    except SimstoreError:
        raise
    except BaseException as exc:
        if passes_through(exc):
            raise
        raise SourceError(
            f"{path}: adapter {_name(adapter)} failed to judge the file (can_read must "
            f"not raise): {adapter_failure(exc)}"
        ) from exc


def check_options_of(adapter: Any, options: Mapping[str, Any]) -> None:
    """Run ``adapter.check_options(options)`` if it has one; a failure is one line.

    The hook raises :class:`~simstore.errors.InvalidInputError` for a bad value; anything
    else it raises becomes one, naming the adapter.
    """
    check = getattr(adapter, "check_options", None)
    if not callable(check):
        return
    try:
        check(options)
    except SimstoreError:
        raise
    except BaseException as exc:
        if passes_through(exc):
            raise
        raise InvalidInputError(
            f"adapter {_name(adapter)}: its check of the options "
            f"{', '.join(repr(k) for k in sorted(options)) or '(none)'} failed: "
            f"{adapter_failure(exc)}"
        ) from exc
