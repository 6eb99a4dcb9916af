"""The ``simstore`` console command: the command line, with Ctrl-C one line throughout.

The command line's modules take a few hundred milliseconds to import (pyarrow, click,
the stores), before the command's own handler of an interrupt exists: a Ctrl-C then,
the moment a user is most likely to press it after a typo, printed Python's traceback.
This module, light itself (``import simstore`` imports nothing heavy), catches it.
Once the command has returned, its work is done (a commit may have landed): an
interrupt while the interpreter shuts down (joining an ingest's process pool) is
ignored, where it printed a traceback or exited as if the command had failed.
"""

from __future__ import annotations

import contextlib
import signal
import sys

#: The exit code of a command stopped by Ctrl-C (SIGINT): 128 + the signal's number, as
#: shells report it.
EXIT_INTERRUPTED = 130


def _debug() -> bool:
    try:
        from simstore._env import env_debug
    except KeyboardInterrupt:  # a second Ctrl-C: no traceback
        return False
    return env_debug()


def main() -> None:
    """Run the ``simstore`` command line (the console script's entry point)."""
    try:
        from simstore.cli import main as cli
    except KeyboardInterrupt:
        if "--debug" in sys.argv[1:] or _debug():  # the traceback, as the command gives it
            import traceback

            traceback.print_exc(file=sys.stderr)
        sys.stderr.write("error: interrupted\n")
        raise SystemExit(EXIT_INTERRUPTED) from None
    try:
        cli()
    finally:
        with contextlib.suppress(ValueError, OSError):  # not the main thread: nothing to do
            signal.signal(signal.SIGINT, signal.SIG_IGN)
