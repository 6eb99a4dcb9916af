"""Ingest commands: ``simstore ingest`` and ``simstore stats``."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import click
from simstore.cli._common import (
    CliContext,
    check_at_least,
    check_message,
    debug_on,
    emit,
    handle_errors,
    parse_size_flag,
    pass_ctx,
    progress_shown,
    text_arg,
)

from simstore._sizes import human_bytes
from simstore.errors import InvalidInputError, SimstoreError, one_line
from simstore.ingest import (
    ADAPTER_GROUP,
    DEFAULT_COMPRESSION,
    FORMAT_GROUP,
    IngestConfig,
    IngestProgress,
    IngestResult,
    adapter_names,
    ingest,
    parse_compression,
    shard_format_names,
)
from simstore.ingest._config import printable_path
from simstore.stats import field_table

__all__ = ["COMMANDS", "ProgressBar"]


def _eta(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "--:--"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class ProgressBar:
    """A one-line progress bar on stderr: files, samples, MiB/s and ETA (by bytes)."""

    def __init__(self, stream: Any = None, width: int = 24, min_interval_s: float = 0.1) -> None:
        self.stream = stream or sys.stderr
        self.width = width
        self.min_interval_s = min_interval_s
        self._last = 0.0
        self._shown = False

    def __call__(self, p: IngestProgress) -> None:
        """Redraw (at most every ``min_interval_s``, and always at the end)."""
        self.draw("files", p.files_done, p.files_total, p.samples, p.bytes_done,
                  p.bytes_total, p.elapsed_s)

    def draw(self, unit: str, done: int, total: int, samples: int, bytes_done: int,
             bytes_total: int, elapsed_s: float) -> None:
        """Redraw for ``done`` of ``total`` ``unit`` (files, shards), by bytes where known."""
        now = time.monotonic()
        if done < total and now - self._last < self.min_interval_s:
            return
        self._last = now
        frac = bytes_done / bytes_total if bytes_total else done / max(1, total)
        filled = int(self.width * min(1.0, frac))
        rate = bytes_done / elapsed_s if elapsed_s > 0 else 0.0
        eta = (bytes_total - bytes_done) / rate if rate > 0 else math.inf
        line = (
            f"\r[{'#' * filled}{'.' * (self.width - filled)}] {unit} {done}/{total}"
            f"  samples {samples}  {rate / 2**20:.1f} MiB/s  ETA {_eta(eta)}"
        )
        self.stream.write(line)
        self.stream.flush()
        self._shown = True

    def finish(self) -> None:
        """End the line the bar drew on."""
        if self._shown:
            self.stream.write("\n")
            self.stream.flush()


def _parse_options(values: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r}: expected key=value", param_hint="--option")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


@contextlib.contextmanager
def _dask_logs(engine: str, *, debug: bool) -> Iterator[None]:
    """Dask's log lines kept off stderr for the run (the error is one line), but with --debug.

    A failed run leaves ``asyncio``'s logger quiet for the rest of the process (which the
    command ends with its error): the client's event loop may report a gather the run no
    longer awaits ("Task exception was never retrieved ... AllExit") when that task is
    collected, after the one line, more often on a busy machine.
    """
    if engine != "dask":
        yield
        return
    from simstore.ingest._dask import quiet_dask_logs  # dask is an optional extra

    try:
        with quiet_dask_logs(not debug):
            yield
    except BaseException:
        if not debug:
            logging.getLogger("asyncio").setLevel(logging.CRITICAL)
        raise


def _check_tmp_dir(tmp_dir: str) -> None:
    """Refuse a ``--tmp-dir`` that is not an existing folder, naming the flag (exit 2)."""
    if os.path.isdir(tmp_dir):
        return
    if not os.path.lexists(tmp_dir):
        problem = "no such directory"
    elif os.path.isfile(tmp_dir):
        problem = "a file, not a directory"
    else:
        problem = "not a directory"
    raise InvalidInputError(f"invalid --tmp-dir {printable_path(tmp_dir)}: {problem}")


def _summary(r: IngestResult) -> str:
    lines = [
        f"ingested {r.files_ingested} files, reused {r.files_reused}, unchanged "
        f"{r.files_unchanged} of {r.files} ({r.samples} samples, {r.samples_staged} staged) "
        f"in {r.seconds:.1f} s [{r.engine}, {r.workers} worker(s)]",
        f"bytes in {human_bytes(r.bytes_in)}, stored {human_bytes(r.bytes_stored)} in "
        f"{r.shards} shards, new {human_bytes(r.new_bytes)}",
    ]
    if r.staging_id:
        lines.append(f"staged {r.staging_id}")
    if r.snapshot_id:
        lines.append(f"snapshot {r.snapshot_id}")
    if not r.staging_id and not r.files_skipped:
        lines.append("nothing new to stage")
    for s in r.files_skipped:
        # as the reason names it: a newline or tab in the name escaped, so each skipped
        # file is one line (and the reason's copy of the path is found and dropped)
        path = one_line(printable_path(s.path))
        # a reason is the file's own one-line error, which names the file first
        reason = s.reason.removeprefix(f"{path}: ")
        lines.append(f"skipped {path}: {reason}")
    if r.files_ignored:
        lines.append(f"ignored {len(r.files_ignored)} files no adapter reads")
    return "\n".join(lines)


@click.command("ingest")
@click.argument("sources", nargs=-1, required=True)
@click.option("--dataset", required=True, help="Dataset to ingest into.")
@click.option("--adapter", default="auto", show_default=True, help="Source adapter name.")
@click.option(
    "--format",
    "shard_format",
    default="parquet",
    show_default=True,
    help="Shard format: parquet, lance, zarr (or an installed one).",
)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=int,
    help="Worker processes (local engine; dask engine without --address: LocalCluster size).",
)
@click.option(
    "--start-method",
    type=click.Choice(["fork", "spawn", "forkserver"]),
    default=None,
    help="How the local engine starts worker processes [default: fork on Linux while no "
    "other Python thread runs and the process has not written Lance shards, else spawn].",
)
@click.option(
    "--engine",
    type=click.Choice(["local", "dask"]),
    default="local",
    show_default=True,
    help="Where tasks run: this machine, or a dask.distributed cluster (pip install "
    "'simstore[dask]').",
)
@click.option(
    "--address",
    default=None,
    metavar="URL",
    help="Dask scheduler, e.g. tcp://host:8786 (with --engine dask; default: start a "
    "LocalCluster on 127.0.0.1).",
)
@click.option("--on-error", type=click.Choice(["fail", "skip"]), default="fail", show_default=True)
@click.option(
    "--mode", type=click.Choice(["upsert", "replace"]), default="upsert", show_default=True
)
@click.option("--snapshot", is_flag=True, help="Commit a snapshot after staging.")
@click.option("-m", "--message", default=None, help="Snapshot message.")
@click.option("--branch", default="main", show_default=True)
@click.option("--allow-schema-change", is_flag=True, help="Accept changed field types.")
@click.option("--nan", type=click.Choice(["allow", "error"]), default="allow", show_default=True)
@click.option("--time-window", type=int, default=None, help="Time steps per sample.")
@click.option("--stride", type=int, default=None, help="Time steps between windows.")
@click.option("--shard-size", default="256MiB", show_default=True, help="Target shard size.")
@click.option(
    "--piece-size",
    default="256MiB",
    show_default=True,
    help="A windowed file over twice max(shard size, this) runs as pieces of about that size.",
)
@click.option(
    "--compression",
    default=DEFAULT_COMPRESSION,
    show_default=True,
    help="none, zstd[:LEVEL] or shuffle-zstd[:LEVEL].",
)
@click.option("--chunk-bytes", default="1MiB", show_default=True, help="Zarr chunk size target.")
@click.option(
    "--dense-threshold",
    default="16MiB",
    show_default=True,
    help="Arrays larger than this stay in the source file and are read in slices "
    "(their samples go to Zarr shards).",
)
@click.option(
    "--zarr-threshold",
    default="128KiB",
    show_default=True,
    help="Samples with an array field larger than this go to Zarr shards.",
)
@click.option(
    "--option",
    "adapter_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Adapter option (repeatable), e.g. cad_tolerance=0.01, time_name=t.",
)
@click.option("--no-resume", is_flag=True, help="Ignore the journal of finished files.")
@click.option("--tmp-dir", default=None, help="Local folder for shards being written.")
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Progress bar (default: when stderr is a terminal).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable summary.")
@pass_ctx
@handle_errors
def ingest_cmd(
    ctx: CliContext,
    sources: tuple[str, ...],
    dataset: str,
    adapter: str,
    shard_format: str,
    workers: int,
    engine: str,
    start_method: str | None,
    address: str | None,
    on_error: str,
    mode: str,
    snapshot: bool,
    message: str | None,
    branch: str,
    allow_schema_change: bool,
    nan: str,
    time_window: int | None,
    stride: int | None,
    shard_size: str,
    piece_size: str,
    compression: str,
    chunk_bytes: str,
    dense_threshold: str,
    zarr_threshold: str,
    adapter_options: tuple[str, ...],
    no_resume: bool,
    tmp_dir: str | None,
    progress: bool | None,
    as_json: bool,
) -> None:
    """Ingest SOURCE files or folders into a dataset (staged; --snapshot commits)."""
    if message is not None and not snapshot:
        raise InvalidInputError(
            "-m/--message names a snapshot: it needs --snapshot (staged entries are "
            "committed later with `simstore snapshot NAME -m MSG`)"
        )
    message = text_arg(message)
    check_message(message)
    check_at_least(workers, "--workers", 1)
    check_at_least(time_window, "--time-window", 1)
    check_at_least(stride, "--stride", 1)
    if stride is not None and time_window is None:
        raise InvalidInputError("--stride needs --time-window (the windows it steps between)")
    if address is not None and engine != "dask":
        raise InvalidInputError(
            f"--address {address} names a dask scheduler: it needs engine='dask' (--engine dask)"
        )
    for flag, name, installed, group in (
        ("--format", shard_format, shard_format_names, FORMAT_GROUP),
        ("--adapter", adapter, adapter_names, ADAPTER_GROUP),
    ):
        names = installed()
        if name not in names:
            raise InvalidInputError(
                f"invalid {flag} {name!r}: installed: {', '.join(names) or 'none'} "
                f"(entry-point group {group})"
            )
    try:
        parse_compression(compression)
    except InvalidInputError as exc:
        raise InvalidInputError(f"--compression: {exc}") from None
    if tmp_dir is not None and address is None:  # a cluster's workers use their own disks
        _check_tmp_dir(tmp_dir)
    config = IngestConfig(
        adapter=adapter,
        format=shard_format,
        workers=workers,
        on_error=on_error,  # type: ignore[arg-type]
        mode=mode,  # type: ignore[arg-type]
        snapshot=snapshot,
        message=message,
        branch=branch,
        allow_schema_change=allow_schema_change,
        nan=nan,  # type: ignore[arg-type]
        time_window=time_window,
        stride=stride,
        shard_size=parse_size_flag(shard_size, "--shard-size", minimum=1),
        piece_bytes=parse_size_flag(piece_size, "--piece-size", minimum=1),
        compression=compression,
        chunk_bytes=parse_size_flag(chunk_bytes, "--chunk-bytes", minimum=1),
        dense_threshold=parse_size_flag(dense_threshold, "--dense-threshold", minimum=1),
        zarr_threshold=parse_size_flag(zarr_threshold, "--zarr-threshold", minimum=1),
        adapter_options=_parse_options(adapter_options),
        resume=not no_resume,
        tmp_dir=tmp_dir,
        engine=engine,  # type: ignore[arg-type]
        address=address,
        start_method=start_method,
    )
    bar = ProgressBar() if progress_shown(progress) else None
    catalog = ctx.catalog()  # ingest() refuses a --branch the dataset has no branch of
    try:
        with _dask_logs(engine, debug=debug_on()), _output_kept(as_json):
            result = ingest(
                list(sources), dataset=dataset, store=catalog, config=config, progress=bar
            )
    except ImportError as exc:  # a missing extra (dask): one line, like a library error
        raise SimstoreError(str(exc)) from exc
    finally:
        if bar is not None:
            bar.finish()
    emit(as_json, result.to_json(), lambda: _summary(result))


@contextlib.contextmanager
def _output_kept(as_json: bool) -> Iterator[None]:
    """With ``--json``, what the ingest's code prints goes to stderr, not into the document.

    An adapter (a plugin's) may ``print``, or a library it calls may write to file
    descriptor 1; on stdout that would precede the JSON and break every parser of it. Both
    the Python stream and the descriptor (which the pool's processes inherit) point at
    stderr until the ingest returns.
    """
    if not as_json or sys.stdout is None or sys.stderr is None:
        yield  # no stream to keep clean, or none to send the output to
        return
    saved = None
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved is not None:
            with contextlib.suppress(OSError, ValueError):
                sys.stdout.flush()
                sys.stderr.flush()
            os.dup2(saved, 1)
            os.close(saved)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


@click.command("stats")
@click.argument("ref")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
@handle_errors
def stats_cmd(ctx: CliContext, ref: str, as_json: bool) -> None:
    """Per-field statistics of a snapshot (merged exactly over the whole revision)."""
    cat = ctx.catalog(read_only=True)
    sid = cat.resolve(ref)
    snap = cat.snapshot(sid)
    rows = field_table(snap)
    exact = bool(snap.stats.get("exact", True)) if snap.stats else True
    obj = {"snapshot": sid, "exact": exact, "fields": rows}

    def text() -> str:
        head = ("field", "comp", "count", "nan", "inf", "mean", "std", "min", "max")
        table = [head] + [
            (
                r["field"],
                _fmt(r["component"]),
                _fmt(r["count"]),
                _fmt(r["nan_count"]),
                _fmt(r["inf_count"]),
                _fmt(r["mean"]),
                _fmt(r["std"]),
                _fmt(r["min"]),
                _fmt(r["max"]),
            )
            for r in rows
        ]
        widths = [max(len(row[i]) for row in table) for i in range(len(head))]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in table
        ]
        note = ("exact" if exact else
                "not exact: keys were replaced or deleted, see docs/ingest.md")
        return "\n".join([f"snapshot {sid} ({note})", *lines])

    emit(as_json, obj, text)


COMMANDS = [ingest_cmd, stats_cmd]
