"""Running the command line in tests."""

from __future__ import annotations

import os

import numpy as np
from click.testing import CliRunner
from simstore.cli import main

from simstore.catalog import Catalog
from simstore.ingest import ingest


def cli(*args: str, code: int, env: dict[str, str] | None = None) -> str:
    """Run simstore; a failure must be one ``error:`` line on stderr and nothing on stdout."""
    result = CliRunner().invoke(main, list(args), catch_exceptions=False, env=env)
    assert result.exit_code == code, (result.stdout, result.stderr)
    if code:
        assert result.stdout == "", result.stdout
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        return lines[0]
    return result.stdout


def tagged_store(root: str, src: str, files: dict[str, np.ndarray]) -> None:
    """A store at ``root`` whose dataset ``d`` holds ``files`` (``<name>.npy`` written in
    the folder ``src``), snapshot on ``main`` and tagged ``v1``."""
    Catalog.init(root)
    os.makedirs(src, exist_ok=True)
    for name, values in files.items():
        np.save(os.path.join(src, f"{name}.npy"), values)
    ingest([src], dataset="d", store=root, snapshot=True, message="one")
    cli("--store", root, "tag", "d", "v1", code=0)
