"""The ingest pipeline: source files in, content-addressed shards and a staged change out.

``ingest(sources, dataset=..., store=...)`` walks the sources, hands each file to a source
adapter (found by name in the entry-point group ``simstore.adapters``), packs the samples
into shards with a shard format (group ``simstore.shard_formats``), stores every shard under
the xxh3-128 hash of its bytes, and stages one manifest change (optionally committing it).
Core never imports ``simstore.formats``: the entry points name the implementations.

Pipeline, per task (a run of files, in key order, about one shard's worth of source bytes,
so the shard layout does not depend on the worker count)::

    file --adapter--> samples --check schema/NaN, hash, summarise--> shard writer(s)
         --close--> temp file --hash--> store.put_file(objects/<id>)

Promises and their mechanics:

- **Bounded memory**: a columnar writer buffers at most ``shard_size`` bytes of samples; a
  dense field above ``dense_threshold`` (or a lazy :class:`ArraySource`) goes to a streaming
  Zarr shard and is read in blocks of ``block_bytes``. Nothing holds a whole source file.
- **Idempotent and resumable**: after a task's shards are stored, each of its files gets a
  journal record (``journal/<dataset>/<digest>``, digest of the file's content hash, key and
  every parameter that shapes the output). A re-run reuses a record whose shards exist and
  reads nothing; shards are deterministic, so a redone task stores nothing new either. An
  upsert stages only files whose samples differ from the branch head.
- **Failure leaves no reference**: staging happens once, after every task succeeded (or was
  skipped under ``on_error="skip"``); a failed run stages nothing, so no snapshot or staging
  entry references what it wrote (gc reclaims it; the journal speeds up the re-run).
- **Exact statistics**: each file's field summaries travel with its rows; the staged entry
  carries their exact merge, which a commit merges into the parent's (see simstore.stats).

This module is long (about 1,550 lines, over the 1,000-line mark): the pipeline was given
one core module, and the public name ``simstore.ingest`` is both this module and its main
function. Its sections (array sources and hashing; shard options and the writer protocol;
discovery of plugins; configuration and results; discovery of files; the worker; the
journal; the driver) are the natural cut for a ``simstore/ingest/`` package later.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import json
import math
import mmap
import multiprocessing
import os
import shutil
import struct
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Literal, Protocol, TypedDict, Unpack, runtime_checkable

import numpy as np
import pyarrow as pa

from simstore.catalog import Catalog
from simstore.errors import (
    InvalidInputError,
    NotFoundError,
    SimstoreError,
    SourceError,
)
from simstore.hashing import Hasher, ObjectId, hash_bytes, object_key
from simstore.manifest import MANIFEST_SCHEMA
from simstore.names import DEFAULT_BRANCH, check_name
from simstore.protocols import ShardFormat, ShardWriteResult, SourceAdapter, WrittenSample
from simstore.sample import FieldSpec, Sample, Schema, canonical_json, merge_schema, spec_of
from simstore.stats import StatsAccumulator, merge_stats
from simstore.storage import ObjectStore, SupportsMoveFile

__all__ = [
    "ADAPTER_GROUP",
    "COMPRESSIONS",
    "DEFAULT_COMPRESSION",
    "FORMAT_GROUP",
    "ArraySource",
    "IngestConfig",
    "IngestOptions",
    "IngestProgress",
    "IngestResult",
    "ShardOptions",
    "ShardWriter",
    "SkippedFile",
    "adapter_names",
    "hash_file",
    "hash_sample_blocks",
    "ingest",
    "is_array_source",
    "iter_blocks",
    "load_adapter",
    "load_adapters",
    "load_shard_format",
    "parse_compression",
    "parse_size",
    "sample_nbytes",
    "shard_format_names",
    "spec_of_value",
]

ADAPTER_GROUP = "simstore.adapters"
FORMAT_GROUP = "simstore.shard_formats"
MiB = 1 << 20
JOURNAL_FORMAT_VERSION = 1


# ---------------------------------------------------------------------------------------
# Array sources: dense fields read in slices
# ---------------------------------------------------------------------------------------
@runtime_checkable
class ArraySource(Protocol):
    """A dense field too large to hold: shape, dtype and reads by slices.

    Adapters yield these instead of numpy arrays for big arrays (an HDF5 dataset, a Zarr
    array, a memory-mapped .npy). ``dtype`` must be a numeric or bool dtype in native byte
    order, and ``__getitem__`` takes a tuple of ``slice`` (step 1), one per axis, and returns
    a numpy array. A source is valid only while the adapter's iterator has not moved on.
    """

    @property
    def shape(self) -> tuple[int, ...]:
        """The array's shape."""
        ...

    @property
    def dtype(self) -> np.dtype[Any]:
        """The array's dtype (numeric or bool, native byte order)."""
        ...

    def __getitem__(self, key: tuple[slice, ...]) -> np.ndarray:
        """The values in a box of slices."""
        ...


def is_array_source(value: object) -> bool:
    """Whether a field value is a lazy :class:`ArraySource` (not an in-memory array)."""
    return not isinstance(value, np.ndarray | np.generic) and isinstance(value, ArraySource)


def _native(arr: np.ndarray) -> np.ndarray:
    arr = np.ascontiguousarray(arr)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return arr


