"""On S3, a catalog object larger than its cap is refused by the Content-Length of its one
GET, its body left unread: no request more than a read of an intact one.

The caps (``simstore/catalog/_caps.py``) are lowered here below the size of real objects,
which S3 cannot hold sparse. Against moto on 127.0.0.1, every request counted by the
fixture's proxy.
"""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner
from simstore.cli import main

from simstore.catalog import Catalog
from simstore.catalog import _caps as caps
from simstore.errors import FormatError, IntegrityError
from simstore.hashing import hash_bytes, object_key
from simstore.manifest import ManifestRow, rows_from_list

pytestmark = pytest.mark.s3

FAST: dict[str, Any] = {"backoff_base_s": 0.001, "backoff_max_s": 0.005, "read_timeout_s": 10}


def _commit(cat: Catalog, items: dict[str, bytes]) -> str:
    rows = []
    for key, payload in sorted(items.items()):
        oid, _ = cat.put_object(payload)
        rows.append(ManifestRow(key=key, sample_hash=hash_bytes(b"s" + payload), shard=oid,
                                position=0, size_bytes=len(payload)))
    cat.stage("ds", changes=rows_from_list(rows), shards=[r.shard for r in rows])
    return cat.commit("ds", message="m").snapshot_id


def _requests(proxy: Any) -> tuple[int, int]:
    return proxy.count(None, "GET"), proxy.count(None, "HEAD")


def test_a_snapshot_over_its_cap_is_one_get_and_an_integrity_error(
    store, proxied, fault_proxy, monkeypatch
):
    sid = _commit(Catalog.init(proxied), {"a": b"one", "b": b"two"})
    key = object_key(sid)
    size = proxied.info(key).size_bytes

    before = _requests(fault_proxy)
    Catalog(proxied).snapshot(sid)
    after = _requests(fault_proxy)
    assert (after[0] - before[0], after[1] - before[1]) == (1, 0)  # as before the caps

    monkeypatch.setattr(caps, "SNAPSHOT_MAX_BYTES", size - 1)
    cat = Catalog(proxied)
    with pytest.raises(IntegrityError) as info:
        cat.snapshot(sid)
    assert type(info.value) is IntegrityError
    assert f"{proxied.url}: {key} is larger than any snapshot simstore writes" in str(info.value)
    again = _requests(fault_proxy)
    assert (again[0] - after[0], again[1] - after[1]) == (1, 0)  # the one GET, unread
    # the connection its body was on is not reused half-read: the next reads are whole
    assert cat.branches("ds").get("main") == sid

    run = CliRunner().invoke(main, ["--store", store.url, "log", "ds"])
    assert run.exit_code == 6, run.output
    (line,) = run.stderr.splitlines()
    assert line.startswith("error: ") and key in line and "larger than any snapshot" in line

    monkeypatch.undo()  # back to the real cap: the same store reads and commits on
    cat = Catalog(proxied)
    assert cat.snapshot(sid).samples == 2
    assert _commit(cat, {"c": b"three"}) == cat.resolve("ds")


def test_a_ref_over_its_cap_is_a_format_error_naming_it(proxied, fault_proxy, monkeypatch):
    sid = _commit(Catalog.init(proxied), {"a": b"one"})
    monkeypatch.setattr(caps, "REF_MAX_BYTES", 16)
    before = _requests(fault_proxy)
    with pytest.raises(FormatError, match="datasets/ds/refs/heads/main is larger than any "
                       "ref simstore writes"):
        Catalog(proxied).resolve("ds")
    after = _requests(fault_proxy)
    assert (after[0] - before[0], after[1] - before[1]) == (1, 0)
    monkeypatch.undo()
    assert Catalog(proxied).resolve("ds") == sid
