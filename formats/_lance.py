"""Lance shards (``--format lance``): one Lance file (format v2) per shard.

A shard opens in stock lance: ``lance.file.LanceFileReader(path).read_all().to_table()``.
The column layout is the Parquet one (see :mod:`simstore.formats._arrow`). Lance's file
writer has no byte-shuffle knob: under ``shuffle-zstd`` float blobs are byte-shuffled by
simstore (as in Parquet) and small columns are plain zstd. Compression is set
through Lance's ``lance-encoding:compression`` field metadata, at Lance's default zstd
level (a second metadata entry for the level would make the bytes nondeterministic:
Lance writes metadata maps in hash order). Lance reads paths, not
Python file objects: ``open`` on a file object copies it to a temporary file first.

Column names: Lance refuses a top-level column name with a ``.`` (the adapters name an
array's attribute ``velocity.units``), and its projections cannot name a column with a
backtick or a NUL. Such a field is stored under an escaped column name: ``%`` and those
three characters become ``%XX`` (the character's hex code, upper case: ``.`` is ``%2E``,
``%`` is ``%25``), so ``velocity.units`` is the column ``velocity%2Eunits`` and a field
already named ``p%2Ex`` is ``p%252Ex``. ``urllib.parse.unquote`` gives the field name
back (:func:`field_name`). A name without those characters is its own column name, so
such shards are the bytes they always were. The reader maps columns to fields by position
(``__key__``, then the ``columns`` of the ``simstore`` metadata, in order), so a shard
written before the escaping (a ``%`` stored as is) reads as it did.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import tempfile
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa

from simstore.errors import FormatError, one_line
from simstore.hashing import Hasher
from simstore.ingest import ShardOptions, hash_sample_blocks, parse_compression, sample_nbytes
from simstore.protocols import ShardWriteResult
from simstore.sample import Sample

from ._arrow import KEY_COLUMN, ColumnPlan, arrow_schema, plans_from_schema
from ._columnar import ColumnarReader, ColumnarWriter

__all__ = ["LanceFormat", "LanceShardReader", "LanceShardWriter", "column_name", "field_name"]

MAGIC = b"LANC"

_ESCAPED = frozenset("%.`\x00")
"""Characters a Lance column name holds as ``%XX``: the escape itself, ``.`` (refused in a
top-level name), backtick and NUL (a projection cannot name them)."""
_UNESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")


def column_name(field: str) -> str:
    """The Lance column name of a field: ``%``, ``.``, backtick and NUL as ``%XX``."""
    if _ESCAPED.isdisjoint(field):
        return field
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in field)


def field_name(column: str) -> str:
    """The field a Lance column holds: the inverse of :func:`column_name`."""
    if "%" not in column:
        return column
    return _UNESCAPE.sub(lambda m: chr(int(m.group(1), 16)), column)


_USED_BY: int | None = None
"""The process that last read or wrote a Lance file (its pid): see :func:`used_here`."""


def used_here() -> bool:
    """Whether this process has read or written a Lance file.

    A child forked after does not count itself (its pid differs). Lance is not fork-safe
    once used: its runtime's threads do not survive into a forked child, which may crash
    on its first read.
    """
    return _USED_BY == os.getpid()


def _is_panic(exc: BaseException) -> bool:
    """Whether ``exc`` is a Rust panic raised through pyo3 (``pyo3_runtime.PanicException``).

    Lance's decoders panic on some damaged pages (a failed assertion, an ``unwrap`` of an
    unknown enum value). pyo3 raises a panic as a ``BaseException``, so a training loop's
    ``except Exception`` would not see it; the type is made by pyo3 itself and not
    importable, so it is known by name.
    """
    kind = type(exc)
    return kind.__name__ == "PanicException" and kind.__module__ == "pyo3_runtime"


@contextlib.contextmanager
def _failures(what: str) -> Iterator[None]:
    """Lance's errors, and its panics on damaged bytes, as a one-line ``FormatError``."""
    try:
        yield
    except BaseException as exc:
        if not (isinstance(exc, OSError | ValueError | RuntimeError) or _is_panic(exc)):
            raise
        # one line: Lance's texts may quote damaged bytes, and a panic's spans lines
        raise FormatError(one_line(f"{what}: {exc}")) from exc


def _lance_file() -> Any:
    global _USED_BY
    try:
        import lance.file as lance_file
    except ImportError as exc:  # pragma: no cover - pylance is a core dependency
        raise ImportError("Lance shards need pylance: pip install pylance") from exc
    _USED_BY = os.getpid()
    return lance_file