def iter_blocks(array: np.ndarray | ArraySource, max_bytes: int) -> Iterator[np.ndarray]:
    """The array's values as C-ordered, contiguous, native-endian blocks of bounded size.

    Concatenating the blocks' bytes gives the array's C-order bytes. A block spans whole
    trailing axes: the outermost axis whose trailing extent fits in ``max_bytes`` is cut
    into slabs, and the axes before it are walked in order. A block is larger than
    ``max_bytes`` only when one row of the last axis is.
    """
    shape = tuple(int(n) for n in array.shape)
    itemsize = np.dtype(array.dtype).itemsize
    if len(shape) == 0:
        yield _native(np.asarray(array[()]).reshape(()))
        return
    if math.prod(shape) == 0:
        return
    k = len(shape) - 1
    for axis in range(len(shape)):
        if math.prod(shape[axis + 1 :]) * itemsize <= max_bytes:
            k = axis
            break
    row_bytes = max(1, math.prod(shape[k + 1 :]) * itemsize)
    step = max(1, max_bytes // row_bytes)
    tail = tuple(slice(0, n) for n in shape[k + 1 :])
    for outer in np.ndindex(*shape[:k]):
        head = tuple(slice(i, i + 1) for i in outer)
        for start in range(0, shape[k], step):
            box = (*head, slice(start, min(shape[k], start + step)), *tail)
            yield _native(np.asarray(array[box]))


def spec_of_value(name: str, value: object) -> FieldSpec:
    """The :class:`FieldSpec` of a field value, lazy array sources included."""
    if is_array_source(value):
        src: ArraySource = value  # type: ignore[assignment]
        dtype = np.dtype(src.dtype)
        if dtype.kind not in "biuf":
            raise InvalidInputError(f"field {name!r}: unsupported array dtype {dtype}")
        return FieldSpec(name=name, kind="tensor", dtype=str(dtype), ndim=len(src.shape))
    return spec_of(name, value)  # type: ignore[arg-type]


def _put(h: Hasher, data: bytes | memoryview) -> None:
    h.update(struct.pack("<Q", len(data)))
    h.update(data)


def _le_str(dtype: np.dtype[Any]) -> bytes:
    if dtype.byteorder == "|":
        return dtype.str.encode()
    return dtype.newbyteorder("<").str.encode()


BlockObserver = Callable[[str, np.ndarray, tuple[int, ...]], None]
ScalarObserver = Callable[[str, object], None]


def hash_sample_blocks(
    sample: Sample,
    block_bytes: int = 4 * MiB,
    *,
    on_block: BlockObserver | None = None,
    on_scalar: ScalarObserver | None = None,
) -> ObjectId:
    """The content hash of a sample, equal to :func:`simstore.sample.hash_sample`.

    Lazy :class:`ArraySource` fields are read in blocks of ``block_bytes``, so hashing a
    field of any size takes bounded memory. ``on_block(name, block, shape)`` sees every
    tensor block and ``on_scalar(name, value)`` every scalar, so statistics come from the
    same single pass. (This mirrors hash_sample's canonical encoding; a test pins the two
    equal.)
    """
    h = Hasher()
    h.update(b"simstore-sample-v1")
    for name in sorted(sample.fields):
        value = sample.fields[name]
        spec = spec_of_value(name, value)
        _put(h, name.encode("utf-8"))
        _put(h, spec.kind.encode())
        if spec.kind == "tensor":
            arr: np.ndarray | ArraySource = value  # type: ignore[assignment]
            dtype = np.dtype(arr.dtype)
            full = tuple(int(n) for n in arr.shape)
            # hash_sample hashes np.ascontiguousarray(value), which is at least 1-d
            shape = full or (1,)
            _put(h, _le_str(dtype))
            _put(h, struct.pack(f"<{len(shape)}q", *shape))
            h.update(struct.pack("<Q", math.prod(shape) * dtype.itemsize))
            for block in iter_blocks(arr, block_bytes):
                if on_block is not None:
                    on_block(name, block, full)
                if block.dtype.byteorder == ">":
                    block = block.astype(block.dtype.newbyteorder("<"))
                h.update(np.ascontiguousarray(block).data.cast("B"))
        elif spec.kind == "scalar":
            if on_scalar is not None:
                on_scalar(name, value)
            _put(h, spec.dtype.encode())
            _put(
                h,
                np.asarray(value, dtype=spec.dtype)
                .astype(np.dtype(spec.dtype).newbyteorder("<"))
                .tobytes(),
            )
        elif spec.kind == "string":
            _put(h, str(value).encode("utf-8"))
        elif spec.kind == "bytes":
            _put(h, bytes(value))  # type: ignore[arg-type]
        else:
            _put(h, canonical_json(value))
    return h.hexdigest()


def sample_nbytes(sample: Sample) -> int:
    """Logical size of a sample, lazy array sources included (see sample_size_bytes)."""
    return sum(_value_nbytes(v) for v in sample.fields.values())


def _value_nbytes(value: object) -> int:
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if is_array_source(value):
        src: ArraySource = value  # type: ignore[assignment]
        return math.prod(src.shape) * np.dtype(src.dtype).itemsize
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value)
    if isinstance(value, Mapping):
        return len(canonical_json(value))
    return 8


# ---------------------------------------------------------------------------------------
# Shard options and the streaming writer protocol
# ---------------------------------------------------------------------------------------
COMPRESSIONS = ("none", "zstd", "shuffle-zstd")
DEFAULT_COMPRESSION = "shuffle-zstd:1"


def parse_compression(text: str) -> tuple[str, int]:
    """Parse ``none``, ``zstd[:LEVEL]`` or ``shuffle-zstd[:LEVEL]`` (``blosc`` is an alias).

    ``shuffle-zstd`` byte-shuffles float fields before zstd: Parquet's BYTE_STREAM_SPLIT
    encoding, Blosc's shuffle in Zarr. Returns (codec, level); level 0 for ``none``.
    """
    name, _, level_text = text.strip().lower().partition(":")
    name = "shuffle-zstd" if name == "blosc" else name
    if name not in COMPRESSIONS:
        raise InvalidInputError(
            f"invalid compression {text!r}: expected none, zstd[:LEVEL] or shuffle-zstd[:LEVEL]"
        )
    if name == "none":
        if level_text:
            raise InvalidInputError(f"invalid compression {text!r}: 'none' takes no level")
        return name, 0
    try:
        level = int(level_text) if level_text else 3
    except ValueError:
        raise InvalidInputError(f"invalid compression level in {text!r}") from None
    if not 1 <= level <= 19:
        raise InvalidInputError(f"invalid compression level {level} in {text!r}: use 1 to 19")
    return name, level


def parse_size(text: str | int) -> int:
    """Parse a byte size: ``268435456``, ``256MiB``, ``1GiB``, ``64k``; at least 1."""
    if isinstance(text, int):
        value = text
    else:
        s = text.strip().lower().replace(" ", "")
        units = {
            "": 1,
            "b": 1,
            "k": 1 << 10,
            "kb": 1 << 10,
            "kib": 1 << 10,
            "m": MiB,
            "mb": MiB,
            "mib": MiB,
            "g": 1 << 30,
            "gb": 1 << 30,
            "gib": 1 << 30,
        }
        num = s.rstrip("abgikm")
        unit = s[len(num) :]
        try:
            value = int(float(num) * units[unit])
        except (KeyError, ValueError):
            raise InvalidInputError(f"invalid size {text!r}: use e.g. 256MiB, 1GiB") from None
    if value < 1:
        raise InvalidInputError(f"invalid size {text!r}: must be positive")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardOptions:
    """How a shard format writes: compression, Zarr chunking, Parquet row-group size.

    ``chunks`` maps a field name to a Zarr chunk shape; other dense fields get chunks of
    about ``chunk_bytes``. Every value here shapes the shard's bytes, so they are all part of
    the journal digest.
    """

    compression: str = DEFAULT_COMPRESSION
    chunk_bytes: int = 1 * MiB
    chunks: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    row_group_bytes: int = 16 * MiB

    def __post_init__(self) -> None:
        parse_compression(self.compression)
        if self.chunk_bytes < 1 or self.row_group_bytes < 1:
            raise InvalidInputError("chunk_bytes and row_group_bytes must be positive")

    def to_json(self) -> dict[str, Any]:
        """JSON shape (for lineage and the journal digest)."""
        return {
            "compression": self.compression,
            "chunk_bytes": self.chunk_bytes,
            "chunks": {k: list(v) for k, v in sorted(self.chunks.items())},
            "row_group_bytes": self.row_group_bytes,
        }


