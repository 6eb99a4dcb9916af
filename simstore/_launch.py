"""The ``simstore`` console command: the command line, with Ctrl-C one line throughout.

The command line's modules take a few hundred milliseconds to import (pyarrow, click,
the stores), before the command's own handler of an interrupt exists: a Ctrl-C then,
the moment a user is most likely to press it after a typo, printed Python's traceback.
This module, light itself (``import simstore`` imports nothing heavy), catches it.
Once the command has returned, its work is done (a commit may have landed): an
interrupt while the interpreter shuts down (joining an ingest's process pool) is
ignored, where it printed a traceback or exited as if the command had failed. SIGTERM
stops a command as Ctrl-C does (:class:`Terminated`).
"""

from __future__ import annotations

import contextlib
import signal
import sys
from typing import Any

#: The exit code of a command stopped by Ctrl-C (SIGINT): 128 + the signal's number, as
#: shells report it.
EXIT_INTERRUPTED = 130
#: The exit code of a command stopped by SIGTERM (a scheduler's stop, ``kill``).
EXIT_TERMINATED = 143


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is, so that it stops as it does on Ctrl-C.

    A scheduler stops a job with SIGTERM (Slurm, a pod's end, ``kill``), then SIGKILL a
    while later. Python's default for SIGTERM ended the process at once: no message, and
    an ingest's scratch files left for the next ingest or gc to reclaim. As an interrupt,
    it unwinds like Ctrl-C (the commands write nothing half-way) and ends with one line,
    ``error: terminated``, and exit code 143.
    """


_RUN = {"launched": False, "returned": False}
"""Whether :func:`main` runs the command, and whether the command has returned."""


def _on_sigterm(signum: int, frame: object) -> None:
    if not _RUN["returned"]:  # once the command has returned its work is done
        raise Terminated()


def is_command_handler(handler: object) -> bool:
    """Whether ``handler`` is the command line's SIGTERM handler (:class:`Terminated`)."""
    return handler is _on_sigterm


def command_returned() -> None:
    """The command has returned (or raised): a Ctrl-C or SIGTERM from now on is ignored.

    Its outcome stands (a commit may have landed, its output is printed); an interrupt
    while the process exits (click's, the interpreter's) printed a traceback or exited 1.
    Only under :func:`main`: a program that runs the command line itself keeps its own.
    """
    if not _RUN["launched"]:
        return
    _RUN["returned"] = True
    with contextlib.suppress(ValueError, OSError):  # not the main thread: nothing to do
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def stopped(exc: KeyboardInterrupt) -> tuple[str, int]:
    """The one-line message and the exit code of a command stopped by ``exc``."""
    if isinstance(exc, Terminated):
        return "error: terminated", EXIT_TERMINATED
    return "error: interrupted", EXIT_INTERRUPTED


def _debug() -> bool:
    try:
        from simstore._env import env_debug
    except KeyboardInterrupt:  # a second Ctrl-C: no traceback
        return False
    return env_debug()


def _started_as_simstore(orig_argv: list[str]) -> bool:
    """Whether the interpreter was started to run simstore, not a program importing it.

    Its console script, or ``python [options] -m simstore``.
    """
    import os

    args, i = orig_argv[1:], 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "-" or not arg.startswith("-"):
            return arg != "-" and os.path.basename(arg) == "simstore"
        if arg.startswith("--"):
            i += arg == "--check-hash-based-pycs"  # its value
            continue
        for j, letter in enumerate(arg[1:], start=2):  # short options, maybe joined (-Im)
            if letter in "mcWX":  # the rest of the word, or the next one, is its value
                value = arg[j:] or (args[i] if i < len(args) else "")
                i += not arg[j:]
                if letter == "m":
                    return value == "simstore"
                if letter == "c":
                    return False
                break
    return False


def _utf8_mode() -> None:
    """Start again in Python's UTF-8 mode where the locale's encoding is another.

    Keys, field names and the names a ``.pvd`` or a Zarr folder lists are the UTF-8
    text of file names; under a Latin-1 locale (or the C locale with ``PYTHONUTF8=0``)
    Python decodes and encodes file names with the locale's encoding, so the same files
    gave other keys and names, or were not found. ``-X utf8`` reads and writes the
    names' own bytes; the arguments pass on as the bytes they were given as. Once, before
    anything is imported, and only as the program itself (the console script or ``python
    -m simstore``), not when another program calls :func:`main`; where the exec fails,
    the command runs as it is.
    """
    from simstore._env import is_utf8

    if sys.flags.utf8_mode or is_utf8(sys.getfilesystemencoding()):
        return
    import os

    if not sys.executable or not _started_as_simstore(sys.orig_argv):
        return  # main() called by another program: starting that again is not ours to do
    argv = [sys.executable, "-X", "utf8", *sys.orig_argv[1:]]
    with contextlib.suppress(OSError, ValueError):
        os.execv(sys.executable, [os.fsencode(a) for a in argv])


def _working_folder_exists() -> None:
    """Refuse, in one line, to run in a working folder that was deleted.

    Relative paths (the default store ``./.simstore``, sources) mean nothing there, and
    some interpreters' imports fail in it (CPython 3.13.0-3.13.2 raise ``SystemError``
    importing NumPy): checked before the command's modules load.
    """
    from simstore._env import WORKING_FOLDER_GONE, working_folder_exists

    if not working_folder_exists():
        sys.stderr.write(f"error: simstore: {WORKING_FOLDER_GONE}\n")
        raise SystemExit(2)


def main() -> None:
    """Run the ``simstore`` command line (the console script's entry point)."""
    _utf8_mode()
    _working_folder_exists()
    _RUN.update(launched=True, returned=False)
    before: Any = None
    with contextlib.suppress(ValueError, OSError):  # not the main thread: left as it is
        before = signal.getsignal(signal.SIGTERM)
        if before is signal.SIG_DFL:  # not one ignored, or handled, on purpose
            signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        from simstore.cli import main as cli
    except KeyboardInterrupt as exc:
        if "--debug" in sys.argv[1:] or _debug():  # the traceback, as the command gives it
            import traceback

            traceback.print_exc(file=sys.stderr)
        message, code = stopped(exc)
        sys.stderr.write(f"{message}\n")
        raise SystemExit(code) from None
    try:
        cli()
    finally:
        command_returned()
        if not _started_as_simstore(sys.orig_argv):  # another program called main()
            _RUN["launched"] = False
            if before is not None:  # its SIGTERM as it was
                with contextlib.suppress(ValueError, OSError, TypeError):
                    signal.signal(signal.SIGTERM, before)
