"""What an ingest is asked (:class:`IngestConfig`) and what it reports (progress, result)."""

from __future__ import annotations

import json
import multiprocessing
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from simstore.errors import InvalidInputError
from simstore.ingest._arrays import MiB
from simstore.ingest._guard import check_options_of
from simstore.ingest._shards import DEFAULT_COMPRESSION, ShardOptions, parse_size
from simstore.names import DEFAULT_BRANCH, check_ref_name
from simstore.protocols import SourceAdapter
from simstore.sample import Schema

KiB = 1 << 10

__all__ = [
    "PIPELINE_OPTIONS",
    "EngineName",
    "IngestConfig",
    "IngestOptions",
    "IngestProgress",
    "IngestResult",
    "Mode",
    "NanPolicy",
    "OnError",
    "SkippedFile",
    "TaskTiming",
]

PIPELINE_OPTIONS = {
    "max_in_memory_bytes": "from dense_threshold, --dense-threshold",
    "tmp_dir": "from tmp_dir, --tmp-dir",
    "source_hash": "the content hash of each file",
    "sample_range": "the samples of one piece of a large file",
    "checked_crcs": "the CRC-32s of the byte ranges an adapter's crc_ranges names",
}
"""Options ingest hands every adapter itself, whatever the user's options say."""

OnError = Literal["fail", "skip"]
Mode = Literal["upsert", "replace"]
NanPolicy = Literal["allow", "error"]
EngineName = Literal["local", "dask"]


