"""Damage is exit 6 wherever it is met, and the store flag's empty value is refused.

A missing or damaged object that a ref or a snapshot names is damage (exit 6, as
``verify`` says), not an unknown name (exit 3) nor a wrong argument (exit 2); an empty
``SIMSTORE_STORE`` is no store, as an empty ``--store`` is not.
"""

from __future__ import annotations

import os

import numpy as np
from click.testing import CliRunner
from simstore.cli import main

from simstore.catalog import Catalog
from simstore.hashing import object_key


def _store(tmp_path):
    store = str(tmp_path / "st")
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        np.savez(src / f"r{i}.npz", u=np.full((4, 4), float(i), np.float32))
    runner = CliRunner()
    assert runner.invoke(main, ["--store", store, "init"]).exit_code == 0
    out = runner.invoke(main, ["--store", store, "ingest", str(src), "--dataset", "d",
                               "--snapshot", "-m", "one", "--no-progress"])
    assert out.exit_code == 0, out.output
    cat = Catalog.open(store)
    return store, cat.snapshot(cat.resolve("d@main"))


def _one_line(result, code, *words):
    assert result.exit_code == code, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_a_missing_manifest_part_is_damage_for_every_command(tmp_path):
    store, snap = _store(tmp_path)
    part = snap.parts[0].id
    os.unlink(os.path.join(store, object_key(part)))
    runner = CliRunner()
    for args in (["pull", "d", "--cache", str(tmp_path / "c")], ["du", "d"], ["cost", "d"],
                 ["gc", "--dry-run"]):
        _one_line(runner.invoke(main, ["--store", store, *args]), 6,
                  f"{object_key(part)} is missing", f"snapshot {snap.id}")


def test_a_missing_snapshot_a_branch_names_is_damage(tmp_path):
    store, snap = _store(tmp_path)
    os.unlink(os.path.join(store, object_key(snap.id)))
    runner = CliRunner()
    for args in (["show", "d"], ["log", "d"], ["ls"], ["tag", "d", "t1"]):
        _one_line(runner.invoke(main, ["--store", store, *args]), 6,
                  f"{object_key(snap.id)} is missing", "branch d@main")
    # an id nobody names is still unknown, not damage
    unknown = "0" * 32
    assert runner.invoke(main, ["--store", store, "show", f"d@{unknown}"]).exit_code == 3


def test_a_damaged_snapshot_is_damage_when_tagged_or_branched(tmp_path):
    store, snap = _store(tmp_path)
    path = os.path.join(store, object_key(snap.id))
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - 2)
        f.write(b"\x00")
    runner = CliRunner()
    for args in (["tag", "d", "t1"], ["branch", "d", "b1"]):
        _one_line(runner.invoke(main, ["--store", store, *args]), 6,
                  f"{object_key(snap.id)} has hash")
    assert Catalog.open(store).tags("d").names() == []


def test_an_empty_store_variable_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["init"], env={"SIMSTORE_STORE": ""})
    _one_line(result, 2, "SIMSTORE_STORE=''", "empty store URL")
    assert os.listdir(tmp_path) == []  # no default store made


def test_a_grace_too_large_names_the_flag(tmp_path):
    store, _ = _store(tmp_path)
    result = CliRunner().invoke(main, ["--store", store, "gc", "--grace", "9" * 400])
    _one_line(result, 2, "--grace", "too large")
