"""A task stopped while it writes its journal records is redone whole on the re-run.

A task stores its shards, then writes one record per file. A run killed among those
records left records for the first files only, while the stored shards held the samples
of every file of the task; the re-run reused the recorded files and packed the others
into a new shard, so their samples were stored twice and the re-run's shards differed from
a clean run's. File records now count only once the task's own record follows them.
"""

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner
from simstore.cli import main

import simstore.ingest._worker as worker_mod
from simstore.catalog import Catalog


def _ingest(store, src):
    return CliRunner().invoke(main, ["--store", store, "ingest", str(src), "--dataset", "d",
                                     "--json", "--no-progress", "--workers", "1", "--snapshot",
                                     "-m", "m"])


def _objects(store):
    """{object id: path} of the store's objects."""
    out = {}
    for d, _, names in os.walk(os.path.join(store, "objects")):
        out.update((n, os.path.join(d, n)) for n in names if not n.startswith("."))
    return out


def _kind(path):
    with open(path, "rb") as f:
        try:
            return json.loads(f.read()).get("kind")
        except ValueError:
            return "not JSON (a shard)"


def _shards(store):
    cat = Catalog.open(store)
    snap = cat.snapshot(cat.resolve("d"))
    return sorted({s for t in cat.iter_parts(snap) for s in t.column("shard").to_pylist()})


class Stopped(BaseException):
    """A kill in the middle of the journaling loop, as far as the store can tell."""


def test_a_task_stopped_among_its_records_is_redone_whole(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    for i in range(40):  # one task: many small files
        np.savez(src / f"s{i:03d}.npz", x=rng.standard_normal(16).astype(np.float32))
    clean = str(tmp_path / "clean")
    assert CliRunner().invoke(main, ["--store", clean, "init"]).exit_code == 0
    assert _ingest(clean, src).exit_code == 0

    store = str(tmp_path / "store")
    assert CliRunner().invoke(main, ["--store", store, "init"]).exit_code == 0
    written = []
    plain = worker_mod.write_journal

    def stop_after_three(ctx, source, res, *task):
        if len(written) == 3:
            raise Stopped
        written.append(source.key)
        plain(ctx, source, res, *task)

    monkeypatch.setattr(worker_mod, "write_journal", stop_after_three)
    with pytest.raises(Stopped):
        _ingest(store, src)
    assert len(written) == 3  # three records written, the task's shard stored
    monkeypatch.setattr(worker_mod, "write_journal", plain)

    again = _ingest(store, src)
    assert again.exit_code == 0, again.output
    summary = json.loads(again.output)
    assert summary["files_reused"] == 0 and summary["files_ingested"] == 40
    # the same shards as a clean run, and no second copy of any sample beside them
    assert _shards(store) == _shards(clean)
    here, there = _objects(store), _objects(clean)
    # only the snapshot differs (its time); the interrupted run's shard is the clean one's
    assert [_kind(here[oid]) for oid in sorted(set(here) - set(there))] == ["snapshot"]
    # and a third run takes every file from the journal
    third = json.loads(_ingest(store, src).output)
    assert third["files_reused"] == 40 and third["files_ingested"] == 0
