"""``simstore cat REF KEY...``: samples by key as text, JSON or an .npz file."""

import json
import os
import stat
import zipfile

import numpy as np
import pytest
from click.testing import CliRunner
from simstore.cli import main

import simstore
from simstore.catalog import Catalog


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    rng = np.random.default_rng(1)
    u = {}
    for i in range(3):
        u[f"r{i}"] = rng.standard_normal((6, 7)).astype(np.float32)
        np.savez(root / f"r{i}.npz", u=u[f"r{i}"], n=np.arange(i + 1), p=np.float64(i + 0.5))
    path = str(tmp_path_factory.mktemp("store") / "s")
    Catalog.init(path)
    simstore.ingest([str(root)], dataset="d", store=path, snapshot=True, message="t")
    return path, u


def _run(store, *args):
    return CliRunner().invoke(main, ["--store", store, "cat", *args])


def test_text_names_each_field_with_its_values_or_summary(store):
    path, u = store
    res = _run(path, "d", "r1")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].startswith("r1 (d@")
    by_name = {line.split()[0]: line for line in lines[1:]}
    assert by_name["n"].split(None, 1)[1] == "tensor int64 (2,) [0, 1]"
    # np.savez stores a 0-d array: a tensor of rank 0, not a scalar parameter
    assert by_name["p"].split(None, 1)[1] == "tensor float64 () [1.5]"
    assert by_name["u"].split(None, 1)[1] == (
        f"tensor float32 (6, 7) min {u['r1'].min():.6g} max {u['r1'].max():.6g} "
        f"mean {u['r1'].astype(np.float64).mean():.6g}"
    )