class ShardWriter(Protocol):
    """An open shard being written sample by sample (the streaming side of a ShardFormat).

    Positions are assigned in ``add`` order from 0. ``close`` finishes the file at the
    path given to ``open_writer`` (``stats``: the shard's field summaries, to embed);
    ``abort`` removes whatever was written.
    """

    def add(self, sample: Sample, *, sample_hash: str, size_bytes: int) -> WrittenSample:
        """Append one sample."""
        ...

    def close(self, stats: Mapping[str, Any] | None = None) -> ShardWriteResult:
        """Finish the shard file."""
        ...

    def abort(self) -> None:
        """Discard the partial shard."""
        ...


# ---------------------------------------------------------------------------------------
# Discovery through entry points
# ---------------------------------------------------------------------------------------
def _entry_points(group: str) -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=group)}


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


def _adapter_of(name: str, ep: Any) -> SourceAdapter:
    obj = ep.load()
    adapter = obj() if isinstance(obj, type) else obj
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
    fmt = eps[name].load()(options or ShardOptions())
    if not isinstance(fmt, ShardFormat):
        raise InvalidInputError(f"entry point {name!r} in {FORMAT_GROUP} is not a ShardFormat")
    return fmt


# ---------------------------------------------------------------------------------------
# Configuration, progress and result
# ---------------------------------------------------------------------------------------
OnError = Literal["fail", "skip"]
Mode = Literal["upsert", "replace"]
NanPolicy = Literal["allow", "error"]


@dataclass(frozen=True, slots=True, kw_only=True)
class IngestConfig:
    """Every option of an ingest (the CLI flags map one to one onto these fields).

    Memory per worker is about ``shard_size`` (a columnar shard is buffered until it is
    written) plus ``dense_threshold`` and ``block_bytes``; it never depends on a source
    file's size. Fields that shape the stored bytes (adapter, its options, format, shard
    options, ``shard_size``, ``dense_threshold``, ``block_bytes``) also key the journal.
    """

    adapter: str = "auto"
    format: str = "parquet"
    workers: int = 1
    on_error: OnError = "fail"
    mode: Mode = "upsert"
    snapshot: bool = False
    message: str | None = None
    branch: str = DEFAULT_BRANCH
    author: str | None = None
    allow_schema_change: bool = False
    nan: NanPolicy = "allow"
    time_window: int | None = None
    stride: int | None = None
    shard_size: int = 256 * MiB
    compression: str = DEFAULT_COMPRESSION
    chunk_bytes: int = 1 * MiB
    chunks: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    row_group_bytes: int = 16 * MiB
    dense_threshold: int = 16 * MiB
    block_bytes: int = 4 * MiB
    adapter_options: Mapping[str, Any] = field(default_factory=dict)
    resume: bool = True
    tmp_dir: str | None = None

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise InvalidInputError(f"invalid workers {self.workers}: must be at least 1")
        for name, allowed in (
            ("on_error", ("fail", "skip")),
            ("mode", ("upsert", "replace")),
            ("nan", ("allow", "error")),
        ):
            if getattr(self, name) not in allowed:
                raise InvalidInputError(
                    f"invalid {name} {getattr(self, name)!r}: expected {' or '.join(allowed)}"
                )
        if self.time_window is not None and self.time_window < 1:
            raise InvalidInputError("time_window must be at least 1")
        if self.stride is not None and (self.stride < 1 or self.time_window is None):
            raise InvalidInputError("stride must be at least 1 and needs time_window")
        for name in (
            "shard_size",
            "chunk_bytes",
            "row_group_bytes",
            "dense_threshold",
            "block_bytes",
        ):
            if int(getattr(self, name)) < 1:
                raise InvalidInputError(f"invalid {name} {getattr(self, name)}: must be positive")
        check_name(self.branch, "branch name")
        self.shard_options()

    def shard_options(self) -> ShardOptions:
        """The options every shard format gets."""
        return ShardOptions(
            compression=self.compression,
            chunk_bytes=self.chunk_bytes,
            chunks={k: tuple(v) for k, v in self.chunks.items()},
            row_group_bytes=self.row_group_bytes,
        )

    def adapter_params(self) -> dict[str, Any]:
        """Options handed to ``SourceAdapter.iter_samples``."""
        params: dict[str, Any] = dict(self.adapter_options)
        params["max_in_memory_bytes"] = self.dense_threshold
        if self.time_window is not None:
            params["time_window"] = self.time_window
            params["stride"] = self.stride or self.time_window
        return params

    def output_params(self) -> dict[str, Any]:
        """Everything that shapes the stored bytes (lineage, and the journal's digest)."""
        return {
            "adapter": self.adapter,
            "adapter_options": _jsonable(self.adapter_params()),
            "format": self.format,
            "shard_options": self.shard_options().to_json(),
            "shard_size": self.shard_size,
            "dense_threshold": self.dense_threshold,
            "block_bytes": self.block_bytes,
        }


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, sort_keys=True, default=str))


class IngestOptions(TypedDict, total=False):
    """Keyword options of :func:`ingest`: the fields of :class:`IngestConfig`."""

    adapter: str
    format: str
    workers: int
    on_error: OnError
    mode: Mode
    snapshot: bool
    message: str | None
    branch: str
    author: str | None
    allow_schema_change: bool
    nan: NanPolicy
    time_window: int | None
    stride: int | None
    shard_size: int
    compression: str
    chunk_bytes: int
    chunks: Mapping[str, tuple[int, ...]]
    row_group_bytes: int
    dense_threshold: int
    block_bytes: int
    adapter_options: Mapping[str, Any]
    resume: bool
    tmp_dir: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class IngestProgress:
    """A progress report, sent after each finished file (in-process) or task (pool)."""

    files_done: int
    files_total: int
    samples: int
    bytes_done: int
    bytes_total: int
    elapsed_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class SkippedFile:
    """A source file left out under ``on_error="skip"``, and why."""

    path: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class IngestResult:
    """What an ingest did (``to_json`` is the ``--json`` summary)."""

    dataset: str
    files: int
    files_ingested: int
    files_reused: int
    files_unchanged: int
    files_skipped: tuple[SkippedFile, ...]
    files_ignored: tuple[str, ...]
    samples: int
    samples_staged: int
    bytes_in: int
    bytes_stored: int
    new_bytes: int
    shards: int
    seconds: float
    engine: str
    workers: int
    staging_id: str | None
    snapshot_id: str | None
    schema: Schema

    def to_json(self) -> dict[str, Any]:
        """The machine-readable summary."""
        mib_s = self.bytes_in / MiB / self.seconds if self.seconds > 0 else 0.0
        return {
            "dataset": self.dataset,
            "files": self.files,
            "files_ingested": self.files_ingested,
            "files_reused": self.files_reused,
            "files_unchanged": self.files_unchanged,
            "skipped": [{"path": s.path, "reason": s.reason} for s in self.files_skipped],
            "ignored": list(self.files_ignored),
            "samples": self.samples,
            "samples_staged": self.samples_staged,
            "bytes_in": self.bytes_in,
            "bytes_stored": self.bytes_stored,
            "new_bytes": self.new_bytes,
            "shards": self.shards,
            "seconds": round(self.seconds, 3),
            "mib_per_s": round(mib_s, 1),
            "engine": self.engine,
            "workers": self.workers,
            "staging_id": self.staging_id,
            "snapshot": self.snapshot_id,
            "schema": [s.to_json() for s in self.schema],
        }


