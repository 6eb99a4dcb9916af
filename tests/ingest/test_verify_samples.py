"""``verify --samples``: every manifest row checked against the shard row it names.

A shard that hashes to its id holds what its writer wrote; these tests build snapshots
whose manifest rows disagree with their shards (rows swapped, a wrong content hash, a
manifest built against another dataset's shard, a position past the shard's end) and
check that the sample check names the shard, the row and what differs, and that a
consistent store passes in every shard format and on a store without local paths.
"""

import json

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner
from simstore.cli import main

import simstore
from simstore.catalog import Catalog, verify
from simstore.errors import InvalidInputError
from simstore.hashing import object_key


def _sources(root, n=6, seed=0):
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        np.savez(root / f"run{i}.npz",
                 u=rng.random((3, 5)).astype(np.float32), steps=np.arange(i + 2))
    return root


def _ingest(cat, src, dataset="d", fmt="parquet"):
    simstore.ingest([str(src)], store=cat, dataset=dataset, format=fmt, workers=1,
                    snapshot=True, message="ingest")
    return cat.resolve(f"{dataset}@main")


def _commit_rows(cat, dataset, rows):
    """A snapshot of ``dataset`` whose manifest is exactly ``rows`` (manifest dicts)."""
    changes = pa.Table.from_pylist(
        [{**r, "deleted": False} for r in rows],
        schema=pa.schema([
            ("key", pa.string()), ("sample_hash", pa.binary(16)), ("shard", pa.string()),
            ("position", pa.int64()), ("size_bytes", pa.int64()), ("deleted", pa.bool_()),
        ]),
    )
    shards = sorted({r["shard"] for r in rows})
    cat.stage(dataset, changes=changes, shards=shards, mode="replace")
    return cat.commit(dataset, message="crafted").snapshot_id


@pytest.mark.parametrize("fmt", ["parquet", "zarr", "lance"])
def test_a_consistent_store_passes_in_every_format(tmp_path, fmt):
    cat = Catalog.init(str(tmp_path / "store"))
    sid = _ingest(cat, _sources(tmp_path / "src"), fmt=fmt)
    report = verify(cat, "d", samples=True)
    assert report.ok, report.problems
    assert report.samples and report.samples_checked == 6
    assert report.to_json()["samples_checked"] == 6
    assert report.snapshot == sid
    # without the flag no sample is read
    assert verify(cat, "d").samples_checked == 0


def test_rows_shared_by_snapshots_are_read_once(tmp_path):
    cat = Catalog.init(str(tmp_path / "store"))
    src = _sources(tmp_path / "src")
    _ingest(cat, src)
    np.savez(src / "run9.npz", u=np.zeros((3, 5), np.float32), steps=np.arange(3))
    _ingest(cat, src)
    report = verify(cat, "d", samples=True, history=True)
    assert report.ok, report.problems
    assert len(report.snapshots) == 2
    assert report.samples_checked == 7  # 6 shared by both snapshots, 1 new


def test_swapped_rows_are_named_by_key_and_content(tmp_path):
    cat = Catalog.init(str(tmp_path / "store"))
    sid = _ingest(cat, _sources(tmp_path / "src"))
    rows = cat.manifest(cat.snapshot(sid)).to_pylist()
    a, b = rows[1], rows[2]
    a["position"], b["position"] = b["position"], a["position"]
    crafted = _commit_rows(cat, "d", rows)

    report = verify(cat, "d", samples=True)
    assert not report.ok
    (p,) = report.problem_objects
    assert (p.object, p.kind, p.problem) == (a["shard"], "shard", "damaged")
    assert p.snapshots == (crafted,)
    assert p.message.startswith(f"{object_key(a['shard'])}: 2 of 6 manifest rows")
    assert f"position {a['position']} holds key {b['key']!r}, the manifest says {a['key']!r}" \
        in p.message
    assert crafted in p.message
    # the honest snapshot it came from still passes
    assert verify(cat, f"d@{sid}", samples=True).ok


def test_a_wrong_content_hash_is_named(tmp_path):
    cat = Catalog.init(str(tmp_path / "store"))
    sid = _ingest(cat, _sources(tmp_path / "src"))
    rows = cat.manifest(cat.snapshot(sid)).to_pylist()
    right = rows[3]["sample_hash"]
    rows[3]["sample_hash"] = rows[4]["sample_hash"]
    _commit_rows(cat, "d", rows)

    (p,) = verify(cat, "d", samples=True).problem_objects
    assert "1 of 6 manifest rows" in p.message
    assert (f"sample {rows[3]['key']!r} at position {rows[3]['position']} hashes to "
            f"{right.hex()}, the manifest says {rows[4]['sample_hash'].hex()}") in p.message
    assert "holds key" not in p.message


