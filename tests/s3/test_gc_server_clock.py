"""gc on S3 compares object times with the server's clock, never with this machine's.

gc computed its cutoff from ``time.time()`` and compared it with the LastModified the
server stamped: a machine whose clock ran ahead of the server's by more than the grace
period deleted objects a writer had stored a moment before (and not yet committed).
"""

from __future__ import annotations

import os
import sys
import time
import types

import pytest

from simstore.catalog import Catalog, _gc, gc
from simstore.cost import OpClass
from simstore.errors import ReadOnlyError, StorageError
from simstore.hashing import object_key
from simstore.storage import CountingStore, FsspecStore
from simstore.storage._s3 import S3Store

pytestmark = pytest.mark.s3

SKEW_S = 2 * 3600.0
FAST = {"backoff_base_s": 0.01, "backoff_max_s": 0.05, "max_attempts": 2}


@pytest.fixture
def local_clock_ahead(monkeypatch):
    """This machine's clock, as gc reads it, runs two hours ahead of the server's."""
    real = time.time
    monkeypatch.setattr(_gc, "time", types.SimpleNamespace(time=lambda: real() + SKEW_S))


@pytest.mark.parametrize("wrapped", [False, True], ids=["s3", "counting-s3"])
def test_object_just_written_survives_gc_when_local_clock_runs_ahead(
    s3_bucket, local_clock_ahead, wrapped
):
    url = f"s3://{s3_bucket()}/store"
    Catalog.init(url)
    store = S3Store(url)
    cat = Catalog(CountingStore(store) if wrapped else store)
    # a writer in flight: stored, not yet committed, well within the grace period
    oid, written = cat.put_object(b"a shard a writer has just stored")
    assert written

    report = gc(cat, grace_s=3600)

    assert cat.store.exists(object_key(oid))
    assert oid not in report.deleted and report.deleted == []
    assert report.kept_recent == 1
    assert list(store.list("_probe/")) == []  # the clock's probe object is gone


def test_s3_clock_is_the_servers_time_in_whole_seconds(s3_bucket):
    store = S3Store(f"s3://{s3_bucket()}/p")
    store.put("objects/aa/written-first", b"x")
    written = store.info("objects/aa/written-first").mtime
    now = store.clock()
    assert now >= written  # the probe is written after the object, on the same clock
    assert now == int(now)  # LastModified: whole seconds, truncated
    assert list(store.list("_probe/")) == []


def test_fsspec_s3_clock_is_read_from_a_probe_object(s3_bucket, s3_env):
    store = FsspecStore(
        f"s3://{s3_bucket()}/p", storage_options={"client_kwargs": {"endpoint_url": s3_env}}
    )
    store.put("objects/aa/written-first", b"x")
    written = store.info("objects/aa/written-first").mtime
    assert store.clock() >= written
    assert list(store.list("_probe/")) == []


def test_gc_on_a_read_only_store_fails_naming_the_store_and_deletes_nothing(s3_bucket):
    url = f"s3://{s3_bucket()}/store"
    Catalog.init(url)
    oid, _ = Catalog.open(url).put_object(b"unreferenced")
    cat = Catalog.open(url, read_only=True)
    with pytest.raises(ReadOnlyError) as info:
        gc(cat, grace_s=0)
    text = str(info.value)
    assert url in text and "clock" in text and "\n" not in text
    assert cat.store.exists(object_key(oid))


def test_a_dry_run_on_a_read_only_store_reads_the_servers_clock_without_a_write(
    s3_bucket, local_clock_ahead
):
    url = f"s3://{s3_bucket()}/store"
    Catalog.init(url)
    oid, _ = Catalog.open(url).put_object(b"unreferenced")
    counted = CountingStore(S3Store(url, read_only=True))
    # the server's clock (the Date of a LIST), not this machine's two hours ahead: the
    # object written a moment ago is within an hour's grace
    report = gc(Catalog(counted), grace_s=3600, dry_run=True)
    assert report.clock == "store"
    assert report.deleted == [] and report.kept_recent == 1
    assert report.to_json()["clock"] == "store"
    sent = {op for t in counted.traffic.usage() for op, u in t.ops.items() if u.requests}
    assert OpClass.LIST in sent  # the clock
    assert not sent & {OpClass.PUT, OpClass.DELETE}  # read-only credentials suffice
    assert Catalog.open(url).store.exists(object_key(oid))


