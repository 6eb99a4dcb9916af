"""Fields and the groups their names make: a field cannot also be a group of fields.

``a/b`` lies under ``a``. No shard can hold both (a Zarr shard stores ``a`` as the array
at ``<position>/a`` and ``a/b`` inside a group there), whether the two come in one
sample, one file or two files: ingest refuses the second, naming both.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

__all__ = ["FieldGroups", "group_clash", "group_clash_message"]


def group_clash(name: str, known: Collection[str]) -> str | None:
    """A field of ``known`` that ``name`` lies under or that lies under ``name``, or None.

    ``a/b`` lies under ``a``: field ``a`` would also be a group of fields, which no shard
    can hold (a Zarr shard stores ``a`` as the array at ``<position>/a`` and ``a/b``
    inside a group there), whether the two come in one sample, one file or two files.
    This scans ``known``; to ask for many names, build a :class:`FieldGroups` once.
    """
    return FieldGroups(known).clash(name)


class FieldGroups:
    """Field names indexed by their groups: :func:`group_clash` in time of a name's depth.

    Asking :func:`group_clash` of each field of a file against all the others scanned
    them all for every name: a file of 10,000 datasets took 17 s, most of it here.
    """

    def __init__(self, names: Iterable[str] = ()) -> None:
        self._names: set[str] = set()
        self._under: dict[str, str] = {}  # a group -> the least field that lies under it
        self.update(names)

    def add(self, name: str) -> None:
        if name in self._names:
            return
        self._names.add(name)
        parts = name.split("/")
        for i in range(1, len(parts)):
            group = "/".join(parts[:i])
            least = self._under.get(group)
            if least is None or name < least:
                self._under[group] = name

    def update(self, names: Iterable[str]) -> None:
        for name in names:
            self.add(name)

    def clash(self, name: str) -> str | None:
        """What :func:`group_clash` gives for ``name`` against these fields."""
        parts = name.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent in self._names:
                return parent
        return self._under.get(name)


def group_clash_message(path: str, name: str, other: str, where: str) -> str:
    """The one-line error for field ``name`` of file ``path`` against ``other`` of ``where``."""
    if name.startswith(other + "/"):
        clash = f"field {name!r} lies under field {other!r} of {where}"
    else:
        clash = f"field {other!r} of {where} lies under field {name!r}"
    return f"{path}: {clash}; a field cannot also be a group of fields"