# ---------------------------------------------------------------------------------------
# Discovery of source files
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Source:
    path: str
    key: str
    size: int
    mtime_ns: int


def _head(path: str) -> bytes:
    if os.path.isdir(path):
        return b""
    with open(path, "rb") as f:
        return f.read(64)


def _resolve(adapter: SourceAdapter, path: str, head: bytes) -> SourceAdapter | None:
    resolve = getattr(adapter, "resolve", None)
    if callable(resolve):
        found = resolve(path, head)
        return found if isinstance(found, SourceAdapter) else None
    return adapter if adapter.can_read(path, head) else None


def _stat(path: str) -> tuple[int, int]:
    if os.path.isdir(path):
        size, mtime = 0, 0
        for root, _, files in os.walk(path):
            for name in files:
                st = os.stat(os.path.join(root, name))
                size += st.st_size
                mtime = max(mtime, st.st_mtime_ns)
        return size, mtime
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def _discover(sources: Sequence[str], adapter: SourceAdapter) -> tuple[list[_Source], list[str]]:
    """Source files in key order, and the walked files no adapter reads."""
    found: dict[str, _Source] = {}
    walked: set[str] = set()
    ignored: list[str] = []
    claimed: set[str] = set()

    def add(path: str, key: str) -> None:
        if key in found and found[key].path != path:
            raise InvalidInputError(
                f"two sources map to the key {key!r}: {found[key].path} and {path}"
            )
        size, mtime = _stat(path)
        found[key] = _Source(path, key, size, mtime)

    for src in sources:
        path = os.path.abspath(os.fspath(src))
        if not os.path.exists(path):
            raise InvalidInputError(f"{src}: no such file or directory")
        if os.path.isdir(path) and _resolve(adapter, path, b"") is None:
            for root, dirs, names in os.walk(path):
                dirs.sort()
                keep = []
                for d in dirs:
                    full = os.path.join(root, d)
                    if d.startswith("."):
                        continue
                    if _resolve(adapter, full, b"") is not None:
                        add(full, os.path.relpath(full, path).replace(os.sep, "/"))
                        walked.add(full)
                    else:
                        keep.append(d)
                dirs[:] = keep
                for name in sorted(names):
                    if name.startswith("."):
                        continue
                    full = os.path.join(root, name)
                    if _resolve(adapter, full, _head(full)) is None:
                        ignored.append(full)
                        continue
                    add(full, os.path.relpath(full, path).replace(os.sep, "/"))
                    walked.add(full)
        else:
            add(path, os.path.basename(path))
    for found_src in list(found.values()):
        chosen = _resolve(adapter, found_src.path, _head(found_src.path))
        companions = getattr(chosen, "companions", None)
        if callable(companions):
            claimed.update(os.path.normpath(os.path.abspath(p)) for p in companions(found_src.path))
    files = [s for s in found.values() if not (s.path in walked and s.path in claimed)]
    return sorted(files, key=lambda s: s.key), sorted(ignored)


_HASH_WINDOW = 64 * MiB  # a multiple of mmap.ALLOCATIONGRANULARITY


def hash_file(path: str) -> tuple[ObjectId, int]:
    """xxh3-128 id and size of a local file, equal to :func:`simstore.hashing.hash_file`.

    Hashes memory-mapped windows of 64 MiB, unmapping each before the next: no copy into
    Python buffers (about 8x faster than reading blocks here) and mapped pages never
    exceed one window, so the resident memory stays bounded.
    """
    h = Hasher()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        for start in range(0, size, _HASH_WINDOW):
            length = min(_HASH_WINDOW, size - start)
            with mmap.mmap(f.fileno(), length, access=mmap.ACCESS_READ, offset=start) as m:
                h.update(memoryview(m))
    return h.hexdigest(), size


def _hash_source(path: str) -> tuple[str, int]:
    """Content hash and size of a source file, or of a directory (sorted names and hashes)."""
    if not os.path.isdir(path):
        oid, size = hash_file(path)
        return str(oid), size
    h = Hasher()
    total = 0
    entries = []
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            entries.append((os.path.relpath(full, path).replace(os.sep, "/"), full))
    for rel, full in sorted(entries):
        oid, size = hash_file(full)
        total += size
        h.update(f"{rel}\0{oid}\0{size}\n".encode())
    return str(h.hexdigest()), total


def _plan_tasks(files: Sequence[_Source], shard_size: int) -> list[list[_Source]]:
    """Runs of files in key order with about ``shard_size`` source bytes each."""
    tasks: list[list[_Source]] = []
    current: list[_Source] = []
    acc = 0
    for f in files:
        current.append(f)
        acc += f.size
        if acc >= shard_size:
            tasks.append(current)
            current, acc = [], 0
    if current:
        tasks.append(current)
    return tasks


# ---------------------------------------------------------------------------------------
# Worker side: files -> samples -> shards
# ---------------------------------------------------------------------------------------
Row = tuple[str, str, str, int, int]  # key, sample hash, shard id, position, size


@dataclass(frozen=True, slots=True)
class _Context:
    """What a worker needs; pickles (the store does) so a process pool can ship it."""

    store: ObjectStore
    dataset: str
    config: IngestConfig
    base_schema: tuple[FieldSpec, ...]
    params_digest: str


@dataclass(slots=True)
class _FileResult:
    path: str
    key: str
    size_bytes: int
    source_hash: str = ""
    adapter: str = ""
    adapter_version: str = ""
    rows: list[Row] = field(default_factory=list)
    schema: list[dict[str, Any]] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    reused: bool = False
    source_object: str | None = None
    new_bytes: int = 0


