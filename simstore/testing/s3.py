"""pytest fixtures for S3 tests: a moto server, a bucket per test, a fault-injecting proxy.

Register them in a ``conftest.py`` with
``from simstore.testing.s3 import fault_proxy, moto_server, s3_bucket, s3_env``.

- ``moto_server`` (session): moto's S3 in server mode on 127.0.0.1 and an ephemeral port,
  so parallel test processes (xdist) never collide and nothing listens beyond loopback.
  A real HTTP server, not moto's in-process mocks, so the store's own HTTP stack, its
  retries and its conditional headers are what is tested.
- ``s3_env``: fake credentials and the server's endpoint in the AWS environment
  variables (monkeypatched; config files pointed away), so no real account is ever used.
- ``s3_bucket``: a factory; each call makes a fresh bucket, emptied and deleted after
  the test.
- ``fault_proxy``: a :class:`FaultProxy` in front of the server, for retry tests.

This module needs the test extras (pytest, moto[server], boto3).
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import random
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import urlsplit

import pytest

__all__ = [
    "atomic_moto_writes",
    "FAKE_ACCESS_KEY",
    "FAKE_SECRET_KEY",
    "Fault",
    "FaultProxy",
    "ProxyRecord",
    "fault_proxy",
    "fast_retry_options",
    "make_s3_client",
    "moto_server",
    "s3_bucket",
    "s3_env",
]

FAKE_ACCESS_KEY = "FAKEACCESSKEYID0TEST"
FAKE_SECRET_KEY = "fake-secret-key-0123456789-never-real"

Fault = Literal["slowdown", "drop", "drop_response", "stall", "truncate", "short", "corrupt"]
"""What the proxy does to a request instead of plain forwarding:

- ``slowdown``: answer 503 SlowDown, as S3 does when throttling;
- ``drop``: close the connection before forwarding (the server never sees the request);
- ``drop_response``: forward, then close without answering (the request landed but its
  response was lost, the case that makes a retried conditional PUT see 412);
- ``stall``: hold the connection silent for ``stall_s``, then close it (a read timeout);
- ``truncate``: forward, answer with the full Content-Length but half the body, and close
  (a connection reset mid-download);
- ``short``: forward, answer with half the body and a Content-Length that says so, the
  other headers (``Content-Range`` too) as the server sent them (a middlebox that cut
  both: the length check alone passes it);
- ``corrupt``: forward, answer with one byte of the body changed (damaged on the way).
"""

_HOP_HEADERS = frozenset(
    {"connection", "keep-alive", "proxy-connection", "expect", "transfer-encoding", "te"}
)
_SLOWDOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message>"
    b"<RequestId>fault-proxy</RequestId></Error>"
)


@dataclass(frozen=True, slots=True)
class ProxyRecord:
    """One request the proxy saw, and the fault it applied (None: forwarded)."""

    method: str
    path: str
    fault: Fault | None
    headers: tuple[tuple[str, str], ...] = ()
    """The request's headers as received (names lower-cased)."""

    def header(self, name: str) -> str | None:
        """The value of header ``name`` (any case), or None."""
        name = name.lower()
        return next((v for k, v in self.headers if k == name), None)


@dataclass(frozen=True, slots=True)
class _Rule:
    fault: Fault
    methods: frozenset[str] | None
    path_contains: str | None

    def matches(self, method: str, path: str) -> bool:
        return (self.methods is None or method in self.methods) and (
            self.path_contains is None or self.path_contains in path
        )


class _QuietServer(ThreadingHTTPServer):
    """The proxy's server: a client that hangs up mid-answer is no error of the proxy.

    Clients time out and close connections by design under stalls and truncations;
    socketserver would print each such broken pipe's traceback to stderr.
    """

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


