"""A Lance shard opened from a file object reads a temporary copy: never left behind."""

import gc
import subprocess
import sys
import textwrap

import numpy as np
from simstore.formats import LanceFormat

from simstore.sample import Sample


def _copies(folder) -> list:
    return sorted(folder.glob("simstore-lance-*"))


def test_a_reader_never_closed_leaves_no_copy(tmp_path, monkeypatch):
    shard = tmp_path / "s.lance"
    LanceFormat().write([Sample("a", {"x": np.arange(3.0)})], str(shard))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    # in a process that exits with the reader open
    code = textwrap.dedent(f"""
        import io, os
        from simstore.formats import LanceFormat
        reader = LanceFormat().open(io.BytesIO(open({str(shard)!r}, "rb").read()))
        assert reader.keys() == ["a"]
        assert len(os.listdir({str(tmp)!r})) == 1  # the copy, while it is open
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False)
    assert run.returncode == 0, run.stderr
    assert _copies(tmp) == []
    # in this process, once the reader is collected
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    with open(shard, "rb") as f:
        reader = LanceFormat().open(f)
    assert len(_copies(tmp)) == 1
    del reader
    gc.collect()
    assert _copies(tmp) == []