@dataclass(slots=True)
class _TaskResult:
    files: list[_FileResult]
    shards: dict[str, int]
    new_bytes: int


class _BufferedWriter:
    """A ShardWriter over a format that only has ``write``: buffers, then writes."""

    def __init__(self, fmt: ShardFormat, path: str) -> None:
        self._fmt, self._path = fmt, path
        self._samples: list[Sample] = []
        self._written: list[WrittenSample] = []

    def add(self, sample: Sample, *, sample_hash: str, size_bytes: int) -> WrittenSample:
        values: Mapping[str, Any] = sample.fields
        fields = {
            n: (np.asarray(v[tuple(slice(0, d) for d in v.shape)]) if is_array_source(v) else v)
            for n, v in values.items()
        }
        self._samples.append(Sample(sample.key, fields))
        ws = WrittenSample(
            key=sample.key,
            sample_hash=sample_hash,
            position=len(self._written),
            size_bytes=size_bytes,
        )
        self._written.append(ws)
        return ws

    def close(self, stats: Mapping[str, Any] | None = None) -> ShardWriteResult:
        return self._fmt.write(self._samples, self._path)

    def abort(self) -> None:
        self._samples = []
        if os.path.exists(self._path):
            os.unlink(self._path)


@dataclass(slots=True)
class _Builder:
    seq: int
    format: str
    path: str
    writer: Any
    stats: StatsAccumulator
    specs: dict[str, FieldSpec] = field(default_factory=dict)
    size_bytes: int = 0
    count: int = 0


class _TaskRunner:
    """Turns one task's files into shards; owns the open shard writers and temp files."""

    def __init__(
        self,
        ctx: _Context,
        progress: Callable[[int, int], None] | None = None,
        plugins: tuple[SourceAdapter, dict[str, ShardFormat]] | None = None,
    ):
        self.ctx = ctx
        self.cfg = ctx.config
        self.progress = progress
        self.adapter, self.formats = plugins or _plugins(self.cfg)
        scratch = self.cfg.tmp_dir
        if scratch is None and isinstance(ctx.store, SupportsMoveFile):
            # build shards on the store's filesystem so storing one is a link, not a copy
            scratch = ctx.store.scratch_dir()
        self.tmp = tempfile.mkdtemp(prefix="simstore-ingest-", dir=scratch)
        self.open: dict[str, _Builder] = {}
        self.shard_of: dict[int, str] = {}
        self.shards: dict[str, int] = {}
        self.new_bytes = 0
        self._seq = 0
        self.run_specs: dict[str, FieldSpec] = {}

    # -- shards ------------------------------------------------------------------------
    def _builder(self, kind: str) -> _Builder:
        b = self.open.get(kind)
        if b is None:
            fmt = self.formats[kind]
            path = os.path.join(self.tmp, f"{self._seq}.{kind}")
            opener = getattr(fmt, "open_writer", None)
            writer = opener(path) if callable(opener) else _BufferedWriter(fmt, path)
            b = _Builder(self._seq, kind, path, writer, StatsAccumulator())
            self._seq += 1
            self.open[kind] = b
        return b

    def _close(self, kind: str) -> None:
        b = self.open.pop(kind)
        b.writer.close(stats=b.stats.to_json())
        oid, size = hash_file(b.path)
        store = self.ctx.store
        if isinstance(store, SupportsMoveFile):
            if store.move_file(object_key(oid), b.path):  # consumes b.path
                self.new_bytes += size
        else:
            if store.put_file(object_key(oid), b.path):
                self.new_bytes += size
            os.unlink(b.path)
        self.shard_of[b.seq] = str(oid)
        self.shards[str(oid)] = size

    def abort(self) -> None:
        for b in self.open.values():
            b.writer.abort()
        self.open.clear()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- files -------------------------------------------------------------------------
    def run(self, files: Sequence[_Source]) -> _TaskResult:
        results: list[_FileResult] = []
        slots: list[list[tuple[int, int, Row]]] = []
        try:
            for src in files:
                res, raw = self._file(src)
                results.append(res)
                slots.append(raw)
                if self.progress is not None:
                    self.progress(src.size, len(raw) or len(res.rows))
        except SourceError:
            # keep what the files before the bad one produced: store their shards and
            # journal them, so the re-run after the fix redoes none of them
            try:
                self._finish(files, results, slots)
            except BaseException:
                self.abort()
            raise
        except BaseException:
            self.abort()
            raise
        self._finish(files, results, slots)
        return _TaskResult(results, self.shards, self.new_bytes)

    def _finish(
        self,
        files: Sequence[_Source],
        results: Sequence[_FileResult],
        slots: Sequence[list[tuple[int, int, Row]]],
    ) -> None:
        """Close the open shards, give finished files their rows, journal them."""
        try:
            for kind in list(self.open):
                self._close(kind)
        except BaseException:
            self.abort()
            raise
        shutil.rmtree(self.tmp, ignore_errors=True)
        for src, res, raw in zip(files, results, slots, strict=False):
            if res.error or res.reused:
                continue
            res.rows = [
                (k, h, self.shard_of[seq], pos, size) for seq, _, (k, h, _s, pos, size) in raw
            ]
            _journal_write(self.ctx, src, res)

    def _file(self, src: _Source) -> tuple[_FileResult, list[tuple[int, int, Row]]]:
        res = _FileResult(path=src.path, key=src.key, size_bytes=src.size)
        if self.cfg.resume:
            reused = _journal_read(self.ctx, src)
            if reused is not None:
                return reused, []
        try:
            return self._ingest(src, res)
        except SourceError as exc:
            # one line, whatever a library put in its message
            message = " ".join(exc.message.split())
            if self.cfg.on_error == "fail":
                if message == exc.message:
                    raise
                raise SourceError(message) from exc
            res.error = message
            return res, []

    def _ingest(
        self, src: _Source, res: _FileResult
    ) -> tuple[_FileResult, list[tuple[int, int, Row]]]:
        path = src.path
        try:
            adapter = _resolve(self.adapter, path, _head(path))
        except OSError as exc:
            raise SourceError(f"{path}: unreadable: {exc}") from exc
        if adapter is None:
            raise SourceError(f"{path}: no installed adapter reads this file")
        res.adapter, res.adapter_version = adapter.name, str(adapter.version)
        res.source_hash, res.size_bytes = _hash_source(path)
        options = self.cfg.adapter_params()
        options["source_hash"] = res.source_hash
        options["tmp_dir"] = self.tmp
        specs: dict[str, FieldSpec] = {}
        # earlier files of this task count as the schema too: they share its shards
        base = {s.name: s for s in self.ctx.base_schema}
        base.update(self.run_specs)
        file_stats = StatsAccumulator()
        raw: list[tuple[int, int, Row]] = []
        keys: set[str] = set()
        samples = adapter.iter_samples(path, src.key, options)
        while True:
            try:
                sample = next(samples)
            except StopIteration:
                break
            except SimstoreError as exc:
                if isinstance(exc, SourceError):
                    raise
                raise SourceError(f"{path}: {exc}") from exc
            except Exception as exc:  # an adapter failing on a file means a bad file
                raise SourceError(f"{path}: {type(exc).__name__}: {exc}") from exc
            if not isinstance(sample.key, str) or not sample.key or sample.key in keys:
                raise SourceError(
                    f"{path}: the adapter gave a missing or repeated key {sample.key!r}"
                )
            keys.add(sample.key)
            self._check_fields(path, sample, specs, base)
            sample_stats = StatsAccumulator()
            try:
                digest = hash_sample_blocks(
                    sample,
                    self.cfg.block_bytes,
                    on_block=sample_stats.add_array,
                    on_scalar=sample_stats.add_scalar,  # type: ignore[arg-type]
                )
            except SourceError:
                raise
            except (InvalidInputError, ValueError, TypeError) as exc:
                raise SourceError(f"{path}: sample {sample.key!r}: {exc}") from exc
            fields_stats = sample_stats.to_json()
            if self.cfg.nan == "error":
                for name, s in fields_stats.items():
                    nan, inf = sum(s["nan_count"]), sum(s.get("inf_count", [0]))
                    if nan or inf:
                        raise SourceError(
                            f"{path}: field {name!r}: {nan} NaN and {inf} Inf values in sample "
                            f"{sample.key!r} (--nan error)"
                        )
            size = sample_nbytes(sample)
            kind = self._route(sample)
            b = self._builder(kind)
            if any(b.specs.get(n, s) != s for n, s in specs.items() if n in sample.fields):
                # an accepted type change (allow_schema_change) starts a new shard
                self._close(kind)
                b = self._builder(kind)
            b.specs.update({n: specs[n] for n in sample.fields})
            ws = b.writer.add(sample, sample_hash=digest, size_bytes=size)
            raw.append((b.seq, ws.position, (sample.key, str(digest), "", ws.position, size)))
            b.stats.merge(fields_stats)
            file_stats.merge(fields_stats)
            b.size_bytes += size
            b.count += 1
            if b.size_bytes >= self.cfg.shard_size:
                self._close(kind)
        if getattr(adapter, "stores_source", False) and not os.path.isdir(path):
            if self.ctx.store.put_file(object_key(res.source_hash), path):
                res.new_bytes += res.size_bytes
            res.source_object = res.source_hash
        res.schema = [specs[n].to_json() for n in sorted(specs)]  # type: ignore[misc]
        res.stats = file_stats.to_json()
        self.run_specs.update(specs)
        return res, raw

    def _route(self, sample: Sample) -> str:
        if self.cfg.format == "zarr":
            return "zarr"
        for value in sample.fields.values():
            if is_array_source(value) or (
                isinstance(value, np.ndarray) and value.nbytes > self.cfg.dense_threshold
            ):
                return "zarr"
        return self.cfg.format

    def _check_fields(
        self, path: str, sample: Sample, specs: dict[str, FieldSpec], base: Mapping[str, FieldSpec]
    ) -> None:
        names = set(sample.fields)
        for name in sorted(names):
            parts = name.split("/")
            for i in range(1, len(parts)):
                if "/".join(parts[:i]) in names:
                    raise SourceError(
                        f"{path}: field {name!r} lies under field {'/'.join(parts[:i])!r}; a "
                        "field cannot also be a group of fields"
                    )
            try:
                spec = spec_of_value(name, sample.fields[name])
            except InvalidInputError as exc:
                raise SourceError(f"{path}: field {name!r}: {exc}") from exc
            prev = specs.get(name) or base.get(name)
            if prev is not None and prev != spec and not self.cfg.allow_schema_change:
                raise SourceError(
                    f"{path}: field {name!r} changes type from {prev.describe()} to "
                    f"{spec.describe()} (use --allow-schema-change to accept)"
                )
            specs[name] = spec