def test_a_manifest_built_against_another_shard_is_found(tmp_path):
    # rows of dataset x pointing into dataset y's shard at the same positions: the shard
    # is intact and hashes to its id, so --deep alone passes
    cat = Catalog.init(str(tmp_path / "store"))
    sx = _ingest(cat, _sources(tmp_path / "x", seed=1), dataset="x")
    sy = _ingest(cat, _sources(tmp_path / "y", seed=2), dataset="y")
    y_shard = cat.manifest(cat.snapshot(sy)).to_pylist()[0]["shard"]
    rows = cat.manifest(cat.snapshot(sx)).to_pylist()
    for r in rows:
        r["shard"] = y_shard
    _commit_rows(cat, "x", rows)

    assert verify(cat, "x", deep=True).ok
    report = verify(cat, "x", deep=True, samples=True)
    (p,) = report.problem_objects
    assert p.object == y_shard
    assert "6 of 6 manifest rows do not match" in p.message
    assert "hashes to" in p.message


def test_a_position_past_the_shards_end(tmp_path):
    cat = Catalog.init(str(tmp_path / "store"))
    sid = _ingest(cat, _sources(tmp_path / "src"))
    rows = cat.manifest(cat.snapshot(sid)).to_pylist()
    rows[0]["position"] = 40
    _commit_rows(cat, "d", rows)
    (p,) = verify(cat, "d", samples=True).problem_objects
    assert "the manifest names position 40, the shard holds 6 samples" in p.message


def test_a_damaged_shard_is_reported_once(tmp_path):
    cat = Catalog.init(str(tmp_path / "store"))
    sid = _ingest(cat, _sources(tmp_path / "src"))
    shard = cat.manifest(cat.snapshot(sid)).to_pylist()[0]["shard"]
    path = cat.store.local_path(object_key(shard))
    with open(path, "r+b") as f:  # a flip inside the first row's values
        f.seek(200)
        byte = f.read(1)[0]
        f.seek(200)
        f.write(bytes([byte ^ 0x40]))
    deep = verify(cat, "d", deep=True, samples=True)
    (p,) = deep.problem_objects  # --deep found it; the sample check does not read it again
    assert f"expected {shard}" in p.message and deep.samples_checked == 0
    shallow = verify(cat, "d", samples=True)
    (q,) = shallow.problem_objects  # without --deep, reading the shard finds it
    assert q.object == shard and q.problem == "damaged"


def test_a_store_without_local_paths_is_fetched_and_hashed(tmp_path):
    cat = Catalog.init("memory://verify-samples-remote")
    try:
        sid = _ingest(cat, _sources(tmp_path / "src"), fmt="zarr")
        shard = cat.manifest(cat.snapshot(sid)).to_pylist()[0]["shard"]
        assert cat.store.local_path(object_key(shard)) is None
        size = cat.store.info(object_key(shard)).size_bytes
        report = verify(cat, "d", samples=True)
        assert report.ok, report.problems
        assert report.samples_checked == 6 and report.bytes_hashed == size
        # --deep hashes the shard in the same fetch, not in a second one
        deep = verify(cat, "d", deep=True).bytes_hashed  # shards and lineage objects
        assert deep > size
        assert verify(cat, "d", deep=True, samples=True).bytes_hashed == deep

        data = bytearray(cat.store.get(object_key(shard)))
        data[100] ^= 0x01
        cat.store.delete(object_key(shard))
        cat.store.put(object_key(shard), bytes(data))
        (p,) = verify(cat, "d", samples=True).problem_objects
        assert p.object == shard and "has hash" in p.message and f"expected {shard}" in p.message
    finally:
        for key in list(cat.store.list()):
            cat.store.delete(key)


def test_cli_exit_code_and_lines(tmp_path):
    store = str(tmp_path / "store")
    cat = Catalog.init(store)
    sid = _ingest(cat, _sources(tmp_path / "src"))
    rows = cat.manifest(cat.snapshot(sid)).to_pylist()
    rows[0]["sample_hash"] = rows[1]["sample_hash"]
    _commit_rows(cat, "d", rows)
    runner = CliRunner()

    ok = runner.invoke(main, ["--store", store, "verify", f"d@{sid}", "--samples"])
    assert ok.exit_code == 0, ok.output
    assert ok.output.startswith("ok: ") and "6 samples read and hashed" in ok.output

    bad = runner.invoke(main, ["--store", store, "verify", "d@main", "--samples"])
    assert bad.exit_code == 6
    lines = bad.output.strip().splitlines()
    assert lines[0].startswith("FAILED: ") and len(lines) == 2
    assert lines[1].startswith(object_key(rows[0]["shard"]))

    js = runner.invoke(main, ["--store", store, "verify", "d@main", "--samples", "--json"])
    doc = json.loads(js.output)
    assert js.exit_code == 6 and doc["samples"] is True and doc["samples_checked"] == 6
    assert doc["problem_objects"][0]["object"] == rows[0]["shard"]


