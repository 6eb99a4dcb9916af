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

This module holds the reader and the format; the writer is in :mod:`._zarr_write`, the
chunk grid and codecs both share in :mod:`._zarr_layout`.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import threading
import weakref
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, BinaryIO, cast

import numpy as np

from simstore.errors import FormatError, InvalidInputError, SimstoreError, version_error
from simstore.ingest import ShardOptions, hash_sample_blocks, sample_nbytes
from simstore.protocols import ShardWriteResult
from simstore.sample import FieldSpec, FieldValue, Sample, Schema

from . import _zip
from ._arrow import SHARD_FORMAT_VERSION
from ._zarr_layout import (
    SLAB_CHUNKS,
    ChunkDecoder,
    auto_chunks,
    import_zarr,
    scalar_from_json,
    slab_axes,
)
from ._zarr_write import ZarrShardWriter
from ._zip import MAGIC, ZipEntry
from ._zip_entries import Mapper, ZipEntries

__all__ = [
    "SLAB_CHUNKS",
    "ZarrFormat",
    "ZarrIndex",
    "ZarrShardReader",
    "ZarrShardWriter",
    "auto_chunks",
    "slab_axes",
]


def _zip_store(source: str | BinaryIO) -> Any:
    zarr = import_zarr()
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


class _Nodes(Mapping[str, Any]):
    """A shard's Zarr node metadata by path, parsed from each node's own ``zarr.json``.

    A node is parsed when first asked for; the root's consolidated copy of them all is
    not parsed at all.
    """

    def __init__(self, reader: ZarrShardReader) -> None:
        # not the reader itself: a reader and its nodes in a cycle waited for the cyclic
        # collector, with its files, zip index and decoders, after it was closed and let go
        self._reader_ref = weakref.ref(reader)
        self._parsed: dict[str, Any] = {}
        self._by_bytes: dict[bytes, Any] = {}
        """Parsed metadata by its bytes: every sample's array of one fixed-shape field has
        the same, parsed (and given a decoder) once. Callers must not modify it."""
        self.parsed_bytes = 0
        """Bytes of the documents parsed (each once): a sample's group ``zarr.json`` holds
        its scalar, string and JSON fields whole (for :attr:`ZarrIndex.nbytes`)."""

    @property
    def _reader(self) -> ZarrShardReader:
        reader = self._reader_ref()
        assert reader is not None, "a reader's nodes outlived it"
        return reader

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
                except (ValueError, RecursionError) as exc:  # or nested too deeply
                    raise FormatError(
                        f"{self._reader.name}: zip entry {path}/zarr.json is not JSON: {exc}"
                    ) from exc
                if meta.get("node_type") == "array":
                    self._by_bytes[raw] = meta
                self.parsed_bytes += len(raw)
            self._parsed[path] = meta
        return meta

    def __contains__(self, path: object) -> bool:
        return f"{path}/zarr.json" in self._reader._infos

    def __iter__(self) -> Iterator[str]:
        return (k[: -len("/zarr.json")] for k in self._reader._infos if k.endswith("/zarr.json"))

    def __len__(self) -> int:
        return sum(1 for _ in self)


