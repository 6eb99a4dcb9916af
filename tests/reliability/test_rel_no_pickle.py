"""No pickle or other code-executing format is ever read.

Statically: no module of the package calls a deserialiser that runs code (pickle, dill,
cloudpickle, marshal, shelve, joblib, torch.load, pandas.read_pickle, unsafe yaml, eval,
exec), and every ``np.load`` passes ``allow_pickle=False``. Dynamically: inputs whose
pickles would create a marker file if anything unpickled them (an object-dtype .npy, the
same inside stored and compressed .npz, Zarr v2 arrays with a pickle codec, a Parquet
shard with a pickled extension type) are refused with an error naming the file, and the
marker never appears; object arrays handed to a shard writer are refused.
"""

from __future__ import annotations

import ast
import json
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest

from simstore.catalog import Catalog
from simstore.errors import FormatError, InvalidInputError, SimstoreError, SourceError
from simstore.ingest import ingest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = ["simstore", "formats", "loaders", "cli"]
BANNED_MODULES = {
    "pickle",
    "cPickle",
    "_pickle",
    "dill",
    "cloudpickle",
    "marshal",
    "shelve",
    "joblib",
    "jsonpickle",
}
BANNED_CALLS = {
    ("torch", "load"),
    ("pd", "read_pickle"),
    ("pandas", "read_pickle"),
    ("yaml", "load"),
    ("yaml", "unsafe_load"),
    ("numpy", "fromfile"),
}


def _sources():
    # simstore/testing and formats/testing.py are test support: their conformance suites
    # pickle stores, formats and errors on purpose (they must survive DataLoader workers)
    # and read no storage
    for d in PACKAGE_DIRS:
        for path in sorted((ROOT / d).rglob("*.py")):
            if "testing" not in path.relative_to(ROOT).parts and path.stem != "testing":
                yield path