def _plugins(cfg: IngestConfig) -> tuple[SourceAdapter, dict[str, ShardFormat]]:
    """The adapter and the shard formats (the chosen one, and Zarr for dense fields)."""
    opts = cfg.shard_options()
    formats = {cfg.format: load_shard_format(cfg.format, opts)}
    if cfg.format != "zarr":
        formats["zarr"] = load_shard_format("zarr", opts)
    return load_adapter(cfg.adapter), formats


def _run_task(
    ctx: _Context,
    files: Sequence[_Source],
    plugins: tuple[SourceAdapter, dict[str, ShardFormat]],
) -> _TaskResult:
    """Process-pool entry point: one task in a worker process.

    The adapter and formats travel pickled with the task, so a worker does not scan the
    installed packages' entry points again.
    """
    return _TaskRunner(ctx, plugins=plugins).run(files)


# ---------------------------------------------------------------------------------------
# The journal: finished files, so a re-run redoes none of them
# ---------------------------------------------------------------------------------------
def _journal_key(ctx: _Context, src: _Source) -> str:
    digest = hash_bytes(
        canonical_json(
            {
                "v": JOURNAL_FORMAT_VERSION,
                "key": src.key,
                "size": src.size,
                "mtime_ns": src.mtime_ns,
                "params": ctx.params_digest,
            }
        )
    )
    return f"journal/{ctx.dataset}/{digest}"


def _journal_write(ctx: _Context, src: _Source, res: _FileResult) -> None:
    if not ctx.config.resume:
        return
    record = {
        "format_version": JOURNAL_FORMAT_VERSION,
        "kind": "ingest-journal",
        "key": res.key,
        "path": res.path,
        "size_bytes": res.size_bytes,
        "source_hash": res.source_hash,
        "adapter": res.adapter,
        "adapter_version": res.adapter_version,
        "rows": [list(r) for r in res.rows],
        "schema": res.schema,
        "stats": res.stats,
        "source_object": res.source_object,
    }
    ctx.store.put(_journal_key(ctx, src), canonical_json(record))


def _journal_read(ctx: _Context, src: _Source) -> _FileResult | None:
    try:
        rec = json.loads(ctx.store.get(_journal_key(ctx, src)))
    except NotFoundError:
        return None
    except ValueError:
        return None
    if rec.get("format_version") != JOURNAL_FORMAT_VERSION or rec.get("kind") != "ingest-journal":
        return None
    rows: list[Row] = [(str(k), str(h), str(s), int(p), int(b)) for k, h, s, p, b in rec["rows"]]
    needed = {r[2] for r in rows} | ({rec["source_object"]} if rec.get("source_object") else set())
    if not all(ctx.store.exists(object_key(oid)) for oid in needed):
        return None  # gc removed what it pointed to: redo the file
    return _FileResult(
        path=src.path,
        key=src.key,
        size_bytes=int(rec["size_bytes"]),
        source_hash=str(rec["source_hash"]),
        adapter=str(rec["adapter"]),
        adapter_version=str(rec["adapter_version"]),
        rows=rows,
        schema=list(rec["schema"]),
        stats=dict(rec["stats"]),
        reused=True,
        source_object=rec.get("source_object"),
    )


