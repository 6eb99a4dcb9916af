"""Shared plumbing of the CLI: the global options, JSON output and error mapping."""

from __future__ import annotations

import functools
import json
import locale
import math
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

import click

from simstore._env import env_debug
from simstore._launch import EXIT_INTERRUPTED, command_returned, stopped
from simstore._sizes import SizeError, parse_size
from simstore.catalog import Catalog
from simstore.errors import InvalidInputError, SimstoreError, one_line
from simstore.storage import local_path
from simstore.storage._s3_options import TEXT_OPTIONS

__all__ = [
    "EXIT_INTERRUPTED",
    "CliContext",
    "SimstoreGroup",
    "check_at_least",
    "check_message",
    "check_not_empty",
    "debug_on",
    "emit",
    "handle_errors",
    "parse_size_flag",
    "pass_ctx",
]

DEFAULT_STORE = "./.simstore"
F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class CliContext:
    """Options every command sees: the store URL, storage options, debug."""

    store_url: str = DEFAULT_STORE
    storage_options: dict[str, Any] = field(default_factory=dict)
    debug: bool = False
    store_flag: str = "--store"

    def catalog(self, *, read_only: bool = False) -> Catalog:
        """Open the (initialised) store's catalog."""
        self.check_local_store()
        return Catalog.open(
            self.store_url, storage_options=self.storage_options, read_only=read_only
        )

    def check_local_store(self) -> None:
        """Refuse a local store path that is, or lies under, a file rather than a folder.

        Without this, ``init`` on a file failed with the backend's "File exists" on
        ``FILE/simstore.json`` (exit 10), and the other commands with "Not a directory".
        """
        if not self.store_url:
            raise InvalidInputError(f"{self._given()}: empty store URL")
        url = local_path(self.store_url)
        if not url:
            return  # another scheme (or a ``file://`` with no path: this folder)
        path = os.path.normpath(url)
        while not os.path.isdir(path):
            if os.path.lexists(path):
                break
            parent = os.path.dirname(path)
            if not parent or parent == path:
                return
            path = parent
        else:
            return
        given = self._given()
        if not os.path.isfile(path):  # a dangling link, a socket...
            raise InvalidInputError(f"{given}: {path} is not a directory")
        what = "store directory" if path == os.path.normpath(url) else "directory"
        raise InvalidInputError(f"{given}: {path} is a file, not a {what}")

    def _given(self) -> str:
        """``--store URL`` or ``SIMSTORE_STORE=URL``: the value as the user gave it."""
        url = self.store_url or "''"
        if self.store_flag.startswith("-"):
            return f"{self.store_flag} {url}"
        return f"{self.store_flag}={url}"


pass_ctx: Callable[[Callable[..., Any]], Callable[..., Any]] = click.make_pass_decorator(
    CliContext
)


def _finite(obj: Any) -> Any:
    """``obj`` with NaN and infinities as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``.

    JSON has no such numbers (Python's ``json`` writes bare ``NaN``, which strict parsers
    refuse); the strings are the ones simstore uses for them in metadata.
    """
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def emit(as_json: bool, obj: Any, text: str | Callable[[], str]) -> None:
    """Print ``obj`` as JSON (``--json``: one valid document) or the human text."""
    if as_json:
        click.echo(
            json.dumps(_finite(obj), indent=2, sort_keys=True, default=str, allow_nan=False)
        )
    else:
        shown = text() if callable(text) else text
        if shown:  # nothing to list (``log -n 0``, an empty store): no blank line
            click.echo(shown)


