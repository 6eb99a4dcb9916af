"""The command line in a hostile process environment: one line and a documented exit code.

Each case was a traceback or a silent failure: a closed stderr made ``ingest`` exit 1
with no message and nothing committed (the progress bar's ``sys.stderr.isatty()`` on
None); a deleted working folder gave a 45-line ``FileNotFoundError``; a shard this user
may not read stopped ``verify --deep`` with a ``PermissionError``; running out of memory
printed Arrow's or Python's traceback.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from simstore.cli import main

from simstore.catalog import Catalog, _contents
from simstore.hashing import object_key


@pytest.fixture
def src(tmp_path):
    folder = tmp_path / "src"
    folder.mkdir()
    for i in range(3):
        np.savez(folder / f"r{i}.npz", u=np.full((4, 4), float(i), np.float32))
    return folder


def _simstore(*args, cwd=None, stderr=None):
    return subprocess.run([sys.executable, "-m", "simstore", *args], cwd=cwd,
                          stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=300)


def test_ingest_with_stderr_closed_commits(tmp_path, src):
    store = str(tmp_path / "st")
    assert _simstore("--store", store, "init").returncode == 0
    # started with fd 2 closed (``2>&-``), the interpreter sets sys.stderr to None
    command = " ".join(shlex.quote(a) for a in [
        sys.executable, "-m", "simstore", "--store", store, "ingest", str(src), "--dataset",
        "d", "--snapshot", "-m", "m"])
    proc = subprocess.run(["sh", "-c", f"exec {command} 2>&-"], stdout=subprocess.PIPE,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout
    assert Catalog.open(store).snapshot(Catalog.open(store).resolve("d")).message == "m"


def test_ingest_json_with_stdout_closed_commits(tmp_path, src):
    """``--json`` sends the ingest's own prints to stderr: with no stdout (``>&-``) that
    was a traceback before anything was read."""
    store = str(tmp_path / "st")
    assert _simstore("--store", store, "init").returncode == 0
    command = " ".join(shlex.quote(a) for a in [
        sys.executable, "-m", "simstore", "--store", store, "ingest", str(src), "--dataset",
        "d", "--snapshot", "-m", "m", "--json"])
    proc = subprocess.run(["sh", "-c", f"exec {command} >&-"], stderr=subprocess.PIPE,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert Catalog.open(store).snapshot(Catalog.open(store).resolve("d")).message == "m"


def test_a_deleted_working_folder_is_one_line(tmp_path, src):
    gone = tmp_path / "gone"
    gone.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", "import os, sys, runpy; os.rmdir(os.getcwd()); "
         "sys.argv = ['simstore', 'log', 'cfd']; runpy.run_module('simstore', "
         "run_name='__main__')"],
        cwd=gone, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "the working directory no longer exists" in lines[0], err
    assert not gone.exists()


def test_a_shard_this_user_may_not_read_stops_verify_in_one_line(tmp_path, src, monkeypatch):
    store = str(tmp_path / "st")
    runner = CliRunner()
    assert runner.invoke(main, ["--store", store, "init"]).exit_code == 0
    assert runner.invoke(main, ["--store", store, "ingest", str(src), "--dataset", "d",
                                "--snapshot", "-m", "m", "--no-progress"]).exit_code == 0
    cat = Catalog.open(store)
    snap = cat.snapshot(cat.resolve("d"))
    shard = cat.read_part(snap.parts[0], snapshot=snap.id).column("shard")[0].as_py()
    path = os.path.join(store, object_key(shard))
    real_open = open

    def refusing_open(file, *args, **kwargs):  # as root, chmod refuses nothing: refused here
        if os.fspath(file) == path:
            raise PermissionError(13, "Permission denied", path)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(_contents, "open", refusing_open, raising=False)
    result = runner.invoke(main, ["--store", store, "verify", "d", "--deep"])
    assert result.exit_code == 10, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == [f"error: {path}: cannot be read: Permission denied"], lines


def test_out_of_memory_is_one_line(tmp_path, monkeypatch):
    import pyarrow as pa
    from simstore.cli import _commands

    def exhausted(*args, **kwargs):
        raise pa.ArrowMemoryError("malloc of size 67108864 failed")

    monkeypatch.setattr(_commands, "gc", exhausted)
    store = str(tmp_path / "st")
    runner = CliRunner()
    assert runner.invoke(main, ["--store", store, "init"]).exit_code == 0
    result = runner.invoke(main, ["--store", store, "gc"])
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(
        "error: out of memory (malloc of size 67108864 failed)"), lines
