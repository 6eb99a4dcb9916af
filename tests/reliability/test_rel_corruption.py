"""Corrupt stored objects: a bit-flipped shard, a truncated manifest part, hand-edited JSON.

``verify`` names the damaged object and the snapshot that references it (``--deep`` for
shards, whose bytes only a re-hash can check), the command exits 6, and the loader raises
an error naming the object instead of yielding a sample. On S3 the same holds with a disk
cache (every fill is hash-checked). ``on_corrupt="skip"`` is not offered by SimDataset
(reported in docs/reliability.md), so a corrupt object always stops the loader. A part whose
row count differs from its snapshot entry is named by the loader too.
"""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest
import rel_harness as h
from click.testing import CliRunner
from simstore.cli import main

from simstore.catalog import Catalog, verify
from simstore.errors import FormatError, IntegrityError, SimstoreError
from simstore.hashing import object_key
from simstore.ingest import ingest
from simstore.testing.s3 import FAKE_ACCESS_KEY, FAKE_SECRET_KEY, make_s3_client


@pytest.fixture
def store(tmp_path):
    """A local store with one dataset of 12 samples in several shards."""
    root = str(tmp_path / "store")
    src = str(tmp_path / "src")
    h.write_sources(src, 0, count=12, seed=4)
    Catalog.init(root)
    ingest([src], dataset="ds", store=root, snapshot=True, message="v0", shard_size=8 * 1024)
    return root


def _shards(cat, ref="ds"):
    snap = cat.snapshot(cat.resolve(ref))
    return sorted({s for t in cat.iter_parts(snap) for s in t.column("shard").to_pylist()})


def _flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << (offset % 8))]))


def _epoch(url, **kw):
    from simstore.loaders import SimDataset

    return {s["__key__"]: s["u"].numpy().copy() for s in SimDataset(url, "ds", shuffle=False, **kw)}


def _epoch_with_pads(url, **kw):
    """``{key: (stood in for, u)}`` of one in-order epoch (which must not raise)."""
    from simstore.loaders import SimDataset

    return {s["__key__"]: (bool(s["__pad__"]), s["u"].numpy().copy())
            for s in SimDataset(url, "ds", shuffle=False, **kw)}


def _cli(root, *args):
    return CliRunner().invoke(main, ["--store", root, *args])


@pytest.mark.parametrize("where", ["first", "middle", "last", "random"])
def test_bit_flipped_shard_is_named_by_verify_and_the_loader(store, where):
    cat = Catalog.open(store)
    sid = cat.resolve("ds")
    shard = _shards(cat)[1]
    path = os.path.join(store, object_key(shard))
    size = os.path.getsize(path)
    offset = {
        "first": 0,
        "middle": size // 2,
        "last": size - 1,
        "random": random.Random(5).randrange(size),
    }[where]
    _flip(path, offset)

    assert verify(cat, "ds").ok  # the shallow check reads no shard bytes
    report = verify(cat, "ds", deep=True)
    assert len(report.problems) == 1
    assert object_key(shard) in report.problems[0] and sid in report.problems[0]
    result = _cli(store, "verify", "ds", "--deep")
    assert result.exit_code == 6 and shard in result.output
    with pytest.raises(IntegrityError) as info:
        _epoch(store)
    assert shard in str(info.value) and sid in str(info.value)


@pytest.fixture
def slow_hash(monkeypatch):
    """Whole-shard hashes that finish only after the readers have started decoding (and
    no read hashes its shard first, which a read of most of a shard would)."""
    import time

    import simstore.loaders._fetch as fetch
    import simstore.loaders._readers as pipeline

    monkeypatch.setattr(pipeline, "HASH_FIRST_SHARE", 0)

    real = fetch.hash_file
    hashed = []

    def slow(path, *args, **kw):
        time.sleep(0.5)
        hashed.append(path)
        return real(path, *args, **kw)

    monkeypatch.setattr(fetch, "hash_file", slow)
    return hashed


