"""A Parquet shard's page layout, kept so that a later open need not parse the file.

A trusted read of a local shard's fixed-width columns copies rows straight from the
mapped file (see ``_pages``). For that it needs the row groups' row counts, each
page-readable column's form, and where each page's values start. Opening the file in
Arrow (the footer read and decoded) and walking the page headers to find them cost a
fresh process 1.0-1.5 ms per shard, most of it holding the interpreter, on the path to
its first batch. They are a pure function of the file's bytes, and a shard is named by
the hash of its bytes, so a node keeps them under the shard id (the loader's layout
cache, beside its shard hash records) and a later job opens a shard whose file it trusts
from them: the Arrow file is then opened only if a read needs it.

A layout is one blob: a magic, an xxh3-64 checksum of the rest, a JSON header (format
version, shard id, file size, row counts, each column's form and pages per row group),
the shard's Arrow schema (IPC), then the pages' first rows and value offsets as int64.
One that does not check out (damaged, cut short, another shard's, another version, a
file of another size) is not used.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import xxhash

__all__ = ["PageColumn", "ShardLayout"]

# the first Arrow schema read of a process costs 0.1-0.2 ms: paid here, at import
pa.ipc.read_schema(pa.py_buffer(pa.schema([]).serialize()))

_MAGIC = b"SIMPAGES"
_VERSION = 1
_HEAD = struct.Struct("<8sQII")  # magic, xxh3-64 of everything after it, header, schema


@dataclass(frozen=True, slots=True)
class PageColumn:
    """A column read from the pages alone: each value ``width`` bytes after ``prefix``."""

    name: str
    leaf: int
    max_def: int
    prefix: int  # a blob value's length prefix (4), none for a plain value (0)
    width: int
    shape: tuple[int, ...]
    native: np.dtype[Any]
    scalar: bool = False  # a scalar field: read back as Python numbers, row by row

    @property
    def step(self) -> int:
        """Bytes from one value's start to the next's."""
        return self.prefix + self.width


PageStarts = tuple[np.ndarray, np.ndarray]
"""``(first row of each page in its row group, where its first value starts)``."""


@dataclass(frozen=True, slots=True, eq=False)
class ShardLayout:
    """What reading a trusted shard from its pages needs, without opening it in Arrow.

    ``columns``: every field of the shard, with its page-readable form or None;
    ``pages[(group, leaf, step)]``: that column's pages in that row group, or None where
    that row group's chunk is not read from its pages.
    """

    size: int
    schema: pa.Schema
    counts: tuple[int, ...]
    columns: dict[str, PageColumn | None]
    pages: dict[tuple[int, int, int], PageStarts | None]

    def to_bytes(self, shard_id: str) -> bytes:
        """The layout as one blob (see the module's note)."""
        cols: list[dict[str, Any]] = []
        arrays: list[bytes] = []
        for name, col in self.columns.items():
            if col is None:
                cols.append({"name": name})
                continue
            per_group, firsts, values = [], [], []
            for g in range(len(self.counts)):
                got = self.pages.get((g, col.leaf, col.step))
                per_group.append(-1 if got is None else len(got[0]))
                if got is not None:
                    firsts.append(got[0])
                    values.append(got[1])
            arrays += [np.ascontiguousarray(np.concatenate(a) if a else [], dtype="<i8").tobytes()
                       for a in (firsts, values)]
            cols.append({"name": name, "leaf": col.leaf, "max_def": col.max_def,
                         "prefix": col.prefix, "width": col.width, "shape": list(col.shape),
                         "dtype": col.native.str, "scalar": col.scalar, "pages": per_group})
        header = json.dumps({"version": _VERSION, "shard": shard_id, "size": self.size,
                             "counts": list(self.counts), "columns": cols},
                            separators=(",", ":")).encode()
        schema = self.schema.serialize().to_pybytes()
        pad = b"\0" * (-(_HEAD.size + len(header) + len(schema)) % 8)
        body = b"".join((header, schema, pad, *arrays))
        return _HEAD.pack(_MAGIC, xxhash.xxh3_64_intdigest(body), len(header),
                          len(schema)) + body

    @classmethod
    def from_bytes(cls, data: bytes, shard_id: str) -> ShardLayout:
        """A layout from its blob; ValueError when it is not a layout of ``shard_id``."""
        if len(data) < _HEAD.size:
            raise ValueError("shorter than its header")
        magic, checksum, head, schema_bytes = _HEAD.unpack_from(data)
        if magic != _MAGIC:
            raise ValueError("not a page layout")
        if xxhash.xxh3_64_intdigest(memoryview(data)[_HEAD.size:]) != checksum:
            raise ValueError("checksum mismatch")
        at = _HEAD.size
        try:
            meta = json.loads(data[at : at + head])
            if meta["version"] != _VERSION or meta["shard"] != shard_id:
                raise ValueError(f"holds {meta['shard']!r} v{meta['version']}")
            size, counts = int(meta["size"]), tuple(int(c) for c in meta["counts"])
            at += head
            schema = pa.ipc.read_schema(pa.py_buffer(data[at : at + schema_bytes]))
            at += schema_bytes
            at += -at % 8
            columns: dict[str, PageColumn | None] = {}
            pages: dict[tuple[int, int, int], PageStarts | None] = {}
            for c in meta["columns"]:
                if "leaf" not in c:
                    columns[str(c["name"])] = None
                    continue
                col = PageColumn(str(c["name"]), int(c["leaf"]), int(c["max_def"]),
                                 int(c["prefix"]), int(c["width"]),
                                 tuple(int(x) for x in c["shape"]), np.dtype(c["dtype"]),
                                 bool(c["scalar"]))
                columns[col.name] = col
                per_group = [int(n) for n in c["pages"]]
                if len(per_group) != len(counts):
                    raise ValueError("pages of another number of row groups")
                n = sum(max(k, 0) for k in per_group)
                first = np.frombuffer(data, dtype="<i8", count=n, offset=at)
                values = np.frombuffer(data, dtype="<i8", count=n, offset=at + 8 * n)
                at += 16 * n
                ends = _check_pages(first, values, per_group, counts, col, size)
                lo = 0
                for g, (k, hi) in enumerate(zip(per_group, ends, strict=True)):
                    pages[(g, col.leaf, col.step)] = (
                        None if k < 0 else (first[lo:hi], values[lo:hi]))
                    lo = hi
        except (KeyError, TypeError, pa.ArrowException) as exc:
            raise ValueError(f"bad layout: {exc}") from None
        if at != len(data):
            raise ValueError("wrong length")
        return cls(size=size, schema=schema, counts=counts, columns=columns, pages=pages)


def _check_pages(first: np.ndarray, values: np.ndarray, per_group: list[int],
                 counts: tuple[int, ...], col: PageColumn, size: int) -> list[int]:
    """Where each row group's pages end in ``first``; ValueError unless they fit.

    The few checks a fresh process can afford on its first batch's path (the blob's
    checksum says it is the one written): every read row group has pages, the first at
    its row 0 and none past its rows, and every page's first value lies in the file.
    A read checks each offset it uses against the file anyway.
    """
    ends, at = [], 0
    for g, k in enumerate(per_group):
        if k == 0:
            raise ValueError("a row group of no pages")
        if k > 0:
            if first[at] != 0 or first[at + k - 1] >= counts[g]:
                raise ValueError("inconsistent pages")
            at += k
        ends.append(at)
    if at and (int(values.min()) < col.prefix or int(values.max()) + col.width > size):
        raise ValueError("pages beyond the file")
    return ends
