"""`import simstore` keeps Arrow's default allocator from committing whole arenas.

pyarrow's default pool (mimalloc) commits its arenas eagerly; where transparent huge
pages are on, a new process's first Parquet read then faults in zeroed 2 MiB pages. Each
case runs in a new process, since the setting is read when pyarrow loads.
"""

import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

VAR = "MIMALLOC_ARENA_EAGER_COMMIT"

PROBE = r"""
import os, sys
FIRST = sys.argv[2]
if FIRST == "pyarrow":
    import pyarrow
import simstore
import pyarrow.parquet as pq
pq.ParquetFile(sys.argv[1]).read(use_threads=False)
huge = None
if os.path.exists("/proc/self/smaps_rollup"):
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("AnonHugePages:"):
                huge = int(line.split()[1])
print(os.environ.get("MIMALLOC_ARENA_EAGER_COMMIT"), huge)
"""


def _probe(path, first="simstore", **env):
    environ = {k: v for k, v in os.environ.items() if k != VAR}
    environ.update(env)
    out = subprocess.run([sys.executable, "-c", PROBE, str(path), first], env=environ,
                         capture_output=True, text=True, check=True)
    value, huge = out.stdout.split()
    return value, (None if huge == "None" else int(huge))


@pytest.fixture
def part(tmp_path):
    path = tmp_path / "part.parquet"
    table = pa.table({"key": [f"sample-{i:08d}" for i in range(20_000)],
                      "position": list(range(20_000))})
    pq.write_table(table, path, compression="zstd")
    return path


def _thp_on():
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            text = f.read()
    except OSError:
        return False
    return "[always]" in text or "[madvise]" in text


def test_import_sets_lazy_commit_and_no_huge_pages_fault_in(part):
    value, huge = _probe(part)
    assert value == "0"
    if huge is not None:
        assert huge == 0


def test_a_value_the_user_set_is_kept(part):
    value, huge = _probe(part, **{VAR: "1"})
    assert value == "1"
    if huge is not None and _thp_on() and pa.default_memory_pool().backend_name == "mimalloc":
        # the reason for the setting: eager commit faults in huge pages here
        assert huge > 0


def test_nothing_is_set_once_pyarrow_is_loaded(part):
    # too late to matter, so the environment (which child processes inherit) is left alone
    value, _huge = _probe(part, first="pyarrow")
    assert value == "None"