def debug_on() -> bool:
    """``--debug``, or ``SIMSTORE_DEBUG`` set to a true value."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx and isinstance(ctx.obj, CliContext) and ctx.obj.debug) or env_debug()


@overload
def text_arg(text: str) -> str: ...
@overload
def text_arg(text: None) -> None: ...
def text_arg(text: str | None) -> str | None:
    """Text typed on the command line (a key, a prefix, a message, an author, a field).

    Keys are the UTF-8 text of file names (see ``simstore.ingest``) and the command line
    runs in Python's UTF-8 mode, which reads arguments as UTF-8: an argument's bytes
    are read as UTF-8 where they are UTF-8, else with the locale's encoding (a Latin-1
    terminal's typing: its ``dä`` is the bytes 64 e4), so ``cat d dä`` finds the key and
    ``-m café`` stores ``café`` under a Latin-1 or C locale too. None (an option not
    given) stays None.
    """
    if text is None:
        return None
    raw = os.fsencode(text)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        pass
    # not UTF-8: typed on a terminal of the locale's own encoding (a Latin-1 terminal's
    # "dä" is the byte e4), which UTF-8 mode does not use to read arguments
    try:
        return raw.decode(locale.getencoding())
    except (UnicodeDecodeError, LookupError):
        return text


def fields_arg(fields: str | None) -> list[str] | None:
    """The field names of a ``--fields a,b`` option (None when it is not given).

    Read as :func:`text_arg` reads text; an empty name (``a,,b``) is refused, naming the
    option as typed.
    """
    if fields is None:
        return None
    wanted = [f.strip() for f in text_arg(fields).split(",")]
    if any(not f for f in wanted):
        raise InvalidInputError(f"invalid --fields {fields!r}: an empty field name")
    return wanted


def progress_shown(progress: bool | None) -> bool:
    """Whether to draw a progress bar on stderr.

    As ``--progress/--no-progress`` say, else when stderr is a terminal; never when stderr
    is closed (``2>&-``: ``sys.stderr`` None).
    """
    if sys.stderr is None:
        return False
    if progress is not None:
        return progress
    try:
        return sys.stderr.isatty()
    except (OSError, ValueError):
        return False


def handle_errors(fn: F) -> F:
    """Turn library errors into one line on stderr and the class's exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SimstoreError as exc:
            if debug_on():
                traceback.print_exc(file=sys.stderr)
            click.echo(f"error: {one_line(str(exc))}", err=True)
            sys.exit(exc.exit_code)
        except MemoryError as exc:  # ArrowMemoryError too
            if debug_on():
                traceback.print_exc(file=sys.stderr)
            detail = one_line(str(exc)) or "an allocation failed"
            click.echo(
                f"error: out of memory ({detail}): give the process more memory, or ask "
                "for less at once (fewer --workers, a smaller --shard-size or --jobs)",
                err=True,
            )
            sys.exit(1)

    return wrapper  # type: ignore[return-value]


def parse_storage_options(values: tuple[str, ...]) -> dict[str, Any]:
    """``key=value`` pairs; values that parse as JSON (numbers, true, objects) are typed.

    Credentials and names (``TEXT_OPTIONS`` of the S3 store's options) stay the text
    typed: an access key or secret of digits (a MinIO user's) is not a number.
    """
    out: dict[str, Any] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r}: expected key=value", param_hint="--storage-option")
        if key in TEXT_OPTIONS:
            out[key] = value
            continue
        if value in ("True", "False"):  # as Python and the docs spell them (anon=True)
            out[key] = value == "True"
            continue
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def check_at_least(value: int | None, flag: str, minimum: int) -> None:
    """Refuse a number flag below ``minimum`` with one line naming the flag (None passes).

    The library checks the same value again, but its error names its parameter
    (``max_workers``), not the flag the user typed (``--jobs``).
    """
    if value is not None and value < minimum:
        raise InvalidInputError(f"invalid {flag} {value}: must be at least {minimum}")


def check_not_empty(value: str | None, flag: str, reason: str) -> None:
    """Refuse a text flag given as empty or blanks, naming it (None: not given, passes).

    ``snapshot -m "" --author ""`` made a snapshot that ``log`` showed as ``: ``.
    """
    if value is not None and not value.strip():
        raise InvalidInputError(f"invalid {flag} {value!r}: {reason}")


def check_message(message: str | None) -> None:
    """Refuse an empty snapshot message (``-m ""``), naming the flag."""
    check_not_empty(message, "-m/--message", "a snapshot needs a message")


