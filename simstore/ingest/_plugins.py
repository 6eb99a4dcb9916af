"""Discovery of source adapters and shard formats through entry points."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from importlib.metadata import entry_points
from typing import Any, BinaryIO

from simstore.errors import InvalidInputError
from simstore.ingest._config import IngestConfig
from simstore.ingest._shards import ShardOptions
from simstore.protocols import ShardFormat, SourceAdapter

__all__ = [
    "ADAPTER_GROUP",
    "FORMAT_GROUP",
    "Plugins",
    "adapter_names",
    "entry_points",
    "installed_shard_formats",
    "load_adapter",
    "load_adapters",
    "load_shard_format",
    "plugins_for",
    "probe_shard",
    "shard_format_names",
    "sniffed_format",
]

ADAPTER_GROUP = "simstore.adapters"
FORMAT_GROUP = "simstore.shard_formats"

Plugins = tuple[SourceAdapter, dict[str, ShardFormat]]
"""The adapter of an ingest and its shard formats by name; they pickle, so they travel
with each task to a worker process instead of every worker scanning entry points again."""


_log = logging.getLogger("simstore.ingest")
_OWN = "simstore."
"""How simstore's own entry points' values begin (``simstore.formats.adapters:...``)."""
_WARNED: set[tuple[str, str, str]] = set()


def _by_name(eps: Any, group: str) -> dict[str, Any]:
    """Entry points by name; of several of one name, simstore's own, else the first.

    Another package's entry point named like a built-in (``hdf5``) would otherwise
    replace it for every ingest, unannounced, whatever the order the packages are
    scanned in. Two packages' of one name: the one whose value sorts first, so every
    process picks the same. Each passed over is logged once as a warning.
    """
    def value(ep: Any) -> str:
        return str(getattr(ep, "value", ""))

    out: dict[str, Any] = {}
    for ep in sorted(eps, key=lambda e: (not value(e).startswith(_OWN), value(e))):
        kept = out.setdefault(ep.name, ep)
        if kept is not ep and value(kept) != value(ep):
            seen = (group, ep.name, value(ep))
            if seen not in _WARNED:
                _WARNED.add(seen)
                _log.warning(
                    "%s plugin %r (%s) ignored: %r names %s already", group, ep.name,
                    value(ep), ep.name, value(kept),
                )
    return out


def _entry_points(group: str) -> dict[str, Any]:
    # Looked up on the package at call time: ``simstore.ingest.entry_points`` is the seam
    # through which a test or an embedding application adds plugins without installing them.
    package = sys.modules[__package__ or "simstore.ingest"]
    find = package.entry_points
    if find is not entry_points:
        return _by_name(find(group=group), group)
    return _installed(group)


_SCAN: list[tuple[tuple[Any, ...] | None, Any]] = []
"""The last scan of installed entry points, every group: ``[(path stamp, entry points)]``."""
_SCAN_LOCK = threading.Lock()


_RACY_NS = 2_000_000_000
"""A folder modified this recently may change again within its timestamps' granularity."""


def _path_stamp() -> tuple[Any, ...] | None:
    """What the installed packages' entry points depend on: ``sys.path`` and its folders.

    Installing or removing a package adds or removes a ``*.dist-info`` folder (a
    reinstall replaces it) in a folder of ``sys.path``, which changes that folder's
    modification time; a stat of each costs microseconds. None when a folder changed in
    the last two seconds: file times advance in ticks of a few milliseconds, so a second
    install in the tick of the first could leave the time as a scan between them saw it.
    """
    stamp: list[Any] = []
    now = time.time_ns()
    for entry in sys.path:
        where = os.path.abspath(entry or os.curdir)
        try:
            st = os.stat(where)
        except OSError:
            stamp.append((where, None))
            continue
        if now - st.st_mtime_ns < _RACY_NS:
            return None
        stamp.append((where, st.st_ino, st.st_mtime_ns))
    return tuple(stamp)


def _installed(group: str) -> dict[str, Any]:
    """The installed entry points of ``group``, scanned again only when packages change.

    A scan reads every installed distribution's metadata, 3-4 ms here, and one ingest
    looks plugins up four times (its shard formats, its adapter, the adapters ``auto``
    picks from) before its first file: one scan of every group serves them all, and
    later ingests of the process, while nothing is installed or removed.
    """
    stamp = _path_stamp()
    with _SCAN_LOCK:
        if stamp is None or not _SCAN or _SCAN[0][0] != stamp:
            _SCAN[:] = [(stamp, _scan())]
        found = _SCAN[0][1]
    return _by_name(found.select(group=group), group)


_scan = entry_points
"""The scan of installed distributions (a test counts its calls through this name)."""


