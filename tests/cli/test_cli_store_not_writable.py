"""A store this process may read but not write (a read-only mount, another user's).

Every reading command works; every writing command fails with one line naming what it
could not write and exit 9 (``ReadOnlyError``; the file system's refusal is a
``NotWritableError``, also a ``StorageError``), and the store is left as it was. A tag or
branch that already exists is answered as on a writable store (exit 4, or 0 at the same
snapshot): nothing is written before the ref is read.
"""

from __future__ import annotations

import json
import os

import numpy as np
from click.testing import CliRunner
from permissions import without_write_access
from simstore.cli import main

from simstore.catalog import Catalog
from simstore.ingest import ingest


def _listing(folder: str) -> list[tuple[str, int, int]]:
    out = []
    for root, _, files in os.walk(folder):
        for name in files:
            st = os.stat(os.path.join(root, name))
            out.append((os.path.relpath(os.path.join(root, name), folder), st.st_size,
                        st.st_mtime_ns))
    return sorted(out)


def test_reading_works_and_writing_fails_with_exit_9(open_dir):
    src = os.path.join(open_dir, "src")
    more = os.path.join(open_dir, "more")
    os.makedirs(src)
    os.makedirs(more)
    for i in range(3):
        np.savez(os.path.join(src, f"r{i}.npz"), x=np.full(4, float(i)))
    np.savez(os.path.join(more, "n.npz"), x=np.arange(5.0))
    store = os.path.join(open_dir, "store")
    Catalog.init(store)
    first = ingest([src], dataset="d", store=store, snapshot=True).snapshot_id
    np.savez(os.path.join(src, "r3.npz"), x=np.arange(2.0))
    second = ingest([src], dataset="d", store=store, snapshot=True).snapshot_id
    cat = Catalog.open(store)
    cat.tags("d").create("v1", first)
    cat.branches("d").create("exp", first)
    before = _listing(store)

    def cli(*args: str) -> tuple[int, str]:
        r = CliRunner().invoke(main, ["--store", store, *args])
        return r.exit_code, r.output

    calls = {
        "log": ("log", "d"),
        "show": ("show", "d@v1"),
        "diff": ("diff", "d@v1", "d"),
        "verify": ("verify", "d", "--deep"),
        "tag same": ("tag", "d@v1", "v1"),
        "init": ("init",),
        "tag elsewhere": ("tag", "d", "v1"),
        "branch elsewhere": ("branch", "d", "exp"),
        "tag new": ("tag", "d", "v2"),
        "branch new": ("branch", "d", "dev"),
        "ingest": ("ingest", more, "--dataset", "d", "--snapshot"),
        "delete": ("delete", "d", "r0"),
        "gc": ("gc", "--grace", "0s"),
    }

    def run_all() -> None:
        raise RuntimeError(json.dumps({k: cli(*a) for k, a in calls.items()}))

    kind, text = without_write_access(store, run_all)
    assert kind == "RuntimeError", text
    got = {k: tuple(v) for k, v in json.loads(text).items()}
    for name in ("log", "show", "diff", "verify", "tag same", "init"):
        assert got[name][0] == 0, (name, got[name])
    assert got["init"][1].startswith(f"already initialised {store} "), got["init"]
    for name in ("tag elsewhere", "branch elsewhere"):
        code, out = got[name]
        assert code == 4, (name, out)
        assert out.startswith("error: d: ") and "already exists" in out, (name, out)
    for name in ("tag new", "branch new", "ingest", "delete", "gc"):
        code, out = got[name]
        assert code == 9, (name, out)
        ref = {"tag new": "tag 'v2'", "branch new": "branch 'dev'"}.get(name)
        start = f"error: d: cannot create {ref}: {store}/" if ref else f"error: {store}/"
        assert out.startswith(start), (name, out)
        assert "may read the store but not write it" in out, (name, out)
        assert out.count("\n") == 1, (name, out)
    assert _listing(store) == before  # nothing half-written
    assert dict(Catalog.open(store).tags("d").list()) == {"v1": first}
    assert Catalog.open(store).resolve("d") == second
