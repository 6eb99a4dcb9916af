"""Zarr v3 shards: dense N-d fields in chunks, in one uncompressed (stored) zip object.

Layout inside the zip (a Zarr v3 hierarchy; stock zarr-python opens it with
``zarr.open_group(zarr.storage.ZipStore(path, mode="r"), mode="r")``)::

    zarr.json                  root group: simstore attributes (keys, schema, statistics)
                               and consolidated metadata of every node below
    <position>/zarr.json       one group per sample; attributes hold its key, scalars,
                               strings and JSON fields
    <position>/<field>/...     one array per tensor or bytes field; a field name with '/'
                               (``cells/triangle``, ``group/pressure``) nests groups

The writer is simstore's own, not zarr-python's: it streams each array chunk by chunk
(a lazy source is read a slab of chunks at a time, at most ``SLAB_CHUNKS`` chunks' bytes,
so a field of any size takes bounded memory), writes zip entries in a fixed order with
fixed timestamps, and so gives equal bytes for equal samples. Entries are stored, not
deflated, so a reader can fetch a chunk with one ranged read. Codecs: ``bytes`` (little
endian), then ``zstd`` or, for float fields under ``shuffle-zstd``, ``blosc`` (zstd with
byte shuffle), all standard Zarr v3 codecs. Reads go straight to the zip entries of the
chunks a request touches (see :class:`ZarrShardReader`); ``array()`` hands out
zarr-python's arrays.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import struct
import threading
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from simstore.errors import FormatError, InvalidInputError
from simstore.ingest import (
    ShardOptions,
    hash_sample_blocks,
    parse_compression,
    sample_nbytes,
    spec_of_value,
)
from simstore.protocols import ShardWriteResult, WrittenSample
from simstore.sample import FieldSpec, FieldValue, Sample, Schema

from . import _zip
from ._arrow import SHARD_FORMAT_VERSION, scalar_out
from ._columnar import write_error
from ._zip import MAGIC, ZipEntry, crc32

__all__ = ["ZarrFormat", "ZarrShardReader", "ZarrShardWriter", "auto_chunks"]

_EPOCH = (1980, 1, 1, 0, 0, 0)


def _zarr() -> Any:
    try:
        import zarr
    except ImportError as exc:  # pragma: no cover - zarr is a core dependency
        raise ImportError("Zarr shards need zarr-python 3: pip install 'zarr>=3'") from exc
    return zarr


CONTIGUOUS_FIELD_CHUNKS = 8
"""A field of at most this many target chunks is chunked in C order (see ``auto_chunks``)."""


def auto_chunks(shape: Sequence[int], itemsize: int, target_bytes: int) -> tuple[int, ...]:
    """A chunk shape of at most about ``target_bytes`` for a field of ``shape``.

    A field of at most ``CONTIGUOUS_FIELD_CHUNKS`` target chunks (8 MiB by default), which
    a training job reads whole, gets chunks that are contiguous runs of the C-order array
    (``[1, ..., 1, k, n, ..., n]``, ``k`` dividing its axis): a whole read then lands
    each chunk straight in its place in the batch, with no gather, and a window along the
    leading (time) axis reads whole chunks. A larger field halves its longest axis until
    a chunk fits, so chunks stay near-cubic and a crop along any axis of a big grid reads
    little it does not need.
    """
    dims = [max(1, int(n)) for n in shape]
    if math.prod(dims) * itemsize <= CONTIGUOUS_FIELD_CHUNKS * target_bytes:
        chunk = list(dims)
        for i in range(len(dims)):
            rest = math.prod(dims[i + 1 :]) * itemsize
            if rest * dims[i] <= target_bytes:
                break
            if rest <= target_bytes:
                chunk[i] = _run_length(dims[i], target_bytes // rest)
                break
            chunk[i] = 1
        return tuple(chunk)
    chunk = list(dims)
    while math.prod(chunk) * itemsize > target_bytes and max(chunk, default=1) > 1:
        i = int(np.argmax(chunk))
        chunk[i] = (chunk[i] + 1) // 2
    return tuple(chunk)


SLAB_CHUNKS = 64
"""A Zarr writer reads a field at most ``SLAB_CHUNKS * chunk_bytes`` at a time."""


def slab_axes(shape: Sequence[int], chunk: Sequence[int], itemsize: int, limit: int) -> int:
    """How many leading axes the writer steps through chunk by chunk, reading slabs.

    A slab spans one chunk on each of the first ``d`` axes and the whole field on the
    rest; ``d`` is the fewest leading axes whose slabs fit in ``limit`` bytes (at most
    every axis: one chunk per read). A slab over whole trailing axes is one contiguous
    read of a C-ordered source, and each of its chunks is cut from memory: a source
    chunked by time step (an HDF5 dataset's ``(1, ny, nx)``) is read once, where reading
    it box by box read each of its chunks once per box (16x more with ``(16, 128,
    128)`` boxes of ``(64, 512, 512)`` float32).
    """
    for d in range(len(shape) + 1):
        if math.prod(chunk[:d]) * math.prod(shape[d:]) * itemsize <= limit:
            return d
    return len(shape)


def _run_length(n: int, fit: int) -> int:
    """Rows per chunk along an axis of ``n``.

    The largest divisor of ``n`` up to ``fit`` (no padded edge chunk), unless that is
    under half of ``fit``: then ``fit``, with a padded edge chunk.
    """
    best = max(
        (d for i in range(1, math.isqrt(n) + 1) if n % i == 0 for d in (i, n // i) if d <= fit),
        default=1,
    )
    return best if 2 * best >= fit else fit


def _fill(dtype: np.dtype[Any]) -> Any:
    if dtype.kind == "b":
        return False
    if dtype.kind == "f":
        return 0.0
    return 0


def _json_scalar(value: Any, dtype: str) -> Any:
    v = np.asarray(value, dtype=dtype).item()
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    return v


def _scalar_from_json(value: Any, dtype: str) -> Any:
    if isinstance(value, str):
        value = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[value]
    return scalar_out(np.asarray(value, dtype=dtype)[()], dtype)


class _Codec:
    """Chunk encoder for one array: its Zarr v3 codec list and the bytes it produces."""

    def __init__(self, compression: str, dtype: np.dtype[Any]) -> None:
        codec, level = parse_compression(compression)
        self.codecs: list[dict[str, Any]] = (
            [{"name": "bytes", "configuration": {"endian": "little"}}]
            if dtype.itemsize > 1
            else [{"name": "bytes"}]
        )
        self._encode: Any = None
        if codec == "shuffle-zstd" and dtype.kind == "f":
            from numcodecs import Blosc

            self.codecs.append(
                {
                    "name": "blosc",
                    "configuration": {
                        "typesize": dtype.itemsize,
                        "cname": "zstd",
                        "clevel": level,
                        "shuffle": "shuffle",
                        "blocksize": 0,
                    },
                }
            )
            self._encode = Blosc(
                cname="zstd", clevel=level, shuffle=Blosc.SHUFFLE, blocksize=0
            ).encode
        elif codec != "none":
            from numcodecs import Zstd

            self.codecs.append(
                {"name": "zstd", "configuration": {"level": level, "checksum": False}}
            )
            self._encode = Zstd(level=level, checksum=False).encode

    def encode(self, chunk: np.ndarray) -> bytes | memoryview:
        raw = np.ascontiguousarray(chunk.astype(chunk.dtype.newbyteorder("<"), copy=False))
        if self._encode is None:
            return raw.reshape(-1).view(np.uint8).data  # the zip entry's bytes, uncopied
        return bytes(self._encode(raw))


class ZarrShardWriter:
    """Writes samples into a deterministic zip of a Zarr v3 hierarchy, chunk by chunk."""

    def __init__(self, path: str, options: ShardOptions) -> None:
        self.path = path
        self.options = options
        try:
            self._file = _zip.HashingFile(path)
        except OSError as exc:
            raise write_error(path, exc) from exc
        self._zip = zipfile.ZipFile(
            self._file, "w", compression=zipfile.ZIP_STORED, allowZip64=True
        )
        self._nodes: dict[str, dict[str, Any]] = {}
        self._written: list[WrittenSample] = []
        self._specs: dict[str, FieldSpec] = {}

    def _entry(self, name: str, data: bytes | memoryview) -> None:
        info = zipfile.ZipInfo(name, date_time=_EPOCH)
        info.compress_type = zipfile.ZIP_STORED
        info.create_system = 3
        info.external_attr = 0o100644 << 16
        try:
            _zip.write_stored(self._zip, info, data)
        except OSError as exc:  # a full disk: the caller aborts the shard
            raise write_error(self.path, exc) from exc

    def _node(self, path: str, meta: dict[str, Any]) -> None:
        self._nodes[path] = meta
        self._entry(f"{path}/zarr.json", json.dumps(meta, sort_keys=True).encode())

    def _group(self, path: str, attributes: dict[str, Any]) -> None:
        self._node(path, {"zarr_format": 3, "node_type": "group", "attributes": attributes})

    def _array(self, path: str, value: Any, kind: str) -> None:
        dtype = np.dtype(value.dtype)
        shape = tuple(int(n) for n in value.shape)
        name = path.split("/", 1)[1]
        chunk = tuple(
            self.options.chunks.get(name)
            or auto_chunks(shape, dtype.itemsize, self.options.chunk_bytes)
        )
        if len(chunk) != len(shape) or any(c < 1 for c in chunk):
            raise InvalidInputError(
                f"chunk shape {chunk} for field {name!r} does not fit its shape {shape}"
            )
        codec = _Codec(self.options.compression, dtype)
        self._node(
            path,
            {
                "zarr_format": 3,
                "node_type": "array",
                "shape": list(shape),
                "data_type": str(dtype),
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunk)}},
                "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
                "fill_value": _fill(dtype),
                "codecs": codec.codecs,
                "attributes": {"simstore": {"kind": kind}},
                "storage_transformers": [],
            },
        )
        if len(shape) == 0:
            self._entry(f"{path}/c", codec.encode(np.asarray(value[()], dtype=dtype).reshape(())))
            return
        if math.prod(shape) == 0:
            return
        grid = tuple(math.ceil(n / c) for n, c in zip(shape, chunk, strict=True))
        lead = slab_axes(shape, chunk, dtype.itemsize, SLAB_CHUNKS * self.options.chunk_bytes)
        for outer in np.ndindex(*grid[:lead]):
            # one read of the source per slab: a lazy source (an HDF5 dataset chunked by
            # time step) read box by box re-reads each of its chunks once per box it spans
            start = [i * c for i, c in zip(outer, chunk[:lead], strict=True)] + [0] * (
                len(shape) - lead
            )
            stop = [min(n, a + c) for a, c, n in zip(start, chunk[:lead], shape, strict=False)]
            stop += list(shape[lead:])
            slab = np.asarray(
                value[tuple(slice(a, b) for a, b in zip(start, stop, strict=True))], dtype=dtype
            )
            for inner in np.ndindex(*grid[lead:]):
                idx = (*outer, *inner)
                box = tuple(
                    slice(i * c - a, min(n, (i + 1) * c) - a)
                    for i, c, n, a in zip(idx, chunk, shape, start, strict=True)
                )
                data = slab[box]
                if data.shape != chunk:
                    padded = np.zeros(chunk, dtype=dtype)
                    padded[tuple(slice(0, n) for n in data.shape)] = data
                    data = padded
                self._entry(f"{path}/c/{'/'.join(str(i) for i in idx)}", codec.encode(data))

    def add(self, sample: Sample, *, sample_hash: str, size_bytes: int) -> WrittenSample:
        """Write one sample's group and arrays now (lazy fields chunk by chunk)."""
        position = len(self._written)
        base = str(position)
        scalars: dict[str, Any] = {}
        strings: dict[str, str] = {}
        jsons: dict[str, Any] = {}
        arrays: list[tuple[str, Any, str]] = []
        for name in sorted(sample.fields):
            value = sample.fields[name]
            spec = spec_of_value(name, value)
            prev = self._specs.setdefault(name, spec)
            if prev != spec:
                raise InvalidInputError(
                    f"sample {sample.key!r}: field {name!r} is {spec.describe()}, but earlier "
                    f"samples of this shard have {prev.describe()}"
                )
            if spec.kind == "tensor":
                arrays.append((name, value, "tensor"))
            elif spec.kind == "bytes":
                arrays.append((name, np.frombuffer(bytes(value), dtype=np.uint8), "bytes"))  # type: ignore[arg-type]
            elif spec.kind == "scalar":
                scalars[name] = [spec.dtype, _json_scalar(value, spec.dtype)]
            elif spec.kind == "string":
                strings[name] = str(value)
            else:
                jsons[name] = value
        names = [a[0] for a in arrays]
        groups = sorted(
            {"/".join(n.split("/")[:i]) for n in names for i in range(1, n.count("/") + 1)}
        )
        clash = sorted(set(groups) & set(names))
        if clash:
            raise InvalidInputError(
                f"sample {sample.key!r}: field {clash[0]!r} is both an array and a group of "
                "other fields; a Zarr shard cannot hold both"
            )
        attrs = {
            "simstore": {"key": sample.key, "scalars": scalars, "strings": strings, "json": jsons}
        }
        self._group(base, attrs)
        for g in groups:
            self._group(f"{base}/{g}", {})
        for name, value, kind in arrays:
            self._array(f"{base}/{name}", value, kind)
        ws = WrittenSample(
            key=sample.key, sample_hash=sample_hash, position=position, size_bytes=size_bytes
        )
        self._written.append(ws)
        return ws

    def close(self, stats: Mapping[str, Any] | None = None) -> ShardWriteResult:
        """Write the root group (with consolidated metadata) and finish the zip."""
        schema = tuple(self._specs[n] for n in sorted(self._specs))
        root_attrs = {
            "simstore": {
                "kind": "shard",
                "format_version": SHARD_FORMAT_VERSION,
                "samples": len(self._written),
                "keys": [w.key for w in self._written],
                "schema": [s.to_json() for s in schema],
                "stats": dict(stats or {}),
            }
        }
        root = {
            "zarr_format": 3,
            "node_type": "group",
            "attributes": root_attrs,
            "consolidated_metadata": {
                "kind": "inline",
                "must_understand": False,
                "metadata": {
                    path: (
                        {
                            **meta,
                            "consolidated_metadata": {
                                "kind": "inline",
                                "must_understand": False,
                                "metadata": {},
                            },
                        }
                        if meta["node_type"] == "group"
                        else meta
                    )
                    for path, meta in self._nodes.items()
                },
            },
        }
        try:
            self._entry("zarr.json", json.dumps(root, sort_keys=True).encode())
            self._zip.close()
            object_id = self._file.object_id()
            self._file.close()
        except OSError as exc:
            self.abort()
            raise write_error(self.path, exc) from exc
        except BaseException:
            self.abort()
            raise
        return ShardWriteResult(
            path=self.path,
            samples=tuple(self._written),
            schema=schema,
            stats=dict(stats or {}),
            object_id=object_id,
        )

    def abort(self) -> None:
        """Close and remove the partial zip."""
        for close in (self._zip.close, self._file.close):
            try:
                close()
            except (OSError, ValueError):
                pass
        Path(self.path).unlink(missing_ok=True)


def _zip_store(source: str | BinaryIO) -> Any:
    zarr = _zarr()
    if isinstance(source, str):
        return zarr.storage.ZipStore(source, mode="r")
    # zarr's ZipStore opens paths only; this one-level subclass opens the caller's seekable
    # file object instead (a ranged reader over a remote object, say) and nothing else.

    class _FileZipStore(zarr.storage.ZipStore):  # type: ignore[misc,name-defined]
        def __init__(self, fileobj: BinaryIO) -> None:
            self._fileobj = fileobj
            super().__init__("<file object>", mode="r")

        def _sync_open(self) -> None:
            if self._is_open:  # type: ignore[has-type]
                raise ValueError("store is already open")
            self._lock = threading.RLock()
            self._zf = zipfile.ZipFile(self._fileobj, mode="r")
            self._is_open = True

    return _FileZipStore(source)


class _ChunkDecoder:
    """Decodes the chunks of one array written with the codecs simstore uses."""

    def __init__(self, meta: Mapping[str, Any]) -> None:
        self.shape = tuple(int(n) for n in meta["shape"])
        self.chunks = tuple(int(n) for n in meta["chunk_grid"]["configuration"]["chunk_shape"])
        self.dtype = np.dtype(str(meta["data_type"]))
        self.fill = meta.get("fill_value", 0)
        codecs = list(meta["codecs"])
        if not codecs or codecs[0]["name"] != "bytes":
            raise ValueError("first codec is not bytes")
        endian = codecs[0].get("configuration", {}).get("endian", "little")
        self.stored = self.dtype.newbyteorder("<" if endian == "little" else ">")
        self._decode: Any = None
        if len(codecs) == 2 and codecs[1]["name"] == "zstd":
            from numcodecs import Zstd

            self._decode = Zstd().decode
        elif len(codecs) == 2 and codecs[1]["name"] == "blosc":
            from numcodecs import Blosc

            self._decode = Blosc().decode
        elif len(codecs) != 1:
            raise ValueError(f"codecs {[c['name'] for c in codecs]} are not simstore's")

    def decode(self, raw: bytes) -> np.ndarray:
        data = self._decode(raw) if self._decode is not None else raw
        arr = np.frombuffer(data, dtype=self.stored).reshape(self.chunks)
        return arr if self.stored == self.dtype else arr.astype(self.dtype)


class _Nodes(Mapping[str, Any]):
    """A shard's Zarr node metadata by path, parsed from each node's own ``zarr.json``.

    A node is parsed when first asked for; the root's consolidated copy of them all is
    not parsed at all.
    """

    def __init__(self, reader: ZarrShardReader) -> None:
        self._reader = reader
        self._parsed: dict[str, Any] = {}
        self._by_bytes: dict[bytes, Any] = {}
        """Parsed metadata by its bytes: every sample's array of one fixed-shape field has
        the same, parsed (and given a decoder) once. Callers must not modify it."""

    def __getitem__(self, path: str) -> Any:
        meta = self._parsed.get(path)
        if meta is None:
            raw = self._reader._small_entry(f"{path}/zarr.json")
            if raw is None:
                raise KeyError(path)
            meta = self._by_bytes.get(raw)
            if meta is None:
                try:
                    meta = json.loads(raw)
                except ValueError as exc:
                    raise FormatError(
                        f"{self._reader.name}: zip entry {path}/zarr.json is not JSON: {exc}"
                    ) from exc
                if meta.get("node_type") == "array":
                    self._by_bytes[raw] = meta
            self._parsed[path] = meta
        return meta

    def __contains__(self, path: object) -> bool:
        return f"{path}/zarr.json" in self._reader._infos

    def __iter__(self) -> Iterator[str]:
        return (k[: -len("/zarr.json")] for k in self._reader._infos if k.endswith("/zarr.json"))

    def __len__(self) -> int:
        return sum(1 for _ in self)


_ROOT_HEAD = '{"attributes": '
"""How the writer's root ``zarr.json`` starts (keys sorted): its attributes come first."""


class ZarrShardReader:
    """An open Zarr shard: whole fields by position, or windows of them (``read_slices``).

    Reads go straight to the zip entries of the chunks a request touches (one seek and
    read per chunk, decoded with numcodecs), not through zarr-python, whose per-call cost
    dominates small reads; ``array()`` still hands out the stock ``zarr.Array``.
    """

    def __init__(self, source: str | BinaryIO, name: str = "zarr shard") -> None:
        self.name = name
        self._source = source
        self._root: Any = None
        self._store: Any = None
        self._offsets: dict[str, tuple[int, int]] = {}
        self._decoders: dict[str, _ChunkDecoder | None] = {}
        self._decoder_of: dict[int, _ChunkDecoder] = {}
        """Decoders by the id of the metadata they were made from (shared, see _Nodes)."""
        self._scratch: dict[tuple[tuple[int, ...], str], np.ndarray] = {}
        self._chunk_bytes: dict[tuple[str, str], int] | None = None
        self._zip: zipfile.ZipFile | None = None
        self._own: BinaryIO | None = None
        self.verifies_pages = True
        """Every zip entry read is checked against its CRC-32 (zipfile checks those it
        reads; the chunk reads that bypass it check their own) until :meth:`trust`."""
        try:
            if isinstance(source, str):
                self._own = open(source, "rb")  # noqa: SIM115 (closed by close())
            self._fp: Any = self._own if self._own is not None else source
            self._fd: int | None = self._own.fileno() if self._own is not None else None
            """A path's descriptor: chunk reads are one ``preadv`` each, with no seek and
            no trip through a file object's read buffer."""
            index = _zip.zip_index(self._fp)
            if index is None:  # not a plain zip: zipfile reads the directory
                self._zip = zipfile.ZipFile(self._fp, mode="r")
                index = {
                    i.filename: ZipEntry(i.header_offset, i.compress_size, i.compress_type, i.CRC)
                    for i in self._zip.infolist()
                }
            self._infos: dict[str, ZipEntry] = index
            text = self._root_text()
            if text.startswith(_ROOT_HEAD):  # the writer's layout: parse the attributes only
                root, _ = json.JSONDecoder().raw_decode(text, len(_ROOT_HEAD))
                root = {"attributes": root}
                self._nodes: Mapping[str, Any] = _Nodes(self)
            else:
                root = json.loads(text)
                self._nodes = root["consolidated_metadata"]["metadata"]
            attrs = root.get("attributes", {}).get("simstore", {})
        except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as exc:
            self._close_file()
            raise FormatError(f"{name} is not a readable Zarr zip: {exc}") from exc
        except FormatError:
            self._close_file()
            raise
        if not isinstance(attrs, dict) or attrs.get("kind") != "shard":
            raise FormatError(f"{name} is not a simstore shard (no simstore root attributes)")
        if attrs.get("format_version") != SHARD_FORMAT_VERSION:
            raise FormatError(
                f"{name} has shard format_version {attrs.get('format_version')!r}, this "
                f"simstore reads {SHARD_FORMAT_VERSION}"
            )
        self._attrs = attrs
        self.num_samples = int(attrs["samples"])
        self._specs = {s["name"]: FieldSpec.from_json(s) for s in attrs.get("schema", [])}

    def _root_text(self) -> str:
        raw = self._entry("zarr.json")
        if raw is None:
            raise KeyError("zarr.json")
        return raw.decode("utf-8")

    def _close_file(self) -> None:
        if self._zip is not None:
            self._zip.close()
        if self._own is not None:
            self._own.close()

    @property
    def schema(self) -> Schema:
        """The field specs of this shard, sorted by name."""
        return tuple(self._specs[n] for n in sorted(self._specs))

    @property
    def stats(self) -> dict[str, Any]:
        """The field summaries embedded in the shard when it was written."""
        return dict(self._attrs.get("stats", {}))

    def keys(self) -> list[str]:
        """Every sample key in position order."""
        return [str(k) for k in self._attrs.get("keys", [])]

    def checked_bytes(self, positions: Sequence[int], fields: Sequence[str] | None = None) -> int:
        """Stored chunk bytes whose CRC-32s a read of ``positions`` would check.

        The requested array fields' chunks of those samples (all array fields when
        ``fields`` is None); 0 once the reader is trusted.
        """
        if not self.verifies_pages or len(positions) == 0:
            return 0
        if self._chunk_bytes is None:
            sizes: dict[tuple[str, str], int] = {}
            for key, info in self._infos.items():
                head, sep, _ = key.rpartition("/c/")
                if not sep and key.endswith("/c"):  # a 0-d field's one chunk
                    head, sep = key[:-2], "/c"
                if sep:
                    p, _, field = head.partition("/")
                    sizes[(p, field)] = sizes.get((p, field), 0) + info.compress_size
            self._chunk_bytes = sizes
        names = [n for n, s in self._specs.items() if s.kind in ("tensor", "bytes")]
        if fields is not None:
            wanted = set(fields)
            names = [n for n in names if n in wanted]
        return sum(
            self._chunk_bytes.get((str(int(p)), n), 0)
            for p in set(np.asarray(positions).tolist())
            for n in names
        )

    def _check(self, position: int) -> int:
        p = int(position)
        if not 0 <= p < self.num_samples:
            raise InvalidInputError(
                f"{self.name}: position {p} out of range (shard holds {self.num_samples} samples)"
            )
        return p

    def array(self, position: int, field: str) -> Any:
        """The stock ``zarr.Array`` of one tensor field of one sample (for custom reads)."""
        spec = self._specs.get(field)
        if spec is None or spec.kind not in ("tensor", "bytes"):
            raise InvalidInputError(f"{self.name}: no array field {field!r}")
        path = f"{self._check(position)}/{field}"
        if path not in self._nodes:
            raise InvalidInputError(
                f"{self.name}: sample at position {position} has no field {field!r}"
            )
        if self._root is None:
            self._store = _zip_store(self._source)
            self._root = _zarr().open_group(self._store, mode="r", use_consolidated=True)
        return self._root[path]

    # -- direct chunk reads ------------------------------------------------------------
    def _stored_at(self, key: str) -> tuple[int, int] | None:
        """(offset, size) of a stored (uncompressed) zip entry's data, or None."""
        info = self._infos.get(key)
        if info is None or info.compress_type != zipfile.ZIP_STORED:
            return None
        where = self._offsets.get(key)
        if where is None:
            if self._fd is not None:
                local = os.pread(self._fd, 30, info.header_offset)
            else:
                self._fp.seek(info.header_offset)
                local = self._fp.read(30)
            if local[:4] != MAGIC:
                raise FormatError(f"{self.name}: bad zip entry {key}")
            n, m = struct.unpack("<HH", local[26:30])
            where = (info.header_offset + 30 + n + m, info.compress_size)
            self._offsets[key] = where
        return where

    def _read_into(self, key: str, out: np.ndarray) -> bool:
        """Read an uncompressed chunk straight into ``out`` (one copy); False if not possible."""
        where = self._stored_at(key)
        if where is None or where[1] != out.nbytes or not out.flags.c_contiguous:
            return False
        view = out.reshape(-1).view(np.uint8).data
        if self._fd is not None:
            got = os.preadv(self._fd, [view], where[0])
        else:
            self._fp.seek(where[0])
            got = self._fp.readinto(view)
        if got != where[1]:
            raise FormatError(f"{self.name}: zip entry {key} is truncated")
        self._check_crc(key, view)
        return True

    def trust(self) -> None:
        """Stop checking chunk CRC-32s: the whole file has been hashed to its id.

        The CRC-32s (ISA-L's, about 17 GiB/s here; zlib's where isal is missing, about 2)
        are work on top of the whole-object hash, which runs once per process anyway, so
        a shard is read with the checks only until that hash is known.
        """
        self.verifies_pages = False

    def _check_crc(self, key: str, data: Any) -> None:
        """The zip entry's CRC-32 against its bytes (read past zipfile, which checks it)."""
        if self.verifies_pages and crc32(data) != self._infos[key].CRC:
            raise FormatError(f"{self.name}: zip entry {key} fails its CRC-32 check")

    def _read_whole(
        self, path: str, dec: _ChunkDecoder, into: Callable[..., Any] | None = None
    ) -> np.ndarray | None:
        """A whole field whose chunks are contiguous runs of it, read with no extra copy.

        With chunks ``[1, ..., 1, k, n, ..., n]`` (what ``auto_chunks`` gives a field a
        training job reads whole), the chunks in grid order are consecutive spans of the
        C-order result, so each uncompressed chunk is read straight into its place (a
        padded edge chunk goes through the scratch chunk); None when the layout does not
        allow it.
        """
        shape, chunks = tuple(dec.shape), tuple(dec.chunks)
        if dec._decode is not None or dec.stored != dec.dtype or not shape:
            return None
        lead = next((i for i, c in enumerate(chunks) if c != 1), len(chunks) - 1)
        if chunks[lead + 1 :] != shape[lead + 1 :]:
            return None
        out = into(shape, dec.dtype) if into is not None else None
        if out is None:
            out = np.empty(shape, dtype=dec.dtype)
        if not out.flags.c_contiguous:
            return None
        flat = out.reshape(-1)
        grid = tuple(math.ceil(n / c) for n, c in zip(shape, chunks, strict=True))
        row, span = math.prod(shape[lead + 1 :]), math.prod(chunks)
        at = 0
        for idx in np.ndindex(*grid):
            key = f"{path}/c/{'/'.join(str(i) for i in idx)}"
            n = min(chunks[lead], shape[lead] - idx[lead] * chunks[lead]) * row
            if n == span:
                if not self._read_into(key, flat[at : at + n]):
                    return None
            else:
                chunk = self._chunk(key, dec)
                if chunk is None:
                    return None
                flat[at : at + n] = chunk.reshape(-1)[:n]
            at += n
        return out

    def _entry(self, key: str) -> bytes | None:
        info = self._infos.get(key)
        if info is None:
            return None
        if info.compress_type != zipfile.ZIP_STORED:
            if self._zip is None:
                self._zip = zipfile.ZipFile(self._fp, mode="r")
            return self._zip.read(key)
        where = self._stored_at(key)
        assert where is not None  # a stored entry that exists
        self._fp.seek(where[0])
        data: bytes = self._fp.read(where[1])
        if len(data) != where[1]:
            raise FormatError(f"{self.name}: zip entry {key} is truncated")
        self._check_crc(key, data)
        return data

    def _small_entry(self, key: str) -> bytes | None:
        """A small stored entry's bytes with one read of its local header and data.

        The data is assumed to follow a local header as long as the central directory's
        (the writer's layout); the header read with it says whether it did, and if not
        the entry is read the careful way (:meth:`_entry`).
        """
        info = self._infos.get(key)
        if (info is None or info.compress_type != zipfile.ZIP_STORED or self._fd is None
                or key in self._offsets):
            return self._entry(key)
        name_len = len(key.encode())
        head = 30 + name_len
        blob = os.pread(self._fd, head + info.compress_size, info.header_offset)
        if (blob[:4] != MAGIC or struct.unpack("<HH", blob[26:30]) != (name_len, 0)
                or len(blob) != head + info.compress_size):
            return self._entry(key)
        data = blob[head:]
        self._offsets[key] = (info.header_offset + head, info.compress_size)
        self._check_crc(key, data)
        return data

    def _decoder(self, path: str) -> _ChunkDecoder | None:
        if path not in self._decoders:
            try:
                meta = self._nodes[path]
                dec = self._decoder_of.get(id(meta))
                if dec is None:
                    dec = self._decoder_of[id(meta)] = _ChunkDecoder(meta)
                self._decoders[path] = dec
            except (KeyError, ValueError, TypeError):
                self._decoders[path] = None  # not simstore's codecs: zarr-python reads it
        return self._decoders[path]

    def _read_box(
        self,
        position: int,
        field: str,
        box: tuple[slice, ...] | None,
        into: Callable[..., Any] | None = None,
    ) -> np.ndarray:
        path = f"{position}/{field}"
        dec = self._decoder(path)
        if dec is None:
            arr = self.array(position, field)
            return np.asarray(arr[box] if box is not None else arr[...])
        shape, chunks = dec.shape, dec.chunks
        full = box is None
        if box is None:
            whole = self._read_whole(path, dec, into)
            if whole is not None:
                return whole
            box = tuple(slice(0, n) for n in shape)
        box = tuple(box) + tuple(slice(0, n) for n in shape[len(box) :])
        ranges = [b.indices(n) for b, n in zip(box, shape, strict=True)]
        if any(step != 1 for _, _, step in ranges):
            arr = self.array(position, field)
            return np.asarray(arr[box])
        lo = [a for a, _, _ in ranges]
        hi = [max(a, b) for a, b, _ in ranges]
        dims = tuple(h - a for a, h in zip(lo, hi, strict=True))
        if not shape:
            raw = self._entry(f"{path}/c")
            if raw is None:
                return np.full(dims, dec.fill, dtype=dec.dtype)
            return dec.decode(raw).reshape(()).copy()
        out = into(dims, dec.dtype) if full and into is not None else None
        if out is None:
            out = np.empty(dims, dtype=dec.dtype)
        if out.size == 0:
            return out
        grid = [range(a // c, (h - 1) // c + 1) for a, h, c in zip(lo, hi, chunks, strict=True)]
        for idx in itertools.product(*grid):
            src, dst = [], []
            for i, c, a, h in zip(idx, chunks, lo, hi, strict=True):
                c0 = i * c
                s0, s1 = max(a, c0), min(h, c0 + c)
                src.append(slice(s0 - c0, s1 - c0))
                dst.append(slice(s0 - a, s1 - a))
            key = f"{path}/c/{'/'.join(str(i) for i in idx)}"
            chunk = self._chunk(key, dec)
            if chunk is None:
                out[tuple(dst)] = dec.fill  # a chunk never written holds the fill value
            else:
                out[tuple(dst)] = chunk[tuple(src)]
        return out

    def _chunk(self, key: str, dec: _ChunkDecoder) -> np.ndarray | None:
        """One decoded chunk, or None when it was never written.

        An uncompressed chunk is read into a scratch array reused for every chunk of its
        shape (it stays in the CPU cache while it is copied out), not into fresh memory.
        """
        if dec._decode is None and dec.stored == dec.dtype:
            where = self._stored_at(key)
            if where is not None:
                scratch = self._scratch.get((dec.chunks, dec.dtype.str))
                if scratch is None:
                    scratch = np.empty(dec.chunks, dtype=dec.dtype)
                    self._scratch[(dec.chunks, dec.dtype.str)] = scratch
                if self._read_into(key, scratch):
                    return scratch
        raw = self._entry(key)
        return dec.decode(raw) if raw is not None else None

    def _sample(
        self,
        position: int,
        fields: Iterable[str] | None,
        into: Callable[[str, Any, Any], Any] | None = None,
    ) -> dict[str, FieldValue]:
        p = self._check(position)
        group = self._nodes.get(str(p), {})
        attrs = group.get("attributes", {}).get("simstore", {})
        wanted = set(fields) if fields is not None else None
        out: dict[str, FieldValue] = {}
        for name, (dtype, value) in attrs.get("scalars", {}).items():
            if wanted is None or name in wanted:
                out[name] = _scalar_from_json(value, dtype)
        for name, value in attrs.get("strings", {}).items():
            if wanted is None or name in wanted:
                out[name] = str(value)
        for name, value in attrs.get("json", {}).items():
            if wanted is None or name in wanted:
                out[name] = value
        for name in sorted(n for n, s in self._specs.items() if s.kind in ("tensor", "bytes")):
            if wanted is not None and name not in wanted:
                continue
            if f"{p}/{name}" not in self._nodes:
                continue  # this sample lacks the field
            fill = None
            if into is not None and self._specs[name].kind == "tensor":
                fill = functools.partial(into, name)
            data = self._read_box(p, name, None, fill)
            out[name] = data.tobytes() if self._specs[name].kind == "bytes" else data
        return dict(sorted(out.items()))

    supports_out = True
    """``read`` takes ``out=``: tensors decode into arrays the caller provides."""

    def read(
        self,
        positions: Sequence[int],
        fields: Sequence[str] | None = None,
        out: Callable[[int, str, Any, Any], Any] | None = None,
    ) -> Iterator[dict[str, FieldValue]]:
        """Field values of the samples at ``positions``, in the order given.

        Only the requested fields' chunks are read. ``out(i, field, shape, dtype)``, when
        given, may return a writable C-contiguous array for the ``i``-th sample's tensor
        field (or None); an uncompressed field is then read straight into it.
        """
        for i, p in enumerate(positions):
            yield self._sample(p, fields, functools.partial(out, i) if out is not None else None)

    def read_slices(
        self, position: int, windows: Mapping[str, tuple[slice, ...]]
    ) -> dict[str, np.ndarray]:
        """Windows (crops) of tensor fields of one sample: ``{field: array[slices]}``.

        Only the chunks that overlap each window are read and decoded, so a 64^3 crop of a
        1024^3 field costs about its own size (rounded out to whole chunks), not the
        field's. Slices must have step 1 (others go through zarr-python).
        """
        p = self._check(position)
        out: dict[str, np.ndarray] = {}
        for name, box in windows.items():
            spec = self._specs.get(name)
            if spec is None or spec.kind != "tensor" or f"{p}/{name}" not in self._nodes:
                raise InvalidInputError(
                    f"{self.name}: sample at position {p} has no tensor field {name!r}"
                )
            out[name] = self._read_box(p, name, tuple(box))
        return out

    def close(self) -> None:
        """Release the zip file."""
        self._close_file()
        if self._store is not None:
            self._store.close()


class ZarrFormat:
    """The Zarr v3 shard format (``--format zarr``, and dense fields above a threshold)."""

    name = "zarr"
    supports_file_objects = True
    supports_streaming_writes = True

    def __init__(self, options: ShardOptions | None = None) -> None:
        self.options = options or ShardOptions()

    def open_writer(self, path: str) -> ZarrShardWriter:
        """A writer that streams samples into ``path`` as they are added."""
        return ZarrShardWriter(path, self.options)

    def write(self, samples: Iterable[Sample], path: str) -> ShardWriteResult:
        """Write samples to one zip; equal samples in equal order give equal bytes."""
        writer = self.open_writer(path)
        try:
            for s in samples:
                writer.add(s, sample_hash=hash_sample_blocks(s), size_bytes=sample_nbytes(s))
        except BaseException:
            writer.abort()
            raise
        return writer.close()

    def open(self, source: str | BinaryIO) -> ZarrShardReader:
        """Open a shard from a local path or a seekable binary file object."""
        name = source if isinstance(source, str) else "zarr shard"
        return ZarrShardReader(source, name=f"zarr shard {name}")

    def sniff(self, head: bytes, tail: bytes) -> bool:
        r"""Zip files start with ``PK\x03\x04``."""
        return head[:4] == MAGIC

    def describe(self) -> Mapping[str, Any]:
        """Parameters that shape the bytes (for lineage)."""
        return {"name": self.name, **self.options.to_json()}