def _flip_first_shard(store, where):
    """Flip a bit of the first shard, in a data page or in a digit of the footer's
    statistics; the catalog, snapshot id and shard id."""
    cat = Catalog.open(store)
    sid = cat.resolve("ds")
    shard = _shards(cat)[0]
    path = os.path.join(store, object_key(shard))
    with open(path, "rb") as f:
        data = f.read()
    if where == "data page":
        offset = len(data) // 8  # in the first column chunk's pages
    else:
        offset = data.index(b'"mean":[') + len(b'"mean":[')
        while not data[offset : offset + 1].isdigit():
            offset += 1
    _flip(path, offset)
    return cat, sid, shard


def _epoch_until_error(store):
    """The keys an epoch delivered before it raised, and the IntegrityError."""
    from simstore.loaders import SimDataset

    ds = SimDataset(store, "ds", shuffle=False)
    received = []
    with pytest.raises(IntegrityError) as info:
        for sample in ds:
            received.append(sample["__key__"])
    return received, str(info.value), len(ds)


@pytest.mark.parametrize("where", ["data page", "footer metadata"])
def test_bit_flip_found_while_the_shard_hash_is_still_running(store, slow_hash, where):
    """Parquet readers decode before the whole-shard hash is known (pages carry CRC-32s).

    A flipped bit in a data page fails its page's CRC and the loader then reports the
    shard's wrong hash; a flipped digit in the footer's statistics decodes fine and is
    found by the hash at the end of the epoch. Either way the epoch raises an
    IntegrityError naming the shard and its snapshot.
    """
    _, sid, shard = _flip_first_shard(store, where)
    received, error, total = _epoch_until_error(store)
    assert shard in error and sid in error
    if where == "footer metadata":
        # the pages were sound: every sample came before the hash was known to be wrong
        assert len(received) == total


def test_a_damaged_footer_fails_the_hash_of_a_shard_read_whole_before_any_sample(store):
    """A read over most of a shard hashes it first: a flipped digit in the footer's
    statistics (pages sound) is named before any sample of the shard comes out."""
    cat, sid, shard = _flip_first_shard(store, "footer metadata")
    received, error, _ = _epoch_until_error(store)
    assert shard in error and sid in error
    snap = cat.snapshot(sid)
    keys = {k for t in cat.iter_parts(snap)
            for k, s in zip(t.column("key").to_pylist(), t.column("shard").to_pylist(),
                            strict=True) if s == shard}
    assert keys and not keys & set(received)


@pytest.mark.parametrize("damaged", [False, True])
def test_hashes_still_queued_at_the_end_of_an_epoch_are_done_then(store, slow_hash, damaged):
    """With one I/O thread and slow hashes, hashes are still queued when the epoch ends;
    the loader hashes them itself before it finishes (a clean epoch ends cleanly, a
    damaged footer is named)."""
    from simstore.loaders import PrefetchConfig, SimDataset

    cat = Catalog.open(store)
    shards = _shards(cat)
    assert len(shards) >= 2
    if damaged:
        path = os.path.join(store, object_key(shards[-1]))
        with open(path, "rb") as f:
            data = f.read()
        at = data.index(b'"mean":[') + len(b'"mean":[')
        while not data[at : at + 1].isdigit():
            at += 1
        _flip(path, at)
    ds = SimDataset(store, "ds", shuffle=False, prefetch=PrefetchConfig(io_threads=1))
    if damaged:
        with pytest.raises(IntegrityError) as info:
            list(ds)
        assert shards[-1] in str(info.value)
    else:
        assert len(list(ds)) == len(ds)
        assert sorted(os.path.basename(p) for p in slow_hash) == sorted(shards)


