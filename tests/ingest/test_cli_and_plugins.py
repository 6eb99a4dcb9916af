"""The ``ingest`` and ``stats`` commands, the progress bar, and adapters from other packages."""

import io
import json
import os
import shutil
import time

import numpy as np
import pytest
from click.testing import CliRunner
from simstore.cli import main
from simstore.cli._ingest import ProgressBar

from simstore.ingest import (
    IngestProgress,
    adapter_names,
    ingest,
    load_adapters,
    shard_format_names,
)
from simstore.testing.adapters import add_adapters


def run(store, *args, code=0):
    result = CliRunner().invoke(main, ["--store", store, *args], catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result


def test_cli_ingest_json_summary_and_stats(tmp_path, npz_dir):
    root, arrays = npz_dir
    store = str(tmp_path / "store")
    run(store, "init")
    out = json.loads(
        run(
            store,
            "ingest",
            str(root),
            "--dataset",
            "cfd",
            "--snapshot",
            "-m",
            "first",
            "--json",
            "--compression",
            "none",
        ).output
    )
    for key in (
        "files",
        "samples",
        "bytes_in",
        "bytes_stored",
        "new_bytes",
        "skipped",
        "seconds",
        "engine",
        "snapshot",
    ):
        assert key in out
    assert out["files"] == 6 and out["samples"] == 6 and out["engine"] == "local"
    assert out["new_bytes"] > 0 and out["skipped"] == []
    stats = json.loads(run(store, "stats", "cfd", "--json").output)
    assert stats["snapshot"] == out["snapshot"] and stats["exact"] is True
    assert set(stats) == {"snapshot", "exact", "fields"}  # the keys docs/cli.md lists
    assert all(set(r) == {"field", "component", "count", "nan_count", "inf_count", "mean",
                          "std", "min", "max"} for r in stats["fields"])
    ids = [r for r in stats["fields"] if r["field"] == "ids"]
    assert ids[0]["count"] == 30 and ids[0]["mean"] == pytest.approx(2.0)
    text = run(store, "stats", "cfd").output
    assert "exact" in text and "mask" in text
    assert out["bytes_read"] == out["bytes_in"] > 0
    again = json.loads(run(store, "ingest", str(root), "--dataset", "cfd", "--compression",
                           "none", "--json").output)
    # everything from the journal: no bytes read, so no rate (it counted bytes_in)
    assert again["files_reused"] == 6 and again["bytes_read"] == 0
    assert again["mib_per_s"] == 0 and again["bytes_in"] == out["bytes_in"]
    human = run(store, "ingest", str(root), "--dataset", "cfd", "--compression", "none").output
    assert "reused 6" in human and "nothing new to stage" in human
    # other writer settings re-read the files, but equal samples stage nothing
    other = run(store, "ingest", str(root), "--dataset", "cfd").output
    assert "ingested 6 files" in other and "unchanged 6" in other
    assert "nothing new to stage" in other


def test_cli_bad_file_is_one_line_and_an_exit_code(tmp_path, npz_dir):
    root, _ = npz_dir
    np.savez(root / "nan.npz", u=np.array([[np.nan]], np.float32))
    store = str(tmp_path / "store")
    run(store, "init")
    result = run(store, "ingest", str(root), "--dataset", "d", "--nan", "error", code=8)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "nan.npz" in lines[0] and "field 'u'" in lines[0]
    out = json.loads(
        run(
            store,
            "ingest",
            str(root),
            "--dataset",
            "d",
            "--nan",
            "error",
            "--on-error",
            "skip",
            "--json",
        ).output
    )
    assert [s["path"].endswith("nan.npz") for s in out["skipped"]] == [True]
    run(store, "ingest", str(root), "--dataset", "d", "--shard-size", "lots", code=2)


def test_cli_skipped_file_with_a_newline_in_its_name_is_one_line(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    np.save(root / "ok.npy", np.arange(3.0))
    (root / "bad\nname.npy").write_bytes(b"garbage")
    (root / "tab\tname.npy").write_bytes(b"garbage")
    store = str(tmp_path / "store")
    run(store, "init")
    result = run(store, "ingest", str(root), "--dataset", "d", "--on-error", "skip", "--no-progress")
    skipped = [line for line in result.output.splitlines() if line.startswith("skipped ")]
    assert len(skipped) == 2, result.output
    for line, name in zip(sorted(skipped), ["bad\\nname.npy", "tab\\tname.npy"], strict=True):
        # the name once, escaped, then the reason: not the path a second time
        assert line.count(name) == 1 and line.startswith(f"skipped {root}/{name}: "), line
        assert "not a valid .npy array" in line, line


def test_cli_time_windows_and_adapter_options(tmp_path, h5_dir):
    root, _ = h5_dir
    store = str(tmp_path / "store")
    run(store, "init")
    out = json.loads(
        run(
            store,
            "ingest",
            str(root),
            "--dataset",
            "w",
            "--time-window",
            "6",
            "--stride",
            "6",
            "--format",
            "zarr",
            "--option",
            "time_name=time",
            "--snapshot",
            "--json",
        ).output
    )
    assert out["samples"] == 6


def test_progress_bar_renders_files_samples_rate_and_eta():
    stream = io.StringIO()
    bar = ProgressBar(stream=stream, min_interval_s=0)
    bar(
        IngestProgress(
            files_done=1,
            files_total=4,
            samples=10,
            bytes_done=2 << 20,
            bytes_total=8 << 20,
            elapsed_s=1.0,
        )
    )
    bar.finish()
    text = stream.getvalue()
    assert "files 1/4" in text and "samples 10" in text and "2.0 MiB/s" in text
    assert "ETA 0:00:03" in text and text.endswith("\n")


def test_progress_callback_sees_every_file(catalog, npz_dir):
    root, _ = npz_dir
    seen = []
    ingest([root], dataset="d", store=catalog, progress=seen.append)
    assert [p.files_done for p in seen] == [1, 2, 3, 4, 5, 6]
    assert seen[-1].samples == 6 and seen[-1].bytes_done == seen[-1].bytes_total


def test_an_adapter_from_another_package_is_found_by_entry_point(catalog, tmp_path, monkeypatch):
    add_adapters(monkeypatch, {"xyz": "custom_adapter:XyzAdapter"})
    root = tmp_path / "clouds"
    root.mkdir()
    (root / "a.xyz").write_text("0 0 0\n1 2 3\n")
    (root / "b.xyz").write_text("4 5 6\n")
    r = ingest([root], dataset="clouds", store=catalog, snapshot=True)  # picked by auto
    assert r.samples == 2
    snap = catalog.snapshot(r.snapshot_id)
    assert snap.lineage["ingests"][0]["adapters"] == {"xyz": "1"}
    assert snap.stats["fields"]["points"]["count"] == [3, 3, 3]


def _doc_example(name: str) -> str:
    """The first Python block under ``## Writing an adapter`` in docs/adapters.md."""
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "adapters.md").read_text()
    section = text.split("## Writing an adapter", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_adapter_example_of_the_docs_runs_as_written(tmp_path, monkeypatch):
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "doc_xyz_adapter.py").write_text(_doc_example("XyzAdapter"))
    monkeypatch.syspath_prepend(str(tmp_path / "mod"))
    add_adapters(monkeypatch, {"xyz": "doc_xyz_adapter:XyzAdapter"})
    root = tmp_path / "clouds"
    root.mkdir()
    (root / "a.xyz").write_text("0 0 0\n1 2 3\n")
    (root / "bad.xyz").write_text("1 2\n3\n")
    store = str(tmp_path / "store")
    run(store, "init")
    # as the docs say: one line naming the file and the field, and exit 8
    bad = run(store, "ingest", str(root), "--dataset", "c", "--adapter", "xyz", code=8)
    lines = [line for line in bad.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "bad.xyz: field 'points'" in lines[0]
    (root / "bad.xyz").unlink()
    # an option the adapter does not read is refused (its ``options`` names none)
    refused = run(store, "ingest", str(root), "--dataset", "c", "--adapter", "xyz",
                  "--option", "scale=2", code=2)
    assert "scale" in refused.output
    run(store, "ingest", str(root), "--dataset", "c", "--adapter", "xyz", "--snapshot", "-m", "x")
    shown = json.loads(run(store, "show", "c@main", "--json").output)
    assert {f["name"] for f in shown["schema"]} == {"points", "n"}
    [versions] = shown["software"]  # the example's ``libraries`` are recorded
    assert versions["numpy"] == np.__version__


def test_an_adapter_plugin_that_fails_to_load_is_one_line_naming_it(tmp_path, monkeypatch):
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "broken_adapter.py").write_text("class Broken(:\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mod"))
    add_adapters(monkeypatch, {"broken": "broken_adapter:Broken"})
    src = tmp_path / "src"
    src.mkdir()
    np.savez(src / "a.npz", u=np.zeros(3, np.float32))
    store = str(tmp_path / "store")
    run(store, "init")
    for adapter in ("auto", "broken"):
        result = run(store, "ingest", str(src), "--dataset", "d", "--adapter", adapter, code=2)
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and "Traceback" not in result.output
        assert "adapter plugin 'broken'" in lines[0] and "broken_adapter:Broken" in lines[0]
        assert "SyntaxError" in lines[0]


