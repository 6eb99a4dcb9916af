"""``on_corrupt="skip"``: a corrupt shard's samples are stood in for, counted and logged.

A training run of days should not stop at one damaged shard when its owner says so; the
ranks must still deliver equal counts (DDP hangs otherwise), so each skipped sample's
slot carries a copy of an intact sample marked ``__pad__``.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from loader_helpers import corrupt_object, keys_of, open_test_shard, write_npz_sources
from simstore.loaders import SimDataLoader, SimDataset
from simstore.loaders._stats import one_line

from simstore.catalog import Catalog
from simstore.errors import FormatError, IntegrityError, InvalidInputError, StorageError
from simstore.hashing import object_key
from simstore.ingest import ingest


def _keys_by_shard(store: str, ref: str) -> dict[str, list[str]]:
    cat = Catalog.open(store)
    out: dict[str, list[str]] = {}
    for table in cat.iter_parts(cat.snapshot(cat.resolve(ref))):
        for key, shard in zip(table.column("key").to_pylist(),
                              table.column("shard").to_pylist(), strict=True):
            out.setdefault(shard, []).append(key)
    return out


def _damaged(small, index: int):
    """``small`` with its ``index``-th shard (by id) damaged; plus keys by shard and it."""
    store, ref, samples = small
    shards = _keys_by_shard(store, ref)
    bad = sorted(shards)[index]
    corrupt_object(store, bad)
    return store, ref, samples, shards, bad


def test_skip_stands_in_for_a_corrupt_shard_and_counts_it(small, caplog):
    store, ref, samples, shards, bad = _damaged(small, 2)
    ds = SimDataset(store, ref, shard_opener=open_test_shard, on_corrupt="skip", seed=3)
    with caplog.at_level("WARNING", logger="simstore.loaders"):
        out = list(ds)
    assert len(out) == len(samples)  # the rank's count is kept
    pads = [s for s in out if s["__pad__"]]
    kept = [s for s in out if not s["__pad__"]]
    assert sorted(s["__key__"] for s in pads) == sorted(shards[bad])
    assert sorted(s["__key__"] for s in kept) == sorted(set(samples) - set(shards[bad]))
    for s in kept:
        assert np.array_equal(s["u"].numpy(), samples[s["__key__"]].fields["u"])
    intact = [s["u"].numpy() for s in kept]
    for s in pads:  # a copy of an intact sample, never the damaged bytes
        assert any(np.array_equal(s["u"].numpy(), u) for u in intact)
    stats = ds.stats()
    assert stats["corrupt_samples"] == len(shards[bad]) and stats["corrupt_shards"] == 1
    assert any(object_key(bad) in r.getMessage() for r in caplog.records)
    assert ds.report()["corrupt"] == {"shards": 1, "samples": len(shards[bad])}
    assert f"{len(shards[bad])} samples of corrupt shards stood in for" in one_line(stats)


@pytest.mark.parametrize(("error", "resource"), [
    (OSError(errno.EMFILE, "Too many open files"), "file descriptors"),
    # pyarrow's own wording: an OSError with no errno, the number in its text
    (OSError("Failed to open local file 'x'. Detail: [errno 24] Too many open files"),
     "file descriptors"),
    (OSError(errno.ENOMEM, "Cannot allocate memory"), "memory"),
    # found by an audit, each taken for a corrupt shard (its samples stood in for):
    # torch's words for a buffer it could not make in shared memory (a full /dev/shm, an
    # address-space limit, no descriptor left), the errno at the end
    (RuntimeError("unable to allocate shared memory(shm) for file </torch_1_2_0>: No "
                  "space left on device (28)"), "shared memory"),
    (RuntimeError("unable to mmap 33554432 bytes from file </torch_1_2_0>: Cannot allocate "
                  "memory (12)"), "memory"),
    (RuntimeError("unable to open shared memory object </torch_1_2_0> in read-write mode: "
                  "Too many open files (24)"), "file descriptors"),
    # a full temp folder or quota (a Lance shard's copy), a file-size limit, no thread
    (OSError(errno.ENOSPC, "No space left on device"), "disk space"),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), "disk space"),
    (OSError(errno.EFBIG, "File too large"), "file size"),
    (RuntimeError("can't start new thread"), "threads"),
])
def test_skip_does_not_take_the_processs_own_limits_for_a_corrupt_shard(small, caplog, error,
                                                                       resource):
    # out of descriptors, healthy shards were logged as corrupt and their samples skipped
    store, ref, samples = small
    bad = sorted(_keys_by_shard(store, ref))[1]

    def opener(source):
        if isinstance(source, str) and bad in source:
            try:
                raise error
            except Exception as exc:  # as the loader's opener wraps it
                raise FormatError(f"cannot read the shard's first and last bytes: {exc}") \
                    from exc
        return open_test_shard(source)

    for mode in ("skip", "raise"):
        ds = SimDataset(store, ref, shard_opener=opener, on_corrupt=mode)
        with caplog.at_level("WARNING", logger="simstore.loaders"):
            with pytest.raises(StorageError) as info:
                list(ds)
        assert not any("corrupt shard" in r.getMessage() for r in caplog.records)
        assert ds.stats()["corrupt_shards"] == 0
        # one line: the shard, the resource and what to do, not damage to the shard
        text = str(info.value)
        assert object_key(bad) in text and "\n" not in text
        assert f"for want of {resource} in this process, not for damage" in text
        assert str(error).split(":")[0] in text


def test_a_refused_shared_memory_buffer_leaves_no_file_and_names_memory(tmp_path):
    """Found by an audit: under an address-space limit, torch's shared-memory buffer was
    refused its mapping after its /dev/shm file was made and sized, and the file stayed
    (32 MiB each, until removed by hand). The real allocator, in a process of its own."""
    script = tmp_path / "refused.py"
    script.write_text(textwrap.dedent("""
        import json, os, resource
        from simstore.loaders._corrupt import resource_error
        from simstore.loaders._tensors import _new_shared

        def vm():
            with open("/proc/self/status") as f:
                return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize"))

        resource.setrlimit(resource.RLIMIT_AS, (vm() + (256 << 20), resource.RLIM_INFINITY))
        try:
            _new_shared(512 << 20)
        except RuntimeError as exc:
            said, error = str(exc), resource_error(exc, "shard x")
        mine = f"torch_{os.getpid()}_"
        print(json.dumps({"said": said, "error": str(error),
                          "left": [n for n in os.listdir("/dev/shm") if n.startswith(mine)]}))
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["left"] == []
    # refused its mapping; or, under a /dev/shm smaller than the buffer (a container's
    # 64 MiB), refused its room there first: torch left its file then too
    if "unable to mmap" in got["said"]:
        assert got["error"].startswith("shard x: the read failed for want of memory")
    else:
        assert "unable to allocate shared memory" in got["said"]
        assert got["error"].startswith("shard x: the read failed for want of shared memory")
    assert "/torch_" in got["said"]