def test_json_and_field_projection(store):
    path, u = store
    res = _run(path, "d", "r2", "r0", "--fields", "u", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert [s["key"] for s in doc["samples"]] == ["r2", "r0"]
    d = doc["samples"][0]["fields"]
    assert list(d) == ["u"]
    assert d["u"]["shape"] == [6, 7] and d["u"]["dtype"] == "float32"
    assert d["u"]["min"] == pytest.approx(float(u["r2"].min()))
    assert d["u"]["nan_count"] == 0
    assert doc["snapshot"] == Catalog.open(path).resolve("d")


def test_out_writes_the_values(store, tmp_path):
    path, u = store
    one = tmp_path / "one.npz"
    assert _run(path, "d", "r1", "--out", str(one)).exit_code == 0
    with np.load(one) as z:
        assert sorted(z.files) == ["n", "p", "u"]
        np.testing.assert_array_equal(z["u"], u["r1"])
        assert z["p"].item() == 1.5
    two = tmp_path / "two.npz"
    assert _run(path, "d", "r0", "r2", "--out", str(two)).exit_code == 0
    with np.load(two) as z:
        assert sorted(z.files) == ["r0/n", "r0/p", "r0/u", "r2/n", "r2/p", "r2/u"]
        np.testing.assert_array_equal(z["r2/u"], u["r2"])
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_bad_input_is_one_line_and_writes_nothing(store, tmp_path):
    path, _ = store
    out = tmp_path / "x.npz"
    missing = _run(path, "d", "r0", "nope", "--out", str(out))
    assert missing.exit_code == 3
    assert missing.output.strip().endswith("has no sample 'nope'")
    assert len(missing.output.strip().splitlines()) == 1
    assert not out.exists()
    suffix = _run(path, "d", "r0", "--out", str(tmp_path / "x.txt"))
    assert suffix.exit_code == 2 and "must end in .npz" in suffix.output
    empty = _run(path, "d", "r0", "--fields", "u,")
    assert empty.exit_code == 2 and "an empty field name" in empty.output
    unknown = _run(path, "d", "r0", "--fields", "w")
    assert unknown.exit_code == 2 and "no field 'w'" in unknown.output
    no_key = _run(path, "d")
    assert no_key.exit_code == 2
    no_dataset = _run(path, "e", "r0")
    assert no_dataset.exit_code == 3


def test_out_entries_never_collide_and_the_file_takes_the_umask(tmp_path):
    root = tmp_path / "src"
    (root / "a").mkdir(parents=True)
    np.savez(root / "a.npz", **{"b/c": np.ones(2)})
    np.savez(root / "a" / "b.npz", c=np.zeros(2))
    path = str(tmp_path / "s")
    Catalog.init(path)
    simstore.ingest([str(root)], dataset="d", store=path, snapshot=True, message="t")
    out = tmp_path / "o.npz"
    clash = _run(path, "d", "a", "a/b", "--out", str(out))
    assert clash.exit_code == 2, clash.output
    assert "entry 'a/b/c' would hold both field 'b/c' of 'a' and field 'c' of 'a/b'" \
        in clash.output
    assert not out.exists()
    again = _run(path, "d", "a", "a", "--out", str(out))  # a key twice: one sample
    assert again.exit_code == 0, again.output
    with np.load(out) as z:
        assert z.files == ["b/c"]
    old = os.umask(0o022)
    try:
        assert _run(path, "d", "a/b", "--out", str(out)).exit_code == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o644


@pytest.fixture(scope="module")
def many_parts(tmp_path_factory):
    """Dataset ``m`` of 300 keys ``a/000``..``c/099`` over many small manifest parts."""
    root = tmp_path_factory.mktemp("keys-src")
    for group in "abc":
        (root / group).mkdir()
        for i in range(100):
            np.savez(root / group / f"{i:03d}.npz", x=np.full(2, i))
    path = str(tmp_path_factory.mktemp("keys-store") / "s")
    cat = Catalog.init(path)
    cat.target_rows = 16
    simstore.ingest([str(root)], dataset="m", store=cat, snapshot=True, message="t")
    return path


def test_keys_lists_in_key_order_with_prefix_and_limit(many_parts):
    every = [f"{g}/{i:03d}" for g in "abc" for i in range(100)]
    res = _run_keys(many_parts, "m")
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == every
    b5 = _run_keys(many_parts, "m", "--prefix", "b/05")
    assert b5.output.splitlines() == [f"b/05{i}" for i in range(10)]
    doc = json.loads(_run_keys(many_parts, "m", "--prefix", "c/", "-n", "3", "--json").output)
    assert [k["key"] for k in doc["keys"]] == ["c/000", "c/001", "c/002"]
    assert doc["truncated"] is True and doc["prefix"] == "c/"
    assert all(k["size_bytes"] == 16 for k in doc["keys"])
    exact = json.loads(_run_keys(many_parts, "m", "--prefix", "b/05", "-n", "10", "--json")
                       .output)
    assert len(exact["keys"]) == 10 and exact["truncated"] is False
    assert _run_keys(many_parts, "m", "--prefix", "d").output == ""
    assert _run_keys(many_parts, "m", "-n", "-1").exit_code == 2


def test_keys_reads_only_the_parts_the_prefix_can_be_in(many_parts):
    cat = Catalog.open(many_parts)
    snap = cat.snapshot(cat.resolve("m"))
    assert len(snap.parts) >= 6
    read = []
    original = cat.read_part

    def counting(part, **kw):
        read.append(part.id)
        return original(part, **kw)

    cat.read_part = counting
    got = [k for t in cat.iter_rows(snap, prefix="b/05") for k in t.column("key").to_pylist()]
    assert got == [f"b/05{i}" for i in range(10)]
    holding = [p.id for p in snap.parts if p.last_key >= "b/050" and p.first_key <= "b/059"]
    assert read == holding


def _run_keys(store, *args):
    return CliRunner().invoke(main, ["--store", store, "keys", *args])


def test_a_prefix_that_is_not_utf8_is_one_line(many_parts):
    # a shell passes the bytes; Python gives them as surrogates (0xff -> U+DCFF)
    for prefix in ("a/0\udcff", "a\udcff"):
        res = _run_keys(many_parts, "m", "--prefix", prefix)
        assert res.exit_code == 2, res.output
        assert res.output.strip() == (
            f"error: key prefix {prefix.encode('utf-8', 'surrogateescape')!r} is not UTF-8 "
            "text (keys are)"
        )


def test_scalars_tensors_of_rank_0_and_absent_fields_are_told_apart(tmp_path):
    import h5py

    root = tmp_path / "src"
    root.mkdir()
    with h5py.File(root / "run.h5", "w") as f:
        f["u"] = np.arange(4.0)
        f.attrs["re"] = 250.0  # an attribute: a scalar parameter
    np.savez(root / "z.npz", p=np.float64(0.5))  # a 0-d array: a tensor of rank 0
    path = str(tmp_path / "s")
    Catalog.init(path)
    simstore.ingest([str(root)], dataset="d", store=path, snapshot=True, message="t",
                    allow_schema_change=True)
    doc = json.loads(_run(path, "d", "run.h5", "z", "--json").output)
    run, z = doc["samples"]
    assert run["fields"]["re"] == {"kind": "scalar", "dtype": "float64", "value": 250.0}
    assert z["fields"]["p"] == {"kind": "tensor", "dtype": "float64", "shape": [],
                                "values": [0.5]}
    assert run["absent"] == ["p"] and z["absent"] == ["re", "u"]
    text = _run(path, "d", "z", "--fields", "u,p").output.splitlines()
    assert text[1:] == ["  p  tensor float64 () [0.5]", "  u  absent"]


@pytest.mark.parametrize("name", ["file", "allow_pickle"])
def test_out_writes_a_field_named_like_a_savez_parameter(tmp_path, name):
    # np.savez(f, **arrays) took a field "file" for its own argument (a TypeError
    # traceback) and one named "allow_pickle" for its flag (an empty .npz, exit 0)
    root = tmp_path / "src"
    root.mkdir()
    arrays = {"x": np.arange(3), name: np.ones(1)}
    with zipfile.ZipFile(root / "a.npz", "w") as z:  # np.savez cannot name these either
        for entry, value in arrays.items():
            with z.open(f"{entry}.npy", "w") as member:
                np.lib.format.write_array(member, value)
    path = str(tmp_path / "s")
    Catalog.init(path)
    simstore.ingest([str(root)], dataset="d", store=path, snapshot=True, message="t")
    out = tmp_path / "o.npz"
    res = _run(path, "d", "a", "--out", str(out))
    assert res.exit_code == 0, res.output
    with np.load(out, allow_pickle=False) as z:
        assert sorted(z.files) == sorted([name, "x"])
        assert z[name].tolist() == [1.0]
        assert z["x"].tolist() == [0, 1, 2]
    only = tmp_path / "only.npz"
    res = _run(path, "d", "a", "--fields", name, "--out", str(only))
    assert res.exit_code == 0, res.output
    with np.load(only, allow_pickle=False) as z:
        assert z.files == [name]


def _listed_keys(tmp_path, names):
    """``keys``' text lines and ``--json`` keys of a snapshot of one .npy per name."""
    root = tmp_path / "src"
    root.mkdir()
    for name in names:
        np.save(root / f"{name}.npy", np.arange(2.0))
    path = str(tmp_path / "s")
    Catalog.init(path)
    simstore.ingest([str(root)], dataset="d", store=path, snapshot=True, message="t")
    res = _run_keys(path, "d")
    assert res.exit_code == 0, res.output
    exact = json.loads(_run_keys(path, "d", "--json").output)
    return res.output.splitlines(), [r["key"] for r in exact["keys"]]


def test_keys_are_one_per_line_whatever_they_hold(tmp_path):
    # a file named with a newline gives a key with a newline (the key is the name): the
    # text listing escapes it, as errors do, and --json gives it exactly
    text, exact = _listed_keys(tmp_path, ("new\nline", "tab\tbed", "plain"))
    assert text == ["new\\nline", "plain", "tab\\tbed"]
    assert exact == ["new\nline", "plain", "tab\tbed"]


def test_keys_that_differ_never_print_alike(tmp_path):
    # a key of a backslash and an "n" against one with a newline: the listing doubles the
    # backslash, as an escaped text does, so each key prints as itself
    text, exact = _listed_keys(tmp_path, ("a\nb", "a\\nb", "back\\slash"))
    assert text == ["a\\nb", "a\\\\nb", "back\\\\slash"]
    assert len(set(text)) == 3
    assert exact == ["a\nb", "a\\nb", "back\\slash"]