class FaultProxy:
    """A threaded HTTP/1.1 proxy on 127.0.0.1 that forwards to ``upstream_url``.

    Faults come from a queue (:meth:`fail_next`: the next matching requests, in order)
    or a share (:meth:`fail_share`: each matching request with a probability, from a
    seeded generator). ``latency_s`` delays every request. ``strip_headers`` names request
    headers removed before forwarding (``{"If-None-Match", "If-Match"}`` plays a server
    without conditional writes). ``records`` lists what was seen.
    """

    def __init__(self, upstream_url: str, *, latency_s: float = 0.0, stall_s: float = 5.0) -> None:
        parts = urlsplit(upstream_url)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.latency_s = latency_s
        self.stall_s = stall_s
        self.strip_headers: frozenset[str] = frozenset()
        self.records: list[ProxyRecord] = []
        self._queue: list[_Rule] = []
        self._share: tuple[float, _Rule, random.Random] | None = None
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._server = _QuietServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._server.block_on_close = False
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )
        self._thread.start()
        host, port = self._server.server_address[:2]
        self.endpoint_url = f"http://{host!s}:{port}"

    def fail_next(
        self,
        *faults: Fault,
        methods: Collection[str] | None = None,
        path_contains: str | None = None,
    ) -> None:
        """Apply ``faults``, in order, to the next requests that match the filters."""
        method_set = frozenset(m.upper() for m in methods) if methods is not None else None
        with self._lock:
            self._queue += [_Rule(f, method_set, path_contains) for f in faults]

    def fail_share(
        self,
        share: float,
        fault: Fault,
        *,
        seed: int,
        methods: Collection[str] | None = None,
        path_contains: str | None = None,
    ) -> None:
        """Apply ``fault`` to each matching request with probability ``share``."""
        method_set = frozenset(m.upper() for m in methods) if methods is not None else None
        with self._lock:
            self._share = (share, _Rule(fault, method_set, path_contains), random.Random(seed))

    def clear(self) -> None:
        """Forget queued faults and the share; keep the records."""
        with self._lock:
            self._queue.clear()
            self._share = None

    def count(self, fault: Fault | None = None, method: str | None = None) -> int:
        """How many requests were seen with this fault (None: forwarded) and method."""
        with self._lock:
            return sum(
                1
                for r in self.records
                if r.fault == fault and (method is None or r.method == method.upper())
            )

    def close(self) -> None:
        """Stop serving; stalled handlers wake up and close their connections."""
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def _choose(self, method: str, path: str,
                headers: tuple[tuple[str, str], ...] = ()) -> Fault | None:
        with self._lock:
            fault: Fault | None = None
            for i, rule in enumerate(self._queue):
                if rule.matches(method, path):
                    fault = self._queue.pop(i).fault
                    break
            else:
                if self._share is not None:
                    share, rule, rng = self._share
                    if rule.matches(method, path) and rng.random() < share:
                        fault = rule.fault
            self.records.append(ProxyRecord(method, path, fault, headers))
            return fault

    def _forward(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*self._upstream, timeout=60)
        strip = _HOP_HEADERS | {"content-length"} | {h.lower() for h in self.strip_headers}
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                if name.lower() not in strip:
                    conn.putheader(name, value)
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            response = conn.getresponse()
            data = response.read()
            return response.status, response.reason, response.getheaders(), data
        finally:
            conn.close()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return  # quiet: tests read ``records`` instead

            def _body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    chunks: list[bytes] = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass  # trailers
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _handle(self) -> None:
                body = self._body()
                if proxy.latency_s:
                    time.sleep(proxy.latency_s)
                fault = proxy._choose(self.command, self.path, tuple(
                    (k.lower(), v) for k, v in self.headers.items()))
                if fault in ("drop", "stall"):
                    if fault == "stall":
                        proxy._closing.wait(proxy.stall_s)
                    self.close_connection = True
                    return
                if fault == "slowdown":
                    payload = b"" if self.command == "HEAD" else _SLOWDOWN_BODY
                    self._respond(503, "Slow Down", [("Content-Type", "application/xml")], payload)
                    return
                status, reason, headers, data = proxy._forward(
                    self.command, self.path, list(self.headers.items()), body
                )
                if fault == "drop_response":
                    self.close_connection = True
                    return
                if data and fault == "short":
                    data = data[: len(data) // 2]
                elif data and fault == "corrupt":
                    middle = len(data) // 2
                    data = data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]
                self._respond(status, reason, headers, data, truncate=fault == "truncate")

            def _respond(
                self,
                status: int,
                reason: str,
                headers: list[tuple[str, str]],
                data: bytes,
                *,
                truncate: bool = False,
            ) -> None:
                self.send_response_only(status, reason)
                keep_length = self.command == "HEAD" or status in (204, 304)
                for name, value in headers:
                    lower = name.lower()
                    if lower in _HOP_HEADERS or (lower == "content-length" and not keep_length):
                        continue
                    self.send_header(name, value)
                if not keep_length:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if not keep_length:
                    self.wfile.write(data[: len(data) // 2] if truncate else data)
                if truncate:
                    self.close_connection = True

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        return Handler


def fast_retry_options(endpoint_url: str, attempts: int = 3, **extra: Any) -> dict[str, Any]:
    """``storage_options`` for the fake server whose retries back off in milliseconds.

    For a fault proxy in front of it too: fault tests run through their attempts quickly.
    ``extra`` adds or overrides options (timeouts, for instance).
    """
    return {
        "endpoint_url": endpoint_url,
        "key": FAKE_ACCESS_KEY,
        "secret": FAKE_SECRET_KEY,
        "region_name": "us-east-1",
        "backoff_base_s": 0.005,
        "backoff_max_s": 0.05,
        "max_attempts": attempts,
        **extra,
    }


def end_helper(proc: subprocess.Popen[str], timeout_s: float = 10.0) -> None:
    """Stop a helper process that serves until its stdin closes; kill it if it lingers.

    For servers run in processes of their own (moto with settings of its own, the
    benchmarks' servers): closing the pipe is the signal, then its stdout is closed too.
    """
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def make_s3_client(endpoint_url: str) -> Any:
    """Make a boto3 S3 client for the fake server with the fake credentials (the back door)."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=FAKE_ACCESS_KEY,
        aws_secret_access_key=FAKE_SECRET_KEY,
    )


_MOTO_WRITES = threading.RLock()


@contextlib.contextmanager
def atomic_moto_writes() -> Iterator[None]:
    """Make each of moto's object writes atomic, as S3's are, while the block runs.

    moto 5 checks ``If-Match``/``If-None-Match`` and then writes, with nothing held
    between the two: two server threads can both pass the check on one ETag and both
    answer 200, so one compare-and-swap silently overwrites the other (an update lost by
    the stand-in, not by the store; seen on a loaded machine in the store conformance
    suite's concurrent increments and in rounds of committing processes). S3 evaluates
    a conditional write atomically; this serialises moto's PutObject and DeleteObject
    handlers (check and write together) for servers in this process. Blocks may nest.
    """
    from moto.s3.responses import S3Response

    originals = {name: getattr(S3Response, name) for name in ("put_object", "delete_object")}

    def atomic(method: Callable[..., Any]) -> Callable[..., Any]:
        def handler(self: Any) -> Any:
            with _MOTO_WRITES:
                return method(self)

        return handler

    for name, method in originals.items():
        setattr(S3Response, name, atomic(method))
    try:
        yield
    finally:
        for name, method in originals.items():
            setattr(S3Response, name, method)


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """Start moto's S3 server on 127.0.0.1, port 0; yield its endpoint URL.

    Its conditional writes are atomic, as S3's are (:func:`atomic_moto_writes`).
    """
    from moto.server import ThreadedMotoServer

    # werkzeug logs every request at INFO; keep test output about the tests.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        with atomic_moto_writes():
            yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch, moto_server: str) -> str:
    """Point the AWS environment at the moto server with fake credentials; yield its URL."""
    for name in (
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_ENDPOINT_URL_S3",
        "AWS_ROLE_ARN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", FAKE_ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/simstore-test-aws-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/simstore-test-aws-creds")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return moto_server


@pytest.fixture
def s3_bucket(s3_env: str) -> Iterator[Callable[[], str]]:
    """Make fresh buckets on the moto server on each call; empty and delete them after."""
    client = make_s3_client(s3_env)
    made: list[str] = []

    def make() -> str:
        name = f"simstore-test-{uuid.uuid4().hex[:16]}"
        client.create_bucket(Bucket=name)
        made.append(name)
        return name

    try:
        yield make
    finally:
        for name in made:
            uploads = client.list_multipart_uploads(Bucket=name).get("Uploads", [])
            for upload in uploads:
                client.abort_multipart_upload(
                    Bucket=name, Key=upload["Key"], UploadId=upload["UploadId"]
                )
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
                for item in page.get("Contents", []):
                    client.delete_object(Bucket=name, Key=item["Key"])
            client.delete_bucket(Bucket=name)
        client.close()


@pytest.fixture
def fault_proxy(s3_env: str) -> Iterator[FaultProxy]:
    """Put a :class:`FaultProxy` in front of the moto server; close it after the test."""
    proxy = FaultProxy(s3_env)
    try:
        yield proxy
    finally:
        proxy.close()
