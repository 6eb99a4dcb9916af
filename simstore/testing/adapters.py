"""Adapters a test registers as if an installed package declared their entry points.

``simstore.ingest`` finds adapters through the ``simstore.adapters`` entry-point group;
a test that brings its own adapter puts it into that group for the test's duration, on
the driver side (a pool or dask task gets the adapter pickled, so workers need only to
import its module).
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import EntryPoint
from typing import Any

import pytest

__all__ = ["adapters_script", "add_adapters", "install_adapters"]


def add_adapters(monkeypatch: pytest.MonkeyPatch, adapters: Mapping[str, Any]) -> None:
    """Make ``simstore.ingest`` find ``adapters`` too, by name, for one test.

    Each value is an entry point's ``"module:Class"`` text, or the adapter class itself.
    """
    import simstore.ingest as ingest_module

    monkeypatch.setattr(ingest_module, "entry_points",
                        _with_adapters(ingest_module.entry_points, adapters))


def install_adapters(adapters: Mapping[str, Any]) -> None:
    """:func:`add_adapters` for the rest of a process (a script a test runs)."""
    import simstore.ingest as ingest_module

    ingest_module.entry_points = _with_adapters(
        ingest_module.entry_points, adapters)


def adapters_script(adapters: Mapping[str, str], *paths: str) -> str:
    """The head of a script a test runs in a process of its own: Python source.

    It puts ``paths`` first on ``sys.path`` and installs ``adapters``
    (:func:`install_adapters`).
    """
    return (
        "import sys\n"
        f"sys.path[:0] = {list(paths)!r}\n"
        "from simstore.testing.adapters import install_adapters\n"
        f"install_adapters({dict(adapters)!r})\n"
    )


def _with_adapters(real: Any, adapters: Mapping[str, Any]) -> Any:
    import simstore.ingest as ingest_module

    def entry_points(group: str) -> list[Any]:
        eps = list(real(group=group))
        if group == ingest_module.ADAPTER_GROUP:
            for name, target in adapters.items():
                eps.append(EntryPoint(name, target, group) if isinstance(target, str)
                           else _Loaded(name, target))
        return eps

    return entry_points


class _Loaded:
    """An entry point whose target is already loaded."""

    def __init__(self, name: str, target: Any) -> None:
        self.name, self._target = name, target

    def load(self) -> Any:
        return self._target