LANCE_FILE_VERSION = "2.2"
"""The Lance file format version of every Lance shard (pylance 14's default)."""


LANCE_FIXED_BOOLS = 4092
"""The most values of a bool tensor Lance writes as a ``fixed_size_list`` of any length
(pylance 14): its bit-packed miniblocks hold at most 8,186 bytes of a chunk's values, and
it refuses the file at ``close`` ("Value is too wide for miniblock encoding") for a list
of 4,093 bools or more, unless the length is a multiple of 8 of at most
:data:`LANCE_FIXED_BOOLS_MAX` bools."""

LANCE_FIXED_BOOLS_MAX = 32736
"""The longest ``fixed_size_list`` of bools with a length that is a multiple of 8 that
Lance 14 writes (32,744 is refused)."""


def lance_writes_fixed(dtype: np.dtype[Any], shape: tuple[int, ...]) -> bool:
    """Whether Lance writes a uniform tensor as a ``fixed_size_list`` (else: a blob).

    Every dtype but ``bool`` within 64 KiB (``fixed_tensor_bytes``); a bool tensor only at the
    lengths :data:`LANCE_FIXED_BOOLS` says (a 256 x 256 mask failed the whole ingest).
    The lengths Lance takes stay fixed columns, so their shards keep their bytes.
    """
    if dtype.kind != "b":
        return True
    n = math.prod(shape)
    return n <= LANCE_FIXED_BOOLS or (n % 8 == 0 and n <= LANCE_FIXED_BOOLS_MAX)


class LanceShardWriter(ColumnarWriter):
    """Streaming side of :class:`LanceFormat` (buffers one shard, writes on close)."""

    def _fixed_ok(self, dtype: np.dtype[Any], shape: tuple[int, ...]) -> bool:
        return lance_writes_fixed(dtype, shape)

    def _schema(self, plans: Sequence[ColumnPlan], stats: Mapping[str, Any] | None) -> pa.Schema:
        codec, _ = parse_compression(self.options.compression)
        # one metadata entry per field: Lance writes metadata maps in hash order
        meta = {b"lance-encoding:compression": b"none" if codec == "none" else b"zstd"}
        return arrow_schema(plans, stats, tensor_extension=False, field_metadata=meta)

    def _write(
        self, plans: Sequence[ColumnPlan], schema: pa.Schema, groups: Sequence[slice]
    ) -> None:
        names = [KEY_COLUMN, *(column_name(p.name) for p in plans)]
        stored = schema
        if names != schema.names:  # a field Lance cannot name as it is: escaped columns
            fields = [f.with_name(n) for f, n in zip(schema, names, strict=True)]
            stored = pa.schema(fields, metadata=schema.metadata)
        # the file format named, not left to the library's default (which a pylance
        # upgrade may move: the same samples would then give other bytes, and a reader
        # older than the default could not read them)
        writer = _lance_file().LanceFileWriter(self.path, stored, version=LANCE_FILE_VERSION)
        for table in self._tables(plans, schema, groups):
            if stored is not schema:
                table = pa.Table.from_arrays(table.columns, schema=stored)
            writer.write_batch(table)
        writer.close()


def _columns_of(schema: pa.Schema, plans: Mapping[str, ColumnPlan], name: str) -> dict[str, str]:
    """Each field's column in a shard's Lance schema (escaped or, written before, as is)."""
    names = list(schema.names)
    if len(names) != len(plans) + 1 or names[0] != KEY_COLUMN:
        raise FormatError(
            f"{name}: its {len(names)} columns are not {KEY_COLUMN} and the "
            f"{len(plans)} fields of its simstore metadata"
        )
    columns = {KEY_COLUMN: KEY_COLUMN}
    for field, column in zip(plans, names[1:], strict=True):
        if column not in (column_name(field), field):
            raise FormatError(f"{name}: column {column!r} does not hold field {field!r}")
        columns[field] = column
    return columns


_COPY_BLOCK = 4 << 20


