"""Keys, messages and authors print escaped, one line each; ``keys -n`` takes any number.

Found by an audit of the versioning commands: ``diff`` and ``cat`` printed keys as they
are, so a key holding a line break (keys are file names) came out as two lines and one
holding an escape sequence reached the terminal raw (``keys`` escaped them already);
``log`` and ``show`` did the same with a snapshot's message and author; ``diff`` never
said how many samples were relocated, which ``--json`` counts; ``keys -n 2**63`` was an
OverflowError's traceback.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_helpers import cli, tagged_store

from simstore.catalog import Catalog
from simstore.ingest import ingest

ODD = ["new\nline", "esc\x1b[31mred", "back\\slash"]


@pytest.fixture
def store(tmp_path):
    root = str(tmp_path / "store")
    first = tmp_path / "one"
    tagged_store(root, str(first), {name: np.arange(3.0) + i for i, name in enumerate(ODD)})
    for i, name in enumerate(ODD):
        np.save(first / f"{name}.npy", np.arange(3.0) - i - 1)
    ingest([str(first)], dataset="d", store=root, snapshot=True,
           message="two\nlines \x1b[2J", author="a\nb")
    return root


def test_diff_prints_each_key_escaped_on_its_own_line(store):
    out = cli("--store", store, "diff", "d@v1", "d", code=0)
    lines = out.splitlines()
    assert sorted(lines[:-1]) == sorted(["M new\\nline", "M esc\\x1b[31mred",
                                         "M back\\\\slash"])
    assert "\x1b" not in out
    keys = cli("--store", store, "keys", "d", code=0).splitlines()
    assert sorted(k for k in keys) == sorted(line[2:] for line in lines[:-1])
    exact = json.loads(cli("--store", store, "diff", "d@v1", "d", "--json", code=0))
    assert sorted(exact["modified"]) == sorted(ODD)


def test_cat_heads_a_sample_with_its_key_escaped(store):
    out = cli("--store", store, "cat", "d", "new\nline", code=0)
    assert out.splitlines()[0].startswith("new\\nline (")


def test_log_and_show_print_a_message_and_author_on_one_line(store):
    log = cli("--store", store, "log", "d", code=0).splitlines()
    assert len(log) == 2  # one line per snapshot
    assert log[0].endswith("a\\nb: two\\nlines \\x1b[2J")
    show = cli("--store", store, "show", "d", code=0)
    assert "message       two\\nlines \\x1b[2J" in show and "by a\\nb" in show
    assert "\x1b" not in show
    exact = json.loads(cli("--store", store, "show", "d", "--json", code=0))
    assert exact["message"] == "two\nlines \x1b[2J"


def test_diff_says_how_many_samples_were_relocated(tmp_path):
    # the same content stored in another shard: a relocation, counted by --json only
    import pyarrow as pa

    from simstore.hashing import hash_bytes
    from simstore.manifest import ManifestRow, rows_from_list

    root = str(tmp_path / "store")
    cat = Catalog.init(root)
    for i, payload in enumerate([b"first copy", b"second copy"]):
        oid, _ = cat.put_object(payload)
        row = ManifestRow(key="a", sample_hash=hash_bytes(b"the sample"), shard=oid,
                          position=0, size_bytes=10)
        table = rows_from_list([row]).append_column("deleted", pa.array([False]))
        cat.stage("d", changes=table, shards=[oid])
        cat.commit("d", message=f"copy {i}")
        if i == 0:
            cli("--store", root, "tag", "d", "v1", code=0)
    summary = json.loads(cli("--store", root, "diff", "d@v1", "d", "--json", code=0))["summary"]
    assert summary["relocated"] == 1
    assert "0 added, 0 removed, 0 modified, 1 relocated (" in cli(
        "--store", root, "diff", "d@v1", "d", code=0)
    assert "relocated" not in cli("--store", root, "diff", "d@v1", "d@v1", code=0)


@pytest.mark.parametrize("limit", [str(2**63), str(10**20)])
def test_keys_takes_a_limit_past_int64(store, limit):
    out = cli("--store", store, "keys", "d", "-n", limit, code=0)
    assert len(out.splitlines()) == len(ODD)
    doc = json.loads(cli("--store", store, "keys", "d", "-n", limit, "--json", code=0))
    assert doc["truncated"] is False and len(doc["keys"]) == len(ODD)