def test_cli_a_field_that_is_a_group_in_another_file_is_exit_code_8(tmp_path):
    import h5py

    src = tmp_path / "src"
    src.mkdir()
    np.savez(src / "a.npz", fields=np.ones((2, 3), np.float32))
    with h5py.File(src / "b.h5", "w") as f:
        f.create_dataset("fields/density", data=np.zeros((2, 3), np.float32))
    store = str(tmp_path / "store")
    run(store, "init")
    result = run(store, "ingest", str(src), "--dataset", "d", "--format", "zarr",
                 "--shard-size", "1", "--snapshot", code=8)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "b.h5" in lines[0]
    assert "field 'fields/density' lies under field 'fields'" in lines[0]
    from simstore.catalog import Catalog

    assert Catalog.open(store).staged("d") == []


def test_cli_refuses_a_message_without_snapshot_and_sizes_beyond_reason(tmp_path, npz_dir):
    root, _ = npz_dir
    store = str(tmp_path / "store")
    run(store, "init")
    out = run(store, "ingest", str(root), "--dataset", "d", "-m", "first", code=2).output
    assert "-m/--message names a snapshot: it needs --snapshot" in out  # it was dropped
    for size in ("inf", "1e400"):  # a traceback (OverflowError)
        out = run(store, "ingest", str(root), "--dataset", "d", "--shard-size", size,
                  code=2).output
        assert f"invalid size '{size}'" in out
    from simstore.catalog import Catalog

    assert Catalog.open(store).staged("d") == []