class LanceShardReader(ColumnarReader):
    """An open Lance shard; ``take_rows`` of only the requested columns.

    Fields are read and returned under their own names; the columns that hold them may be
    escaped (:func:`column_name`).
    """

    copy_id: str | None = None
    """The xxh3-128 id of the bytes copied from a file object (:meth:`LanceFormat.open`);
    None for a shard opened at its path."""

    def __init__(self, path: str, name: str = "lance shard", cleanup: str | None = None) -> None:
        self._path = path
        # the temporary copy of a file object goes at close, or with a reader never
        # closed, when it is collected or the process exits
        self._remove_copy = (
            weakref.finalize(self, shutil.rmtree, cleanup, True) if cleanup else None
        )
        self._readers: dict[tuple[str, ...], Any] = {}
        with _failures(f"{name} is not a readable Lance file"):
            reader = _lance_file().LanceFileReader(path)
            num_rows = reader.num_rows()
            schema = reader.metadata().schema
        plans = plans_from_schema(schema, source=name)
        self._column = _columns_of(schema, plans, name)
        self._field = {c: f for f, c in self._column.items()}
        self._escaped = any(f != c for f, c in self._column.items())
        super().__init__(name, schema, plans, num_rows, self._column)

    def _reader(self, columns: tuple[str, ...]) -> Any:
        reader = self._readers.get(columns)
        if reader is None:
            reader = _lance_file().LanceFileReader(self._path, columns=list(columns))
            if len(self._readers) > 8:
                self._readers.clear()
            self._readers[columns] = reader
        return reader

    @contextlib.contextmanager
    def _reading(self, what: str) -> Iterator[None]:
        """A read of this shard, failing as :func:`_failures` says.

        A reader that failed (or panicked) is not used again.
        """
        try:
            with _failures(f"{self.name}: {what}"):
                yield
        except FormatError:
            self._readers.clear()
            raise

    def _read_positions(self, positions: Sequence[int], columns: Sequence[str]) -> pa.Table:
        stored = tuple(self._column[c] for c in columns)
        with self._reading("read failed"):
            table = self._reader(stored).take_rows(list(positions)).to_table()
        if self._escaped:  # the fields' own names, as the decoder looks them up
            table = table.rename_columns([self._field[c] for c in table.column_names])
        return table

    def keys(self) -> list[str]:
        """Every sample key in position order."""
        with self._reading("reading its keys failed"):
            table = self._reader((KEY_COLUMN,)).read_all().to_table()
        return [str(k) for k in table.column(KEY_COLUMN).to_pylist()]

    def close(self) -> None:
        """Drop readers (and the temporary copy of a file object)."""
        self._readers.clear()
        if self._remove_copy is not None:
            self._remove_copy()


class LanceFormat:
    """The Lance shard format (``--format lance``)."""

    name = "lance"
    libraries = ("pylance", "pyarrow", "numcodecs")  # numcodecs: the byte shuffle
    """Distributions this writer's bytes depend on (recorded in an ingest's lineage)."""
    supports_file_objects = True
    supports_streaming_writes = True

    def __init__(self, options: ShardOptions | None = None) -> None:
        self.options = options or ShardOptions()

    def open_writer(self, path: str) -> LanceShardWriter:
        """A writer that buffers samples and writes ``path`` on close."""
        return LanceShardWriter(path, self.options)

    def write(self, samples: Iterable[Sample], path: str) -> ShardWriteResult:
        """Write samples to one file; equal samples in equal order give equal bytes."""
        writer = self.open_writer(path)
        for s in samples:
            writer.add(s, sample_hash=hash_sample_blocks(s), size_bytes=sample_nbytes(s))
        return writer.close()

    def open(self, source: str | BinaryIO) -> LanceShardReader:
        """Open a shard: a local path, or a file object (copied to a temporary file)."""
        if isinstance(source, str):
            return LanceShardReader(source, name=f"lance shard {source}")
        given = getattr(source, "name", None)
        name = f"lance shard {given}" if isinstance(given, str) and given else "lance shard"
        tmp = tempfile.mkdtemp(prefix="simstore-lance-")
        try:
            path = os.path.join(tmp, "shard.lance")
            source.seek(0)
            # the copy is the whole object: hashed on the way, its caller can check it
            # against the object's id (ranged reads of a remote store hash nothing else)
            h = Hasher()
            with open(path, "wb") as f:
                while block := source.read(_COPY_BLOCK):
                    h.update(block)
                    f.write(block)
            reader = LanceShardReader(path, name=name, cleanup=tmp)
            reader.copy_id = h.hexdigest()
            return reader
        except BaseException:
            # a shard that cannot be opened leaves no copy behind (one per failed open)
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def sniff(self, head: bytes, tail: bytes) -> bool:
        """Lance files end with the magic ``LANC``."""
        return tail[-4:] == MAGIC

    def describe(self) -> Mapping[str, Any]:
        """Parameters that shape the bytes (for lineage)."""
        return {"name": self.name, **self.options.to_json()}
