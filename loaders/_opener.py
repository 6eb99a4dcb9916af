"""Opening shards of any installed format, with the format list looked up once per reader.

``simstore.formats.open_shard`` finds the installed formats through entry points on every
call, which costs tens of milliseconds; a loader opens thousands of shards. A
:class:`FormatOpener` made at the start of a reading iteration (never at import: no
module-level state) first tries simstore's own formats, imported by the magic bytes they
claim (Parquet's ``PAR1``, a Zarr zip's ``PK``, Lance's ``LANC``), with no entry-point
scan; for anything else it asks for the installed formats once, recognises the shard by
the ``sniff(head, tail)`` of core's ``ShardFormat`` protocol, and leaves what it cannot
place to ``open_shard`` itself, for its error message.
"""

from __future__ import annotations

import importlib
from typing import Any, BinaryIO

from simstore.errors import FormatError, InvalidInputError
from simstore.ingest import installed_shard_formats, probe_shard, sniffed_format
from simstore.protocols import ShardFormat, ShardReader

try:  # the default format's reader loads with the loader, not inside the first batch
    import simstore.formats._parquet  # noqa: F401
except ImportError:  # pragma: no cover - formats ships with simstore
    pass

__all__ = ["FormatOpener"]


def _formats_module() -> Any:
    try:
        return importlib.import_module("simstore.formats")
    except ImportError as exc:  # pragma: no cover - formats ships with simstore
        raise InvalidInputError(
            f"no shard reader available ({exc}); pass shard_opener= or install simstore fully"
        ) from exc


_BUILTIN = (
    ("simstore.formats._parquet", "ParquetFormat"),
    ("simstore.formats._zarr", "ZarrFormat"),
    ("simstore.formats._lance", "LanceFormat"),
)


def _builtin_for(head: bytes, tail: bytes) -> tuple[str, str] | None:
    if head[:4] == b"PAR1":
        return _BUILTIN[0]
    if head[:2] == b"PK":
        return _BUILTIN[1]
    if tail[-4:] == b"LANC":
        return _BUILTIN[2]
    return None


class FormatOpener:
    """Opens shards by their magic bytes with the formats found once (picklable, lazy)."""

    def __init__(self) -> None:
        self._formats: list[ShardFormat] | None = None
        self._builtin: dict[tuple[str, str], ShardFormat] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"_formats": None, "_builtin": {}}

    def _own(self, head: bytes, tail: bytes) -> ShardFormat | None:
        where = _builtin_for(head, tail)
        if where is None:
            return None
        fmt = self._builtin.get(where)
        if fmt is None:
            try:
                fmt = getattr(importlib.import_module(where[0]), where[1])()
            except ImportError:
                return None
            self._builtin[where] = fmt
        return fmt

    def _installed(self) -> list[ShardFormat]:
        if self._formats is None:
            self._formats = installed_shard_formats()
        return self._formats

    def open_laid_out(self, path: str, layout: bytes, shard_id: str) -> ShardReader | None:
        """A local shard opened from the page layout kept of its bytes, or None.

        For a file that hashed to ``shard_id``; None when the layout is not one this
        format can use (see ``formats._layout``): the caller opens the shard as usual.
        """
        fmt = self._own(b"PAR1", b"PAR1")
        laid = getattr(fmt, "open_laid_out", None)
        if not callable(laid):
            return None
        reader: ShardReader | None = laid(path, layout, shard_id)
        return reader

    def __call__(self, source: str | BinaryIO) -> ShardReader:
        try:
            head, tail = probe_shard(source)
        except OSError as exc:
            raise FormatError(f"cannot read the shard's first and last bytes: {exc}") from exc
        own = self._own(head, tail)
        file_object = not isinstance(source, str)
        fmt = sniffed_format([own], head, tail, file_object=file_object) if own else None
        if fmt is None:  # only then the installed formats (an entry-point scan)
            fmt = sniffed_format(self._installed(), head, tail, file_object=file_object)
        if fmt is not None:
            return fmt.open(source)
        opener: Any = _formats_module().open_shard
        reader: ShardReader = opener(source, head=head, tail=tail)
        return reader
