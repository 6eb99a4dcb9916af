"""A store over any fsspec filesystem (``memory://``, ``gs://``, ...).

This wraps fsspec rather than exposing it: the rest of simstore sees only the small
``ObjectStore`` protocol. The filesystem is created lazily with
``skip_instance_cache=True`` so an instance pickles into a worker process and never shares
fsspec's per-process cache across ``fork``.

Compare-and-swap here is atomic only within one process (a lock held around read, compare
and write). That is exact for ``memory://``, which lives in one process; backends that
offer conditional writes get their own class (S3). ``supports_atomic_cas`` says which.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import fsspec

from simstore.errors import (
    ConflictError,
    FormatError,
    InvalidInputError,
    NotFoundError,
    ReadOnlyError,
    StorageError,
)
from simstore.hashing import hash_bytes
from simstore.storage._base import ObjectInfo, check_key, larger_than
from simstore.storage._s3_options import DAY_S, Tuning

__all__ = ["FsspecStore"]

# Filesystems whose files are stamped with this machine's clock (see ``clock``).
_LOCAL_CLOCK_PROTOCOLS = frozenset({"memory", "file", "local"})
_PROBE_PREFIX = "_probe/"

# One lock per process guards CAS for in-process filesystems (memory://): fsspec's memory
# filesystem is itself one per process, so the lock has exactly its scope.
_CAS_LOCK = threading.Lock()


_CREDENTIALS = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*):[^/\s@]*@")


def without_passwords(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` in it masked."""
    return _CREDENTIALS.sub(r"\1:***@", text)


def refuse_query_or_fragment(url: str, path: str, hint: str = "") -> None:
    """Refuse store URL ``url`` whose ``path`` holds a ``?`` or ``#``: keys are appended to it.

    ``hint`` ends the message (how to name such a folder, where the scheme has a way).
    """
    if "?" in path or "#" in path:
        raise InvalidInputError(
            f"{without_passwords(url)}: a store URL cannot have a query string or fragment "
            f"('?', '#'): object keys are appended to its path{hint}"
        )


def _why(exc: BaseException) -> str:
    """An error's text (passwords of URLs masked), or its type where it has none."""
    return without_passwords(str(exc)) or type(exc).__name__


_TIMEOUT_OPTIONS = {name: getattr(Tuning(), name) for name in ("connect_timeout_s",
                                                                "read_timeout_s")}
"""An HTTP store's socket timeouts (seconds): the S3 store's options, with its defaults;
without them a server that stalls part way through a reply stalls the read for ever."""


def _http_timeouts(
    url: str, protocol: str, options: Mapping[str, Any]
) -> tuple[float, float] | None:
    """An ``http(s)://`` store's (connect, read) timeouts; None for other schemes.

    Other schemes take no such option: one given goes to their filesystem as it is.
    """
    if protocol not in ("http", "https"):
        return None
    out = []
    for name, default in _TIMEOUT_OPTIONS.items():
        value = options.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not (
            0 < value <= DAY_S
        ):
            raise InvalidInputError(
                f"{url}: storage option {name} must be a number of seconds in (0, {DAY_S}], "
                f"got {value!r}"
            )
        out.append(float(value))
    return out[0], out[1]


