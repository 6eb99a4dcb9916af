"""The Zarr v3 shard writer: samples into a deterministic zip, chunk by chunk.

Each sample is a group, each tensor an array chunked as :mod:`._zarr_layout` says; a
lazy source is read a slab of chunks at a time, so a field of any size takes bounded
memory. Zip entries are stored (not deflated), in a fixed order with fixed timestamps,
through a file that hashes them on the way out (:class:`._zip.HashingFile`): equal
samples give equal bytes, and the shard's object id needs no second read.
"""

from __future__ import annotations

import json
import math
import zipfile
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from simstore._buffers import POOL
from simstore.errors import InvalidInputError
from simstore.ingest import ShardOptions, spec_of_value
from simstore.protocols import ShardWriteResult, WrittenSample
from simstore.sample import FieldSpec, Sample

from . import _zip
from ._arrow import SHARD_FORMAT_VERSION
from ._columnar import write_error
from ._zarr_layout import (
    SLAB_CHUNKS,
    ChunkCodec,
    auto_chunks,
    fill_value_of,
    json_scalar,
    slab_axes,
)

__all__ = ["ZarrShardWriter"]

_EPOCH = (1980, 1, 1, 0, 0, 0)


class ZarrShardWriter:
    """Writes samples into a deterministic zip of a Zarr v3 hierarchy, chunk by chunk."""

    writes_in_add = True
    """``add`` does the work (CRC-32s, the shard's hash, the writes): an ingest may call it
    on a thread of its own while it reads the next sample, one call at a time, in order."""

    encode_threads = 1
    """Threads that compress a field's chunks side by side (an ingest sets it where cores
    are spare). Each chunk is encoded alone, so the bytes are the same with any number."""

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
        self._arrays: set[str] = set()
        """Array fields of the samples written so far."""
        self._groups: set[str] = set()
        """Groups of fields (the parents of array fields with '/') written so far."""
        self._gather: np.ndarray | None = None
        self._encoders: ThreadPoolExecutor | None = None

    def _contiguous(self, box: np.ndarray, chunk: tuple[int, ...]) -> np.ndarray:
        """``box`` as a C-contiguous chunk of shape ``chunk`` (zero-padded at an edge).

        A box that is not one run of its slab (a near-cubic chunk of a larger field) is
        gathered into memory the writer keeps for the next chunk: a fresh array per chunk
        cost a page fault and a zeroed page per 4 KiB, about four times the copy itself
        in a new process. The chunk's bytes are written out (or encoded) before the next
        one is gathered, so one buffer serves every chunk.
        """
        if box.shape == chunk and box.flags.c_contiguous:
            return box
        nbytes = math.prod(chunk) * box.dtype.itemsize
        if self._gather is None or self._gather.nbytes < nbytes:
            self._gather = POOL.array((nbytes,), np.dtype(np.uint8))
        out = self._gather[:nbytes].view(box.dtype).reshape(chunk)
        if box.shape != chunk:
            out[...] = 0
            out[tuple(slice(0, n) for n in box.shape)] = box
        else:
            np.copyto(out, box)
        return out

    def _stop_encoders(self) -> None:
        if self._encoders is not None:
            self._encoders.shutdown(wait=True, cancel_futures=True)
            self._encoders = None

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
        codec = ChunkCodec(self.options.compression, dtype)
        self._node(
            path,
            {
                "zarr_format": 3,
                "node_type": "array",
                "shape": list(shape),
                "data_type": str(dtype),
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunk)}},
                "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
                "fill_value": fill_value_of(dtype),
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
        side = self.encode_threads > 1 and codec.compresses and math.prod(grid) > 1
        ahead: deque[tuple[str, Future[Any]]] = deque()  # chunks encoding, in order
        try:
            for name, data in self._chunks(path, value, shape, chunk, dtype, grid, lead):
                if not side:
                    self._entry(name, codec.encode(data))
                    continue
                if self._encoders is None:
                    self._encoders = ThreadPoolExecutor(
                        self.encode_threads, thread_name_prefix="simstore-chunk-encoder"
                    )
                while len(ahead) >= 2 * self.encode_threads:  # at most that many in flight
                    done, encoded = ahead.popleft()
                    self._entry(done, encoded.result())
                # a copy: the gather buffer is the next chunk's
                ahead.append((name, self._encoders.submit(codec.encode, data.copy())))
            while ahead:
                done, encoded = ahead.popleft()
                self._entry(done, encoded.result())
        finally:
            for _, encoded in ahead:  # a failure: what is still encoding is not written
                encoded.cancel()

    def _chunks(
        self,
        path: str,
        value: Any,
        shape: tuple[int, ...],
        chunk: tuple[int, ...],
        dtype: np.dtype[Any],
        grid: tuple[int, ...],
        lead: int,
    ) -> Iterator[tuple[str, np.ndarray]]:
        """Each chunk of ``value`` as its entry name and C-contiguous bytes, in order."""
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
                name = f"{path}/c/{'/'.join(str(i) for i in idx)}"
                yield name, self._contiguous(slab[box], chunk)

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
                scalars[name] = [spec.dtype, json_scalar(value, spec.dtype)]
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
        # across samples too: a reader takes the node at <position>/<field> for the field
        clash = sorted((set(groups) & self._arrays) | (set(names) & self._groups))
        if clash:
            raise InvalidInputError(
                f"sample {sample.key!r}: field {clash[0]!r} is an array in some samples of "
                "this shard and a group of other fields in others; a Zarr shard cannot hold both"
            )
        self._arrays.update(names)
        self._groups.update(groups)
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
        self._stop_encoders()
        self._gather = None  # back to the pool for the next shard
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
        self._stop_encoders()
        self._gather = None
        for close in (self._zip.close, self._file.close):
            try:
                close()
            except (OSError, ValueError):
                pass
        Path(self.path).unlink(missing_ok=True)