class ZarrIndex:
    """What a trusted reader of a shard parsed and learnt, for the next reader of its bytes.

    The zip's directory, the root attributes, the nodes' metadata parsed so far, the
    data places of the entries read so far and the arrays' decoders: a shard reopened
    from it (``ZarrShardReader(path, index=...)``) reads no directory and no sample's
    ``zarr.json`` again. Only a reader whose file hashed to the shard's id gives one
    (:meth:`ZarrShardReader.take_index`), and only a reader of a file with the same id
    may use it; the reader that gave it is closed, and one reader at a time uses it.
    """

    __slots__ = ("attrs", "by_bytes", "chunk_bytes", "decoder_of", "decoders", "file_size",
                 "infos", "nodes", "offsets", "parsed", "parsed_bytes", "root_bytes", "specs")

    ENTRY_BYTES = 800
    """Memory an index holds per zip entry, about (its directory entry, data place,
    parsed node and decoder: 775 bytes measured over a shard of 4,096 small samples)."""

    def __init__(self, reader: ZarrShardReader) -> None:
        self.file_size = reader._file_size
        self.infos = reader._infos
        nodes = reader._nodes
        self.nodes: Mapping[str, Any] | None = None
        """The root's consolidated metadata (a foreign writer's layout), else None."""
        self.parsed: dict[str, Any] = {}
        self.by_bytes: dict[bytes, Any] = {}
        self.parsed_bytes = 0
        if isinstance(nodes, _Nodes):
            self.parsed, self.by_bytes = nodes._parsed, nodes._by_bytes
            self.parsed_bytes = nodes.parsed_bytes
        else:
            self.nodes = nodes
        self.root_bytes = reader._root_bytes
        """What the root ``zarr.json`` holds parsed: the writer's attributes (every key, the
        schema, the field statistics), or a foreign writer's whole document."""
        self.offsets = reader._offsets
        self.decoders = reader._decoders
        self.decoder_of = reader._decoder_of
        self.chunk_bytes = reader._chunk_bytes
        self.attrs = reader._attrs
        self.specs = reader._specs

    def reopen(self, path: str) -> ZarrShardReader:
        """The shard at ``path`` (a file with the id of the one this came from), trusted."""
        reader = ZarrShardReader(path, name=f"zarr shard {path}", index=self)
        reader.trust()
        return reader

    @property
    def nbytes(self) -> int:
        """Memory it holds, estimated (for a cache's budget).

        Beyond ``ENTRY_BYTES`` an entry, the text of the documents it parsed, about byte
        for byte: a large one is mostly string, JSON or key fields, held once as parsed.
        """
        return self.ENTRY_BYTES * len(self.infos) + self.parsed_bytes + self.root_bytes


AHEAD_BYTES = 64 << 20
"""The largest sample a reader of a remote file fetches in one request before reading it."""

_ROOT_HEAD = '{"attributes": '
"""How the writer's root ``zarr.json`` starts (keys sorted): its attributes come first."""