class FsspecStore:
    """An :class:`~simstore.storage.ObjectStore` over an fsspec filesystem and root path."""

    def __init__(
        self,
        url: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        read_only: bool = False,
    ) -> None:
        given = url.rstrip("/")
        self.url = without_passwords(given)
        """The URL as shown in messages and output: a password in it is masked."""
        self.protocol, _, path = given.partition("://")
        refuse_query_or_fragment(given, path)
        self.root = path.rstrip("/")
        self._url_options: dict[str, Any] = {}
        """What the URL itself says beyond the path: a host, a port, a user (ftp://,
        sftp://, webhdfs://, ...), as fsspec's own ``url_to_fs`` takes it."""
        if self.protocol != "memory":
            try:
                cls = fsspec.get_filesystem_class(self.protocol)
            except (ImportError, ValueError):
                pass  # a missing package is said when the filesystem is first needed
            else:
                self.root = str(cls._strip_protocol(given)).rstrip("/")
                self._url_options = dict(cls._get_kwargs_from_urls(given))
        self.storage_options = dict(storage_options or {})
        if self.url != given and "password" in self._url_options:
            # the URL shown has it masked: the options carry it, so that the store opens
            # again from ``url`` and ``storage_options`` (given options still win)
            self.storage_options.setdefault("password", self._url_options["password"])
        self._timeouts = _http_timeouts(self.url, self.protocol, self.storage_options)
        self.read_only = read_only
        self.supports_atomic_cas = self.protocol == "memory"
        self._fs: fsspec.AbstractFileSystem | None = None
        self._fs_pid = 0
        """The process the filesystem was made in: a forked process (a DataLoader worker)
        makes its own, as clients such as HTTP's are not fork-safe."""

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_fs"] = None
        return state

    def __repr__(self) -> str:
        return f"FsspecStore({self.url!r})"

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        """The filesystem, created on first use in this process."""
        if self._fs is None or self._fs_pid != os.getpid():
            options = {**self._url_options, **self.storage_options}
            if self._timeouts is not None:
                import aiohttp  # fsspec's HTTP filesystem's client

                connect, read = self._timeouts
                for name in _TIMEOUT_OPTIONS:
                    options.pop(name, None)
                client = dict(options.get("client_kwargs") or {})
                client.setdefault("timeout", aiohttp.ClientTimeout(sock_connect=connect,
                                                                   sock_read=read))
                options["client_kwargs"] = client
            self._fs = fsspec.filesystem(self.protocol, skip_instance_cache=True, **options)
            self._fs_pid = os.getpid()
        return self._fs

    def _path(self, key: str) -> str:
        check_key(key)
        return f"{self.root}/{key}" if self.root else key

    def _key(self, path: str) -> str:
        path = path.lstrip("/") if self.protocol == "memory" else path
        root = self.root.lstrip("/") if self.protocol == "memory" else self.root
        return path[len(root) + 1 :] if root else path

    def _check_writable(self, key: str) -> None:
        check_key(key)
        if self.read_only:
            raise ReadOnlyError(f"{self.url}: store is read-only, cannot write {key}")

    def get(
        self, key: str, byte_range: tuple[int, int] | None = None, *,
        max_bytes: int | None = None,
    ) -> bytes:
        """Read an object or a byte range (see ``ObjectStore.get``).

        With ``max_bytes``, a whole read asks for at most ``max_bytes + 1`` bytes (one
        request still, as a filesystem's size lookup first would not be; an HTTP server
        that ignores the range sends it all, refused once it has arrived).
        """
        path = self._path(key)
        try:
            if byte_range is None:
                if max_bytes is None:
                    return bytes(self.fs.cat_file(path))
                data = bytes(self.fs.cat_file(path, start=0, end=max_bytes + 1))
                if len(data) > max_bytes:
                    raise larger_than(self.url, key, max_bytes)
                return data
            start, end = byte_range
            data = bytes(self.fs.cat_file(path, start=start, end=end))
        except FileNotFoundError as exc:
            raise NotFoundError(f"{self.url}: no object {key}") from exc
        except FormatError:  # larger than max_bytes
            raise
        except Exception as exc:
            raise StorageError(f"{self.url}/{key}: read failed: {_why(exc)}") from exc
        if len(data) > end - start:
            # the whole object: a server that ignores Range (Python's http.server) and
            # a client that does not cut the reply
            data = data[start:end]
        return data

    def get_versioned(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        """Read a ref and its version token (the hash of its bytes)."""
        data = self.get(key, max_bytes=max_bytes)
        return data, hash_bytes(data)

    def put(self, key: str, data: bytes) -> None:
        """Write an object."""
        self._check_writable(key)
        path = self._path(key)
        try:
            try:
                self.fs.pipe_file(path, data)
            except Exception:
                # a filesystem with real folders (ftp://) that does not make them, as
                # its file uploads do: make the folder, and try once more
                parent = path.rsplit("/", 1)[0]
                if not parent or parent == path or self.fs.isdir(parent):
                    raise
                self.fs.makedirs(parent, exist_ok=True)
                self.fs.pipe_file(path, data)
        except Exception as exc:
            raise StorageError(f"{self.url}/{key}: write failed: {_why(exc)}") from exc

    def _touch(self, key: str) -> None:
        # memory:// keeps a created time per file; refresh it so gc's grace applies.
        if self.protocol == "memory":
            entry = getattr(self.fs, "store", {}).get(self._path(key).lstrip("/"))
            if entry is None:
                entry = getattr(self.fs, "store", {}).get("/" + self._path(key).lstrip("/"))
            if entry is not None:
                entry.created = entry.modified = _now_dt()

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Write unless present; refresh the modification time when present."""
        self._check_writable(key)
        with _CAS_LOCK:
            if self.exists(key):
                self._touch(key)
                return False
            self.put(key, data)
            return True

    def put_file(self, key: str, path: str) -> bool:
        """Upload a local file unless present."""
        self._check_writable(key)
        dest = self._path(key)
        if self.exists(key):
            self._touch(key)
            return False
        try:
            self.fs.put_file(path, dest)
        except Exception as exc:
            raise StorageError(f"{self.url}/{key}: upload failed: {_why(exc)}") from exc
        return True

    def compare_and_swap(self, key: str, expected: str | None, data: bytes | None) -> str | None:
        """Swap if the content hash equals ``expected`` (atomic within this process)."""
        self._check_writable(key)
        with _CAS_LOCK:
            try:
                current: str | None = self.get_versioned(key)[1]
            except NotFoundError:
                current = None
            if current != expected:
                raise ConflictError(
                    f"{self.url}/{key} changed concurrently "
                    f"(expected version {expected or 'absent'}, found {current or 'absent'})"
                )
            if data is None:
                self.delete(key)
                return None
            self.put(key, data)
            return hash_bytes(data)

    def refresh(self, key: str) -> bool:
        """Refresh the modification time (gc's grace; memory:// only); False when absent."""
        self._check_writable(key)
        if not self.exists(key):
            return False
        self._touch(key)
        return True

    def exists(self, key: str) -> bool:
        """Whether the key exists."""
        path = self._path(key)
        try:
            return bool(self.fs.isfile(path))
        except Exception as exc:
            raise StorageError(f"{self.url}/{key}: exists failed: {_why(exc)}") from exc

    def info(self, key: str) -> ObjectInfo:
        """Size and modification time."""
        path = self._path(key)
        try:
            info = self.fs.info(path)
        except FileNotFoundError as exc:
            raise NotFoundError(f"{self.url}: no object {key}") from exc
        except Exception as exc:
            raise StorageError(f"{self.url}/{key}: stat failed: {_why(exc)}") from exc
        return ObjectInfo(key, int(info.get("size", 0)), _mtime(info))

    def delete(self, key: str) -> None:
        """Delete; missing is fine."""
        self._check_writable(key)
        path = self._path(key)
        try:
            self.fs.rm_file(path)
        except FileNotFoundError:
            return
        except Exception as exc:
            raise StorageError(f"{self.url}/{key}: delete failed: {_why(exc)}") from exc

    def list(self, prefix: str = "") -> Iterator[str]:
        """Keys under ``prefix``, sorted."""
        for info in self.list_info(prefix):
            yield info.key

    def list_info(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Infos of keys under ``prefix``, sorted."""
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = f"{self.root}/{base}" if base else (self.root or "")
        try:
            found = self.fs.find(start, detail=True) if self.fs.exists(start) else {}
        except FileNotFoundError:
            found = {}
        except Exception as exc:
            raise StorageError(f"{self.url}/{prefix}: list failed: {_why(exc)}") from exc
        for path in sorted(found):
            key = self._key(path)
            if key.startswith(prefix) and found[path].get("type", "file") == "file":
                size = found[path].get("size")
                if size is None:  # a listing without sizes (an HTTP index page): ask
                    try:
                        size = self.fs.size(path)
                    except Exception as exc:
                        raise StorageError(f"{self.url}/{key}: size unknown: {_why(exc)}") from exc
                yield ObjectInfo(key, int(size or 0), _mtime(found[path]))

    def local_path(self, key: str) -> str | None:
        """Never local."""
        return None

    def clock(self) -> float:
        """The store's time: this machine's for ``memory://``, else the server's.

        A remote filesystem's times are its server's; they are read from a probe object
        written under ``_probe/`` (and deleted), so a read-only store, or one whose
        listing has no times, raises rather than guess from this machine's clock.
        """
        if self.protocol in _LOCAL_CLOCK_PROTOCOLS:
            return time.time()  # memory:// stamps files with this process's clock
        if self.read_only:
            raise ReadOnlyError(
                f"{self.url}: cannot read the server's clock: the store is read-only and "
                f"the clock is read from a probe object written under {_PROBE_PREFIX}"
            )
        key = f"{_PROBE_PREFIX}clock-{uuid.uuid4().hex}"
        path = self._path(key)
        try:
            self.fs.pipe_file(path, b"")
            info = self.fs.info(path)
        except Exception as exc:
            raise StorageError(
                f"{self.url}: cannot read the server's clock: probe object {key}: {exc}"
            ) from exc
        finally:
            with contextlib.suppress(Exception):
                self.fs.rm_file(path)
        found = _mtime_or_none(info)
        if found is None:
            raise StorageError(
                f"{self.url}: cannot read the server's clock: the filesystem reports no "
                f"modification time for probe object {key}"
            )
        return found


def _now_dt() -> Any:
    import datetime

    return datetime.datetime.now(tz=datetime.UTC)


def _mtime_or_none(info: Mapping[str, Any]) -> float | None:
    for name in ("mtime", "LastModified", "modified", "created", "updated"):
        value = info.get(name)
        if value is None:
            continue
        if isinstance(value, int | float):
            return float(value)
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
    return None


def _mtime(info: Mapping[str, Any]) -> float:
    found = _mtime_or_none(info)
    return time.time() if found is None else found
