"""A source that changes while an ingest runs is a bad file, on every engine.

Discovery records each file's size, mtime and identity; a task checks the file against
that when it opens it and after reading it. A file rewritten while read in pieces must
not give a snapshot mixing its old and new samples, and the re-run reads the new file
whole (no piece of the old one is taken from the journal).
"""

import os
import re

import numpy as np
import pytest
from changing_adapters import new_values, write_table

import simstore.ingest._driver as driver_module
from simstore.errors import InvalidInputError, SourceError
from simstore.ingest import ingest
from simstore.testing.adapters import add_adapters

pytestmark = pytest.mark.dask

SHARD = 512
ENGINES = ["local", "pool", "dask"]


@pytest.fixture
def rewrites(monkeypatch):
    """Register ``changing_adapters.RewritingAdapter`` as ``rewrites`` (driver side)."""
    add_adapters(monkeypatch, {"rewrites": "changing_adapters:RewritingAdapter"})
    return "rewrites"


@pytest.fixture
def engine_options(request):
    """The ingest keywords of one engine: in process, a process pool, or dask."""

    def options(engine):
        if engine == "local":
            return {}
        if engine == "pool":
            return {"workers": 2}
        return {"engine": "dask", "address": request.getfixturevalue("dask_address")}

    return options


def make_sources(root, rng, big=None):
    """Two one-row tables, and ``big`` (a 40-row table planned as pieces) if named."""
    root.mkdir()
    write_table(root / "a0.vals", rng.standard_normal((1, 8)))
    write_table(root / "a1.vals", rng.standard_normal((1, 8)))
    if big:
        write_table(root / big, rng.standard_normal((40, 8)))
        assert (root / big).stat().st_size > 8 * SHARD
    return root


def keys_and_hashes(catalog, snapshot_id):
    return {
        r["key"]: r["sample_hash"]
        for r in catalog.manifest(catalog.snapshot(snapshot_id)).to_pylist()
    }


def changed(path):
    return re.escape(str(path)) + r": changed since it was listed \([a-z/: ]+\); re-run the ingest"


@pytest.mark.parametrize("how", ["replace", "inplace"])
@pytest.mark.parametrize("engine", ENGINES)
def test_a_file_rewritten_while_read_in_pieces_is_never_half_committed(
    catalog_at, tmp_path, rewrites, engine_options, engine, how
):
    rng = np.random.default_rng(5)
    src = make_sources(tmp_path / "src", rng, big="rewrite.vals")
    big = src / "rewrite.vals"
    old = np.loadtxt(big, ndmin=2)
    markers = tmp_path / "markers"
    markers.mkdir()
    opts = dict(
        dataset="d",
        adapter=rewrites,
        adapter_options={"marker_dir": str(markers), "how": how},
        shard_size=SHARD,
        piece_bytes=SHARD,
        snapshot=True,
        **engine_options(engine),
    )
    cat = catalog_at("s")
    # the first piece rewrites the file after its first sample: the run fails, naming it
    with pytest.raises(SourceError, match="^" + changed(big) + "$"):
        ingest([src], store=cat, **opts)
    assert (markers / "rewrite.vals.rewritten").exists()
    assert cat.staged("d") == [] and cat.branches("d").get_versioned("main")[0] is None

    # the same under --on-error skip: the file is skipped whole, the others committed
    write_table(big, old)
    os.unlink(markers / "rewrite.vals.rewritten")
    r = ingest([src], store=cat, on_error="skip", **opts)
    assert [s.path for s in r.files_skipped] == [str(big)]
    assert re.fullmatch(changed(big), r.files_skipped[0].reason), r.files_skipped[0].reason
    assert sorted(keys_and_hashes(cat, r.snapshot_id)) == ["a0.vals/r0000", "a1.vals/r0000"]

    # the re-run reads the new file whole: no piece of the old one comes from the journal
    now = np.loadtxt(big, ndmin=2)
    assert np.allclose(now[:40], new_values(old), rtol=1e-5)
    again = ingest([src], store=cat, on_error="skip", **opts)
    assert again.files_skipped == ()
    assert (again.files_ingested, again.files_reused) == (1, 2)
    assert again.bytes_read == big.stat().st_size
    reference = catalog_at("reference")
    fresh = ingest([src], store=reference, **opts)
    assert keys_and_hashes(cat, again.snapshot_id) == keys_and_hashes(reference, fresh.snapshot_id)
    assert len(keys_and_hashes(cat, again.snapshot_id)) == 2 + len(now)


