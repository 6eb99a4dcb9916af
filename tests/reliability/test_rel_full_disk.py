"""A full disk: a clear error, no corrupt object, a store that still verifies, a re-run.

Three ways, from the most real to the one that always runs:

- a size-limited tmpfs mounted for the test (needs root and mount permission; skipped
  with the reason otherwise), holding the whole store, scratch included, at several
  sizes so the disk fills during shard writing, the journal, staging or the commit;
- every shard format writing to ``/dev/full`` (every write fails with ENOSPC);
- a substitute that always runs: a local store whose writes fail with ENOSPC once a byte
  budget is spent (:class:`QuotaStore`), at many budgets.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import rel_harness as h
from click.testing import CliRunner
from rel_harness import QuotaStore
from simstore.cli import main

from simstore.catalog import Catalog
from simstore.errors import NotFoundError, StorageError
from simstore.hashing import hash_file
from simstore.ingest import ingest


def _big_sources(root, count=12, side=192):
    import numpy as np

    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(5)
    for i in range(count):
        np.savez(
            os.path.join(root, f"r{i:02d}.npz"),
            u=rng.standard_normal((side, side)).astype(np.float32),
        )
    return root


def _corrupt_objects(root):
    bad = []
    for dirpath, _dirs, files in os.walk(os.path.join(root, "objects")):
        for name in files:
            if hash_file(os.path.join(dirpath, name))[0] != name:
                bad.append(name)
    return bad


def _expected(src):
    cat = Catalog.init(f"memory://full-disk-{os.getpid()}-{id(src)}")
    ingest([src], dataset="ds", store=cat, snapshot=True, message="x", compression="none")
    return cat.snapshot(cat.resolve("ds")).content_hash


def _check_after(root, src, expected, error):
    """A clear error, an intact store, and a re-run (with room) that converges."""
    if error is not None:
        assert isinstance(error, StorageError), repr(error)
        assert "no space left on device" in str(error), str(error)
    cat = Catalog.open(root)
    assert h.store_problems(cat) == []
    assert _corrupt_objects(root) == []


@pytest.mark.parametrize("size", ["256k", "768k", "1280k", "1792k", "2304k"])
def test_ingest_on_a_full_filesystem(tmp_path, small_fs, size):
    src = _big_sources(str(tmp_path / "src"))
    expected = _expected(src)
    mnt = small_fs(size)
    root = os.path.join(mnt, "store")
    Catalog.init(root)
    error = None
    try:
        ingest(
            [src],
            dataset="ds",
            store=root,
            snapshot=True,
            message="x",
            compression="none",
            on_error="skip",
        )
    except StorageError as exc:
        error = exc
    _check_after(root, src, expected, error)
    # the command line says so in one line, with the storage exit code
    result = CliRunner().invoke(
        main, ["--store", root, "ingest", src, "--dataset", "cli", "--compression", "none"]
    )
    if result.exit_code != 0:
        assert result.exit_code == StorageError.exit_code, result.output
        assert "no space left on device" in result.output
        assert "Traceback" not in result.output
    small_fs.grow(mnt, "64m")
    ingest([src], dataset="ds", store=root, snapshot=True, message="x", compression="none")
    cat = Catalog.open(root)
    assert cat.snapshot(cat.resolve("ds")).content_hash == expected
    assert h.store_problems(cat) == []


def _write_shard(fmt, path, limit_bytes):
    """Write a shard in this (forked) process under RLIMIT_FSIZE; exit 0 on a clear error."""
    import resource
    import signal
    import sys

    import numpy as np
    from simstore.formats import get_format

    from simstore.sample import Sample

    if limit_bytes is not None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over the limit: EFBIG, not a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    rng = np.random.default_rng(0)
    samples = [
        Sample(f"k{i}", {"u": rng.standard_normal((64, 64)).astype(np.float32)}) for i in range(4)
    ]
    try:
        get_format(fmt).write(samples, path)
    except StorageError as exc:
        text = str(exc)
        ok = path in text and ("no space left on device" in text or "too large" in text)
        sys.exit(0 if ok else 3)
    sys.exit(2)  # no error at all


@pytest.mark.parametrize("fmt", ["parquet", "zarr", "lance"])
def test_shard_formats_fail_clearly_when_the_disk_is_full(tmp_path, forkserver, fmt):
    """On /dev/full where the system has one, else past a file size limit (RLIMIT_FSIZE)."""
    if os.path.exists("/dev/full"):
        path, limit = "/dev/full", None
    else:
        path, limit = str(tmp_path / f"shard.{fmt}"), 16 * 1024
    proc = forkserver.Process(target=_write_shard, args=(fmt, path, limit))
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0, f"exit {proc.exitcode}: 2 = no error, 3 = unclear error"
    if limit is not None:
        assert not os.path.exists(path)  # the partial shard was removed


@pytest.mark.parametrize("share", [0.0, 0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99, 0.999, 1.0])
def test_store_writes_fail_clearly_when_space_runs_out(tmp_path, share):
    """Substitute for a full disk that always runs: writes fail past a share of the need."""
    src = _big_sources(str(tmp_path / "src"))
    expected = _expected(src)
    probe = QuotaStore(str(tmp_path / "probe"), 1 << 40)
    Catalog.init(str(tmp_path / "probe"))
    ingest(
        [src], dataset="ds", store=Catalog(probe), snapshot=True, message="x", compression="none"
    )
    need = (1 << 40) - probe.budget
    budget = int(need * share)
    root = str(tmp_path / "store")
    Catalog.init(root)
    error = None
    try:
        ingest(
            [src],
            dataset="ds",
            store=Catalog(QuotaStore(root, budget)),
            snapshot=True,
            message="x",
            compression="none",
            on_error="skip",
        )
    except StorageError as exc:
        error = exc
    assert (error is None) == (share == 1.0)
    _check_after(root, src, expected, error)
    # the commit alone, out of space (or of a dataset that no staged entry made yet)
    with contextlib.suppress(StorageError, NotFoundError):
        Catalog(QuotaStore(root, budget // 100)).commit("ds", message="late")
    _check_after(root, src, expected, None)
    ingest([src], dataset="ds", store=root, snapshot=True, message="x", compression="none")
    cat = Catalog.open(root)
    assert cat.snapshot(cat.resolve("ds")).content_hash == expected
    assert h.store_problems(cat) == []