def _install(site, dist, adapters, when):
    """A package ``dist`` in folder ``site`` with adapters by entry point, installed at ``when``."""
    info = site / f"{dist}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[simstore.adapters]\n" + "".join(f"{n} = {t}\n" for n, t in adapters.items())
    )
    os.utime(site, (when, when))


def test_installed_plugins_are_scanned_once_until_a_package_comes_or_goes(tmp_path, monkeypatch):
    import simstore.ingest._plugins as plugins

    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    scans = []
    real = plugins._scan
    monkeypatch.setattr(plugins, "_scan", lambda: scans.append(1) or real())
    # the other folders of sys.path (this checkout's, written by the test run) count as
    # settled here; the last step below takes the guard against fresh folders back
    monkeypatch.setattr(plugins, "_RACY_NS", 0)
    hour_ago = time.time() - 3600
    _install(site, "xyz_plugin", {"xyz": "custom_adapter:XyzAdapter"}, hour_ago)
    assert "xyz" in adapter_names()
    assert "xyz" in adapter_names() and "xyz" in load_adapters()
    assert "parquet" in shard_format_names()
    assert len(scans) == 1  # every group from one scan, kept while nothing changes
    _install(site, "abc_plugin", {"abc": "custom_adapter:XyzAdapter"}, hour_ago + 1)
    assert {"abc", "xyz"} <= set(adapter_names())
    assert len(scans) == 2
    shutil.rmtree(site / "xyz_plugin-1.0.dist-info")
    os.utime(site, (hour_ago + 2, hour_ago + 2))
    assert "xyz" not in adapter_names() and "abc" in adapter_names()
    assert len(scans) == 3
    # a folder changed a moment ago may change again within its time's granularity
    monkeypatch.setattr(plugins, "_RACY_NS", 2_000_000_000)
    _install(site, "def_plugin", {"def": "custom_adapter:XyzAdapter"}, time.time())
    assert "def" in adapter_names() and "def" in adapter_names()
    assert len(scans) == 5
