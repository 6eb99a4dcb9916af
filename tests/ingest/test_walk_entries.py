"""What a walk meets besides files: broken links, pipes, folders named like files.

Each broken entry gets one line naming it and exit code 8 (``SourceError``), or is
skipped with that reason under ``--on-error skip``; none is opened (a pipe would block).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import source_files as sf

from simstore.catalog import Catalog
from simstore.ingest import ingest


def dangling(folder):
    os.symlink("/nonexistent/run.npz", folder / "dangling.npz")
    return "dangling.npz", "a dangling symbolic link (to /nonexistent/run.npz"


def loop(folder):
    os.symlink("loop.h5", folder / "loop.h5")
    return "loop.h5", "a symbolic link loop"


def fifo(folder):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes here")
    os.mkfifo(folder / "pipe.npz")
    return "pipe.npz", "a named pipe, not a regular file or directory"


BROKEN = [dangling, loop, fifo]


def simstore(store, *args):
    """The command line in a child process, bounded: a pipe opened for reading blocks."""
    return subprocess.run(
        [sys.executable, "-m", "simstore.cli", "--store", str(store), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    np.savez(root / "good.npz", x=np.arange(3.0))
    Catalog.init(str(tmp_path / "store"))
    return root


@pytest.mark.parametrize("make", BROKEN, ids=lambda f: f.__name__)
def test_a_broken_entry_in_a_walked_folder_is_skipped_with_its_reason(tmp_path, folder, make):
    name, why = make(folder)
    os.symlink("/nonexistent/notes.txt", folder / "notes.txt")  # no adapter's: ignored
    out = simstore(
        tmp_path / "store", "ingest", str(folder), "--dataset", "d", "--on-error", "skip", "--json"
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["files_ingested"] == 1  # good.npz
    [skipped] = summary["skipped"]
    assert skipped["path"] == str(folder / name)
    assert skipped["reason"].startswith(f"{folder / name}: {why}")
    assert summary["ignored"] == [str(folder / "notes.txt")]


@pytest.mark.parametrize("make", BROKEN, ids=lambda f: f.__name__)
@pytest.mark.parametrize("named", [False, True], ids=["walked", "named"])
def test_a_broken_entry_fails_the_ingest_with_one_line_naming_it(tmp_path, folder, make, named):
    name, why = make(folder)
    source = folder / name if named else folder
    out = simstore(tmp_path / "store", "ingest", str(source), "--dataset", "d")
    assert out.returncode == 8, out.stderr
    assert "Traceback" not in out.stderr
    assert out.stderr.startswith(f"error: {folder / name}: {why}")
    assert out.stderr.count("\n") == 1


def test_a_folder_named_like_a_source_file_is_walked(catalog, tmp_path):
    root = tmp_path / "runs"
    (root / "case.h5").mkdir(parents=True)
    np.savez(root / "case.h5" / "p.npz", x=np.arange(3.0))
    sf.write_zarr_group(root / "grid.nc")  # a Zarr group, whatever its name says
    r = ingest([root], dataset="d", store=catalog, snapshot=True)
    snap = catalog.snapshot(r.snapshot_id)
    assert sorted(catalog.manifest(snap).column("key").to_pylist()) == ["case.h5/p", "grid.nc"]
    r = ingest([root / "case.h5"], dataset="e", store=catalog, snapshot=True)
    assert catalog.manifest(catalog.snapshot(r.snapshot_id)).column("key").to_pylist() == ["p"]


@pytest.mark.parametrize("url", ["s3://bucket/runs/a.npz", "gs://b/runs", "https://host/a.h5"])
def test_a_url_source_is_refused_with_what_to_do(tmp_path, folder, url):
    out = simstore(tmp_path / "store", "ingest", url, "--dataset", "d")
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert out.stderr.startswith(f"error: {url}: sources are files on a filesystem, not URLs")
    assert "mount" in out.stderr
    assert out.stderr.count("\n") == 1
    assert Catalog.open(str(tmp_path / "store")).datasets() == []


def test_a_folder_whose_path_looks_like_a_url_is_still_read(catalog, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s3:" / "bucket").mkdir(parents=True)
    np.savez(tmp_path / "s3:" / "bucket" / "a.npz", x=np.arange(4.0))
    r = ingest(["s3://bucket"], dataset="d", store=catalog, snapshot=True)
    snap = catalog.snapshot(r.snapshot_id)
    assert catalog.manifest(snap).column("key").to_pylist() == ["a"]
