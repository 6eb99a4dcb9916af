"""Equal samples give equal shard bytes whichever CPU ingests them.

Shards embed their fields' statistics, so the statistics must round the same way on every
CPU. OpenBLAS picks its kernels at run time by CPU and its kernels round differently; here
a process that forces the oldest x86-64 kernels (``OPENBLAS_CORETYPE=Prescott``, which
any x86-64 CPU runs) ingests next to one that gets this CPU's own. A statistic computed
with a BLAS dot product differed in its last bit between the two, and so did the shards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

_INGEST = r"""
import json, subprocess, sys
from pathlib import Path
import numpy as np
from simstore.stats import summarise_array

source, store = Path(sys.argv[1]), Path(sys.argv[2])
for args in (["init"], ["ingest", "--dataset", "ds", "--format", "zarr", str(source)],
             ["ingest", "--dataset", "pq", str(source)]):
    subprocess.run([sys.executable, "-m", "cli", "--store", str(store), *args], check=True)
shards = {}
for path in sorted((store / "objects").rglob("*")):
    head = path.read_bytes()[:4] if path.is_file() else b""
    if head in (b"PAR1", b"PK\x03\x04"):  # Parquet and Zarr-in-zip shards
        shards[path.name] = head.decode("latin-1")
with np.load(source / "run.npz") as arrays:
    summaries = {name: summarise_array(arrays[name]) for name in sorted(arrays.files)}
print(json.dumps({"shards": shards, "summaries": summaries}, sort_keys=True))
"""


def _ingest_under(coretype: str | None, source: Path, store: Path) -> dict:
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    if coretype is not None:
        env["OPENBLAS_CORETYPE"] = coretype
    out = subprocess.run(
        [sys.executable, "-c", _INGEST, str(source), str(store)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    result: dict = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_shards_and_statistics_are_the_same_with_any_blas_kernel(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    source = tmp_path / "src"
    source.mkdir()
    np.savez(
        source / "run.npz",
        u=(rng.standard_normal(300_001) * 3 + 1e3).astype(np.float32),  # several sub-blocks
        points=rng.standard_normal((50_000, 3)),  # a vector field: per-component moments
        w=rng.standard_normal((64, 64)),
    )
    oldest = _ingest_under("Prescott", source, tmp_path / "a")
    native = _ingest_under(None, source, tmp_path / "b")
    assert sorted(oldest["shards"].values()) == ["PAR1", "PK\x03\x04"]
    assert oldest["shards"] == native["shards"]
    assert oldest["summaries"] == native["summaries"]


_INGEST_IN_PROCESS = r"""
import json, sys
from pathlib import Path
from simstore import stats
from simstore.catalog import Catalog
from simstore.ingest import ingest
from simstore.storage import LocalStore

source, store, kernel = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "kernel"
if not kernel:
    stats._kernel = None  # NumPy alone, as where no C compiler built simstore._moments
assert (stats._kernel is not None) == kernel
cat = Catalog.init(LocalStore(str(store)))
for dataset, fmt in (("ds", "zarr"), ("pq", "parquet")):
    ingest([str(source)], dataset=dataset, store=cat, format=fmt, workers=1, snapshot=True,
           progress=None)
shards = sorted(p.name for p in (store / "objects").rglob("*")
                if p.is_file() and p.read_bytes()[:4] in (b"PAR1", b"PK\x03\x04"))
print(json.dumps({"shards": shards, "stats": cat.snapshot(cat.resolve("ds")).stats}))
"""


def test_shards_are_the_same_with_or_without_the_compiled_statistics(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    source = tmp_path / "src"
    source.mkdir()
    u = (rng.standard_normal(300_001) * 3 + 1e3).astype(np.float32)
    u[7] = -0.0  # a zero bound's sign must not depend on the path
    np.savez(
        source / "run.npz",
        u=u,
        velocity=rng.standard_normal((40_000, 2)).astype(np.float32),
        points=rng.standard_normal((50_000, 3)),
        w=(rng.standard_normal((64, 64)) * 0.0).astype(np.float32),  # -0.0 and +0.0 only
    )
    np.save(source / "neg.npy", -np.abs(rng.standard_normal(1000)).astype(np.float32) * 0.0)
    runs = {}
    for mode in ("kernel", "numpy"):
        out = subprocess.run(
            [sys.executable, "-c", _INGEST_IN_PROCESS, str(source), str(tmp_path / mode), mode],
            capture_output=True, text=True, timeout=300,
        )
        assert out.returncode == 0, out.stderr
        runs[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(runs["kernel"]["shards"]) >= 2
    assert runs["kernel"]["shards"] == runs["numpy"]["shards"]
    assert runs["kernel"]["stats"] == runs["numpy"]["stats"]