def _violations(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            for name in names:
                if name.split(".")[0] in BANNED_MODULES:
                    out.append(f"{path}:{node.lineno}: imports {name}")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in ("eval", "exec"):
                out.append(f"{path}:{node.lineno}: calls {func.id}")
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                pair = (func.value.id, func.attr)
                if pair in BANNED_CALLS:
                    out.append(f"{path}:{node.lineno}: calls {'.'.join(pair)}")
                if func.value.id in ("np", "numpy") and func.attr == "load":
                    safe = any(
                        k.arg == "allow_pickle"
                        and isinstance(k.value, ast.Constant)
                        and k.value.value is False
                        for k in node.keywords
                    )
                    if not safe:
                        out.append(f"{path}:{node.lineno}: np.load without allow_pickle=False")
    return out


def test_no_code_executing_deserialiser_in_the_package():
    files = list(_sources())
    assert len(files) > 40
    assert [v for f in files for v in _violations(f)] == []


def test_the_scan_catches_what_it_looks_for(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import pickle\nimport numpy as np\nnp.load('x')\ntorch.load('y')\neval('1')\n")
    assert len(_violations(bad)) == 4


class _Evil:
    """Unpickling this writes the marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (
            eval,
            (f"(open({self.marker!r}, 'w').write('pwned'), __import__('numpy').zeros(4))[1]",),
        )


def _npy_with_pickle(path, marker):
    """A .npy whose header says object dtype and whose body is the evil pickle."""
    header = {"descr": "|O", "fortran_order": False, "shape": (1,)}
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        pickle.dump(np.array([_Evil(marker)], dtype=object), f, protocol=3)


def _zarr_v2_with_pickle(path, marker, where):
    os.makedirs(os.path.join(path, "u"))
    with open(os.path.join(path, ".zgroup"), "w") as f:
        json.dump({"zarr_format": 2}, f)
    meta = {
        "zarr_format": 2,
        "shape": [4],
        "chunks": [4],
        "dtype": "<f8",
        "compressor": None,
        "fill_value": 0.0,
        "order": "C",
        "filters": None,
        "dimension_separator": ".",
    }
    if where == "filter":
        meta.update(dtype="|O", filters=[{"id": "pickle", "protocol": 5}], fill_value=0)
    else:
        meta.update(compressor={"id": "pickle", "protocol": 5})
    with open(os.path.join(path, "u", ".zarray"), "w") as f:
        json.dump(meta, f)
    with open(os.path.join(path, "u", "0"), "wb") as f:
        f.write(pickle.dumps(_Evil(marker)))


@pytest.mark.parametrize(
    "case", ["npy", "npz-stored", "npz-compressed", "zarr-filter", "zarr-compressor"]
)
def test_pickled_sources_are_refused_unread(tmp_path, case):
    marker = str(tmp_path / "PWNED")
    src = tmp_path / "src"
    src.mkdir()
    if case == "npy":
        path = src / "evil.npy"
        _npy_with_pickle(path, marker)
    elif case.startswith("npz"):
        member = tmp_path / "u.npy"
        _npy_with_pickle(member, marker)
        path = src / "evil.npz"
        mode = zipfile.ZIP_STORED if case == "npz-stored" else zipfile.ZIP_DEFLATED
        with zipfile.ZipFile(path, "w", compression=mode) as zf:
            zf.write(member, "u.npy")
    else:
        path = src / "evil.zarr"
        _zarr_v2_with_pickle(str(path), marker, case.split("-")[1])
    with pytest.raises(SourceError) as info:
        ingest(
            [str(path)],
            dataset="d",
            store=Catalog.init(f"memory://pk-{case}"),
            snapshot=True,
            message="m",
        )
    assert str(path) in str(info.value)
    assert not os.path.exists(marker), "a pickle was executed"


def test_parquet_shard_with_a_pickled_extension_type_is_not_unpickled(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from simstore.formats import get_format

    marker = str(tmp_path / "PWNED")
    payload = pickle.dumps(_Evil(marker))
    field = pa.field(
        "u",
        pa.int64(),
        metadata={
            b"ARROW:extension:name": b"arrow.py_extension_type",
            b"ARROW:extension:metadata": payload,
        },
    )
    path = str(tmp_path / "evil.parquet")
    pq.write_table(pa.table({"u": pa.array([1, 2])}).cast(pa.schema([field])), path)
    with pytest.raises(FormatError):
        get_format("parquet").open(path)
    pq.read_table(path)  # pyarrow itself leaves the extension unpickled, too
    assert not os.path.exists(marker)


@pytest.mark.parametrize("fmt", ["parquet", "zarr", "lance"])
def test_object_arrays_are_refused_by_every_shard_writer(tmp_path, fmt):
    from simstore.formats import get_format

    from simstore.sample import Sample

    for value in (np.array([1, None], dtype=object), np.array([{"a": 1}], dtype=object)):
        with pytest.raises(InvalidInputError, match="object"):
            get_format(fmt).write([Sample("k", {"x": value})], str(tmp_path / f"s.{fmt}"))


def test_loader_state_and_every_store_object_are_json_or_arrow(tmp_path):
    """What simstore reads back from storage parses as JSON, Parquet, Zarr or Lance only."""
    import rel_harness as h

    root = str(tmp_path / "store")
    src = str(tmp_path / "src")
    h.write_sources(src, 0, seed=2)
    Catalog.init(root)
    ingest([src], dataset="ds", store=root, snapshot=True, message="m")
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as f:
                head = f.read(4)
            assert head[:1] in (b"{", b"[", b"") or head in (b"PAR1", b"PK\x03\x04"), (
                f"{dirpath}/{name} starts with {head!r}"
            )
            assert not head.startswith(b"\x80"), "a pickle in the store"
    with pytest.raises(SimstoreError):
        from simstore.loaders import SimDataset

        SimDataset(root, "ds").load_state_dict({"kind": "pickle"})