def test_bit_flip_in_a_zarr_chunk_found_while_the_shard_hash_is_still_running(
    tmp_path, slow_hash
):
    """Zarr shards are zips: each chunk read is checked against its entry's CRC-32."""
    root = str(tmp_path / "zstore")
    src = str(tmp_path / "src")
    h.write_sources(src, 0, count=6, seed=4)
    Catalog.init(root)
    ingest([src], dataset="ds", store=root, snapshot=True, message="v0", format="zarr")
    cat = Catalog.open(root)
    sid = cat.resolve("ds")
    shard = _shards(cat)[0]
    path = os.path.join(root, object_key(shard))
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/c/" in i.filename), key=lambda i: i.file_size)
        with open(path, "rb") as f:
            f.seek(info.header_offset + 26)
            n, m = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
    _flip(path, info.header_offset + 30 + n + m + info.file_size // 2)
    from simstore.formats import ZarrFormat

    reader = ZarrFormat().open(path)
    with pytest.raises(FormatError, match="CRC-32"):
        list(reader.read(list(range(reader.num_samples))))
    reader.close()
    with pytest.raises(IntegrityError) as info_err:
        _epoch(root)
    assert shard in str(info_err.value) and sid in str(info_err.value)


@pytest.mark.parametrize("where", ["first", "last"])
def test_a_shard_that_cannot_be_opened_does_not_wait_for_the_first_chunk(
    store, monkeypatch, where
):
    """Hashes wait for the first chunk; a reader that fails to open must start them, not
    wait for a first chunk that it is itself holding up (a liveness check: the epoch has
    to end, with the shard named, long before the hashes' own deadline)."""
    import threading

    import simstore.loaders._readers as pipeline

    monkeypatch.setattr(pipeline, "_HASH_DELAY_S", 3600.0)
    cat = Catalog.open(store)
    shard = _shards(cat)[0]
    path = os.path.join(store, object_key(shard))
    _flip(path, 0 if where == "first" else os.path.getsize(path) - 1)
    outcome = []

    def epoch():
        try:
            _epoch(store)
        except SimstoreError as exc:
            outcome.append(exc)

    t = threading.Thread(target=epoch, daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive(), "the epoch hung waiting for a hash"
    assert outcome and isinstance(outcome[0], IntegrityError) and shard in str(outcome[0])


def test_truncated_manifest_part_is_named_by_verify_and_the_loader(store):
    cat = Catalog.open(store)
    snap = cat.snapshot(cat.resolve("ds"))
    part = snap.parts[0].id
    path = os.path.join(store, object_key(part))
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    report = verify(Catalog.open(store), "ds")
    assert report.problems and part in report.problems[0] and snap.id in report.problems[0]
    assert _cli(store, "verify", "ds").exit_code == 6
    with pytest.raises(SimstoreError) as info:
        _epoch(store)
    assert part in str(info.value)


@pytest.mark.parametrize("edit", ["message", "samples", "parts", "garbage"])
def test_hand_edited_snapshot_is_named(store, edit):
    cat = Catalog.open(store)
    sid = cat.resolve("ds")
    path = os.path.join(store, object_key(sid))
    with open(path, "rb") as f:
        obj = json.loads(f.read())
    if edit == "message":
        obj["message"] = "rewritten history"
    elif edit == "samples":
        obj["samples"] += 1
    elif edit == "parts":
        obj["parts"] = obj["parts"][:0]
    text = b"{not json" if edit == "garbage" else json.dumps(obj).encode()
    with open(path, "wb") as f:
        f.write(text)
    report = verify(Catalog.open(store), "ds")
    assert report.problems and sid in report.problems[0]
    result = _cli(store, "verify", "ds")
    assert result.exit_code == 6 and sid in result.output
    for command in (["log", "ds"], ["show", "ds"], ["diff", "ds", "ds"]):
        result = _cli(store, *command)
        assert result.exit_code == IntegrityError.exit_code and sid in result.output, command
        assert "Traceback" not in result.output
    with pytest.raises(IntegrityError) as info:
        _epoch(store)
    assert sid in str(info.value)


@pytest.mark.parametrize("change", ["shorter", "longer"])
def test_part_whose_row_count_differs_from_its_entry_is_named_by_the_loader(store, change):
    """A hash-valid part planted under its own id, one row short or long of its entry."""
    import pyarrow as pa

    from simstore.catalog._refs import encode_ref
    from simstore.manifest import encode_part
    from simstore.sample import canonical_json

    cat = Catalog.open(store)
    snap = cat.snapshot(cat.resolve("ds"))
    table = cat.read_part(snap.parts[0])
    if change == "shorter":
        table = table.slice(0, table.num_rows - 1)
    else:
        extra = table.slice(table.num_rows - 1, 1).to_pydict()
        extra["key"] = ["~after-every-key"]
        table = pa.concat_tables([table, pa.table(extra, schema=table.schema)])
    part, _ = cat.put_object(encode_part(table))
    obj = snap.to_json()
    obj["parts"] = [{**obj["parts"][0], "id": part}, *obj["parts"][1:]]
    sid, _ = cat.put_object(canonical_json(obj))
    cat.store.put("datasets/ds/refs/heads/main", encode_ref(sid))
    problems = verify(Catalog.open(store), "ds").problems
    assert problems and part in problems[0]  # verify names it already
    with pytest.raises(FormatError) as info:
        _epoch(store)
    assert part in str(info.value)


@pytest.mark.parametrize(
    "text",
    [
        b"",
        b"{",
        b'{"format_version":1}',
        b'{"format_version":1,"snapshot":"../../etc/passwd"}',
        b'{"format_version":9,"snapshot":"00000000000000000000000000000000"}',
    ],
)
def test_hand_edited_ref_is_named(store, text):
    key = "datasets/ds/refs/heads/main"
    with open(os.path.join(store, key), "wb") as f:
        f.write(text)
    with pytest.raises(FormatError) as info:
        Catalog.open(store).resolve("ds")
    assert key in str(info.value)
    result = _cli(store, "verify", "ds")
    assert result.exit_code == FormatError.exit_code and key in result.output
    with pytest.raises(FormatError) as info:
        _epoch(store)
    assert key in str(info.value)


def test_hand_edited_staging_entry_is_named(store, tmp_path):
    h.write_sources(str(tmp_path / "src"), 1, count=12, seed=4)
    ingest([str(tmp_path / "src")], dataset="ds", store=store, shard_size=8 * 1024)
    cat = Catalog.open(store)
    [entry] = cat.staged("ds")
    key = f"datasets/ds/staging/{entry.id}"
    with open(os.path.join(store, key), "wb") as f:
        f.write(b'{"kind":"staging","format_version":1,"id":')
    result = _cli(store, "snapshot", "ds", "-m", "x")
    assert result.exit_code == FormatError.exit_code and key in result.output
    assert h.head(Catalog.open(store), "ds") == cat.resolve("ds")  # nothing committed


@pytest.mark.s3
def test_bit_flipped_shard_on_s3_is_caught_by_the_cache(tmp_path, s3_bucket, moto_server):
    bucket = s3_bucket()
    url = f"s3://{bucket}/store"
    options = {
        "endpoint_url": moto_server,
        "key": FAKE_ACCESS_KEY,
        "secret": FAKE_SECRET_KEY,
        "region_name": "us-east-1",
    }
    src = str(tmp_path / "src")
    h.write_sources(src, 0, count=12, seed=4)
    Catalog.init(url, storage_options=options)
    cat = Catalog.open(url, storage_options=options)
    ingest([src], dataset="ds", store=cat, snapshot=True, message="v0", shard_size=8 * 1024)
    clean = _epoch(url, storage_options=options)  # reads clean before the flip
    assert clean
    shard = _shards(cat)[0]
    client = make_s3_client(moto_server)
    body = bytearray(
        client.get_object(Bucket=bucket, Key=f"store/{object_key(shard)}")["Body"].read()
    )
    footer = int.from_bytes(body[-8:-4], "little")
    body[4 + (len(body) - footer - 12) // 2] ^= 0x10  # in the row groups' pages
    client.put_object(Bucket=bucket, Key=f"store/{object_key(shard)}", Body=bytes(body))
    report = verify(Catalog.open(url, storage_options=options), "ds", deep=True)
    assert len(report.problems) == 1 and shard in report.problems[0]
    with pytest.raises(IntegrityError) as info:
        _epoch(url, storage_options=options, cache_dir=str(tmp_path / "cache"))
    assert shard in str(info.value)
    # without a cache reads are ranged and cannot hash the whole object: the pages' CRC-32
    # checksums catch the flip in the pages read
    with pytest.raises(SimstoreError) as info:
        _epoch(url, storage_options=options)
    assert shard in str(info.value)
    # on_corrupt="skip": the epoch goes on, through the cache and without one; the damaged
    # shard's samples are stood in for (marked __pad__) and every other sample is intact
    for kw in ({"cache_dir": str(tmp_path / "cache2")}, {}):
        got = _epoch_with_pads(url, storage_options=options, on_corrupt="skip", **kw)
        assert sorted(got) == sorted(clean)
        stood_in = [k for k, (pad, _) in got.items() if pad]
        assert stood_in, kw
        for key, (pad, u) in got.items():
            if not pad:
                assert np.array_equal(u, clean[key]), (kw, key)