# ---------------------------------------------------------------------------------------
# Driver: run the tasks, check the whole run, stage (and commit) once
# ---------------------------------------------------------------------------------------
def _run_tasks(
    ctx: _Context,
    tasks: Sequence[Sequence[_Source]],
    report: Callable[[int, int, int], None],
    plugins: tuple[SourceAdapter, dict[str, ShardFormat]],
) -> list[_TaskResult]:
    """Run every task, in process or on a spawn-started process pool; results in task order."""
    workers = min(ctx.config.workers, len(tasks))
    if workers <= 1:
        return [_TaskRunner(ctx, lambda b, s: report(1, b, s), plugins).run(t) for t in tasks]
    results: list[_TaskResult | None] = [None] * len(tasks)
    # spawn, not fork: the parent may hold threads (zarr's event loop, a store's pool)
    pool = cf.ProcessPoolExecutor(
        max_workers=workers, mp_context=multiprocessing.get_context("spawn")
    )
    try:
        queue = iter(enumerate(tasks))
        pending: dict[cf.Future[_TaskResult], int] = {}

        def submit() -> None:
            for i, task in queue:
                pending[pool.submit(_run_task, ctx, list(task), plugins)] = i
                if len(pending) >= 2 * workers:
                    return

        submit()
        while pending:
            done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
            for fut in done:
                i = pending.pop(fut)
                try:
                    res = fut.result()
                except cf.process.BrokenProcessPool as exc:
                    raise SimstoreError(
                        f"an ingest worker process died ({exc}); out of memory? Lower "
                        "--workers or --shard-size; a re-run resumes where this one stopped"
                    ) from exc
                results[i] = res
                report(
                    len(tasks[i]),
                    sum(f.size for f in tasks[i]),
                    sum(len(f.rows) for f in res.files),
                )
            submit()
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return [r for r in results if r is not None]


def _head_hashes(catalog: Catalog, snap: Any, keys: Sequence[str]) -> dict[str, str]:
    """Sample hashes the snapshot holds for sorted ``keys``; reads only the parts they fall in."""
    import bisect

    parts = snap.parts
    firsts = [p.first_key for p in parts]
    needed = set()
    for key in keys:
        i = bisect.bisect_right(firsts, key) - 1
        if i >= 0 and key <= parts[i].last_key:
            needed.add(i)
    wanted = set(keys)
    out: dict[str, str] = {}
    for i in sorted(needed):
        table = catalog.read_part(parts[i], snapshot=snap.id)
        for k, h in zip(
            table.column("key").to_pylist(), table.column("sample_hash").to_pylist(), strict=True
        ):
            if k in wanted:
                out[k] = h.hex()
    return out


def _rows_table(rows: Sequence[Row]) -> pa.Table:
    return pa.table(
        {
            "key": pa.array([r[0] for r in rows], pa.string()),
            "sample_hash": pa.array([bytes.fromhex(r[1]) for r in rows], pa.binary(16)),
            "shard": pa.array([r[2] for r in rows], pa.string()),
            "position": pa.array([r[3] for r in rows], pa.int64()),
            "size_bytes": pa.array([r[4] for r in rows], pa.int64()),
        },
        schema=MANIFEST_SCHEMA,
    )


def ingest(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    dataset: str,
    store: str | os.PathLike[str] | ObjectStore | Catalog,
    config: IngestConfig | None = None,
    progress: Callable[[IngestProgress], None] | None = None,
    **options: Unpack[IngestOptions],
) -> IngestResult:
    """Ingest source files or folders into ``dataset``; stage the change, optionally commit.

    ``options`` override fields of ``config`` (see :class:`IngestConfig`), so a pipeline
    writes ``simstore.ingest(["runs/"], dataset="cfd", store="s3://b/p", workers=8,
    snapshot=True, message="nightly")``. Call it under ``if __name__ == "__main__":`` when
    ``workers > 1``: the process pool starts workers with ``spawn``.

    Raises :class:`SourceError` for a bad file (naming file and field) unless
    ``on_error="skip"``, :class:`InvalidInputError` for bad options; a failed run stages
    nothing. Re-running after a failure or a finished run redoes no finished file.
    """
    t0 = time.perf_counter()
    try:
        cfg = dataclasses.replace(config or IngestConfig(), **options)
    except TypeError as exc:
        raise InvalidInputError(f"invalid ingest option: {exc}") from None
    check_name(dataset, "dataset name")
    catalog = store if isinstance(store, Catalog) else Catalog.open(store)
    if cfg.workers > 1 and catalog.store.url.startswith("memory://"):
        raise InvalidInputError("a memory:// store lives in one process: use workers=1")
    srcs = [sources] if isinstance(sources, str | os.PathLike) else list(sources)
    if not srcs:
        raise InvalidInputError("no sources given")
    plugins = _plugins(cfg)
    files, ignored = _discover([os.fspath(s) for s in srcs], plugins[0])
    if not files:
        raise InvalidInputError(
            f"no source files found in {', '.join(os.fspath(s) for s in srcs)}"
            + (f" ({len(ignored)} files no adapter reads)" if ignored else "")
        )
    head_id, _ = catalog.branches(dataset).get_versioned(cfg.branch)
    head = catalog.snapshot(head_id) if head_id else None
    ctx = _Context(
        store=catalog.store,
        dataset=dataset,
        config=cfg,
        base_schema=tuple(head.schema) if head else (),
        params_digest=hash_bytes(canonical_json(cfg.output_params())),
    )
    tasks = _plan_tasks(files, cfg.shard_size)
    totals = {"files": 0, "bytes": 0, "samples": 0}
    bytes_total = sum(f.size for f in files)

    def report(n_files: int, n_bytes: int, n_samples: int) -> None:
        totals["files"] += n_files
        totals["bytes"] += n_bytes
        totals["samples"] += n_samples
        if progress is not None:
            progress(
                IngestProgress(
                    files_done=totals["files"],
                    files_total=len(files),
                    samples=totals["samples"],
                    bytes_done=totals["bytes"],
                    bytes_total=bytes_total,
                    elapsed_s=time.perf_counter() - t0,
                )
            )

    results = _run_tasks(ctx, tasks, report, plugins)
    return _finish(catalog, ctx, files, ignored, results, head, t0)