def adapter_names() -> list[str]:
    """Names of the installed source adapters (entry-point group ``simstore.adapters``)."""
    return sorted(_entry_points(ADAPTER_GROUP))


def shard_format_names() -> list[str]:
    """Names of the installed shard formats (entry-point group ``simstore.shard_formats``)."""
    return sorted(_entry_points(FORMAT_GROUP))


def load_adapters() -> dict[str, SourceAdapter]:
    """Every installed source adapter by name (one scan of the installed packages)."""
    return {
        name: _adapter_of(name, ep) for name, ep in sorted(_entry_points(ADAPTER_GROUP).items())
    }


def _loaded(ep: Any, kind: str, make: Any = None) -> Any:
    """What entry point ``ep`` names (called with ``make``'s arguments, if given).

    A plugin whose module fails to import, or whose class fails to build, is an error of
    one line naming the entry point and the failure, not a traceback: with ``auto`` every
    ingest loads every installed adapter.
    """
    try:
        obj = ep.load()
        return make(obj) if make is not None else obj
    except Exception as exc:
        why = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise InvalidInputError(
            f"{kind} plugin {ep.name!r} ({ep.value}) failed to load: {why}"
        ) from exc


def _adapter_of(name: str, ep: Any) -> SourceAdapter:
    adapter = _loaded(ep, "adapter",
                      lambda obj: obj() if isinstance(obj, type) else obj)
    if not isinstance(adapter, SourceAdapter):
        raise InvalidInputError(f"entry point {name!r} in {ADAPTER_GROUP} is not a SourceAdapter")
    return adapter


def load_adapter(name: str) -> SourceAdapter:
    """The source adapter registered as ``name``; its entry point names a class or factory."""
    eps = _entry_points(ADAPTER_GROUP)
    if name not in eps:
        raise InvalidInputError(
            f"unknown adapter {name!r}; installed: {', '.join(sorted(eps)) or 'none'} "
            f"(entry-point group {ADAPTER_GROUP})"
        )
    return _adapter_of(name, eps[name])


def load_shard_format(name: str, options: ShardOptions | None = None) -> ShardFormat:
    """The shard format registered as ``name``, built with ``options``.

    Its entry point names a callable taking one :class:`ShardOptions` (usually the class).
    """
    eps = _entry_points(FORMAT_GROUP)
    if name not in eps:
        raise InvalidInputError(
            f"unknown shard format {name!r}; installed: {', '.join(sorted(eps)) or 'none'} "
            f"(entry-point group {FORMAT_GROUP})"
        )
    fmt = _loaded(eps[name], "shard format", lambda obj: obj(options or ShardOptions()))
    if not isinstance(fmt, ShardFormat):
        raise InvalidInputError(f"entry point {name!r} in {FORMAT_GROUP} is not a ShardFormat")
    return fmt


PROBE_BYTES = 8
"""A shard's first and last bytes that ``ShardFormat.sniff`` recognises it by."""

_BUILTIN_FORMATS = ("parquet", "zarr", "lance")


def probe_shard(source: str | BinaryIO) -> tuple[bytes, bytes]:
    """A shard's first and last :data:`PROBE_BYTES` bytes.

    ``source`` is a path, or a seekable file object whose position is put back.
    """
    if isinstance(source, str):
        with open(source, "rb") as f:
            return probe_shard(f)
    pos = source.tell()
    source.seek(0)
    head = source.read(PROBE_BYTES)
    end = source.seek(0, os.SEEK_END)
    source.seek(max(0, end - PROBE_BYTES))
    tail = source.read(PROBE_BYTES)
    source.seek(pos)
    return head, tail


def installed_shard_formats() -> list[ShardFormat]:
    """Every installed shard format (one scan of the installed packages), simstore's first."""
    names = shard_format_names()
    ordered = [n for n in _BUILTIN_FORMATS if n in names]
    ordered += [n for n in names if n not in _BUILTIN_FORMATS]
    return [load_shard_format(n) for n in ordered]


def sniffed_format(
    formats: list[ShardFormat], head: bytes, tail: bytes, *, file_object: bool = False
) -> ShardFormat | None:
    """The first of ``formats`` that claims a shard of these first and last bytes.

    With ``file_object``, only a format that reads from one; None when none claims it.
    """
    for fmt in formats:
        if fmt.sniff(head, tail) and (not file_object or fmt.supports_file_objects):
            return fmt
    return None


def plugins_for(cfg: IngestConfig) -> Plugins:
    """The adapter and the shard formats (the chosen one, and Zarr for dense fields)."""
    opts = cfg.shard_options()
    formats = {cfg.format: load_shard_format(cfg.format, opts)}
    if cfg.format != "zarr":
        formats["zarr"] = load_shard_format("zarr", opts)
    return load_adapter(cfg.adapter), formats
