"""Source hashes taken ahead, in the reading thread's waits for the writer thread.

The hash of the file a task reaches next advances a step at a time while the reading
thread waits for a shard write; by the file's turn it is done, and equals the hash taken
at the file's turn. A file that changes before or while it is hashed ahead is hashed
again at its turn (and refused by its listing check, as any changed file is).
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import simstore.ingest._engine as engine
import simstore.ingest._worker as worker
from simstore.catalog import Catalog
from simstore.hashing import hash_file
from simstore.ingest import ingest
from simstore.ingest._ahead import STEP_BYTES, HashAhead
from simstore.ingest._records import Piece, SourceFile
from simstore.ingest._sources import _stat, hash_source
from simstore.ingest._writes import _WriterThread


def _age(path):
    """Times in the past, so a write now changes the mtime however coarse the clock."""
    os.utime(path, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))


def _listed(path, piece=None):
    size, mtime, identity = _stat(str(path))
    return SourceFile(str(path), os.path.basename(path), size, mtime, piece=piece,
                      identity=identity)


def _files(tmp_path, sizes=(3 * STEP_BYTES + 5, STEP_BYTES, 0, 2 * STEP_BYTES)):
    rng = np.random.default_rng(3)
    out = []
    for i, n in enumerate(sizes):
        p = tmp_path / f"f{i}.bin"
        p.write_bytes(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
        _age(p)
        out.append(_listed(p))
    return out


def _yes(src):
    return True


def _run(ahead):
    steps = 0
    while ahead.step(_yes):
        steps += 1
    return steps


def test_each_file_is_hashed_ahead_one_at_a_time_and_equals_its_hash(tmp_path):
    files = _files(tmp_path)
    ahead = HashAhead(files, same_host=True)
    for src in files:
        steps = _run(ahead)  # this file only: one ahead of the reader at most
        assert steps == -(-src.size // STEP_BYTES) + 1  # the reads, and the last (empty) one
        assert ahead.step(_yes) is False
        assert ahead.reach(src) == hash_source(src.path)
    assert _run(ahead) == 0
    ahead.close()


def test_a_pass_under_way_is_finished_when_the_reader_reaches_its_file(tmp_path):
    files = _files(tmp_path)
    ahead = HashAhead(files, same_host=True)
    ahead.step(_yes)
    ahead.step(_yes)  # a third of f0
    assert ahead.reach(files[0]) == hash_source(files[0].path)
    ahead.close()


def test_a_file_changed_since_it_was_listed_is_not_hashed_ahead(tmp_path):
    files = _files(tmp_path)
    path = files[0].path
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    ahead = HashAhead(files, same_host=True)
    assert ahead.step(_yes) is True  # found changed: nothing more to do for it
    assert ahead.step(_yes) is False
    assert ahead.reach(files[0]) is None  # hashed at its turn (and refused by its check)
    ahead.close()


def test_a_file_changed_while_hashed_ahead_is_not_taken(tmp_path):
    files = _files(tmp_path)
    ahead = HashAhead(files, same_host=True)
    ahead.step(_yes)
    with open(files[0].path, "r+b") as f:  # rewritten in place: same size, new bytes
        f.write(b"changed")
    assert _run(ahead) >= 1
    assert ahead.reach(files[0]) is None
    ahead.close()


def test_a_file_changed_after_it_was_hashed_ahead_is_not_taken(tmp_path):
    files = _files(tmp_path)
    ahead = HashAhead(files, same_host=True)
    _run(ahead)
    with open(files[0].path, "r+b") as f:
        f.write(b"changed")
    assert ahead.reach(files[0]) is None
    ahead.close()


def test_files_not_wanted_pieces_after_the_first_and_folders_are_not_hashed_ahead(tmp_path):
    files = _files(tmp_path)
    asked = []

    def no(src):
        asked.append(src.path)
        return False

    ahead = HashAhead(files, same_host=True)
    assert ahead.step(no) is True and ahead.step(no) is False
    assert asked == [files[0].path]
    assert ahead.reach(files[0]) is None
    # a file's second piece and a folder: not even asked about
    later = _listed(files[1].path, Piece(1, 2, 5, 10))
    folder = tmp_path / "group"
    folder.mkdir()
    (folder / "a").write_bytes(b"x")
    ahead = HashAhead([later, _listed(folder)], same_host=True)
    assert ahead.step(_yes) is False
    assert ahead.reach(later) is None
    ahead.close()


def test_a_file_the_reader_passed_without_taking_its_hash_does_not_stop_the_next(tmp_path):
    files = _files(tmp_path)
    ahead = HashAhead(files, same_host=True)
    _run(ahead)  # f0 done, never taken (its journal record was reused, say)
    assert ahead.reach(files[1]) is None  # f1 reached before it was hashed ahead
    _run(ahead)
    assert ahead.reach(files[2]) == hash_source(files[2].path)
    ahead.close()


def test_a_wait_for_the_writer_thread_does_other_work_until_the_write_is_done():
    writes = _WriterThread(ThreadPoolExecutor(1))
    release = threading.Event()
    writes.submit(release.wait)
    calls = []

    def idle():
        calls.append(1)
        if len(calls) == 3:
            release.set()  # the write ends while the waiter works
            time.sleep(0.05)
        return True

    writes.wait(idle)
    assert len(calls) == 3 and not writes.pending
    # idle says it has nothing more: the wait blocks until the write is done
    release.clear()
    writes.submit(time.sleep, 0.05)
    calls.clear()
    writes.wait(lambda: calls.append(1) or False)
    assert calls == [1] and not writes.pending
    writes.close()


# -- through an ingest -------------------------------------------------------------------
@pytest.fixture
def slow_writer(monkeypatch):
    """The writer thread forced on, each sample's write slowed, the source hashes counted."""
    monkeypatch.setattr(worker, "writer_thread_wanted", lambda workers: True)
    monkeypatch.setattr(engine, "writer_thread_wanted", lambda workers: True)
    real_add = worker._add

    def add(*args):
        time.sleep(0.05)  # long enough for the next file's hash to be taken meanwhile
        real_add(*args)

    monkeypatch.setattr(worker, "_add", add)
    hashed: list[str] = []
    real_hash = worker.hash_source

    def counted(path):
        hashed.append(os.path.basename(path))
        return real_hash(path)

    monkeypatch.setattr(worker, "hash_source", counted)
    return hashed


