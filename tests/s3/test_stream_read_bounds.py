"""Streamed reads (``S3Store.open_read``, the loader's cache fills) within the retry bounds.

- A body that keeps breaking without progress gives up at ``retry_deadline_s``, as every
  other request does, not after ``max_attempts`` full timeouts; the deadline runs on the
  store's clock, which these tests replace by one that advances 10 s with every GET the
  proxy sees (each attempt "takes" 10 s), so the count of GETs is exact.
- A body broken off by a reset keeps the bytes it received: a link that resets every few
  hundred kB still delivers the object.
- A timeout while a body is read names the object's URL (botocore leaves it ``None``).

Against moto on 127.0.0.1 through the fault proxy. Resets and stalls in the middle of a
body are played by :class:`BodyFaultProxy`, the fixture's proxy whose ``truncate`` sends
the headers and ``body_bytes`` of the body, then resets the connection or holds it.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from simstore.catalog import Catalog
from simstore.errors import StorageError
from simstore.ingest import ingest
from simstore.storage._s3 import S3Store
from simstore.testing.s3 import FaultProxy

pytestmark = pytest.mark.s3

MiB = 1024 * 1024
FAST: dict[str, Any] = {"backoff_base_s": 0.001, "backoff_max_s": 0.005, "read_timeout_s": 10}
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te",
        "content-length"}


class BodyFaultProxy(FaultProxy):
    """A :class:`FaultProxy` whose ``truncate`` sends ``body_bytes`` of the body, then
    resets the connection (``body_fault="reset"``), holds it silent (``"stall"``), sends
    the rest a byte every 0.2 s (``"trickle"``), or all of it 1 KiB every 0.25 s
    (``"paced"``, a slow link that keeps coming)."""

    body_bytes = 0
    body_fault = "reset"

    def _handler_class(self) -> Any:
        base: Any = super()._handler_class()
        proxy = self

        class Handler(base):  # type: ignore[misc, valid-type]
            def _respond(self, status, reason, headers, data, *, truncate=False):
                if not truncate or self.command == "HEAD":
                    return super()._respond(status, reason, headers, data, truncate=truncate)
                self.send_response_only(status, reason)
                for name, value in headers:
                    if name.lower() not in _HOP:
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: proxy.body_bytes])
                self.wfile.flush()
                if proxy.body_fault == "stall":
                    proxy._closing.wait(proxy.stall_s)
                elif proxy.body_fault in ("trickle", "paced"):
                    # a byte inside every read timeout, or 1 KiB every 0.25 s to the end
                    step = 1 if proxy.body_fault == "trickle" else 1024
                    pause = 0.2 if proxy.body_fault == "trickle" else 0.25
                    rest = data[proxy.body_bytes:]
                    for at in range(0, len(rest), step):
                        if proxy._closing.wait(pause):
                            break
                        try:
                            self.wfile.write(rest[at : at + step])
                            self.wfile.flush()
                        except OSError:  # the reader cut it off
                            break
                    else:
                        if proxy.body_fault == "paced":
                            return  # all of it sent: a whole, slow reply
                # a reset: no FIN, the bytes not yet read by the client may be lost
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
                self.connection.close()
                self.close_connection = True

        return Handler


@pytest.fixture
def body_proxy(s3_env: str) -> Iterator[BodyFaultProxy]:
    proxy = BodyFaultProxy(s3_env, stall_s=30)
    try:
        yield proxy
    finally:
        proxy.close()


def gets_clock(proxy: FaultProxy, path: str = "") -> Callable[..., float]:
    """A clock that reads 10 s per GET the proxy has seen (of paths containing ``path``)."""

    def now(*_: object) -> float:
        return 10.0 * sum(1 for r in list(proxy.records) if r.method == "GET" and path in r.path)

    return now


def stores(bucket: str, endpoint: str, **options: Any) -> tuple[S3Store, S3Store]:
    direct = S3Store(f"s3://{bucket}/root", storage_options=dict(FAST))
    proxied = S3Store(
        f"s3://{bucket}/root", storage_options={**FAST, **options, "endpoint_url": endpoint}
    )
    return direct, proxied


def test_a_body_that_never_progresses_gives_up_at_the_retry_deadline(
    s3_bucket, fault_proxy, monkeypatch
):
    direct, proxied = stores(
        s3_bucket(), fault_proxy.endpoint_url, max_attempts=50, retry_deadline_s=25.0
    )
    direct.put("objects/one", b"x")
    # every GET answers 200 with Content-Length 1 and no byte of the body
    fault_proxy.fail_share(1.0, "truncate", seed=0, methods=["GET"])
    monkeypatch.setattr(proxied, "_clock", gets_clock(fault_proxy), raising=False)
    with proxied.open_read("objects/one") as reader:  # GET 1, at "10 s"
        with pytest.raises(StorageError) as info:
            reader.read(MiB)
        assert reader.tell() == 0
    text = str(info.value)
    assert text.startswith(f"{proxied.url}/objects/one: read failed after 4 attempts ")
    assert "(retry deadline 25.0 s reached)" in text
    # the read began at 10 s (GET 1 sent): failures after GETs 1, 2, 3 (at 10, 20, 30 s)
    # are retried; after GET 4 (40 s) a retry would start 30 s into the read, past the
    # deadline: 4 attempts, far below max_attempts
    assert fault_proxy.count("truncate", "GET") == 4


def test_a_fill_that_keeps_breaking_gives_up_at_the_retry_deadline(
    s3_bucket, body_proxy, tmp_path, monkeypatch
):
    from simstore.loaders import SimDataset

    url = f"s3://{s3_bucket()}/store"
    rng = np.random.default_rng(0)
    (tmp_path / "src").mkdir()
    for i in range(4):
        np.savez(tmp_path / "src" / f"run{i}.npz", u=rng.normal(size=(64, 64)).astype(np.float32))
    Catalog.init(url, storage_options=FAST)
    ingest([str(tmp_path / "src")], dataset="d", store=Catalog.open(url, storage_options=FAST),
           snapshot=True, message="x", shard_size=40_000)
    cat = Catalog.open(url, storage_options=FAST)
    snap = cat.snapshot(cat.resolve("d"))
    shard = sorted({s for t in cat.iter_parts(snap) for s in t.column("shard").to_pylist()})[0]
    body_proxy.body_bytes = 0  # reset before any byte of the shard: no progress ever
    body_proxy.fail_share(1.0, "truncate", seed=0, methods=["GET"], path_contains=shard)
    monkeypatch.setattr(S3Store, "_clock", gets_clock(body_proxy, shard), raising=False)
    options = {**FAST, "endpoint_url": body_proxy.endpoint_url, "max_attempts": 50,
               "retry_deadline_s": 25.0}
    ds = SimDataset(url, "d", shuffle=False, storage_options=options,
                    cache_dir=str(tmp_path / "cache"))
    with pytest.raises(StorageError) as info:
        list(ds)
    text = str(info.value)
    assert f"{url}/objects/{shard[:2]}/{shard}: read failed" in text
    assert "(retry deadline 25.0 s reached)" in text
    assert body_proxy.count("truncate", "GET") == 4


def test_a_link_that_resets_every_few_hundred_kb_still_delivers(s3_bucket, body_proxy,
                                                               monkeypatch):
    direct, proxied = stores(s3_bucket(), body_proxy.endpoint_url, max_attempts=20)
    data = os.urandom(3 * MiB + 5)
    direct.put("objects/big", data)
    body_proxy.body_bytes = 300_000  # at most: the reset drops what was not yet sent
    body_proxy.fail_share(1.0, "truncate", seed=0, methods=["GET"])
    monkeypatch.setattr(proxied, "_clock", lambda: 0.0, raising=False)  # attempts bound it
    out = bytearray()
    with proxied.open_read("objects/big") as reader:
        while block := reader.read(MiB):  # the loader's cache fill reads 1 MiB blocks
            out += block
        requests = reader.requests
    assert bytes(out) == data
    # every GET was cut, so each one delivered no more than 300,000 bytes
    assert requests == body_proxy.count("truncate", "GET") >= len(data) // 300_000


def test_a_body_read_timeout_names_the_objects_url(s3_bucket, body_proxy):
    bucket = s3_bucket()
    direct, proxied = stores(bucket, body_proxy.endpoint_url, max_attempts=1,
                             read_timeout_s=0.5)
    direct.put("objects/slow", os.urandom(100_000))
    body_proxy.body_bytes, body_proxy.body_fault = 1000, "stall"
    body_proxy.fail_share(1.0, "truncate", seed=0, methods=["GET"])
    where = f'endpoint URL: "{body_proxy.endpoint_url}/{bucket}/root/objects/slow"'
    with proxied.open_read("objects/slow") as reader:
        with pytest.raises(StorageError) as info:
            reader.read(MiB)
    text = str(info.value)
    assert text.startswith(f"{proxied.url}/objects/slow: read failed after 1 attempts")
    assert f"ReadTimeoutError: Read timeout on {where}" in text and '"None"' not in text
    with pytest.raises(StorageError) as info:  # a whole-object get, the same
        proxied.get("objects/slow")
    text = str(info.value)
    assert f"ReadTimeoutError: Read timeout on {where}" in text and '"None"' not in text


@pytest.mark.parametrize("way", ["open_read", "get", "range"])
def test_a_body_that_trickles_in_is_cut_off_at_the_retry_deadline(s3_bucket, body_proxy, way):
    # found by an audit: a byte inside every read timeout never failed, so no bound ended
    # the read (a shard at 80 B/s); now it fails as a broken body past the deadline
    direct, proxied = stores(s3_bucket(), body_proxy.endpoint_url, read_timeout_s=1,
                             retry_deadline_s=1.0, max_attempts=50)
    direct.put("objects/slow", b"s" * 4096)
    body_proxy.body_bytes, body_proxy.body_fault = 100, "trickle"
    body_proxy.fail_share(1.0, "truncate", seed=0, methods=["GET"])
    with pytest.raises(StorageError) as info:
        if way == "open_read":
            with proxied.open_read("objects/slow") as reader:
                reader.read(4096)
        elif way == "get":
            proxied.get("objects/slow")
        else:
            proxied.get("objects/slow", (0, 4000))
    text = str(info.value)
    assert text.startswith(f"{proxied.url}/objects/slow: read failed after ")
    assert "(retry deadline 1.0 s reached)" in text


@pytest.mark.parametrize("way", ["open_read", "get", "range"])
def test_a_slow_body_that_keeps_coming_is_read_past_the_retry_deadline(s3_bucket, body_proxy,
                                                                      way):
    # found by a review: the cut at the deadline took a steady 4 KiB/s body for a trickle;
    # it runs to the later of the deadline and the body's size at min_read_bytes_per_second
    direct, proxied = stores(s3_bucket(), body_proxy.endpoint_url, read_timeout_s=2,
                             retry_deadline_s=0.5, max_attempts=50,
                             min_read_bytes_per_second=1024)
    blob = os.urandom(4096)
    direct.put("objects/paced", blob)
    body_proxy.body_bytes, body_proxy.body_fault = 0, "paced"  # about 1 s for the body
    body_proxy.fail_share(1.0, "truncate", seed=0, methods=["GET"])
    if way == "open_read":
        with proxied.open_read("objects/paced") as reader:
            assert reader.read(4096) == blob
    elif way == "get":
        assert proxied.get("objects/paced") == blob
    else:
        assert proxied.get("objects/paced", (0, 4000)) == blob[:4000]
