"""The ``simstore`` command line: thin click commands over the library."""

from __future__ import annotations

import contextlib
import os
import sys

import click
from simstore.cli._common import (
    DEFAULT_STORE,
    CliContext,
    SimstoreGroup,
    parse_storage_options,
)

from simstore._env import WORKING_FOLDER_GONE, is_utf8, working_folder_exists

__all__ = ["main"]


@click.group(
    "simstore",
    cls=SimstoreGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    # called with global options and no command too, to print the help as `simstore`
    # alone does (click's own answer there is "missing command")
    invoke_without_command=True,
    no_args_is_help=True,
    subcommand_metavar="COMMAND [ARGS]...",
)
@click.option(
    "--store",
    "store_url",
    envvar="SIMSTORE_STORE",
    metavar="URL",
    default=DEFAULT_STORE,
    show_default=True,
    help="Store URL: a local path, file://, memory://, s3://bucket/prefix (env SIMSTORE_STORE).",
)
@click.option(
    "--storage-option",
    "storage_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Option passed to the storage backend (repeatable), e.g. endpoint_url=http://...",
)
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
@click.version_option(package_name="simstore")
@click.pass_context
def main(ctx: click.Context, store_url: str, storage_options: tuple[str, ...], debug: bool) -> None:
    """simstore: versioned training data for physics foundation models."""
    if ctx.invoked_subcommand is None:  # `simstore --store s1`: the help, exit 2
        raise click.exceptions.NoArgsIsHelpError(ctx)
    for stream in (sys.stdout, sys.stderr):
        # keys, names and messages are UTF-8 text: under a locale that cannot spell them
        # (Latin-1, ASCII) a character is written as an escape, not a UnicodeEncodeError
        if stream is not None and not is_utf8(stream.encoding):
            with contextlib.suppress(AttributeError, ValueError):
                stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
    if not working_folder_exists():
        # relative paths (the default store ./.simstore, sources) mean nothing there, and
        # torch's libraries fail to load in it: one line, not a traceback (the launcher
        # checks first; this is for main() called from Python)
        raise click.UsageError(WORKING_FOLDER_GONE)
    from_env = ctx.get_parameter_source("store_url") is click.core.ParameterSource.ENVIRONMENT
    if (not from_env and ctx.get_parameter_source("store_url")
            is click.core.ParameterSource.DEFAULT and os.environ.get("SIMSTORE_STORE") == ""):
        # click takes an empty variable for an unset one, and so the default store: an
        # empty value is refused as an empty --store is
        store_url, from_env = "", True
    ctx.obj = CliContext(
        store_url=store_url,
        storage_options=parse_storage_options(storage_options),
        debug=debug,
        store_flag="SIMSTORE_STORE" if from_env else "--store",
    )


def _register() -> None:
    import importlib

    for module in ("_commands", "_ingest", "_cost", "_samples"):
        try:
            mod = importlib.import_module(f"simstore.cli.{module}")
        except ModuleNotFoundError as exc:
            if exc.name != f"simstore.cli.{module}":
                raise
            continue
        for command in getattr(mod, "COMMANDS", []):
            main.add_command(command)


_register()
