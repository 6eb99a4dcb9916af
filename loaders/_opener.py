"""Opening shards of any installed format, with the format list looked up once per reader.

``simstore.formats.open_shard`` finds the installed formats through entry points on every
call, which costs tens of milliseconds; a loader opens thousands of shards. A
:class:`ShardOpener` made at the start of a reading iteration (never at import: no
module-level state) asks for the formats once, then recognises each shard by the
``sniff(head, tail)`` of core's ``ShardFormat`` protocol, and leaves anything it cannot
place to ``open_shard`` itself, for its error message.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, BinaryIO

from simstore.errors import FormatError, InvalidInputError
from simstore.protocols import ShardFormat, ShardReader

__all__ = ["FormatOpener"]

_PROBE_BYTES = 8


def _formats_module() -> Any:
    try:
        return importlib.import_module("simstore.formats")
    except ImportError as exc:  # pragma: no cover - formats ships with simstore
        raise InvalidInputError(
            f"no shard reader available ({exc}); pass shard_opener= or install simstore fully"
        ) from exc


def _probe(source: str | BinaryIO) -> tuple[bytes, bytes]:
    if isinstance(source, str):
        with open(source, "rb") as f:
            return _probe(f)
    source.seek(0)
    head = source.read(_PROBE_BYTES)
    end = source.seek(0, os.SEEK_END)
    source.seek(max(0, end - _PROBE_BYTES))
    tail = source.read(_PROBE_BYTES)
    source.seek(0)
    return head, tail


class FormatOpener:
    """Opens shards by their magic bytes with the formats found once (picklable, lazy)."""

    def __init__(self) -> None:
        self._formats: list[ShardFormat] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"_formats": None}

    def _installed(self) -> list[ShardFormat]:
        if self._formats is None:
            module = _formats_module()
            self._formats = [module.get_format(n) for n in module.list_formats()]
        return self._formats

    def __call__(self, source: str | BinaryIO) -> ShardReader:
        try:
            head, tail = _probe(source)
        except OSError as exc:
            raise FormatError(f"cannot read the shard's first and last bytes: {exc}") from exc
        for fmt in self._installed():
            if fmt.sniff(head, tail) and (isinstance(source, str) or fmt.supports_file_objects):
                return fmt.open(source)
        opener: Any = _formats_module().open_shard
        reader: ShardReader = opener(source, head=head, tail=tail)
        return reader
