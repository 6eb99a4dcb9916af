"""``simstore cat REF KEY...``: samples by key as text, JSON or an .npz file."""

import json
import os
import stat

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
    assert by_name["p"].split(None, 1)[1] == "scalar float64 1.5"
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