def _finish(
    catalog: Catalog,
    ctx: _Context,
    files: Sequence[_Source],
    ignored: Sequence[str],
    results: Sequence[_TaskResult],
    head: Any,
    t0: float,
) -> IngestResult:
    """Check the run as a whole (schema across files, unique keys), then stage and commit."""
    cfg = ctx.config
    schema: dict[str, FieldSpec] = {s.name: s for s in ctx.base_schema}
    skipped: list[SkippedFile] = []
    accepted: list[_FileResult] = []
    owner: dict[str, str] = {}
    file_results = [f for r in results for f in r.files]

    def reject(res: _FileResult, message: str) -> None:
        if cfg.on_error == "fail":
            raise SourceError(message)
        skipped.append(SkippedFile(path=res.path, reason=message))

    for res in file_results:
        if res.error is not None:
            skipped.append(SkippedFile(path=res.path, reason=res.error))
            continue
        specs = [FieldSpec.from_json(s) for s in res.schema]
        bad = next((s for s in specs if s.name in schema and schema[s.name] != s), None)
        if bad is not None and not cfg.allow_schema_change:
            reject(
                res,
                f"{res.path}: field {bad.name!r} changes type from "
                f"{schema[bad.name].describe()} to {bad.describe()} "
                "(use --allow-schema-change to accept)",
            )
            continue
        dup = next((r[0] for r in res.rows if r[0] in owner), None)
        if dup is not None:
            reject(res, f"{res.path}: sample key {dup!r} is also produced by {owner[dup]}")
            continue
        for r in res.rows:
            owner[r[0]] = res.path
        schema = {
            s.name: s
            for s in merge_schema(
                tuple(schema.values()),
                tuple(specs),
                source=res.path,
                allow_change=cfg.allow_schema_change,
            )
        }
        accepted.append(res)
    unchanged: set[str] = set()
    known: dict[str, str] = {}
    if head is not None and cfg.mode == "upsert" and accepted:
        known = _head_hashes(catalog, head, sorted(owner))
        for res in accepted:
            if res.rows and all(known.get(k) == h for k, h, *_ in res.rows):
                unchanged.add(res.path)
    staged = [r for r in accepted if r.path not in unchanged]
    rows = [row for r in staged for row in r.rows]
    # checked against the head: no staged key exists there, so merged statistics stay exact
    new_keys_in = head.id if head is not None and not any(r[0] in known for r in rows) else None
    shards = sorted({row[2] for row in rows})
    new_bytes = sum(r.new_bytes for r in results) + sum(f.new_bytes for f in file_results)
    staging_id: str | None = None
    snapshot_id: str | None = None
    final_schema = tuple(schema[n] for n in sorted(schema))
    if staged:
        staging_id, snapshot_id, extra = _stage(
            catalog, ctx, staged, rows, shards, final_schema, new_keys_in
        )
        new_bytes += extra
    elif cfg.snapshot and head is not None:
        snapshot_id = head.id
    written = {oid: size for r in results for oid, size in r.shards.items()}
    return IngestResult(
        dataset=ctx.dataset,
        files=len(files),
        files_ingested=sum(1 for r in accepted if not r.reused),
        files_reused=sum(1 for r in accepted if r.reused),
        files_unchanged=len(unchanged),
        files_skipped=tuple(skipped),
        files_ignored=tuple(ignored),
        samples=sum(len(r.rows) for r in accepted),
        samples_staged=len(rows),
        bytes_in=sum(r.size_bytes for r in file_results),
        bytes_stored=sum(written.values()),
        new_bytes=new_bytes,
        shards=len(written),
        seconds=time.perf_counter() - t0,
        engine="local" if min(cfg.workers, len(results)) <= 1 else "process-pool",
        workers=cfg.workers,
        staging_id=staging_id,
        snapshot_id=snapshot_id,
        schema=final_schema,
    )


def _stage(
    catalog: Catalog,
    ctx: _Context,
    staged: Sequence[_FileResult],
    rows: Sequence[Row],
    shards: Sequence[str],
    schema: Schema,
    new_keys_in: str | None,
) -> tuple[str, str | None, int]:
    """Stage the rows (reusing an identical pending entry) and commit when asked.

    ``new_keys_in``: the snapshot every staged key was checked to be absent from; the
    commit trusts it (skipping its own key-range test) only when that is its parent.
    """
    cfg = ctx.config
    rows_digest = hash_bytes(canonical_json([list(r) for r in sorted(rows)]))
    sources = [
        {
            "key": r.key,
            "path": r.path,
            "hash": r.source_hash,
            "size": r.size_bytes,
            "adapter": r.adapter,
        }
        for r in staged
    ]
    sources_id, sources_new = catalog.put_object(canonical_json(sources))
    extra = len(canonical_json(sources)) if sources_new else 0
    objects = sorted({sources_id, *(r.source_object for r in staged if r.source_object)})
    stats = merge_stats([r.stats for r in staged])
    lineage = {
        "kind": "ingest",
        "adapter": cfg.adapter,
        "adapters": {r.adapter: r.adapter_version for r in staged},
        "parameters": cfg.output_params(),
        "engine": "local" if cfg.workers == 1 else "process-pool",
        "workers": cfg.workers,
        "sources": {
            "object": sources_id,
            "files": len(staged),
            "bytes": sum(r.size_bytes for r in staged),
        },
        "objects": objects,
        "rows_digest": rows_digest,
    }
    entry = next(
        (
            e
            for e in catalog.staged(ctx.dataset)
            if e.lineage.get("rows_digest") == rows_digest and e.mode == cfg.mode
        ),
        None,
    )
    if entry is None:
        entry = catalog.stage(
            ctx.dataset,
            changes=_rows_table(rows),
            shards=shards,
            schema=schema,
            stats={"fields": stats, "exact": True, "new_keys_in": new_keys_in},
            lineage=lineage,
            mode=cfg.mode,
        )
    snapshot_id: str | None = None
    if cfg.snapshot:
        message = cfg.message or f"ingest {len(staged)} files ({len(rows)} samples)"
        commit = catalog.commit(
            ctx.dataset,
            message=message,
            branch=cfg.branch,
            author=cfg.author,
            staging_ids=[entry.id],
            allow_schema_change=cfg.allow_schema_change,
        )
        snapshot_id = commit.snapshot_id
    return entry.id, snapshot_id, extra


class _CallableModule(types.ModuleType):
    """Makes ``simstore.ingest(...)`` work even after the submodule itself was imported.

    ``simstore`` exports the function ``ingest`` lazily, but importing the submodule
    ``simstore.ingest`` rebinds that attribute to this module; calling the module calls
    the function, so both spellings keep working.
    """

    def __call__(
        self,
        sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        **kwargs: Any,
    ) -> IngestResult:
        return ingest(sources, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