def test_raise_is_the_default_and_names_the_shard(small):
    store, ref, _, _, bad = _damaged(small, 2)
    with pytest.raises(IntegrityError, match=object_key(bad)):
        list(SimDataset(store, ref, shard_opener=open_test_shard))


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_with_the_loader_and_workers(small, workers):
    store, ref, samples, shards, bad = _damaged(small, 4)
    ds = SimDataset(store, ref, shard_opener=open_test_shard, on_corrupt="skip", seed=1)
    loader = SimDataLoader(ds, batch_size=4, num_workers=workers)
    batches = list(loader)
    assert sum(len(b["__key__"]) for b in batches) == len(samples)
    assert sorted(keys_of(batches)) == sorted(set(samples) - set(shards[bad]))
    skipped = [k for b in batches for k, p in zip(b["__key__"], b["__pad__"].tolist(),
                                                   strict=True) if p]
    assert sorted(skipped) == sorted(shards[bad])
    assert ds.stats()["corrupt_samples"] == len(shards[bad])


def test_every_shard_corrupt_is_an_error_naming_them(small):
    store, ref, _ = small
    for shard in _keys_by_shard(store, ref):
        corrupt_object(store, shard)
    with pytest.raises(IntegrityError, match="no intact sample"):
        list(SimDataset(store, ref, shard_opener=open_test_shard, on_corrupt="skip"))


