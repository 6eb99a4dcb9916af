"""Bad dataset, branch and tag names are refused, and nothing is written outside the root.

Every name with ``..``, ``/``, a backslash, NUL or another control character, a leading
``.`` or ``-``, ``@`` or a space, or more than 200 characters is refused with
InvalidInputError (exit code 2 on the command line, one line, no traceback) by the
library and the CLI, for datasets, branches and tags alike. The store sits in a box
folder, and after every attempt the box holds nothing outside the store's root; within the
root nothing appears under ``datasets/`` but the valid dataset. A property test checks
that any name ``check_name`` accepts keeps a key inside the root.
"""

from __future__ import annotations

import os

import pytest
import rel_harness as h
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from simstore.cli import main

from simstore.catalog import Catalog
from simstore.catalog._refs import ref_key
from simstore.errors import InvalidInputError
from simstore.ingest import ingest
from simstore.names import check_name
from simstore.storage import LocalStore, check_key

BAD_NAMES = [
    "",
    ".",
    "..",
    "../x",
    "x/..",
    "a/b",
    "/abs",
    "a\\b",
    "a\x00b",
    "a\nb",
    "\t",
    "a\x7fb",
    "a\x1bb",
    ".hidden",
    "-flag",
    "a@b",
    "a b",
    "a..b",
    "x" * 201,
    "../../../../tmp/escape",
    "ü",
    "a:b",
    "*",
    "%2e%2e",
]


@pytest.fixture
def box(tmp_path):
    """A store in a box folder, with one dataset, and its sources outside the box."""
    box = tmp_path / "box"
    root = str(box / "store")
    src = str(tmp_path / "src")
    h.write_sources(src, 0, count=3, seed=1)
    Catalog.init(root)
    ingest([src], dataset="ds", store=root, snapshot=True, message="m")
    return box, root, src


def _assert_contained(box, root):
    assert h.files_outside(str(box), root) == []
    assert sorted(os.listdir(os.path.join(root, "datasets"))) == ["ds"]
    assert sorted(os.listdir(os.path.join(root, "datasets", "ds", "refs", "heads"))) == ["main"]
    assert not os.path.exists(os.path.join(root, "datasets", "ds", "refs", "tags"))


def test_valid_edge_names_work(box):
    _, root, _ = box
    cat = Catalog.open(root)
    sid = cat.resolve("ds")
    for name in ["a", "x" * 200, "v1.0", "A_b-c", "0", "_"]:
        check_name(name)
        cat.tags("ds").create(name, sid)
        assert cat.resolve(f"ds@{name}") == sid
        cat.tags("ds").delete(name)


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_are_refused_by_the_library(box, name):
    boxdir, root, src = box
    cat = Catalog.open(root)
    sid = cat.resolve("ds")
    attempts = [
        lambda: cat.branches(name),
        lambda: cat.tags(name),
        lambda: cat.tags("ds").create(name, sid),
        lambda: cat.branches("ds").create(name, sid),
        lambda: cat.resolve(f"{name}@main"),
        lambda: cat.resolve(f"ds@{name}"),
        lambda: cat.commit(name, message="m"),
        lambda: cat.commit("ds", message="m", branch=name),
        lambda: cat.stage(name, changes=None),  # type: ignore[arg-type]
        lambda: ingest([src], dataset=name, store=root, snapshot=True, message="m"),
        lambda: ingest([src], dataset="ds", store=root, snapshot=True, message="m", branch=name),
    ]
    refused = 0
    for attempt in attempts:
        with pytest.raises(InvalidInputError):
            attempt()
        refused += 1
        _assert_contained(boxdir, root)
    assert refused == len(attempts)


@pytest.mark.parametrize("name", [n for n in BAD_NAMES if n and "\x00" not in n])
def test_bad_names_are_refused_by_the_cli(box, name):
    boxdir, root, src = box
    commands = [
        ["ingest", src, "--dataset", name],
        ["ingest", src, "--dataset", "ds", "--branch", name, "--snapshot"],
        ["tag", "ds", name],
        ["branch", "ds", name],
        ["snapshot", name, "-m", "m"],
        ["snapshot", "ds", "--branch", name, "-m", "m"],
        ["log", f"ds@{name}"],
        ["delete", name, "k", "--snapshot"],
    ]
    if "@" not in name:  # 'a@b' is a valid REF (dataset a, revision b)
        commands.append(["verify", name])
    for command in commands:
        result = CliRunner().invoke(main, ["--store", root, *command])
        assert result.exit_code == InvalidInputError.exit_code, (command, result.output)
        assert "Traceback" not in result.output
        # one line from simstore, or click's usage error for a name that looks like an option
        assert result.output.startswith("error: ") or "Error: No such option" in result.output
        _assert_contained(boxdir, root)


@pytest.mark.parametrize(
    "key", ["../x", "a/../../x", "/etc/passwd", "a//b", "a\\b", "a\x00", ".", "objects/.."]
)
def test_storage_keys_cannot_leave_the_root(tmp_path, key):
    store = LocalStore(str(tmp_path / "box" / "store"))
    with pytest.raises(InvalidInputError):
        check_key(key)
    for call in (
        lambda: store.put(key, b"x"),
        lambda: store.get(key),
        lambda: store.put_if_absent(key, b"x"),
        lambda: store.delete(key),
        lambda: store.compare_and_swap(key, None, b"x"),
    ):
        with pytest.raises(InvalidInputError):
            call()
    assert h.files_outside(str(tmp_path), str(tmp_path / "box" / "store")) == []


@settings(max_examples=400, deadline=None)
@given(st.text(min_size=0, max_size=220))
def test_any_accepted_name_keeps_keys_inside_the_root(name):
    try:
        check_name(name)
    except InvalidInputError:
        return
    root = "/store/root"
    for kind in ("heads", "tags"):
        key = ref_key(name, kind, name)
        path = os.path.normpath(os.path.join(root, key))
        assert path.startswith(root + "/datasets/")
        assert path == os.path.join(root, key)  # nothing to normalise away
        check_key(key)