class ZarrShardReader(ZipEntries):
    """An open Zarr shard: whole fields by position, or windows of them (``read_slices``).

    Reads go straight to the zip entries of the chunks a request touches (one read per
    chunk, of its local header too the first time; decoded with numcodecs), not through
    zarr-python, whose per-call cost dominates small reads; ``array()`` still hands out
    the stock ``zarr.Array``.
    """

    def __init__(self, source: str | BinaryIO, name: str = "zarr shard",
                 index: ZarrIndex | None = None) -> None:
        """Open ``source``; from ``index`` where it applies.

        ``index``: what a trusted reader of a file with the same id left (see
        :class:`ZarrIndex`); used when ``source`` is a path of the size it records.
        """
        self.name = name
        self._source = source
        self._root: Any = None
        self._store: Any = None
        self._offsets: dict[str, tuple[int, int]] = {}
        self._decoders: dict[str, ChunkDecoder | None] = {}
        self._decoder_of: dict[int, ChunkDecoder] = {}
        """Decoders by the id of the metadata they were made from (shared, see _Nodes)."""
        self._scratch: dict[tuple[tuple[int, ...], str], np.ndarray] = {}
        self._chunk_bytes: dict[tuple[str, str], int] = {}
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
            self._file_size: int = cast(BinaryIO, self._fp).seek(0, os.SEEK_END)
            """What an entry's declared size is checked against before it is read."""
            if (index is not None and self._fd is not None
                    and index.file_size == self._file_size):
                self._reopen(index)
                return
            entries = _zip.zip_index(self._fp)
            if entries is None:  # not a plain zip: zipfile reads the directory
                self._zip = zipfile.ZipFile(self._fp, mode="r")
                infos = self._zip.infolist()
                entries = {
                    i.filename: ZipEntry(i.header_offset, i.compress_size, i.compress_type, i.CRC)
                    for i in infos
                }
                if len(entries) != len(infos):
                    raise ValueError("a zip entry appears twice in the central directory")
                declared = _zip.declared_entries(self._fp)
                if declared is not None and declared != len(infos):
                    # a damaged header field made zipfile skip entries without a word
                    raise ValueError(
                        f"the central directory yields {len(infos)} entries, its end "
                        f"record declares {declared}"
                    )
            self._infos: Mapping[str, ZipEntry] = entries
            text = self._root_text()
            if text.startswith(_ROOT_HEAD):  # the writer's layout: parse the attributes only
                root, end = json.JSONDecoder().raw_decode(text, len(_ROOT_HEAD))
                root = {"attributes": root}
                self._nodes: Mapping[str, Any] = _Nodes(self)
                self._root_bytes = end - len(_ROOT_HEAD)
            else:
                root = json.loads(text)
                self._nodes = root["consolidated_metadata"]["metadata"]
                self._root_bytes = len(text)
            attrs = root.get("attributes", {}).get("simstore", {})
            if not isinstance(attrs, dict) or attrs.get("kind") != "shard":
                raise FormatError(
                    f"{name} is not a simstore shard (no simstore root attributes)"
                )
            if attrs.get("format_version") != SHARD_FORMAT_VERSION:
                raise version_error(f"{name} has shard", attrs.get("format_version"),
                                    SHARD_FORMAT_VERSION)
        except (OSError, ValueError, KeyError, TypeError, RecursionError,
                zipfile.BadZipFile) as exc:
            self._close_file()
            raise FormatError(f"{name} is not a readable Zarr zip: {exc}") from exc
        except FormatError:  # the file's own refusals above, and the index's
            self._close_file()
            raise
        self._attrs = attrs
        self.num_samples = int(attrs["samples"])
        self._specs = {s["name"]: FieldSpec.from_json(s) for s in attrs.get("schema", [])}

    def _reopen(self, index: ZarrIndex) -> None:
        """Take up where the reader that left ``index`` stopped (its file's bytes are these)."""
        self._infos = index.infos
        if index.nodes is not None:
            self._nodes = index.nodes
        else:
            nodes = _Nodes(self)
            nodes._parsed, nodes._by_bytes = index.parsed, index.by_bytes
            nodes.parsed_bytes = index.parsed_bytes
            self._nodes = nodes
        self._root_bytes = index.root_bytes
        self._offsets = index.offsets
        self._decoders, self._decoder_of = index.decoders, index.decoder_of
        self._chunk_bytes = index.chunk_bytes
        self._attrs = index.attrs
        self.num_samples = int(index.attrs["samples"])
        self._specs = index.specs

    def take_index(self) -> ZarrIndex | None:
        """What this reader parsed and learnt, for the next reader of the same bytes.

        None unless the reader is trusted (its file hashed to the shard's id: see
        :meth:`trust`) and reads a path through simstore's own zip index. The reader must
        be closed next: the index holds its tables, which later readers fill further.
        """
        if self.verifies_pages or self._fd is None or self._zip is not None:
            return None
        return ZarrIndex(self)

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
        names = [n for n, s in self._specs.items() if s.kind in ("tensor", "bytes")]
        if fields is not None:
            wanted = set(fields)
            names = [n for n in names if n in wanted]
        return sum(self._stored_chunk_bytes(p, n)
                   for p in set(np.asarray(positions).tolist()) for n in names)

    def _stored_chunk_bytes(self, position: int, name: str) -> int:
        """Stored bytes of the chunks of one sample's array field (0 if it has none).

        Found from the field's chunk grid, for the samples asked about: a scan of every
        entry of a shard of 38,561 (8 KiB samples) cost 113 ms before its first read.
        """
        key = (str(int(position)), name)
        known = self._chunk_bytes.get(key)
        if known is not None:
            return known
        path = f"{key[0]}/{name}"
        total = 0
        if path in self._nodes:
            grid = self._grid(path)
            if grid is None or math.prod(grid) > len(self._infos):
                # not the layout this reader writes, or more chunks declared than the zip
                # holds entries (a crafted shape of 2^40 chunks, say): count the entries
                prefix = f"{path}/c"
                total = sum(self._infos[k].compress_size for k in self._infos
                            if k == prefix or k.startswith(prefix + "/"))
            elif not grid:  # a 0-d array: one chunk
                total = self._entry_size(f"{path}/c")
            else:
                total = sum(self._entry_size(f"{path}/c/" + "/".join(map(str, idx)))
                            for idx in np.ndindex(*grid))
        self._chunk_bytes[key] = total
        return total

    def _grid(self, path: str) -> list[int] | None:
        """Array ``path``'s chunk grid as its metadata declares it (None: not readable)."""
        try:
            meta = self._nodes[path]
            shape = [int(n) for n in meta.get("shape", [])]
            chunks = [int(c) for c in meta["chunk_grid"]["configuration"]["chunk_shape"]]
            grid = [-(-n // c) for n, c in zip(shape, chunks, strict=True)]
        except (KeyError, TypeError, ValueError, ZeroDivisionError, AttributeError):
            return None
        return None if min(grid, default=0) < 0 else grid

    def _check_grid(self, path: str) -> None:
        """Refuse an array that declares more chunks than the shard holds zip entries.

        The writer stores every chunk, so such metadata is crafted or damaged: a shape of
        2^40 one-element chunks would otherwise be walked chunk by chunk (and its result
        allocated) before the first missing chunk is found. Bad metadata of other kinds is
        left to the read, which says what is wrong. Checked once per array, where its
        decoder is made (:meth:`_decoder`).
        """
        grid = self._grid(path)
        cells = math.prod(grid) if grid is not None else 0
        if cells > len(self._infos):
            raise FormatError(
                f"{self.name}: array {path} declares {cells} chunks; the shard holds "
                f"{len(self._infos)} entries in all: its metadata is damaged"
            )

    def _check(self, position: int) -> int:
        p = int(position)
        if not 0 <= p < self.num_samples:
            raise InvalidInputError(
                f"{self.name}: position {p} out of range (shard holds {self.num_samples} samples)"
            )
        return p

    def _has_array(self, position: int, field: str) -> bool:
        """Whether the sample at ``position`` holds array field ``field`` (False: it lacks it).

        Raises :class:`FormatError` when a group of fields sits at the field's path: a
        shard holding array ``a`` in one sample and ``a/b`` in another (ingest refuses
        such a dataset; a shard written before it did may hold one).
        """
        path = f"{position}/{field}"
        if self._decoders.get(path) is not None:
            return True  # read before: an array
        if path not in self._nodes:
            spec = self._specs.get(field)
            ndim = 1 if spec is None or spec.kind == "bytes" else spec.ndim
            first = f"{path}/c" + "/0" * ndim  # an array of any values has this chunk
            if first in self._infos:
                raise FormatError(
                    f"{self.name}: sample at position {position}: field {field!r} has "
                    f"chunks but no {path}/zarr.json: the zip's index is damaged"
                )
            return False
        try:
            node_type = self._nodes[path].get("node_type")
        except AttributeError:
            node_type = None
        if node_type == "group":
            raise FormatError(
                f"{self.name}: sample at position {position}: field {field!r} is a group of "
                "other fields there, not an array (a field cannot also be a group of fields)"
            )
        if node_type != "array":
            raise FormatError(
                f"{self.name}: sample at position {position}: field {field!r} is a Zarr node "
                f"of node_type {node_type!r}, not an array"
            )
        return True

    def has_field(self, position: int, field: str) -> bool:
        """Whether the sample at ``position`` holds array field ``field``."""
        spec = self._specs.get(field)
        return spec is not None and spec.kind in ("tensor", "bytes") and self._has_array(
            self._check(position), field
        )

    def array(self, position: int, field: str) -> Any:
        """The stock ``zarr.Array`` of one tensor field of one sample (for custom reads)."""
        spec = self._specs.get(field)
        if spec is None or spec.kind not in ("tensor", "bytes"):
            raise InvalidInputError(f"{self.name}: no array field {field!r}")
        p = self._check(position)
        if not self._has_array(p, field):
            raise InvalidInputError(
                f"{self.name}: sample at position {position} has no field {field!r}"
            )
        path = f"{p}/{field}"
        if self._root is None:
            self._store = _zip_store(self._source)
            self._root = import_zarr().open_group(self._store, mode="r", use_consolidated=True)
        return self._root[path]

    def _read_whole(
        self, path: str, dec: ChunkDecoder, into: Callable[..., Any] | None = None,
        mapper: Mapper | None = None,
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
        span = math.prod(chunks)
        parts = [(f"{path}/c/{suffix}", n) for suffix, n in _runs(shape, chunks, lead)]
        out = None
        if into is not None:
            # a destination that can take mapped chunks is told when all of them can be
            # (checks passed, every chunk whole and page-aligned in the file)
            mappable = (mapper is not None and self._fd is not None and not self.verifies_pages
                        and all(n == span and self._page_aligned(key) for key, n in parts))
            out = into(shape, dec.dtype, mappable=True) if mappable else into(shape, dec.dtype)
        if out is None:
            out = np.empty(shape, dtype=dec.dtype)
        if not out.flags.c_contiguous:
            return None
        flat = out.reshape(-1)
        at = 0
        for key, n in parts:
            if n == span:
                if not self._read_into(key, flat[at : at + n], mapper):
                    return None
            else:
                chunk = self._chunk(key, dec)
                if chunk is None:
                    return None
                flat[at : at + n] = chunk.reshape(-1)[:n]
            at += n
        return out

    def _decoder(self, path: str) -> ChunkDecoder | None:
        if path not in self._decoders:
            try:  # metadata already given a decoder (every sample's of a fixed-shape
                # field: one parsed object) has passed the grid check
                known = id(self._nodes[path]) in self._decoder_of
            except KeyError:
                known = False
            if not known:
                self._check_grid(path)  # raises before anything is cached for the array
            try:
                meta = self._nodes[path]
                dec = self._decoder_of.get(id(meta))
                if dec is None:
                    dec = self._decoder_of[id(meta)] = ChunkDecoder(meta)
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
        mapper: Mapper | None = None,
    ) -> np.ndarray:
        path = f"{position}/{field}"
        dec = self._decoder(path)
        if dec is None:
            arr = self.array(position, field)
            return np.asarray(arr[box] if box is not None else arr[...])
        shape, chunks = dec.shape, dec.chunks
        full = box is None
        if box is None:
            whole = self._read_whole(path, dec, into, mapper)
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
            raw = self._small_entry(f"{path}/c")
            if raw is None:
                # written for every 0-d array, as every chunk of the others (see below)
                raise FormatError(
                    f"{self.name}: zip entry {path}/c is missing from the shard's index: the "
                    "shard is damaged"
                )
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
                # simstore writes every chunk of an array with values: a missing one is a
                # damaged index (a zip's central directory is covered by no CRC), never
                # Zarr's "never written, so the fill value"
                raise FormatError(
                    f"{self.name}: zip entry {key} is missing from the shard's index: the "
                    "shard is damaged"
                )
            out[tuple(dst)] = chunk[tuple(src)]
        return out

    def _chunk(self, key: str, dec: ChunkDecoder) -> np.ndarray | None:
        """One decoded chunk, or None when it was never written.

        An uncompressed chunk is read into a scratch array reused for every chunk of its
        shape (it stays in the CPU cache while it is copied out), not into fresh memory.
        """
        if dec._decode is None and dec.stored == dec.dtype:
            info = self._infos.get(key)
            if info is not None and info.compress_type == zipfile.ZIP_STORED:
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
        mapper: Mapper | None = None,
    ) -> dict[str, FieldValue]:
        p = self._check(position)
        if str(p) not in self._nodes:
            # the writer makes every sample's group; without it (an index entry renamed
            # by a flipped byte, which no CRC covers) its scalars, strings and JSON are lost
            raise FormatError(
                f"{self.name}: sample at position {p}: no {p}/zarr.json (the sample's group): "
                "the zip's index is damaged"
            )
        group = self._nodes[str(p)]
        attrs = group.get("attributes", {}).get("simstore", {})
        wanted = set(fields) if fields is not None else None
        out: dict[str, FieldValue] = {}
        for name, (dtype, value) in attrs.get("scalars", {}).items():
            if wanted is None or name in wanted:
                try:
                    out[name] = scalar_from_json(value, dtype)
                except (ValueError, TypeError) as exc:
                    raise FormatError(
                        f"{self.name}: sample at position {p}: scalar field {name!r}: {exc}"
                    ) from exc
        for name, value in attrs.get("strings", {}).items():
            if wanted is None or name in wanted:
                out[name] = str(value)
        for name, value in attrs.get("json", {}).items():
            if wanted is None or name in wanted:
                out[name] = value
        for name in sorted(n for n, s in self._specs.items() if s.kind in ("tensor", "bytes")):
            if wanted is not None and name not in wanted:
                continue
            if not self._has_array(p, name):
                continue  # this sample lacks the field
            fill = None
            if into is not None and self._specs[name].kind == "tensor":
                fill = functools.partial(into, name)
            try:
                data = self._read_box(p, name, None, fill, mapper if fill is not None else None)
            except (ValueError, TypeError) as exc:
                if isinstance(exc, SimstoreError):
                    raise
                # chunks that do not fit the metadata (a chunk of 64 values where it
                # declares 16): NumPy's words, the shard, sample and field named
                raise FormatError(
                    f"{self.name}: sample at position {p}: field {name!r}: {exc}"
                ) from exc
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
        field (or None); an uncompressed field is then read straight into it. When ``out``
        also has ``map_file`` (a :data:`Mapper`) and takes ``mappable=True``, page-aligned
        chunks of a shard opened from a path are offered to it in place of the read,
        unless its ``maps_files`` is false (it would decline every one).
        """
        mapper = getattr(out, "map_file", None) if out is not None else None
        if not getattr(out, "maps_files", True):
            mapper = None  # it would decline every chunk: they are read (one call each)
        if fields is not None:
            fields = tuple(fields)  # read once per sample: an iterator would be used up
        ahead: Callable[[int, int], None] | None = (
            getattr(self._fp, "will_read", None) if self._fd is None else None)
        every = fields is None or {n for n, s in self._specs.items()
                                   if s.kind in ("tensor", "bytes")} <= set(fields)
        for i, p in enumerate(positions):
            span = self._extent(p) if ahead is not None and every else None
            if span is not None and ahead is not None:
                ahead(*span)
            try:
                sample = self._sample(
                    p, fields, functools.partial(out, i) if out is not None else None, mapper)
            finally:
                if span is not None:
                    self._fp.done_reading()
            yield sample

    def _extent(self, position: int) -> tuple[int, int] | None:
        """The bytes of a sample's entries, laid out end to end by the writer, or None.

        From its group's ``zarr.json`` to the next sample's (or the root's, written last),
        when the entries between are the sample's own and fill those bytes
        (``ZipIndex.extent``); None for another layout (a foreign writer's order, a
        damaged directory) or more than :data:`AHEAD_BYTES` (a sample whose large chunks
        cost few requests each anyway). What a reader of a remote file fetches in one
        request before reading the sample's entries (``RangedFile.will_read``).
        """
        extent = getattr(self._infos, "extent", None)
        if extent is None:  # zipfile's directory: a foreign zip
            return None
        p = int(position)
        after = f"{p + 1}/zarr.json" if f"{p + 1}/zarr.json" in self._infos else "zarr.json"
        span: tuple[int, int] | None = extent(f"{p}/zarr.json", after, f"{p}/")
        return span if span is not None and span[1] - span[0] <= AHEAD_BYTES else None

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
            if spec is None or spec.kind != "tensor" or not self._has_array(p, name):
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
    libraries = ("numcodecs",)
    """What its bytes depend on beyond the base: numcodecs compresses the chunks (the zip
    and the metadata are simstore's own)."""
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
        # a file object's name is the format's alone (the caller names the object)
        name = f"zarr shard {source}" if isinstance(source, str) else "zarr shard"
        return ZarrShardReader(source, name=name)

    def sniff(self, head: bytes, tail: bytes) -> bool:
        r"""Zip files start with ``PK\x03\x04``."""
        return head[:4] == MAGIC

    def describe(self) -> Mapping[str, Any]:
        """Parameters that shape the bytes (for lineage)."""
        return {"name": self.name, **self.options.to_json()}


@functools.lru_cache(maxsize=256)
def _runs(
    shape: tuple[int, ...], chunks: tuple[int, ...], lead: int
) -> tuple[tuple[str, int], ...]:
    """The chunks of a field read whole, in grid order: key suffix and values held.

    Every sample of a fixed-shape field has the same, so they are worked out once, not
    per sample: 0.5 us a field where NumPy's ``ndindex`` and the key strings took 5.5.
    """
    grid = [math.ceil(n / c) for n, c in zip(shape, chunks, strict=True)]
    row = math.prod(shape[lead + 1 :])
    return tuple(("/".join(map(str, idx)),
                  min(chunks[lead], shape[lead] - idx[lead] * chunks[lead]) * row)
                 for idx in itertools.product(*map(range, grid)))

