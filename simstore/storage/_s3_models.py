"""botocore's data files kept parsed, per user, so that a fresh process makes its client sooner.

An S3 client needs three of botocore's JSON files: the endpoints of every service (1.2 MB),
the S3 model and its endpoint rules. Parsing them is most of a fresh process's first
client (a CLI call, a training job, each spawned DataLoader worker). Each file, once
parsed, is written here in ``marshal`` form, which loads about four times faster than the
JSON parses, and cannot run code when loaded (unlike pickle).

Where: ``$SIMSTORE_MODEL_CACHE`` if set (``off`` turns the cache off), else
``$XDG_CACHE_HOME/simstore/botocore``, else ``~/.cache/simstore/botocore``; the directory
is made private to the user (mode 0700). An entry is named by the data file's path, size
and modification time, botocore's version and Python's, so an upgrade or an edited file
(``AWS_DATA_PATH``) gets a new entry; it holds a checksum of its bytes. Entries are
written to a temporary name and renamed, so a reader never sees half of one. Anything
wrong with the cache (unwritable, a damaged entry) falls back to parsing the file: the
cache only ever saves time. Old entries are a few MB; delete the directory at will.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import marshal
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import xxhash

__all__ = ["cache_directory", "gc_paused", "load"]

ENV = "SIMSTORE_MODEL_CACHE"
_FORMAT = b"simstore-botocore-model-1\n"
_DIGEST = 16


def cache_directory() -> str | None:
    """The directory of parsed botocore files, or None when the cache is off."""
    value = os.environ.get(ENV, "")
    if value.lower() == "off":
        return None
    if value:
        return value
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "simstore", "botocore")


def _entry(directory: str, path: str) -> str:
    import botocore

    st = os.stat(path)
    ident = "\0".join((os.path.abspath(path), str(st.st_size), str(st.st_mtime_ns),
                       botocore.__version__, sys.version))
    return os.path.join(directory, hashlib.sha256(ident.encode()).hexdigest()[:32] + ".marshal")


def _read(entry: str) -> Any:
    try:
        with open(entry, "rb") as f:
            blob = f.read()
    except OSError:
        return None
    head = len(_FORMAT) + _DIGEST
    if len(blob) < head or not blob.startswith(_FORMAT):
        return None
    payload = memoryview(blob)[head:]
    if xxhash.xxh3_128_digest(payload) != blob[len(_FORMAT):head]:
        return None
    try:
        return marshal.loads(payload)
    except (ValueError, EOFError, TypeError):
        return None


def _write(directory: str, entry: str, data: Any) -> None:
    try:
        payload = marshal.dumps(data)
    except ValueError:  # not plain data: nothing to keep
        return
    tmp = f"{entry}.{uuid.uuid4().hex}.tmp"  # writers in several threads and processes
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(_FORMAT + xxhash.xxh3_128_digest(payload) + payload)
        os.replace(tmp, entry)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def load(path: str, parse: Callable[[], Any]) -> Any:
    """The data of botocore's file ``path``: from the cache, else ``parse()`` (then kept)."""
    directory = cache_directory()
    if directory is None:
        return parse()
    try:
        entry = _entry(directory, path)
    except OSError:
        return parse()
    data = _read(entry)
    if isinstance(data, dict):
        return data
    data = parse()
    _write(directory, entry, data)
    return data


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while botocore builds a client.

    A client is some 100,000 new dicts and lists (the models, the handlers); in a process
    that holds torch's objects, the collections they trigger walked them and the heap many
    times over. Collection resumes after (if it was on); nothing is lost, only deferred.
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
