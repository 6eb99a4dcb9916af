"""A later job on a node opens the shards it trusts from the page layouts an earlier one kept.

A reader trusted by the time it closes leaves its shard's page layout in ``layouts/``
beside the node's shard hash records; a later job that trusts the same file (its record)
opens the shard from it, without opening the file in Arrow or walking its pages. The
samples are the same either way; a layout that does not check out, or one of a file the
job does not trust, is not used.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from loader_helpers import npz_parquet_store, snapshot_shards
from simstore.loaders import SimDataLoader, SimDataset

from simstore.catalog import Catalog
from simstore.hashing import object_key


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return npz_parquet_store(tmp_path_factory, seed=11)


def _epoch(ds: SimDataset, workers: int = 0) -> tuple[dict[str, np.ndarray], dict]:
    """(samples by key, stats) of one epoch of a new job's dataset, in batches."""
    loader = SimDataLoader(ds, batch_size=4, num_workers=workers,
                           multiprocessing_context="fork" if workers else None)
    out = {}
    for batch in loader:
        for key, value in zip(batch["__key__"], batch["u"], strict=True):
            out[key] = value.numpy().copy()
    return out, ds.stats()


def _layouts(folder: str) -> list[str]:
    where = os.path.join(folder, "layouts")
    return sorted(n for n in os.listdir(where) if n.endswith(".layout")) if os.path.isdir(
        where) else []


@pytest.mark.parametrize("workers", [0, 2])
def test_a_later_job_opens_trusted_shards_from_their_layouts(store, node_records, workers):
    shards = snapshot_shards(store)
    assert len(shards) > 2
    first, st = _epoch(SimDataset(store, "d@main", seed=2), workers)
    # nothing kept yet (a worker may open one its sibling kept moments before)
    assert st["shards_laid_out"] == 0 or workers
    assert _layouts(node_records) == sorted(f"{s}.layout" for s in shards)
    second, st = _epoch(SimDataset(store, "d@main", seed=2), workers)
    assert st["shards_hashed"] == 0
    assert st["shards_laid_out"] >= len(shards)
    assert first.keys() == second.keys() and len(first) == 24
    for key, value in first.items():
        np.testing.assert_array_equal(second[key], value)


def test_a_damaged_layout_is_not_used_and_is_written_again(store, node_records):
    want, _ = _epoch(SimDataset(store, "d@main", seed=2))
    shard = snapshot_shards(store)[0]
    path = os.path.join(node_records, "layouts", f"{shard}.layout")
    with open(path, "r+b") as f:
        f.seek(-5, os.SEEK_END)
        byte = f.read(1)
        f.seek(-5, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x40]))
    with open(path, "rb") as f:
        damaged = f.read()
    got, st = _epoch(SimDataset(store, "d@main", seed=2))
    assert st["shards_laid_out"] == len(snapshot_shards(store)) - 1
    assert got.keys() == want.keys()
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value)
    with open(path, "rb") as f:
        assert f.read() != damaged  # kept again by the reader that opened the shard
    _, st = _epoch(SimDataset(store, "d@main", seed=2))
    assert st["shards_laid_out"] == len(snapshot_shards(store))


def test_a_fifo_in_a_layouts_or_rows_place_is_a_miss_that_is_written_over(store, node_records):
    # found by an audit: every later job hung opening it (a FIFO waits for a writer)
    want, _ = _epoch(SimDataset(store, "d@main", seed=2))
    shard = snapshot_shards(store)[0]
    layout = os.path.join(node_records, "layouts", f"{shard}.layout")
    rows = [os.path.join(node_records, "rows", n) for n in os.listdir(
        os.path.join(node_records, "rows"))]
    assert rows
    for path in (layout, *rows):
        os.unlink(path)
        os.mkfifo(path)
    got, st = _epoch(SimDataset(store, "d@main", seed=2))
    assert st["shards_laid_out"] == len(snapshot_shards(store)) - 1
    assert got.keys() == want.keys()
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value)
    for path in (layout, *rows):
        assert os.path.isfile(path)  # kept again, in the FIFO's place


def test_a_layout_is_used_only_for_a_file_the_job_trusts(store, node_records):
    shards = snapshot_shards(store)
    _epoch(SimDataset(store, "d@main", seed=2))
    assert len(_layouts(node_records)) == len(shards)
    # no record trusts the files: each is hashed, and its layout left alone
    _, st = _epoch(SimDataset(store, "d@main", seed=2, verify_every_s=0))
    assert st["shards_hashed"] >= len(shards) and st["shards_laid_out"] == 0
    _, st = _epoch(SimDataset(store, "d@main", seed=2, verify=False))
    assert st["shards_laid_out"] == 0


