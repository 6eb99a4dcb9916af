"""Blosc chunks leave the process's default multiprocessing start method alone.

numcodecs makes Blosc's lock with ``multiprocessing.Lock()`` on first use, which fixes
the default start method: a pipeline that ingested (or a training script that read) Blosc
chunks could no longer call ``multiprocessing.set_start_method``. Each case runs in a
fresh interpreter, whose start method is not yet set.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CASES = {
    "ingest": """
        simstore.ingest([src], dataset="d", store=store, format="zarr", snapshot=True)
    """,
    "read": """
        subprocess.run([sys.executable, "-c", f"import numpy as np, simstore; "
                        f"simstore.ingest([{src!r}], dataset='d', store={store!r}, "
                        f"format='zarr', snapshot=True)"], check=True)
        from simstore.loaders import SimDataset
        assert len(list(SimDataset(store, "d"))) == 2
    """,
    "zarr source": """
        import zarr
        from numcodecs import Blosc
        g = os.path.join(tmp, "g.zarr")
        subprocess.run([sys.executable, "-c", f"import zarr, numpy as np; "
                        f"from numcodecs import Blosc; "
                        f"a = zarr.open_group({g!r}, mode='w', zarr_format=2)"
                        f".create_array('u', shape=(64,), chunks=(16,), dtype='f4', "
                        f"compressors=Blosc()); a[:] = np.arange(64)"], check=True)
        simstore.ingest([g], dataset="z", store=store, snapshot=True)
    """,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_blosc_chunks_leave_the_start_method_unset(tmp_path, case):
    script = textwrap.dedent("""
        import multiprocessing, os, subprocess, sys
        import numpy as np
        import simstore
        from simstore.catalog import Catalog
        tmp = sys.argv[1]
        src = os.path.join(tmp, "src")
        os.makedirs(src)
        for i in range(2):
            np.savez(os.path.join(src, f"r{i}.npz"), x=np.linspace(0, 1, 1 << 16) + i)
        store = os.path.join(tmp, "store")
        Catalog.init(store)
    """) + textwrap.dedent(CASES[case]) + textwrap.dedent("""
        from numcodecs import blosc
        assert getattr(blosc, "_MUTEX_IS_INIT", True), "no Blosc chunk was coded"
        print(multiprocessing.get_start_method(allow_none=True))
        multiprocessing.set_start_method("spawn")
    """)
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "None"
