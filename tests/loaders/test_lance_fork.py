"""Workers are not forked from a process that has used Lance (its runtime is not fork-safe).

An audit saw a worker forked after the main process read a Lance snapshot die of SIGSEGV
in 1 run of 5. Left to the platform's default, the loader now starts its workers from a
fork server (a fresh interpreter that never used Lance) once the process has read or
written Lance files (a caller who asks for fork keeps it: Lance warns).
"""

import subprocess
import sys
import textwrap

import pytest
from loader_helpers import write_npz_sources

from simstore.catalog import Catalog

_SCRIPT = textwrap.dedent("""
    import sys
    from simstore.formats._lance import used_here
    from simstore.loaders import SimDataLoader, SimDataset
    from simstore.loaders._loader import _forks

    store = sys.argv[1]
    ds = SimDataset(store, "d@main", shuffle=False)
    fresh = SimDataLoader(ds, batch_size=4, num_workers=2)
    assert not used_here() and _forks(fresh)  # nothing read yet: the default stays
    expect = sorted(k for b in fresh for k in b["__key__"])
    assert _forks(fresh) and not used_here()  # the workers read it, not this process
    assert len(expect) == 12
    seen = sorted(s["__key__"] for s in ds)  # a pass in this process: Lance used here
    assert seen == expect and used_here()
    loader = SimDataLoader(ds, batch_size=4, num_workers=2)
    got = sorted(k for b in loader for k in b["__key__"])
    assert got == expect, got
    assert loader.multiprocessing_context.get_start_method() == "forkserver"
    asked = SimDataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="spawn")
    assert sorted(k for b in asked for k in b["__key__"]) == expect
    print("ok")
""")


@pytest.mark.multiprocess
def test_a_process_that_used_lance_starts_its_workers_from_a_fork_server(tmp_path):
    import simstore

    src = tmp_path / "src"
    src.mkdir()
    write_npz_sources(str(src), 12, seed=3)
    store = str(tmp_path / "store")
    Catalog.init(store)
    simstore.ingest([str(src)], dataset="d", store=store, format="lance", snapshot=True,
                    message="t", zarr_threshold=1 << 30)
    # a process of its own: this one may have used Lance in other tests
    run = subprocess.run([sys.executable, "-c", _SCRIPT, store], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]