def test_a_dry_run_whose_clock_cannot_be_read_uses_the_local_one_and_says_so(
    s3_bucket, fault_proxy
):
    url = f"s3://{s3_bucket()}/store"
    Catalog.init(url)
    oid, _ = Catalog.open(url).put_object(b"unreferenced")
    store = S3Store(url, read_only=True,
                    storage_options={**FAST, "endpoint_url": fault_proxy.endpoint_url})
    fault_proxy.fail_next("slowdown", "slowdown", methods=["GET"], path_contains="_probe")
    report = gc(Catalog(store), grace_s=0, dry_run=True)
    assert report.clock.startswith("local: ") and "clock" in report.clock
    assert report.to_json()["clock"] == report.clock
    assert Catalog.open(url).store.exists(object_key(oid))


def test_gc_fails_when_the_server_refuses_the_clock_probe(s3_bucket, fault_proxy):
    url = f"s3://{s3_bucket()}/store"
    Catalog.init(url)
    oid, _ = Catalog.open(url).put_object(b"unreferenced")
    cat = Catalog.open(url, storage_options={**FAST, "endpoint_url": fault_proxy.endpoint_url})
    fault_proxy.fail_next("slowdown", "slowdown", methods=["PUT"], path_contains="/_probe/")
    with pytest.raises(StorageError) as info:
        gc(cat, grace_s=0)
    text = str(info.value)
    assert text.startswith(f"{url}: cannot read the server's clock") and "\n" not in text
    assert fault_proxy.count("slowdown", "PUT") == 2
    assert cat.store.exists(object_key(oid))


@pytest.mark.parametrize("zone", ["GMT", "-0000", "+0000"])
def test_the_date_a_dry_run_reads_is_utc_whatever_the_local_zone(monkeypatch, zone):
    """An HTTP date with a ``-0000`` zone parses as a naive time, which ``timestamp()``
    took as this machine's local time (five hours off in New York)."""
    import calendar
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    stamp = "Tue, 01 Dec 2026 12:00:00"
    expected = calendar.timegm(time.strptime(stamp, "%a, %d %b %Y %H:%M:%S"))

    class Listing(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the name http.server calls
            body = (b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>b</Name>'
                    b"<KeyCount>0</KeyCount><MaxKeys>1</MaxKeys>"
                    b"<IsTruncated>false</IsTruncated></ListBucketResult>")
            self.send_response_only(200)
            self.send_header("Date", f"{stamp} {zone}")
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Listing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        store = S3Store("s3://b/store", read_only=True, storage_options={
            **FAST, "endpoint_url": f"http://127.0.0.1:{server.server_address[1]}",
            "key": "k", "secret": "s"})
        assert store.read_clock() == expected
    finally:
        monkeypatch.undo()
        time.tzset()
        server.shutdown()
        server.server_close()


def test_a_key_below_a_refs_name_is_no_ref_and_stops_nothing(s3_bucket):
    # S3 has no folders: a key below a ref's name (a console's folder marker, a file
    # copied in) stands beside the ref, not in its place, unlike a local folder there
    # (tests/catalog/test_ref_replaced_by_folder.py): gc goes on and keeps the branch
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "catalog"))
    from catalog_helpers import content, expected_hash, stage_samples

    url = f"s3://{s3_bucket()}/store"
    cat = Catalog.init(url)
    stage_samples(cat, "ds", {"a": b"kept" * 20})
    sid = cat.commit("ds", message="m").snapshot_id
    S3Store(url).put("datasets/ds/refs/heads/main/notes", b"x")

    report = gc(cat, grace_s=0)

    # the branch and everything it reaches are kept; with no grace, what the commit left
    # unreachable (the staged entry's own objects) may go once a second has turned on
    # the server's clock, which only whole seconds give (it failed 1 run in 5 as
    # ``report.deleted == []``)
    assert cat.resolve("ds") == sid
    snapshot = cat.snapshot(sid)
    kept = {sid} | {part.id for part in snapshot.parts}
    kept |= {s for t in cat.iter_parts(snapshot) for s in t.column("shard").to_pylist()}
    assert not kept & set(report.deleted)
    assert all(cat.store.exists(object_key(oid)) for oid in kept)
    assert content(cat, "ds") == {"a": expected_hash(b"kept" * 20)}