def test_a_replaced_file_is_hashed_and_not_read_through_the_old_layout(store, node_records,
                                                                        tmp_path):
    import shutil

    copy = str(tmp_path / "copy")
    shutil.copytree(store, copy)
    want, _ = _epoch(SimDataset(copy, "d@main", seed=2))
    shard = snapshot_shards(copy)[0]
    path = os.path.join(copy, object_key(shard))
    # the same bytes written again: a new file (new stamp), so no record trusts it
    with open(path, "rb") as f:
        data = f.read()
    os.unlink(path)
    with open(path, "wb") as f:
        f.write(data)
    got, st = _epoch(SimDataset(copy, "d@main", seed=2))
    assert st["shards_hashed"] == 1
    # the others from their layouts; the new file too if a reader opened it only once its
    # hash had matched in this job (the same bytes, so the same layout), which depends on
    # the threads' timing: a full run saw it once
    assert st["shards_laid_out"] in (len(snapshot_shards(copy)) - 1, len(snapshot_shards(copy)))
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value)


def test_readers_closed_mid_epoch_leave_their_layouts(store, node_records, monkeypatch):
    # one reader open at a time: each shard's reader is closed as the next opens, mid-epoch
    from simstore.loaders import PrefetchConfig, _readers

    closed_open: list[int] = []  # readers still in the pool as each layout is written
    plain = _readers.ReaderPool._keep_layout

    def keep(self, key, entry):
        closed_open.append(len(self._entries))
        return plain(self, key, entry)

    monkeypatch.setattr(_readers.ReaderPool, "_keep_layout", keep)
    few = PrefetchConfig(chunks=1, shards=1, max_open_shards=1, chunk_samples=4)
    shards = snapshot_shards(store)
    want, _ = _epoch(SimDataset(store, "d@main", seed=2, shuffle=False, prefetch=few))
    assert _layouts(node_records) == sorted(f"{s}.layout" for s in shards)
    assert any(n > 0 for n in closed_open)  # some written while another reader was open
    got, st = _epoch(SimDataset(store, "d@main", seed=2, shuffle=False, prefetch=few))
    assert st["shards_laid_out"] >= len(shards)
    assert list(got) == list(want)
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value)


def test_verify_deep_keeps_the_layouts_and_rows_of_what_it_checks(store, node_records,
                                                                 tmp_path):
    import json
    import shutil

    from click.testing import CliRunner
    from simstore.cli import main

    copy = str(tmp_path / "copy")
    shutil.copytree(store, copy)
    shards = snapshot_shards(copy)
    result = CliRunner().invoke(main, ["--store", copy, "verify", "d", "--deep", "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["shards_recorded"] == len(shards)
    assert _layouts(node_records) == sorted(f"{s}.layout" for s in shards)
    # and each manifest part's stream rows
    cat = Catalog.open(copy)
    parts = [p.id for p in cat.snapshot(cat.resolve("d")).parts]
    rows = sorted(n for n in os.listdir(os.path.join(node_records, "rows"))
                  if n.endswith(".rows"))
    assert rows == sorted(f"{p}.rows" for p in parts)
    # the node's first job after it neither hashes, nor opens a shard in Arrow, nor
    # reads a manifest part
    got, st = _epoch(SimDataset(copy, "d@main", seed=2))
    assert st["shards_hashed"] == 0 and st["shards_laid_out"] >= len(shards)
    assert st["manifest_rows_cached"] == len(parts) and st["manifest_parts"] == 0
    want, _ = _epoch(SimDataset(store, "d@main", seed=2, verify=False))
    assert got.keys() == want.keys()
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value)
    # a shallow verify hashes no shard, so keeps nothing
    for folder in ("layouts", "rows"):
        shutil.rmtree(os.path.join(node_records, folder))
    result = CliRunner().invoke(main, ["--store", copy, "verify", "d"],
                                catch_exceptions=False)
    assert result.exit_code == 0 and _layouts(node_records) == []
    assert not os.path.exists(os.path.join(node_records, "rows"))


def test_what_is_not_a_shard_or_a_part_keeps_nothing(node_records, tmp_path):
    import pyarrow as pa
    from simstore.loaders._nodecache import layout_cache
    from simstore.loaders._partrows import part_rows_cache

    path = tmp_path / "not-a-shard"
    path.write_bytes(b"PAR1 not really PAR1")
    assert not layout_cache().keep_file("ab" * 16, str(path))
    assert _layouts(node_records) == []
    assert not part_rows_cache().keep_table("cd" * 16, pa.table({"x": [1, 2]}))
    rows = os.path.join(node_records, "rows")
    assert not os.path.isdir(rows) or os.listdir(rows) == []


def test_verify_deep_says_once_that_a_layouts_folder_others_can_write_is_not_used(
        store, node_records, tmp_path, caplog):
    import shutil

    from click.testing import CliRunner
    from simstore.cli import main

    copy = str(tmp_path / "copy")
    shutil.copytree(store, copy)
    shards = snapshot_shards(copy)
    assert len(shards) > 2
    folder = os.path.join(node_records, "layouts")
    os.makedirs(folder)
    os.chmod(folder, 0o777)
    with caplog.at_level("WARNING", logger="simstore.loaders"):
        result = CliRunner().invoke(main, ["--store", copy, "verify", "d", "--deep"],
                                    catch_exceptions=False)
    assert result.exit_code == 0, result.output
    said = [r for r in caplog.records if "shard page layouts not kept" in r.getMessage()]
    assert len(said) == 1  # one check of the folder, not one per shard recorded
    assert os.listdir(folder) == []
