"""Bodies that arrive other than they were sent are read again, not taken for the object.

Found by an audit with a proxy in front of moto: a body cut short together with its
Content-Length passed the length check, so a ranged GET returned half its range, and a
whole object of a multipart upload (whose GET botocore checks no checksum of) came back
short; a body that failed its checksum failed the read at once, with no retry. Damage in
transit then read as damage of the stored object: ``verify --deep`` exit 6 and the
loader's ``IntegrityError`` named intact objects. Now a ranged reply is checked against
its ``Content-Range``, a checksum failure is retried as a cut is, and a whole object whose
bytes do not hash to its id (a cache fill, ``verify --deep``) is read once more before the
damage is reported.

Against moto on 127.0.0.1 through the fixture's fault proxy (``short``: half the body with
a Content-Length that says so; ``corrupt``: one byte changed).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from simstore.catalog import Catalog, verify
from simstore.errors import IntegrityError
from simstore.hashing import hash_bytes
from simstore.ingest import ingest
from simstore.storage._s3 import S3Store

pytestmark = pytest.mark.s3

MiB = 1024 * 1024
FAST: dict[str, Any] = {"backoff_base_s": 0.001, "backoff_max_s": 0.005, "read_timeout_s": 10}


def test_a_ranged_reply_cut_with_its_length_is_read_again(store, proxied, fault_proxy):
    data = os.urandom(200_000)
    store.put("objects/x", data)
    fault_proxy.fail_next("short", methods=["GET"])
    assert proxied.get("objects/x", byte_range=(1_000, 51_000)) == data[1_000:51_000]
    assert fault_proxy.count("short") == 1 and fault_proxy.count(None, "GET") == 1
    # a range past the end is still cut at the end, as before
    assert proxied.get("objects/x", byte_range=(190_000, 250_000)) == data[190_000:]


def test_a_body_that_fails_its_checksum_is_read_again(store, proxied, fault_proxy):
    data = os.urandom(100_000)
    store.put("objects/y", data)
    retried: list[tuple[str, int]] = []
    proxied.on_retry = lambda request, received: retried.append((request, received))
    fault_proxy.fail_next("corrupt", methods=["GET"])
    assert proxied.get("objects/y") == data
    assert fault_proxy.count("corrupt") == 1 and fault_proxy.count(None, "GET") == 1
    assert retried == [("get", 100_000)]  # the damaged body was all sent (egress)


def _ingested(store: S3Store, tmp_path) -> tuple[Catalog, list[str]]:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        np.savez(src / f"r{i}.npz", u=np.full((256, 256), i, np.float32))
    cat = Catalog.init(store)
    ingest([src], dataset="d", store=cat, snapshot=True, shard_size=300 * 1024,
           format="parquet", compression="none")
    keys = list(store.list("objects/"))
    shards = sorted({k.rsplit("/", 1)[-1] for k in keys if store.info(k).size_bytes > 200 * 1024})
    assert shards, [(k, store.info(k).size_bytes) for k in keys]
    return cat, shards


def test_a_shard_whose_whole_get_came_back_short_is_fetched_again(store, proxied,
                                                                  fault_proxy, tmp_path):
    from simstore.loaders import SimDataLoader, SimDataset

    cat, shards = _ingested(store, tmp_path)
    assert shards
    fault_proxy.fail_next("short", methods=["GET"], path_contains=f"/objects/{shards[0][:2]}/")
    ds = SimDataset(proxied, "d", cache_dir=str(tmp_path / "cache"))
    got = {k: float(u[0, 0]) for b in SimDataLoader(ds, batch_size=1)
           for k, u in zip(b["__key__"], b["u"], strict=True)}
    assert got == {f"r{i}": float(i) for i in range(4)}
    assert fault_proxy.count("short") == 1
    # the copy kept is the object's own bytes
    for name in shards:
        path = os.path.join(tmp_path / "cache", "objects", name[:2], name)
        if os.path.exists(path):
            with open(path, "rb") as f:
                assert hash_bytes(f.read()) == name


def test_verify_reads_a_shard_that_arrived_damaged_once_more(store, proxied, fault_proxy,
                                                            tmp_path):
    _cat, shards = _ingested(store, tmp_path)
    clean = verify(Catalog(proxied), all_refs=True, deep=True).bytes_hashed
    fault_proxy.fail_next("short", methods=["GET"], path_contains=f"/objects/{shards[0][:2]}/")
    report = verify(Catalog(proxied), all_refs=True, deep=True)
    assert report.ok, report.problems
    assert fault_proxy.count("short") == 1
    size = store.info(f"objects/{shards[0][:2]}/{shards[0]}").size_bytes
    assert report.bytes_hashed == clean + size // 2  # both readings count


def test_a_shard_damaged_in_the_store_is_still_reported(store, proxied, tmp_path):
    _cat, shards = _ingested(store, tmp_path)
    key = f"objects/{shards[0][:2]}/{shards[0]}"
    data = bytearray(store.get(key))
    data[len(data) // 2] ^= 0xFF
    store.put(key, bytes(data))  # the stored object itself is damaged
    report = verify(Catalog(proxied), all_refs=True, deep=True)
    assert not report.ok
    assert [p.problem for p in report.problem_objects] == ["damaged"]
    from simstore.loaders import SimDataLoader, SimDataset

    ds = SimDataset(proxied, "d", cache_dir=str(tmp_path / "cache"))
    with pytest.raises(IntegrityError, match=shards[0]):
        list(SimDataLoader(ds, batch_size=1))


def test_what_a_ranged_reply_may_be():
    from simstore.storage._s3_files import TruncatedBody, checked_range

    d = bytes(range(100))
    assert checked_range("bytes=10-19", "bytes 10-19/100", d[10:20]) == d[10:20]
    assert checked_range("bytes=90-119", "bytes 90-99/100", d[90:]) == d[90:]  # cut at the end
    assert checked_range("bytes=10-19", None, d, 200) == d[10:20]  # a server ignoring ranges
    assert checked_range("bytes=10-19", None, d[10:20], 206) == d[10:20]  # nothing to check
    for given, body in (("bytes 10-14/100", d[10:15]), ("bytes 11-20/100", d[11:21]),
                        ("bytes 10-19/100", d[10:15]), ("bytes 10-19", d[10:20])):
        with pytest.raises(TruncatedBody):
            checked_range("bytes=10-19", given, body)