@dataclass(frozen=True, slots=True, kw_only=True)
class IngestConfig:
    """Every option of an ingest (the CLI flags map one to one onto these fields).

    Memory per worker is about ``shard_size`` (a columnar shard is buffered until it is
    written) plus ``dense_threshold`` and ``block_bytes``, plus up to 128 MiB of read
    buffers kept for reuse (``simstore._buffers``); it never depends on a source file's
    size. Fields that shape the stored bytes (adapter, its options, format, shard
    options, ``shard_size``, ``dense_threshold``, ``zarr_threshold``, ``block_bytes``,
    ``piece_bytes``) also key the journal.

    ``engine`` says where tasks run: ``local`` (in process, or, with ``workers`` N > 1,
    in this process and a pool of N - 1 processes, forked where safe, else spawned) or ``dask`` (a
    dask.distributed cluster at ``address``, or, without one, a ``LocalCluster`` of
    ``workers`` processes on 127.0.0.1). The engine never changes what is stored: tasks
    are planned the same way and give the same shards.
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
    row_group_bytes: int = 4 * MiB
    dense_threshold: int = 16 * MiB
    zarr_threshold: int = 128 * KiB
    """A sample with an array field larger than this goes to a Zarr shard (with the
    default Parquet or Lance format): Zarr reads arrays of 256 KiB 2.5x faster than
    Parquet and of 1-4 MiB 2-7x, at 64 KiB the two are about even
    (``python -m benchmarks.bench_loader --only formats``; docs/performance.md)."""
    block_bytes: int = 4 * MiB
    piece_bytes: int = 256 * MiB
    """A file its adapter can read in sample ranges (time windows) is cut into pieces, one
    task each, when it is larger than twice ``max(shard_size, piece_bytes)``, in pieces of
    about that many bytes. Each piece opens its file again (about 5 ms for HDF5, 15-25 ms
    for NetCDF-4 here), so pieces are kept large however small the shards are."""
    adapter_options: Mapping[str, Any] = field(default_factory=dict)
    resume: bool = True
    tmp_dir: str | None = None
    engine: EngineName = "local"
    address: str | None = None
    start_method: str | None = None
    """How the local engine's pool starts processes (``fork``, ``spawn``, ``forkserver``);
    None: ``fork`` on Linux while no other Python thread runs and the process has not
    written Lance shards, else ``spawn`` (see :func:`simstore.ingest._engine.start_method`)."""

    def __post_init__(self) -> None:
        for name in ("snapshot", "allow_schema_change", "resume"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidInputError(
                    f"invalid {name} {getattr(self, name)!r}: must be True or False"
                )
        for name in ("message", "author", "tmp_dir", "address", "start_method"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise InvalidInputError(f"invalid {name} {value!r}: must be a string")
        for name in ("message", "author"):
            value = getattr(self, name)
            if value is not None and not value.strip():
                raise InvalidInputError(
                    f"invalid {name} {value!r}: "
                    + ("a snapshot needs a message" if name == "message"
                       else "empty (leave it out for the current user)")
                )
        if self.message is not None and not self.snapshot:
            raise InvalidInputError(
                "message names a snapshot: it needs snapshot=True (staged entries are "
                "committed later, with the message given then)"
            )
        for name in ("workers", "time_window", "stride"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool)
                                      or not isinstance(value, numbers.Integral)):
                raise InvalidInputError(f"invalid {name} {value!r}: must be a whole number")
        if self.workers < 1:
            raise InvalidInputError(f"invalid workers {self.workers}: must be at least 1")
        if self.engine not in ("local", "dask"):
            raise InvalidInputError(f"invalid engine {self.engine!r}: expected local or dask")
        if self.address is not None and self.engine != "dask":
            raise InvalidInputError("address names a dask scheduler: it needs engine='dask'")
        methods = multiprocessing.get_all_start_methods()
        if self.start_method is not None and self.start_method not in methods:
            raise InvalidInputError(
                f"invalid start_method {self.start_method!r}: this platform starts processes "
                f"with {', '.join(methods)}"
            )
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
            "zarr_threshold",
            "block_bytes",
            "piece_bytes",
        ):
            value = getattr(self, name)
            if isinstance(value, str):  # "256MiB", as on the command line
                try:
                    value = parse_size(value)
                except InvalidInputError as exc:
                    raise InvalidInputError(f"{name}: {exc}") from None
                object.__setattr__(self, name, value)
            elif isinstance(value, numbers.Integral | float) and not isinstance(value, bool) \
                    and float(value).is_integer():
                value = int(value)
                object.__setattr__(self, name, value)
            else:
                raise InvalidInputError(
                    f"invalid {name} {value!r}: give a number of bytes or a size such as '256MiB'"
                )
            if value < 1:
                raise InvalidInputError(f"invalid {name} {value}: must be positive")
        check_ref_name(self.branch, "branch name")
        self._check_option_types()
        self.shard_options()

    def _check_option_types(self) -> None:
        """``adapter_options`` and ``chunks`` are mappings of names (no raw TypeError later)."""
        if not isinstance(self.adapter_options, Mapping) or not all(
            isinstance(k, str) for k in self.adapter_options
        ):
            raise InvalidInputError(
                f"invalid adapter_options {self.adapter_options!r}: "
                "must map option names to values"
            )
        if not isinstance(self.chunks, Mapping):
            raise InvalidInputError(
                f"invalid chunks {self.chunks!r}: must map field names to chunk shapes"
            )
        for name, shape in self.chunks.items():
            if not isinstance(name, str) or isinstance(shape, str | bytes) or not isinstance(
                shape, Sequence
            ) or not shape or not all(
                isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 1
                for n in shape
            ):
                raise InvalidInputError(
                    f"invalid chunks entry {name!r}: {shape!r}: give a field name and a chunk "
                    "shape of positive whole numbers, such as (1, 64, 64)"
                )

    def check_adapter_options(self, adapter: SourceAdapter) -> None:
        """Refuse an option that ``adapter`` does not take, before anything is read or written.

        The options checked are ``adapter_options`` and ``time_window``/``stride``. An
        adapter lists the options it takes in ``options`` (``auto``: those of every adapter
        it may pick); one that declares no ``options`` takes any. The options ingest itself
        sets (:data:`PIPELINE_OPTIONS`) are refused from a user: ingest would replace them.
        An adapter with a ``check_options(options)`` hook then checks the values given
        (``auto``: each adapter it may pick, its own options only) and raises
        ``InvalidInputError`` for a bad one.
        """
        for key in self.adapter_options:
            if key in PIPELINE_OPTIONS:
                raise InvalidInputError(
                    f"adapter option {key!r} is set by ingest itself ({PIPELINE_OPTIONS[key]}): "
                    "remove it"
                )
        given = set(self.adapter_options)
        if self.time_window is not None:
            given.add("time_window")
        if self.stride is not None:
            given.add("stride")
        if "stride" in given and "time_window" not in given:
            raise InvalidInputError("adapter option 'stride' needs a time_window")
        declared = getattr(adapter, "options", None)
        if declared is not None:
            unknown = sorted(given - set(declared))
            if unknown:
                takes = ", ".join(sorted(declared)) or "none"
                raise InvalidInputError(
                    f"unknown adapter option{'s' if len(unknown) > 1 else ''} "
                    f"{', '.join(repr(k) for k in unknown)} for adapter {adapter.name!r} "
                    f"(options it takes: {takes})"
                )
        check_options_of(adapter, {k: v for k, v in self.adapter_params().items() if k in given})

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
            "zarr_threshold": self.zarr_threshold,
            "block_bytes": self.block_bytes,
            "piece_bytes": self.piece_bytes,
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
    zarr_threshold: int
    block_bytes: int
    piece_bytes: int
    adapter_options: Mapping[str, Any]
    resume: bool
    tmp_dir: str | None
    engine: EngineName
    address: str | None
    start_method: str | None


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
class TaskTiming:
    """How one task ran: where, how long, and how much it read and wrote.

    ``worker`` is the dask worker's address, ``pid <n>`` for a process-pool worker, or
    ``local``. ``seconds`` is the wall time inside the task (the last attempt, when the
    engine retried it); ``failed`` is set when the task failed and its files were skipped.
    """

    task: int
    worker: str
    files: int
    bytes_in: int
    samples: int
    shards: int
    seconds: float
    failed: bool = False

    def to_json(self) -> dict[str, Any]:
        """JSON shape (one entry of the ``--json`` summary's ``tasks``)."""
        return {
            "task": self.task,
            "worker": self.worker,
            "files": self.files,
            "bytes_in": self.bytes_in,
            "samples": self.samples,
            "shards": self.shards,
            "seconds": round(self.seconds, 4),
            "failed": self.failed,
        }


def printable_path(path: str) -> str:
    r"""``path`` as valid text: the bytes of a name that are not UTF-8 as ``\xe9`` escapes.

    Such a name reaches Python as lone surrogates (``\udce9``), which strict JSON parsers
    refuse and a terminal cannot show; skip reasons name such files the same way. A
    path is text like any other here: :func:`printable_text` of it.
    """
    return printable_text(path)


def printable_text(text: str) -> str:
    r"""A message with every path in it as :func:`printable_path` shows it.

    A path whose bytes are not UTF-8 (a source root named ``run\xff``, say) reaches a
    message as lone surrogates, which a strict UTF-8 stream or a JSON parser refuses:
    they become ``\xff`` escapes, and the rest of the text is kept as it is.
    """
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate no file name decodes to
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass(frozen=True, slots=True, kw_only=True)
class IngestResult:
    """What an ingest did (``to_json`` is the ``--json`` summary).

    ``engine`` is ``local``, ``process-pool`` or ``dask``; ``workers`` is the number of
    workers the run used (for dask: distinct workers that ran at least one task), and
    ``tasks`` the timing of every task in plan order.
    """

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
    bytes_read: int
    """Bytes of the files this run read (``bytes_in`` less the files taken from the
    journal): what ``mib_per_s`` is a rate of."""
    bytes_stored: int
    new_bytes: int
    shards: int
    seconds: float
    engine: str
    workers: int
    staging_id: str | None
    snapshot_id: str | None
    schema: Schema
    tasks: tuple[TaskTiming, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The machine-readable summary."""
        mib_s = self.bytes_read / MiB / self.seconds if self.seconds > 0 else 0.0
        return {
            "dataset": self.dataset,
            "files": self.files,
            "files_ingested": self.files_ingested,
            "files_reused": self.files_reused,
            "files_unchanged": self.files_unchanged,
            "skipped": [
                {"path": printable_path(s.path), "reason": s.reason} for s in self.files_skipped
            ],
            "ignored": [printable_path(p) for p in self.files_ignored],
            "samples": self.samples,
            "samples_staged": self.samples_staged,
            "bytes_in": self.bytes_in,
            "bytes_read": self.bytes_read,
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
            "tasks": [t.to_json() for t in self.tasks],
        }