def test_an_unknown_choice_is_refused(small):
    store, ref, _ = small
    with pytest.raises(InvalidInputError, match="on_corrupt"):
        SimDataset(store, ref, shard_opener=open_test_shard, on_corrupt="ignore")


@pytest.mark.parametrize("fmt", ["parquet", "zarr"])
def test_skip_over_a_damaged_shard_of_each_format(tmp_path, fmt):
    src = tmp_path / "src"
    src.mkdir()
    arrays = write_npz_sources(str(src), 24, seed=5)
    store = str(tmp_path / "store")
    Catalog.init(store)
    ingest([str(src)], dataset="ds", store=store, format=fmt, snapshot=True, message="m",
           shard_size=40_000)
    shards = _keys_by_shard(store, "ds")
    assert len(shards) >= 3
    bad = sorted(shards)[1]
    corrupt_object(store, bad)
    with pytest.raises(IntegrityError, match=object_key(bad)):
        list(SimDataset(store, "ds", shuffle=False))
    ds = SimDataset(store, "ds", shuffle=False, on_corrupt="skip")
    out = list(ds)
    assert len(out) == 24
    kept = {s["__key__"]: s["u"].numpy() for s in out if not s["__pad__"]}
    skipped = sorted(s["__key__"] for s in out if s["__pad__"])
    # every sample is delivered once, intact, or stood in for; the stood-in ones are the
    # damaged shard's (a Parquet shard's intact pages may still be read before the
    # damage is found, so some of its samples can come through, checked)
    assert sorted([*kept, *skipped]) == sorted(arrays)
    assert skipped and set(skipped) <= set(shards[bad])
    for key, u in kept.items():
        assert np.array_equal(u, arrays[key]), key
    assert ds.stats()["corrupt_samples"] == len(skipped)
    assert os.path.exists(os.path.join(store, object_key(bad)))  # nothing deleted


def test_a_first_chunk_made_only_of_corrupt_samples_gets_a_stand_in_from_the_stream(small):
    """Without workers the first chunk is one batch (here one sample): when its shard is
    the corrupt one, the stand-in is found further on in the stream."""
    store, ref, samples = small
    shards = _keys_by_shard(store, ref)
    first = min(samples)  # shuffle=False reads in key order
    bad = next(s for s, keys in shards.items() if first in keys)
    corrupt_object(store, bad)
    ds = SimDataset(store, ref, shard_opener=open_test_shard, on_corrupt="skip", shuffle=False)
    out = list(ds)
    assert [s["__key__"] for s in out] == sorted(samples)
    assert out[0]["__pad__"] and sorted(s["__key__"] for s in out if s["__pad__"]) == sorted(
        shards[bad])
    intact = [s["u"].numpy() for s in out if not s["__pad__"]]
    assert any(np.array_equal(out[0]["u"].numpy(), u) for u in intact)


def test_stand_in_copies_into_the_slot_rows_of_arrays_and_scalars():
    from simstore.loaders._tensors import ChunkBuffers

    buffers = ChunkBuffers(3, shared=False)
    scatter = buffers.take_many([0, 1], "a", (2,), np.dtype(np.float32))
    assert scatter is not None
    buf, index, rows = scatter
    buf[index] = [[1, 2], [3, 4]]
    count = buffers.take_many([0, 1], "n", (), np.dtype(np.int64))
    assert count is not None
    count[0][count[1]] = [7, 8]
    taken = buffers.take(2, "a", (2,), np.dtype(np.float32))  # a failed read's row
    assert taken is not None
    model = {"a": rows[1], "n": count[0][1], "name": "run1"}
    got = buffers.stand_in(2, model)
    assert got["name"] == "run1" and int(got["n"]) == 8
    assert np.array_equal(got["a"], [3, 4])
    values = [{"a": rows[0], "n": count[2][0]}, {"a": rows[1], "n": count[2][1]}, got]
    batch = buffers.rows("a", 0, 3, values)  # still one view of the buffer
    assert batch is not None and batch.tolist() == [[1, 2], [3, 4], [3, 4]]
    assert buffers.rows("n", 0, 3, values).tolist() == [7, 8, 8]


