"""Discovery of source files, their content hashes, and the plan that cuts them into tasks.

The plan depends only on the files (their keys, sizes and, for very large files whose
adapter reads sample ranges, their sample counts) and the shard size, never on the engine
or the worker count, so every engine stores the same shards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import math
import os
import re
import socket
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from simstore.errors import InvalidInputError, SourceError, StorageError, exhausted
from simstore.hashing import Hasher
from simstore.ingest._config import printable_path, printable_text
from simstore.ingest._filehash import hash_file
from simstore.ingest._guard import claims
from simstore.ingest._records import Piece, SourceFile
from simstore.protocols import SourceAdapter

__all__ = [
    "ListedSource",
    "SourceGone",
    "SupportsSampleRanges",
    "check_key",
    "discover",
    "hash_source",
    "host_token",
    "plan_tasks",
    "read_head",
    "resolve_adapter",
    "sample_counter",
]


@runtime_checkable
class SupportsSampleRanges(Protocol):
    """Optional adapter capability: count a file's samples and read a range of them.

    An adapter that declares ``supports_sample_ranges = True`` lets ingest cut a very large
    file (more than twice ``shard_size``) into pieces that run as separate tasks, on
    several workers at once. Implementers keep this contract: ``count_samples(path,
    options)`` is the number of samples ``iter_samples(path, key, options)`` yields, and
    with ``options["sample_range"] = [start, stop]`` ``iter_samples`` yields exactly samples
    ``start`` to ``stop - 1`` of that sequence, with the same keys and values, reading
    (about) only what those samples need. Time windows of a trajectory are the model: the
    window count comes from the time axis, and a range of windows is a range of time steps.
    """

    supports_sample_ranges: bool

    def count_samples(self, path: str, options: Mapping[str, Any]) -> int:
        """How many samples the file yields under these options."""
        ...


# What names an object by URL rather than a file (``s3://b/k``, ``gs://``, ``https://``):
# only when no file of that name exists is a source taken for one.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")

_KINDS = {
    stat.S_IFIFO: "a named pipe",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def _unreadable(path: str, exc: OSError) -> SourceError | StorageError:
    """The one-line error for an entry that cannot be opened: which link broke, or why.

    Out of descriptors or memory is this process's limit, not a bad file: a
    :class:`StorageError`, which ``on_error="skip"`` does not skip (every file after it
    would be "skipped" for the same reason, and the run end with exit 0).
    """
    out_of = exhausted(exc)
    if out_of is not None:
        return StorageError(
            f"{path}: cannot be opened: {exc.strerror or exc}: out of {out_of}; "
            "raise the limit, or ingest with fewer --workers"
        )
    if exc.errno == errno.ELOOP:
        return SourceError(f"{path}: a symbolic link loop")
    if exc.errno == errno.ENOENT and os.path.islink(path):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return SourceError(f"{path}: a dangling symbolic link (to {target}, which does not exist)")
    return SourceError(f"{path}: unreadable: {exc.strerror or exc}")


def _check_kind(path: str, mode: int) -> None:
    """Refuse what is neither a regular file nor a directory, by its ``stat`` mode.

    Reading a named pipe blocks until some writer appears (for ever, usually), and a
    device or a socket is no source.
    """
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        kind = _KINDS.get(stat.S_IFMT(mode), "an entry of an unknown kind")
        raise SourceError(f"{path}: {kind}, not a regular file or directory (not opened)")


def key_text(name: str) -> str:
    r"""A key from a relative path as the file system gave it: its bytes read as UTF-8.

    Python decodes file names with the locale's encoding, so under a Latin-1 locale the
    UTF-8 name ``dä.npy`` arrives as ``dÃ¤.npy``, and under the C locale without UTF-8
    mode as surrogate escapes: the same files would give other keys in another locale.
    A name whose bytes are not UTF-8 is returned as it is, for :func:`check_key` to refuse.
    """
    try:
        return os.fsencode(name).decode("utf-8")
    except UnicodeDecodeError:
        return name


def check_key(path: str, key: str) -> None:
    r"""Refuse a source whose key is not valid UTF-8 text (no key can name it).

    The key is the path relative to the ingest root (a named file's: its name), so only
    that part must be UTF-8: a root whose own path is not (``/data/run\xff/``) is fine.
    The one-line :class:`SourceError` names the whole path, its bytes that are not UTF-8
    as escapes (``caf\xe9.npy``).
    """
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise SourceError(
            f"{printable_path(path)}: the name is not valid UTF-8 (keys are text); "
            "rename the file"
        ) from None


def read_head(path: str, n: int = 64) -> bytes:
    """The first ``n`` bytes of a file (adapters sniff them); empty for a directory.

    Raises :class:`SourceError`, one line naming the path, for an entry that is no file to
    read: a dangling symbolic link, a link loop, a named pipe, socket or device (never
    opened: a pipe would block), or a file that cannot be opened. A walk lists such an
    entry as a source of its own (see :func:`discover`), so its task reports it like any
    bad file: an error, or a skipped file with this reason under ``on_error="skip"``. (A
    source whose key is not UTF-8 is refused the same way, by :func:`check_key`.)
    """
    try:
        st = os.stat(path)
    except OSError as exc:
        raise _unreadable(path, exc) from exc
    if stat.S_ISDIR(st.st_mode):
        return b""
    _check_kind(path, st.st_mode)
    # O_NONBLOCK: should the entry have become a pipe since the stat, the open still
    # returns, and the fstat below refuses it (no effect on a regular file)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError as exc:
        raise _unreadable(path, exc) from exc
    try:
        _check_kind(path, os.fstat(fd).st_mode)
        return os.read(fd, n)
    except OSError as exc:
        raise _unreadable(path, exc) from exc
    finally:
        os.close(fd)


_ADAPTER_TYPES: set[type] = set()  # types that passed the (slow) runtime protocol check


def resolve_adapter(adapter: SourceAdapter, path: str, head: bytes) -> SourceAdapter | None:
    """The adapter that reads ``path`` (``auto`` picks one), or None when none does.

    A directory is judged under its path with a trailing separator (``runs/case.h5/``):
    an adapter that reads directories looks at what is inside (the Zarr adapter finds
    ``zarr.json`` or ``.zgroup`` there) and still accepts it, while one that judges by
    extension no longer claims a folder that merely has its extension in its name, so
    that folder is walked like any other.
    """
    if head == b"" and os.path.isdir(path):
        path = os.path.join(path, "")
    resolve = getattr(adapter, "resolve", None)
    if callable(resolve):
        found = resolve(path, head)
        if found is None:
            return None
        if type(found) not in _ADAPTER_TYPES:
            if not isinstance(found, SourceAdapter):
                return None
            _ADAPTER_TYPES.add(type(found))
        return found  # type: ignore[no-any-return]
    return adapter if claims(adapter, path, head) else None


def _dir_identity(path: str) -> tuple[int, int] | None:
    """Device and inode of the directory at ``path`` (a link followed), None if unreadable."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _walk(top: str) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk(top)`` that follows links to directories, each real directory once.

    A directory reached again (a link to an ancestor, a second link to one directory, a
    link to a directory that is also walked under its own name) is left out of ``dirs``
    before the walk descends, so a loop ends and nothing is read twice: of the names a
    directory is reached under, the walk keeps the one it meets first (top-down, names
    sorted). The caller may prune ``dirs`` further, as with ``os.walk``.
    """
    seen = {_dir_identity(top)}
    for root, dirs, names in os.walk(top, followlinks=True):
        dirs.sort()
        idents = {d: _dir_identity(os.path.join(root, d)) for d in dirs}
        dirs[:] = [d for d in dirs if idents[d] is not None and idents[d] not in seen]
        yield root, dirs, names
        # what the caller kept is walked next (what it pruned, a hidden folder, is not
        # taken as walked): once each
        keep = []
        for d in dirs:
            ident = idents.get(d) or _dir_identity(os.path.join(root, d))
            if ident is not None and ident not in seen:
                seen.add(ident)
                keep.append(d)
        dirs[:] = keep


def _stat(path: str) -> tuple[int, int, str]:
    """Size, mtime and identity of a source (a directory: its files' sums and maxima).

    The identity is what the journal needs beyond size and mtime to tell a file from
    another: device, inode and change time. A copy unpacked with its times kept (``tar``,
    ``rsync -a``) or a file of the same name in another folder has the same key, size and
    mtime, but no program sets a change time, so its record is not taken for the other's.
    """
    st = os.stat(path)
    if stat.S_ISDIR(st.st_mode):
        return _dir_stat(path, st)
    return st.st_size, st.st_mtime_ns, f"{st.st_dev}:{st.st_ino}:{st.st_ctime_ns}"


def _dir_stat(path: str, top: os.stat_result) -> tuple[int, int, str]:
    """A directory source's total size, latest mtime and identity.

    The identity is ``dir:<files>:<times>:<inodes>``: digests of every folder's and file's
    path under ``path`` with, for ``times``, its size, mtime and change time, and for
    ``inodes`` its device and inode (this machine's numbers: compared only where the
    listing was made on this machine). Sums and maxima alone missed a folder inside
    renamed or two swapped (a rename changes the change time of the folder renamed, not
    of the files in it), and a re-run reused the old values.
    """
    size = mtime = count = 0
    times, inodes = Hasher(), Hasher()

    def note(rel: str, st: os.stat_result) -> None:
        name = os.fsencode(rel)
        times.update(b"%s\0%d\0%d\0%d\n" % (name, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        inodes.update(b"%s\0%d\0%d\n" % (name, st.st_dev, st.st_ino))

    note(".", top)
    for root, _, files in _walk(path):
        if root != path:
            try:
                note(os.path.relpath(root, path), os.stat(root))
            except OSError:  # gone meanwhile: the check after reading says so
                continue
        for name in sorted(files):
            full = os.path.join(root, name)
            try:
                st = os.stat(full)
            except OSError:  # a broken link inside: hashing the directory names it
                continue
            note(os.path.relpath(full, path), st)
            size += st.st_size
            mtime = max(mtime, st.st_mtime_ns)
            count += 1
    return size, mtime, f"dir:{count}:{times.hexdigest()}:{inodes.hexdigest()}"


def _same_dir(then: str, now: str, same_host: bool) -> bool:
    """Whether two identities of a directory source (``_dir_stat``) say it is unchanged."""
    if same_host:
        return then == now
    return then.rsplit(":", 1)[0] == now.rsplit(":", 1)[0]  # another machine's inodes


def _companion_stat(path: str) -> tuple[int, int, str]:
    """A companion file's size, mtime and identity; ``(-1, 0, "missing")`` when gone."""
    try:
        return _stat(path)
    except OSError:
        return -1, 0, "missing"


@functools.cache
def host_token() -> str:
    """Which machine (and boot of it) this process runs on.

    Device numbers, and on some network filesystems inode numbers, are the numbers of
    one machine's mounts: another machine may give the same file others. A task compares
    them with its file's listing only where this equals the listing machine's.
    """
    boot = ""
    with contextlib.suppress(OSError):
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
    return f"{socket.gethostname()}/{boot}"


def listed_here(listed_on: str) -> bool:
    """Whether this process runs on the machine ``listed_on`` (a :func:`host_token`) names.

    Only there may its sources' device and inode numbers be compared with their listing.
    """
    return bool(listed_on) and listed_on == host_token()


class SourceGone(SourceError):
    """A listed source that is not at its path when its task opens it.

    Removed since it was listed, or, on a dask worker, not visible there at all (the
    sources are not on a filesystem every worker mounts at the same path).
    """

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path

    def __reduce__(self) -> tuple[type[SourceGone], tuple[str, str]]:  # type: ignore[override]
        return (type(self), (self.message, self.path))


_CHANGED = "changed since it was listed ({}); re-run the ingest"


def listing_differs(src: SourceFile, st: os.stat_result, same_host: bool) -> list[str]:
    """What of regular file ``src``'s listing its stat ``st`` does not match.

    Size, mtime and change time, and device and inode where ``same_host`` (this is the
    machine that listed it).
    """
    what = []
    if st.st_size != src.listed_size:
        what.append("size")
    if st.st_mtime_ns != src.mtime_ns:
        what.append("mtime")
    parts = src.identity.split(":")
    if len(parts) == 3:
        dev, ino, ctime = parts
        if same_host and (str(st.st_dev), str(st.st_ino)) != (dev, ino):
            what.append("inode")
        if str(st.st_ctime_ns) != ctime:
            what.append("ctime")
    return what


class ListedSource:
    """One source checked against its listing while a task reads it.

    :meth:`open` (before the adapter opens the file) and :meth:`check` (after the last
    sample is read) compare the file with what discovery recorded: its size, mtime and
    change time, and on the machine that listed it its device and inode too. A regular
    file is opened here and held open while the task reads it, so :meth:`check` looks at
    the file that was opened (``fstat``: rewritten in place) and at what the path names
    now (``stat``: replaced by a rename, removed). A directory source (a Zarr group) is
    walked again after reading: its files' count, total size and latest times. A mismatch
    is a :class:`SourceError`, ``<path>: changed since it was listed (size/mtime); re-run
    the ingest``; a source missing at :meth:`open` is a :class:`SourceGone`. A source
    listed as broken (no identity) is not checked: its task reports what is wrong.
    """

    def __init__(self, src: SourceFile, same_host: bool) -> None:
        self.src = src
        self.same_host = same_host
        self.is_dir = src.identity.startswith("dir:")
        self.fd: int | None = None

    @property
    def active(self) -> bool:
        return bool(self.src.identity)

    def _changed(self, what: Sequence[str]) -> SourceError:
        return SourceError(f"{printable_path(self.src.path)}: {_CHANGED.format('/'.join(what))}")

    def _differs(self, st: os.stat_result) -> list[str]:
        """What of the file's listing ``st`` does not match (a regular file's stat)."""
        return listing_differs(self.src, st, self.same_host)

    def open(self) -> None:
        """Check the source before it is read; raises if it is gone or changed."""
        if not self.active:
            return
        path = self.src.path
        try:
            if self.is_dir:
                os.stat(path)
                return
            flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
            fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR) and not os.path.islink(path):
                raise SourceGone(
                    f"{printable_path(path)}: {_CHANGED.format('removed: no such file')}",
                    path,
                ) from exc
            return  # the task's own open says what is wrong (permissions, a dangling link)
        self.fd = fd
        try:
            what = self._differs(os.fstat(fd))
        except OSError:
            return
        if what:
            raise self._changed(what)

    def _companions_changed(self) -> list[str]:
        """The companions (a ``.pvd``'s steps) that differ from their listing now."""
        out = []
        for path, size, mtime, identity in self.src.companions:
            now_size, now_mtime, now_identity = _companion_stat(path)
            then, now = identity.split(":"), now_identity.split(":")
            if not self.same_host and len(then) == 3 == len(now):
                then, now = then[2:], now[2:]  # another machine's device and inode numbers
            if (now_size, now_mtime, now) != (size, mtime, then):
                out.append(printable_path(path))
        return out

    def check(self) -> None:
        """Check the source after it was read; raises if it changed since it was listed.

        Its companions (files its adapter read with it) are checked too.
        """
        if not self.active:
            return
        changed = self._companions_changed()
        if changed:
            more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
            raise SourceError(
                f"{printable_path(self.src.path)}: the file it references "
                f"{', '.join(changed[:3])}{more} changed since it was listed; re-run the ingest"
            )
        path = self.src.path
        if self.is_dir:
            try:
                size, mtime, identity = _stat(path)
            except OSError:
                raise self._changed(["removed"]) from None
            differs = [
                name
                for name, now, then in (
                    ("size", size, self.src.listed_size),
                    ("mtime", mtime, self.src.mtime_ns),
                )
                if now != then
            ]
            if not _same_dir(self.src.identity, identity, self.same_host):
                differs.append("files")
            if differs:
                raise self._changed(differs)
            return
        what: set[str] = set()
        if self.fd is not None:  # the file that was opened: rewritten in place?
            with contextlib.suppress(OSError):
                what.update(self._differs(os.fstat(self.fd)))
        try:  # what the path names now: replaced, removed?
            what.update(self._differs(os.stat(path)))
        except OSError:
            what.add("removed")
        if what:
            order = ("size", "mtime", "inode", "ctime", "removed")
            raise self._changed(sorted(what, key=order.index))

    def close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            with contextlib.suppress(OSError):
                os.close(fd)


def discover(sources: Sequence[str], adapter: SourceAdapter) -> tuple[list[SourceFile], list[str]]:
    """Source files in key order, and the walked files no adapter reads.

    Nothing here fails on a bad entry in a walked folder, whatever ``on_error`` says: a
    dangling symbolic link, a link loop, a named pipe, socket or device, or a file that
    cannot be opened is still listed as a source (size 0) when its name is one an
    adapter reads, and its task then fails on it with one line naming it (see
    :func:`read_head`): an error, or a skipped file under ``on_error="skip"``. Such an
    entry is never opened here (a pipe would block the walk for ever); one whose name no
    adapter reads is ignored like any other such file. A file whose ``companions`` cannot
    be listed (a malformed ``.pvd``) claims none and stays a source: its task reports it.

    A walk follows symbolic links, to files and to directories alike, and walks each real
    directory once (see :func:`_walk`): a link to an ancestor ends there, and of two
    links to one directory the first met (names sorted, top-down) gives its files' keys.
    """
    found: dict[str, SourceFile] = {}
    walked: set[str] = set()
    ignored: list[str] = []
    claimed: set[str] = set()
    chosen: dict[str, SourceAdapter | None] = {}  # the adapter each walked file resolved to
    broken: set[str] = set()  # entries read_head refuses: their tasks report them

    # each listed file's source and key, by its real folder: one reached twice is refused
    key_of: dict[str, tuple[int, str]] = {}
    real_folders: dict[str, str] = {}

    def add(path: str, key: str, source: int) -> None:
        """List ``path`` under ``key``, found by the ``source``-th source."""
        if key in found and found[key].path != path:
            raise InvalidInputError(
                printable_text(f"two sources map to the key {key!r}: {found[key].path} and {path}")
            )
        # by the real folder and the name: a source given through a linked folder (a
        # linked home or data folder) reaches the same files as one given as it is; a
        # file that is itself a link stays a source of its own (adapters.md)
        folder = os.path.dirname(path)
        real_folder = real_folders.get(folder)
        if real_folder is None:  # once per folder: a deep one costs a stat per level
            real_folder = real_folders[folder] = os.path.realpath(folder)
        real = os.path.join(real_folder, os.path.basename(path))
        first_source, first_key = key_of.setdefault(real, (source, key))
        if first_source != source and first_key != key:
            # a folder and a folder (or file) inside it, both given: the same file would
            # be ingested twice, as two samples under two keys
            raise InvalidInputError(printable_text(
                f"{path} is reached by two sources, as the keys {first_key!r} and {key!r} "
                "(a folder and a folder or file inside it): give each file once"
            ))
        size, mtime, identity = (0, 0, "") if path in broken else _stat(path)
        found[key] = SourceFile(path, key, size, mtime, identity=identity, file_size=size)

    def sniff(path: str, key: str) -> bytes:
        try:
            check_key(path, key)  # only the part under the root must be UTF-8
            return read_head(path)
        except SourceError:
            broken.add(path)
            return b""  # judged by its name alone

    def judged(path: str, head: bytes) -> SourceAdapter | None:
        """The adapter of a walked entry; ``adapter`` itself where one failed to judge it.

        An adapter's ``can_read`` that raises on one file makes that file a source its
        task reports (a bad file, skipped under ``on_error="skip"``), not a failed walk.
        """
        try:
            return resolve_adapter(adapter, path, head)
        except SourceError:
            broken.add(path)
            return adapter

    for number, src in enumerate(sources):
        path = os.path.abspath(os.fspath(src))
        if not os.path.lexists(path):
            if _URL.match(os.fspath(src)):
                raise InvalidInputError(printable_text(
                    f"{src}: sources are files on a filesystem, not URLs: copy the objects "
                    "to a local or shared filesystem first (aws s3 sync, rclone) or mount "
                    "the bucket (mountpoint-s3, s3fs)"
                ))
            raise InvalidInputError(printable_text(f"{src}: no such file or directory"))
        if os.path.isdir(path) and resolve_adapter(adapter, path, b"") is None:
            for root, dirs, names in _walk(path):
                keep = []
                for d in dirs:
                    full = os.path.join(root, d)
                    if d.startswith("."):
                        continue
                    if judged(full, b"") is not None:
                        add(full, key_text(os.path.relpath(full, path).replace(os.sep, "/")),
                            number)
                        walked.add(full)
                    else:
                        keep.append(d)
                dirs[:] = keep
                for name in sorted(names):
                    if name.startswith("."):
                        continue
                    full = os.path.join(root, name)
                    key = key_text(os.path.relpath(full, path).replace(os.sep, "/"))
                    picked = judged(full, sniff(full, key))
                    if picked is None:
                        ignored.append(full)
                        continue
                    if full not in broken:
                        chosen[full] = picked
                    add(full, key, number)
                    walked.add(full)
        else:
            key = key_text(os.path.basename(path))
            sniff(path, key)  # a broken entry named explicitly: its task says what is wrong
            add(path, key, number)
    for found_src in list(found.values()):
        if found_src.path in broken:
            continue
        picked = chosen.get(found_src.path)
        if picked is None:
            picked = resolve_adapter(adapter, found_src.path, sniff(found_src.path, found_src.key))
        companions = getattr(picked, "companions", None)
        if not callable(companions):
            continue
        try:
            referenced = list(companions(found_src.path))
        except Exception:  # a malformed .pvd: its own task reports it, naming the file
            continue
        # a .pvd that lists itself must not claim itself: it would vanish from the ingest,
        # neither read nor reported; its own task reports the data set instead
        own = os.path.normpath(os.path.abspath(found_src.path))
        paths = sorted({os.path.normpath(os.path.abspath(p)) for p in referenced} - {own})
        claimed.update(paths)
        if paths:
            found[found_src.key] = dataclasses.replace(
                found_src, companions=tuple((p, *_companion_stat(p)) for p in paths))
    files = [s for s in found.values() if not (s.path in walked and s.path in claimed)]
    return sorted(files, key=lambda s: s.key), sorted(ignored)


def hash_source(path: str) -> tuple[str, int]:
    """Content hash and size of a source file, or of a directory (sorted names and hashes)."""
    try:
        oid, size = hash_file(path)
        return str(oid), size
    except (IsADirectoryError, PermissionError):
        if not os.path.isdir(path):
            raise
    h = Hasher()
    total = 0
    entries = []
    for root, _, files in _walk(path):
        for name in files:
            full = os.path.join(root, name)
            # the name's bytes, not the locale's reading of them (UTF-8 order is text order)
            entries.append((os.fsencode(os.path.relpath(full, path).replace(os.sep, "/")), full))
    for rel, full in sorted(entries):
        try:  # a member that is no regular file is refused by name, never opened
            _check_kind(full, os.stat(full).st_mode)
        except OSError as exc:
            raise _unreadable(full, exc) from exc
        oid, size = hash_file(full)
        total += size
        h.update(rel + f"\0{oid}\0{size}\n".encode())
    return str(h.hexdigest()), total


def sample_counter(
    adapter: SourceAdapter, options: Mapping[str, Any]
) -> Callable[[SourceFile], int | None]:
    """``count(file)``: the file's sample count when its adapter reads ranges, else None.

    A file the adapter cannot count (unreadable, corrupt) is not cut: its task will give
    the error that names the file and what is wrong.
    """

    def count(src: SourceFile) -> int | None:
        try:
            found = resolve_adapter(adapter, src.path, read_head(src.path))
            if not isinstance(found, SupportsSampleRanges) or not found.supports_sample_ranges:
                return None
            return int(found.count_samples(src.path, options))
        except Exception:  # the file's own task reports what is wrong
            return None

    return count


def _pieces(src: SourceFile, samples: int, shard_size: int) -> list[SourceFile]:
    """The file cut into about ``shard_size`` source bytes per piece, by sample ranges."""
    count = min(samples, math.ceil(src.size / shard_size))
    bounds = [i * samples // count for i in range(count + 1)]
    shares = [src.size * b // samples for b in bounds]
    return [
        # everything else of the listing kept (its companions key each piece's record)
        dataclasses.replace(
            src,
            size=shares[i + 1] - shares[i],
            piece=Piece(index=i, count=count, start=bounds[i], stop=bounds[i + 1]),
            file_size=src.listed_size,
        )
        for i in range(count)
    ]


def plan_tasks(
    files: Sequence[SourceFile],
    shard_size: int,
    count_samples: Callable[[SourceFile], int | None] | None = None,
    piece_bytes: int = 0,
) -> list[list[SourceFile]]:
    """Runs of files in key order with about ``shard_size`` source bytes each.

    With ``count_samples`` (see :func:`sample_counter`), a file of more than twice
    ``max(shard_size, piece_bytes)`` bytes that it can count is cut into pieces of about
    that many bytes, one task each, so one huge file spreads over many workers. (Each
    piece opens its file again: ``piece_bytes`` keeps that cost small against the piece's
    work however small the shards are.)
    """
    piece = max(shard_size, piece_bytes)
    tasks: list[list[SourceFile]] = []
    current: list[SourceFile] = []
    acc = 0
    for f in files:
        samples = None
        if count_samples is not None and f.size > 2 * piece:
            samples = count_samples(f)
        if samples is not None and samples > 1:
            if current:
                tasks.append(current)
                current, acc = [], 0
            tasks.extend([p] for p in _pieces(f, samples, piece))
            continue
        current.append(f)
        acc += f.size
        if acc >= shard_size:
            tasks.append(current)
            current, acc = [], 0
    if current:
        tasks.append(current)
    return tasks