@pytest.mark.parametrize("how", ["replace", "inplace"])
@pytest.mark.parametrize("engine", ENGINES)
def test_a_whole_file_rewritten_while_read_is_refused(
    catalog_at, tmp_path, rewrites, engine_options, engine, how
):
    """Checked after reading too: the file was whole and unchanged when it was opened."""
    rng = np.random.default_rng(4)
    src = make_sources(tmp_path / "src", rng)
    write_table(src / "rewrite.vals", rng.standard_normal((5, 8)))
    markers = tmp_path / "markers"
    markers.mkdir()
    cat = catalog_at("s")
    r = ingest(
        [src], dataset="d", store=cat, adapter=rewrites, on_error="skip", snapshot=True,
        adapter_options={"marker_dir": str(markers), "how": how}, shard_size=1,
        **engine_options(engine),
    )
    assert (markers / "rewrite.vals.rewritten").exists()
    assert [s.path for s in r.files_skipped] == [str(src / "rewrite.vals")]
    assert re.fullmatch(changed(src / "rewrite.vals"), r.files_skipped[0].reason)
    assert sorted(keys_and_hashes(cat, r.snapshot_id)) == ["a0.vals/r0000", "a1.vals/r0000"]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_file_changed_between_listing_and_reading_is_not_read(
    catalog_at, tmp_path, rewrites, engine_options, engine, monkeypatch
):
    rng = np.random.default_rng(6)
    src = make_sources(tmp_path / "src", rng)
    write_table(src / "b.vals", rng.standard_normal((3, 8)))
    markers = tmp_path / "markers"
    markers.mkdir()
    real_plan = driver_module.plan_tasks

    def plan_then_change(files, *args, **kwargs):
        tasks = real_plan(files, *args, **kwargs)
        write_table(src / "b.vals", rng.standard_normal((5, 8)))  # listed, not yet read
        return tasks

    monkeypatch.setattr(driver_module, "plan_tasks", plan_then_change)
    opts = dict(
        dataset="d",
        adapter=rewrites,
        adapter_options={"marker_dir": str(markers)},
        shard_size=1,
        snapshot=True,
        **engine_options(engine),
    )
    cat = catalog_at("s")
    with pytest.raises(SourceError, match="^" + changed(src / "b.vals") + "$"):
        ingest([src], store=cat, **opts)
    assert cat.staged("d") == []
    r = ingest([src], store=cat, on_error="skip", **opts)
    assert [(s.path, bool(re.fullmatch(changed(s.path), s.reason))) for s in r.files_skipped] == [
        (str(src / "b.vals"), True)
    ]
    assert sorted(keys_and_hashes(cat, r.snapshot_id)) == ["a0.vals/r0000", "a1.vals/r0000"]
    # refused when its task opened it: the adapter never read the changed file
    assert not (markers / "b.vals.opened").exists()
    assert (markers / "a0.vals.opened").exists()


@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_a_listed_file_a_dask_worker_cannot_find_fails_the_run_naming_both(
    catalog_at, tmp_path, rewrites, dask_address, monkeypatch, on_error
):
    """What a worker without the sources' filesystem sees: the run fails, whatever
    ``on_error`` says (no good file is skipped as unreadable), naming worker and file."""
    rng = np.random.default_rng(7)
    src = make_sources(tmp_path / "src", rng)
    write_table(src / "b.vals", rng.standard_normal((3, 8)))
    markers = tmp_path / "markers"
    markers.mkdir()
    real_plan = driver_module.plan_tasks

    def plan_then_hide(files, *args, **kwargs):
        tasks = real_plan(files, *args, **kwargs)
        os.rename(src / "b.vals", tmp_path / "b.vals")  # not there for the workers
        return tasks

    monkeypatch.setattr(driver_module, "plan_tasks", plan_then_hide)
    cat = catalog_at("s")
    with pytest.raises(InvalidInputError) as info:
        ingest(
            [src], dataset="d", store=cat, adapter=rewrites, on_error=on_error, shard_size=1,
            adapter_options={"marker_dir": str(markers)}, snapshot=True, engine="dask",
            address=dask_address,
        )
    message = str(info.value)
    assert re.match(
        rf"dask worker tcp://127\.0\.0\.1:\d+ cannot find {re.escape(str(src / 'b.vals'))}, "
        "a source the driver listed: ",
        message,
    ), message
    assert "\n" not in message
    assert cat.staged("d") == [] and cat.branches("d").get_versioned("main")[0] is None


def test_on_the_local_engine_a_removed_file_is_a_skipped_file(
    catalog_at, tmp_path, rewrites, monkeypatch
):
    rng = np.random.default_rng(8)
    src = make_sources(tmp_path / "src", rng)
    write_table(src / "b.vals", rng.standard_normal((3, 8)))
    markers = tmp_path / "markers"
    markers.mkdir()
    real_plan = driver_module.plan_tasks

    def plan_then_remove(files, *args, **kwargs):
        tasks = real_plan(files, *args, **kwargs)
        os.unlink(src / "b.vals")
        return tasks

    monkeypatch.setattr(driver_module, "plan_tasks", plan_then_remove)
    cat = catalog_at("s")
    r = ingest(
        [src], dataset="d", store=cat, adapter=rewrites, on_error="skip", shard_size=1,
        adapter_options={"marker_dir": str(markers)}, snapshot=True,
    )
    assert [(s.path, s.reason) for s in r.files_skipped] == [
        (
            str(src / "b.vals"),
            f"{src / 'b.vals'}: changed since it was listed (removed: no such file); "
            "re-run the ingest",
        )
    ]
    assert sorted(keys_and_hashes(cat, r.snapshot_id)) == ["a0.vals/r0000", "a1.vals/r0000"]


def test_bad_input_on_a_dask_worker_is_still_a_skipped_file(
    catalog_at, tmp_path, rewrites, dask_address
):
    rng = np.random.default_rng(9)
    src = make_sources(tmp_path / "src", rng)
    (src / "bad.vals").write_text("not a number\n")
    markers = tmp_path / "markers"
    markers.mkdir()
    cat = catalog_at("s")
    r = ingest(
        [src], dataset="d", store=cat, adapter=rewrites, on_error="skip", shard_size=1,
        adapter_options={"marker_dir": str(markers)}, snapshot=True, engine="dask",
        address=dask_address,
    )
    assert [s.path for s in r.files_skipped] == [str(src / "bad.vals")]
    assert "changed since" not in r.files_skipped[0].reason
    assert sorted(keys_and_hashes(cat, r.snapshot_id)) == ["a0.vals/r0000", "a1.vals/r0000"]