def parse_size_flag(text: str, flag: str | None = None, *, minimum: int = 0) -> int:
    """Bytes in the value of a size flag (``--shard-size 256MiB``), at least ``minimum``.

    The rule of :mod:`simstore._sizes`, the same as the library's: ``KB``/``MB``/... are
    powers of 1000, ``KiB``/``MiB``/... and a bare ``K``/``M``/... powers of 1024, a bare
    number is bytes, a fraction rounds down. A bad value is an :class:`InvalidInputError`
    (exit 2) naming the flag: ``--shard-size: invalid size '1XB': unknown unit 'XB'; ...``.
    """
    where = f"{flag}: " if flag else ""
    try:
        value = parse_size(text)
    except SizeError as exc:
        raise InvalidInputError(f"{where}invalid size {text!r}: {exc}") from None
    if value < minimum:
        need = "positive" if minimum == 1 else f"at least {minimum} bytes"
        raise InvalidInputError(f"{where}invalid size {text!r}: must be {need}, got {value} bytes")
    return value


class _OneLineUsageError(click.UsageError):
    """A click usage error shown as one line: ``error: simstore CMD: what is wrong``."""

    def __init__(self, line: str, ctx: click.Context | None) -> None:
        super().__init__(line, ctx)
        self.line = line

    def show(self, file: Any = None) -> None:
        """Print the one line on stderr (no usage block, no "Try --help")."""
        click.echo(f"error: {self.line}", file=file if file is not None else sys.stderr)


def _usage_line(exc: click.UsageError, ctx: click.Context | None) -> str:
    """``simstore ingest: no such option '--wokers'...``: the command, then click's reason."""
    names: list[str] = []
    if exc.ctx is None and ctx is not None and ctx.invoked_subcommand:
        names.append(ctx.invoked_subcommand)  # raised while parsing the command's arguments
    ctx = exc.ctx or ctx
    while ctx is not None and ctx.parent is not None:
        names.append(ctx.info_name or ctx.command.name or "")
        ctx = ctx.parent
    command = " ".join(["simstore", *reversed([n for n in names if n])])
    message = " ".join(exc.format_message().split()).rstrip(".")
    if message[:1].isupper() and message[1:2].islower():
        message = message[0].lower() + message[1:]
    return f"{command}: {message}"


@contextmanager
def _one_line_usage_errors(ctx: click.Context | None) -> Iterator[None]:
    try:
        yield
    except (_OneLineUsageError, click.exceptions.NoArgsIsHelpError):
        raise  # already one line; or ``simstore`` with no command, which prints the help
    except click.UsageError as exc:
        raise _OneLineUsageError(_usage_line(exc, ctx), exc.ctx or ctx) from exc


class SimstoreGroup(click.Group):
    """The ``simstore`` group, whose usage errors are one line on stderr.

    An unknown option, a bad value or a missing argument prints ``error: simstore CMD:
    what is wrong``, naming the option, and exits 2 (click's code), like a library error;
    ``--help`` and ``simstore`` with no command (alone, or after global options only:
    see ``main``) still print the help.
    """

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        """Parse the global options; a usage error among them is one line."""
        with _one_line_usage_errors(None):
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; a usage error of its arguments is one line, and so is Ctrl-C.

        An interrupt (SIGINT) prints ``error: interrupted`` and exits 130, not click's
        ``Aborted!`` with exit 1, the code of other errors; the commands write nothing
        half-way (an ingest stages once, at its end; a failed commit's entry is removed).
        """
        try:
            with _one_line_usage_errors(ctx):
                try:
                    return super().invoke(ctx)
                finally:
                    command_returned()  # an interrupt from here on is ignored
        except KeyboardInterrupt as exc:
            if debug_on():
                traceback.print_exc(file=sys.stderr)
            message, code = stopped(exc)  # Ctrl-C, or SIGTERM under the console command
            click.echo(message, err=True)
            raise click.exceptions.Exit(code) from None


class PathArg(click.Path):
    """A ``click.Path`` that refuses an empty value (exit 2, naming the option).

    An empty ``--cache`` was the working folder to ``du`` and a missing folder named ""
    to ``pull`` (exit 10); an empty ``--store`` was already refused.
    """

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        if isinstance(value, str | bytes) and not value:
            self.fail("an empty path", param, ctx)
        return super().convert(value, param, ctx)
