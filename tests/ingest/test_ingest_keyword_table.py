"""docs/ingest.md's table of ``simstore ingest`` flags and ``simstore.ingest()`` keywords.

The doc said ``ingest()`` "takes the CLI options as keywords", but ``piece_size=`` is
refused (the keyword is ``piece_bytes``), ``--option`` is ``adapter_options`` and
``--no-resume`` is ``resume=False``: the table names each flag's keyword, and this checks
it against the command and the function.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import click
import pytest
from simstore.cli._ingest import ingest_cmd

from simstore.errors import InvalidInputError
from simstore.ingest import IngestConfig, ingest

DOC = Path(__file__).resolve().parents[2] / "docs" / "ingest.md"
HEADER = "| `simstore ingest` | `simstore.ingest()` |"


def _rows() -> list[tuple[str, str]]:
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = lines.index(HEADER) + 2  # past the header and its |---| line
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        left, right = re.split(r"(?<!\\)\|", line.strip())[1:3]
        rows.append((left, right))
    return rows


def test_every_flag_of_the_command_has_a_row():
    flags = {f for left, _ in _rows() for f in re.findall(r"(?<![\w-])--?[a-z][a-z-]*", left)}
    wanted = set()
    for param in ingest_cmd.params:
        if isinstance(param, click.Option):
            wanted.update(param.opts, param.secondary_opts)
    assert wanted <= flags, sorted(wanted - flags)
    assert any("SOURCE..." in left for left, _ in _rows())


def test_every_keyword_in_the_table_is_accepted_and_every_field_is_named():
    fields = {f.name for f in dataclasses.fields(IngestConfig)}
    params = set(inspect.signature(ingest).parameters) - {"options"}
    named = {k for _, right in _rows() for k in re.findall(r"`(\w+)=", right)}
    assert named and named <= fields | params, sorted(named - fields - params)
    text = DOC.read_text(encoding="utf-8")
    assert all(f"`{name}`" in text or f"`{name}=" in text for name in fields), sorted(
        name for name in fields if f"`{name}`" not in text and f"`{name}=" not in text)


@pytest.mark.parametrize(("flag", "keyword"), [
    ("--piece-size", "piece_bytes"),
    ("--option", "adapter_options"),
    ("--no-resume", "resume"),
])
def test_the_keywords_that_differ_from_their_flags(flag, keyword):
    row = [right for left, right in _rows() if f"`{flag} " in left or f"`{flag}`" in left]
    assert len(row) == 1 and f"`{keyword}=" in row[0], row
    wrong = flag.lstrip("-").replace("-", "_")
    with pytest.raises(InvalidInputError, match=f"unexpected keyword argument '{wrong}'"):
        ingest([], dataset="d", store="memory://unused", **{wrong: 1})


def test_the_typed_keywords_of_ingest_are_every_config_field():
    """``IngestOptions`` types ``ingest(**options)`` for strict callers: a field missing
    from it is a keyword that works but fails their type check."""
    import dataclasses

    from simstore.ingest._config import IngestConfig, IngestOptions

    assert set(IngestOptions.__annotations__) == {f.name for f in dataclasses.fields(IngestConfig)}


def test_ingest_without_snapshot_refuses_a_branch_the_dataset_lacks(tmp_path):
    """A staged run dedups against ``branch`` and a later snapshot commits onto it: a
    mistyped name is refused before any file is read, as with ``snapshot=True``."""
    import numpy as np
    import pytest

    from simstore.catalog import Catalog
    from simstore.errors import NotFoundError
    from simstore.ingest import ingest

    src = tmp_path / "src"
    src.mkdir()
    np.savez(src / "a.npz", u=np.zeros(4, np.float32))
    store = str(tmp_path / "store")
    Catalog.init(store)
    ingest([str(src)], dataset="d", store=store, snapshot=True)
    with pytest.raises(NotFoundError, match=r"^dataset 'd' has no branch 'mian' \(branches: "
                                            r"main\); create it at a snapshot first"):
        ingest([str(src)], dataset="d", store=store, branch="mian")
    assert Catalog.open(store).staged("d") == []
    ingest([str(src)], dataset="new", store=store, branch="dev")  # no branches yet: passes


def test_simstore_ingest_shows_the_functions_signature_whichever_spelling():
    # importing the package simstore.ingest rebinds simstore.ingest to a callable module,
    # whose own __call__ takes (sources, **kwargs): help() and editors showed that
    import simstore
    import simstore.ingest
    from simstore.ingest import _driver

    want = inspect.signature(_driver.ingest)
    assert inspect.signature(simstore.ingest) == want
    assert {"dataset", "store", "config", "progress"} <= set(want.parameters)