@pytest.mark.parametrize("fmt", ["parquet", "zarr"])
def test_skip_does_not_take_a_newer_shard_format_for_damage(tmp_path, monkeypatch, fmt):
    # an intact shard that a newer simstore wrote (a later format_version) is no damage:
    # skipping it would drop its samples from every epoch of a job on an older image
    import simstore.formats._arrow as arrow
    import simstore.formats._zarr_write as zarr_write

    src = tmp_path / "src"
    src.mkdir()
    write_npz_sources(str(src), 12, seed=2)
    store = str(tmp_path / "store")
    Catalog.init(store)
    ingest([str(src)], dataset="ds", store=store, format=fmt, snapshot=True, message="old",
           shard_size=40_000, workers=1)
    monkeypatch.setattr(arrow, "SHARD_FORMAT_VERSION", 2)
    monkeypatch.setattr(zarr_write, "SHARD_FORMAT_VERSION", 2)
    more = tmp_path / "more"
    more.mkdir()
    write_npz_sources(str(more), 12, seed=3)
    ingest([str(more)], dataset="ds", store=store, format=fmt, snapshot=True, message="new",
           shard_size=40_000, workers=1)
    monkeypatch.undo()
    ds = SimDataset(store, "ds", shuffle=False, on_corrupt="skip")
    with pytest.raises(FormatError, match=r"format_version 2, this simstore reads 1"):
        list(ds)
    assert ds.stats()["corrupt_shards"] == 0


@pytest.mark.parametrize("workers", [0, 2])
def test_a_corrupt_shard_is_met_once_per_reading_process_not_once_per_epoch(
    small, caplog, workers, monkeypatch
):
    # found by an audit: each epoch made its own record of corrupt shards, so a damaged
    # shard was read (downloaded, on a remote store) again, logged again and counted
    # again every epoch: 3 epochs said 3 corrupt shards with no workers, 6 with 2
    # persistent workers
    from simstore.loaders._fetch import ShardAccess

    store, ref, samples, shards, bad = _damaged(small, 3)
    touched = []  # the bad shard's preparations (a hash, a download) and opens
    for name in ("prepare", "open"):
        real = getattr(ShardAccess, name)

        def spy(self, shard_id, *args, _real=real, **kwargs):
            if shard_id == bad:
                touched.append(shard_id)
            return _real(self, shard_id, *args, **kwargs)

        monkeypatch.setattr(ShardAccess, name, spy)
    ds = SimDataset(store, ref, shard_opener=open_test_shard, on_corrupt="skip", seed=2)
    loader = SimDataLoader(ds, batch_size=4, num_workers=workers,
                           persistent_workers=workers > 0,
                           multiprocessing_context="fork" if workers else None)
    with caplog.at_level("WARNING", logger="simstore.loaders"):
        for epoch in range(3):
            if epoch == 1:
                first = len(touched)
            loader.set_epoch(epoch)
            batches = list(loader)
            assert sum(len(b["__key__"]) for b in batches) == len(samples)
            skipped = [k for b in batches for k, p in zip(b["__key__"],
                                                          b["__pad__"].tolist(), strict=True)
                       if p]
            assert sorted(skipped) == sorted(shards[bad])  # stood in for every epoch
    readers = max(1, workers)
    assert ds.stats()["corrupt_shards"] <= readers
    assert ds.stats()["corrupt_samples"] == 3 * len(shards[bad])
    if not workers:  # a worker's reads and warnings are its own process's
        assert first >= 1 and len(touched) == first  # not touched after the first epoch
        assert sum("corrupt shard" in r.getMessage() for r in caplog.records) == 1