def _npy_sources(root, n=4):
    root.mkdir()
    rng = np.random.default_rng(5)
    for i in range(n):  # 1.25 MiB each: past the size handed to the writer thread
        np.save(root / f"run{i}.npy", rng.standard_normal((64, 64, 80)).astype(np.float32))
        _age(root / f"run{i}.npy")
    return root


@pytest.mark.parametrize("shard_size", [None, 1 << 20], ids=["one task", "a task per file"])
def test_an_ingest_takes_the_hashes_ahead_and_records_the_same_lineage(
    tmp_path, slow_writer, shard_size
):
    src = _npy_sources(tmp_path / "src")
    cat = Catalog.init(str(tmp_path / "store"))
    opts = {} if shard_size is None else {"shard_size": shard_size}
    r = ingest([src], dataset="d", store=cat, format="zarr", snapshot=True, workers=1, **opts)
    assert r.files_ingested == 4
    # the first files were hashed at their turn (a file of one sample hands it off once
    # the next file is hashed: the first wait comes with the second file's sample); the
    # rest in the waits before theirs
    assert slow_writer[:1] == ["run0.npy"] and len(slow_writer) <= 2
    assert "run2.npy" not in slow_writer and "run3.npy" not in slow_writer
    (lin,) = cat.snapshot(r.snapshot_id).lineage["ingests"]
    sources = json.loads(cat.get_object(lin["sources"]["object"]))
    assert len(sources) == 4
    for s in sources:
        assert s["hash"] == hash_file(s["path"])[0]
        assert s["size"] == os.path.getsize(s["path"])


def test_a_file_changed_after_its_hash_was_taken_ahead_is_skipped(
    tmp_path, slow_writer, monkeypatch
):
    src = _npy_sources(tmp_path / "src")
    real_reach = HashAhead.reach

    def reach(self, listed):
        got = real_reach(self, listed)
        if listed.path.endswith("run2.npy"):
            assert got is not None  # it was hashed ahead ...
            with open(listed.path, "r+b") as f:  # ... and is rewritten in place before its read
                f.seek(200)
                f.write(b"\x01\x02\x03\x04")
        return got

    monkeypatch.setattr(HashAhead, "reach", reach)
    cat = Catalog.init(str(tmp_path / "store"))
    r = ingest([src], dataset="d", store=cat, format="zarr", snapshot=True, workers=1,
               on_error="skip")
    assert [os.path.basename(s.path) for s in r.files_skipped] == ["run2.npy"]
    assert "changed since it was listed" in r.files_skipped[0].reason
    keys = sorted(cat.manifest(cat.snapshot(r.snapshot_id)).column("key").to_pylist())
    assert keys == ["run0", "run1", "run3"]


def _count_reads(monkeypatch):
    """The offsets of the ``preadv`` calls made from now on."""
    reads = []
    real = os.preadv

    def counted(fd, buffers, offset):
        reads.append(offset)
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", counted)
    return reads


def test_a_file_grown_while_hashed_ahead_is_not_read_past_its_listed_size(tmp_path, monkeypatch):
    files = _files(tmp_path)
    ahead = HashAhead(files, same_host=True)
    ahead.step(_yes)  # a third of f0
    os.truncate(files[0].path, files[0].size + 256 * STEP_BYTES)  # grown (sparse) meanwhile
    reads = _count_reads(monkeypatch)
    assert ahead.reach(files[0]) is None  # refused at its turn, as any changed file is
    # no more than a step past the size it was listed with (not the 256 MiB it grew by)
    assert len(reads) <= -(-files[0].size // STEP_BYTES) + 1
    ahead.close()


def test_a_file_swapped_for_a_named_pipe_is_refused_without_waiting_at_the_open(tmp_path):
    files = _files(tmp_path)
    os.unlink(files[0].path)
    os.mkfifo(files[0].path)  # no writer: a blocking open would wait for one for ever
    ahead = HashAhead(files, same_host=True)
    done = threading.Event()

    def run():
        ahead.step(_yes)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(10)
    assert ahead.step(_yes) is False  # refused: not as listed
    assert ahead.reach(files[0]) is None
    ahead.close()


def test_a_file_passed_without_reading_stops_its_pass_where_it_is(tmp_path, monkeypatch):
    files = _files(tmp_path)
    ahead = HashAhead(files, same_host=True)
    ahead.step(_yes)  # a third of f0, whose journal record the reader then reuses
    reads = _count_reads(monkeypatch)
    assert ahead.reach(files[0], take=False) is None
    assert reads == []  # the rest of f0 is not read
    _run(ahead)  # the next file is hashed ahead
    assert ahead.reach(files[1]) == hash_source(files[1].path)
    ahead.close()