def test_a_split_divides_the_shards_between_tasks(tmp_path):
    cat = Catalog.init(str(tmp_path / "store"))
    src = _sources(tmp_path / "src", n=24)
    simstore.ingest([str(src)], store=cat, dataset="d", workers=1, snapshot=True,
                    message="many shards", shard_size=300)
    sid = cat.resolve("d@main")
    rows = cat.manifest(cat.snapshot(sid)).to_pylist()
    shards = sorted({r["shard"] for r in rows})
    assert len(shards) >= 6
    whole = verify(cat, "d", deep=True, samples=True)
    assert whole.ok and whole.samples_checked == 24
    parts = [verify(cat, "d", deep=True, samples=True, split=(k, 3)) for k in range(3)]
    assert all(p.ok and p.split == (k, 3) for k, p in enumerate(parts))
    assert sum(p.samples_checked for p in parts) == 24
    assert sum(p.bytes_hashed for p in parts) == whole.bytes_hashed
    assert sum(p.objects_checked for p in parts) == whole.objects_checked + 2 * (1 + 1)
    assert all(0 < p.samples_checked < 24 for p in parts)  # 6+ uniform ids over 3 parts
    assert parts[0].to_json()["split"] == [0, 3]

    victim = shards[0]
    path = cat.store.local_path(object_key(victim))
    with open(path, "r+b") as f:
        f.seek(200)
        byte = f.read(1)[0]
        f.seek(200)
        f.write(bytes([byte ^ 0x40]))
    found = [[p.object for p in verify(cat, "d", deep=True, split=(k, 3)).problem_objects]
             for k in range(3)]
    assert sorted(found, key=len) == [[], [], [victim]]

    runner = CliRunner()
    store = str(tmp_path / "store")
    owner = next(k for k in range(3) if found[k])
    res = runner.invoke(main, ["--store", store, "verify", "d", "--deep",
                               "--split", f"{owner}/3"])
    assert res.exit_code == 6 and f"(part {owner} of 3 of its shards)" in res.output
    for bad in ("3/3", "1/0", "a/3", "2", "-1/3", "\u00b2/3", "0/\u00b3", "\u0661/\u0663"):
        res = runner.invoke(main, ["--store", store, "verify", "d", "--split", bad])
        assert res.exit_code == 2, (bad, res.output)
        assert f"invalid --split {bad!r}" in res.output
    with pytest.raises(InvalidInputError, match="0 <= K < N"):
        verify(cat, "d", split=(3, 3))


def test_progress_reports_each_shard_and_ends_at_the_totals(tmp_path):
    cat = Catalog.init(str(tmp_path / "store"))
    src = _sources(tmp_path / "src", n=12)
    simstore.ingest([str(src)], store=cat, dataset="d", workers=1, snapshot=True,
                    message="one", shard_size=300)
    np.savez(src / "run99.npz", u=np.zeros((3, 5), np.float32), steps=np.arange(2))
    simstore.ingest([str(src)], store=cat, dataset="d", workers=1, snapshot=True,
                    message="two", shard_size=300)
    seen = []
    report = verify(cat, "d", samples=True, history=True, progress=seen.append)
    assert report.ok
    shards = {r["shard"] for sid in report.snapshots
              for r in cat.manifest(cat.snapshot(sid)).to_pylist()}
    assert [p.shards_done for p in seen] == list(range(1, len(shards) + 1))
    last = seen[-1]
    assert last.shards_total == len(shards) and last.samples == report.samples_checked == 13
    # rows both snapshots list count in both totals: progress ends at exactly 100%
    listed = sum(r["size_bytes"] for sid in report.snapshots
                 for r in cat.manifest(cat.snapshot(sid)).to_pylist())
    assert last.bytes_total == listed and last.bytes_done == listed
    assert all(a.bytes_done <= b.bytes_done for a, b in zip(seen, seen[1:], strict=False))

    res = CliRunner().invoke(main, ["--store", str(tmp_path / "store"), "verify", "d",
                                    "--samples", "--progress"])
    assert res.exit_code == 0, res.output
    assert f"shards {len(shards)}/{len(shards)}  samples 13" in res.output
    quiet = CliRunner().invoke(main, ["--store", str(tmp_path / "store"), "verify", "d",
                                      "--samples"])
    assert "shards" not in quiet.output  # not a terminal: no bar unless asked
