"""Shared plumbing of the CLI: the global options, JSON output and error mapping."""

from __future__ import annotations

import functools
import json
import math
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click

from simstore.catalog import Catalog
from simstore.errors import SimstoreError

__all__ = ["CliContext", "emit", "handle_errors", "pass_ctx"]

DEFAULT_STORE = "./.simstore"
F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class CliContext:
    """Options every command sees: the store URL, storage options, debug."""

    store_url: str = DEFAULT_STORE
    storage_options: dict[str, Any] = field(default_factory=dict)
    debug: bool = False

    def catalog(self, *, read_only: bool = False) -> Catalog:
        """Open the (initialised) store's catalog."""
        return Catalog.open(
            self.store_url, storage_options=self.storage_options, read_only=read_only
        )


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
        click.echo(text() if callable(text) else text)


def handle_errors(fn: F) -> F:
    """Turn library errors into one line on stderr and the class's exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SimstoreError as exc:
            ctx = click.get_current_context(silent=True)
            debug = bool(ctx and isinstance(ctx.obj, CliContext) and ctx.obj.debug)
            if debug or os.environ.get("SIMSTORE_DEBUG"):
                traceback.print_exc(file=sys.stderr)
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)

    return wrapper  # type: ignore[return-value]


def parse_storage_options(values: tuple[str, ...]) -> dict[str, Any]:
    """``key=value`` pairs; values that parse as JSON (numbers, true, objects) are typed."""
    out: dict[str, Any] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r}: expected key=value", param_hint="--storage-option")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out
