"""Out of file descriptors is this process's limit, not a bad source file.

Under ``ulimit -n 14`` an ``ingest --on-error skip`` "skipped" every file as
"unreadable: Too many open files" and exited 0 with nothing staged; without ``skip`` it
was exit 8, the code of a bad source file.
"""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from simstore.errors import SourceError, StorageError
from simstore.ingest import ingest


@pytest.mark.parametrize("on_error", ["skip", "fail"])
def test_a_source_that_cannot_be_opened_for_want_of_descriptors(
    catalog, tmp_path, monkeypatch, on_error
):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("a", "b"):
        np.save(src / f"{name}.npy", np.arange(4.0))
    crowded = str(src / "b.npy")
    real_open = os.open

    def open_(path, *args, **kwargs):
        if os.fspath(path) == crowded:
            raise OSError(errno.EMFILE, "Too many open files", crowded)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    with pytest.raises(StorageError) as err:
        ingest([src], dataset="d", store=catalog, on_error=on_error, snapshot=True, message="m")
    assert not isinstance(err.value, SourceError)
    assert str(err.value).startswith(f"{crowded}: cannot be opened: Too many open files: out "
                                     "of this process's open files (ulimit -n)")
    assert not catalog.staged("d") and catalog.datasets() == []


@pytest.mark.parametrize("kind", ["hdf5", "npz"])
def test_an_adapter_out_of_descriptors_stops_the_run(catalog, tmp_path, monkeypatch, kind):
    # the adapters wrap a library's OSError in their own SourceError ("not a readable
    # HDF5 file: ... errno = 24"): under --on-error skip that file, and every one after
    # it, was skipped as bad
    import zipfile

    import h5py

    src = tmp_path / "src"
    src.mkdir()
    with h5py.File(src / "h1.h5", "w") as f:
        f["x"] = np.arange(4.0)
    np.savez(src / "z1.npz", x=np.arange(4.0))
    if kind == "hdf5":
        def refuse(*args, **kwargs):  # h5py's own text: an errno in the message, none set
            raise OSError("Unable to synchronously open file (unable to open file: name = "
                          "'h1.h5', errno = 24, error message = 'Too many open files')")
        monkeypatch.setattr(h5py, "File", refuse)
    else:
        def refuse(*args, **kwargs):
            raise OSError(errno.EMFILE, "Too many open files")
        monkeypatch.setattr(zipfile, "ZipFile", refuse)
    with pytest.raises(StorageError) as err:
        ingest([src], dataset="d", store=catalog, on_error="skip", snapshot=True, message="m")
    assert not isinstance(err.value, SourceError)
    assert "out of this process's open files (ulimit -n)" in str(err.value)
    assert "\n" not in str(err.value)
    assert not catalog.staged("d") and catalog.datasets() == []


def test_a_file_named_like_a_limit_is_not_one():
    # h5py takes its errno from the first "errno = N" of its message, which names the
    # file: a missing "run errno = 24, v2.h5" read as out of descriptors, and stopped a
    # run that --on-error skip should have finished
    from simstore.errors import exhausted

    missing = OSError("Unable to synchronously open file (unable to open file: name = "
                      "'/x/run errno = 24, v2.h5', errno = 2, error message = 'No such file "
                      "or directory', flags = 0, o_flags = 0)")
    missing.errno = 24
    assert exhausted(missing) is None
    assert exhausted(OSError(errno.EMFILE, "Too many open files")) is not None
    assert exhausted(OSError("Detail: [Errno 24] Too many open files")) is not None
    assert exhausted(SourceError("/x/[Errno 24] Too many open files.h5: bad")) is None
