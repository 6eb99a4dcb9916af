"""Snapshots: immutable, content-addressed descriptions of a dataset revision. Pure.

A snapshot is canonical JSON (sorted keys, no spaces, UTF-8); its id is the xxh3-128 hash
of those bytes, and it is stored as ``objects/<2 hex>/<id>`` like every other immutable
object. It names its parents, the manifest parts that list every sample, the schema,
totals, merged field statistics and the lineage of the data (adapter, parameters, sources).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NewType, TypedDict

from simstore.errors import FormatError, version_error
from simstore.hashing import hash_bytes, is_object_id
from simstore.manifest import PartRef, PartRefJSON
from simstore.sample import FieldSpec, FieldSpecJSON, Schema, canonical_json

__all__ = [
    "SNAPSHOT_FORMAT_VERSION",
    "SNAPSHOT_HEAD",
    "Snapshot",
    "SnapshotId",
    "SnapshotJSON",
    "content_hash_of",
]

SNAPSHOT_FORMAT_VERSION = 1
SNAPSHOT_HEAD = b'{"author":'
"""The first bytes of every snapshot object: canonical JSON sorts keys, ``author`` first.
Enough to tell a snapshot from a shard or manifest part without reading it whole."""
SnapshotId = NewType("SnapshotId", str)


class SnapshotJSON(TypedDict):
    """JSON shape of a :class:`Snapshot`."""

    format_version: int
    kind: str
    dataset: str
    parents: list[str]
    created: str
    author: str
    message: str
    schema: list[FieldSpecJSON]
    parts: list[PartRefJSON]
    samples: int
    sample_bytes: int
    content_hash: str
    stats: dict[str, Any]
    lineage: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """One immutable dataset revision.

    ``content_hash`` digests the set of (key, sample hash) pairs (see
    :func:`content_hash_of`): equal for equal content whatever wrote it.
    """

    dataset: str
    parents: tuple[str, ...]
    created: str
    author: str
    message: str
    schema: Schema
    parts: tuple[PartRef, ...]
    samples: int
    sample_bytes: int
    content_hash: str
    stats: Mapping[str, Any] = field(default_factory=dict)
    lineage: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> SnapshotJSON:
        """The JSON shape."""
        return {
            "format_version": SNAPSHOT_FORMAT_VERSION,
            "kind": "snapshot",
            "dataset": self.dataset,
            "parents": list(self.parents),
            "created": self.created,
            "author": self.author,
            "message": self.message,
            "schema": [s.to_json() for s in self.schema],
            "parts": [p.to_json() for p in self.parts],
            "samples": self.samples,
            "sample_bytes": self.sample_bytes,
            "content_hash": self.content_hash,
            "stats": dict(self.stats),
            "lineage": dict(self.lineage),
        }

    def to_bytes(self) -> bytes:
        """Canonical JSON bytes; the snapshot id is their hash."""
        return canonical_json(self.to_json())

    @property
    def id(self) -> SnapshotId:
        """The snapshot id: the hash of :meth:`to_bytes`."""
        return SnapshotId(hash_bytes(self.to_bytes()))

    @property
    def manifest_bytes(self) -> int:
        """Stored size of all manifest parts."""
        return sum(p.size_bytes for p in self.parts)

    @classmethod
    def from_bytes(cls, data: bytes, *, object_id: str = "") -> Snapshot:
        """Parse snapshot bytes; raise :class:`FormatError` naming the object when bad."""
        name = f"snapshot {object_id}" if object_id else "snapshot"
        try:
            obj = json.loads(data, parse_constant=_no_constant)
        except (ValueError, RecursionError) as exc:
            # beside bad JSON: nested too deeply for the parser, an integer of more digits
            # than Python converts, NaN or Infinity (a crafted object; none is written)
            raise FormatError(f"{name} is not valid JSON: {exc}") from exc
        if not isinstance(obj, dict) or obj.get("kind") != "snapshot":
            raise FormatError(f"{name} is not a simstore snapshot")
        version = obj.get("format_version")
        if version != SNAPSHOT_FORMAT_VERSION:
            raise version_error(f"{name} has", version, SNAPSHOT_FORMAT_VERSION)
        try:
            _check_shape(obj)
            snap = cls(
                dataset=str(obj["dataset"]),
                parents=tuple(obj["parents"]),
                created=str(obj["created"]),
                author=str(obj["author"]),
                message=str(obj["message"]),
                schema=tuple(FieldSpec.from_json(s) for s in obj["schema"]),
                parts=tuple(PartRef.from_json(p) for p in obj["parts"]),
                samples=int(obj["samples"]),
                sample_bytes=int(obj["sample_bytes"]),
                content_hash=str(obj["content_hash"]),
                stats=dict(obj.get("stats", {})),
                lineage=dict(obj.get("lineage", {})),
            )
            _check_parts(snap)
            return snap
        except FormatError as exc:  # a nested entry: say which snapshot holds it
            raise FormatError(f"{name}: {exc}") from exc
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise FormatError(f"{name} is missing or has a malformed field: {exc}") from exc


def _check_shape(obj: dict[str, Any]) -> None:
    """Refuse values that would send a reader outside ``objects/`` or break its arithmetic.

    Parents and the content hash are object ids, counts are non-negative integers, the
    schema and parts are lists, stats and lineage are objects, the lineage lists
    (``staging``, ``objects``) hold strings and its ``after`` is a string. Raises
    ``ValueError`` naming the field.
    """
    parents = obj["parents"]
    if not isinstance(parents, list) or not all(
        isinstance(p, str) and is_object_id(p) for p in parents
    ):
        raise ValueError(f"parents {parents!r} are not a list of snapshot ids")
    if not (isinstance(obj["content_hash"], str) and is_object_id(obj["content_hash"])):
        raise ValueError(f"content_hash {obj['content_hash']!r} is not a digest")
    for count in ("samples", "sample_bytes"):
        value = obj[count]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{count} {value!r} is not a non-negative integer")
    for listed in ("schema", "parts"):
        if not isinstance(obj[listed], list):
            raise ValueError(f"{listed} is not a list")
    for mapping in ("stats", "lineage"):
        if not isinstance(obj.get(mapping, {}), dict):
            raise ValueError(f"{mapping} is not an object")
    lineage = obj.get("lineage", {})
    for listed in ("staging", "objects"):
        values = lineage.get(listed, [])
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ValueError(f"lineage.{listed} is not a list of strings")
    if not isinstance(lineage.get("after", ""), str):
        raise ValueError(f"lineage.after {lineage['after']!r} is not a time")


def _check_parts(snap: Snapshot) -> None:
    """Refuse parts out of key order or overlapping, and totals that are not their sums.

    A writer cuts the manifest's sorted rows into parts, so each part's keys follow the
    last part's; a snapshot whose parts repeat or swap (a hand-made or buggy writer's,
    self-consistent down to its content hash) served samples twice and hid keys from a
    lookup by key. Raises :class:`FormatError` naming the part.
    """
    last: str | None = None
    for i, part in enumerate(snap.parts):
        if part.first_key > part.last_key:
            raise FormatError(f"part {i} ({part.id}) starts at {part.first_key!r}, after its "
                             f"last key {part.last_key!r}")
        if last is not None and part.first_key <= last:
            raise FormatError(f"part {i} ({part.id}) starts at {part.first_key!r}, not after "
                             f"the last key of the part before ({last!r}): parts out of "
                             "key order or overlapping")
        last = part.last_key
    rows = sum(p.rows for p in snap.parts)
    nbytes = sum(p.sample_bytes for p in snap.parts)
    if (snap.samples, snap.sample_bytes) != (rows, nbytes):
        raise FormatError(f"it counts {snap.samples} samples of {snap.sample_bytes} bytes, "
                         f"its parts {rows} of {nbytes}")


def content_hash_of(parts: tuple[PartRef, ...] | list[PartRef]) -> str:
    """The content hash of a manifest: a hash of its parts' content digests, in key order.

    Part boundaries depend only on the (key, sample hash) rows, and each part's content
    digest covers only those two columns, so equal content gives an equal hash whatever
    shard format, shard layout or history produced it.
    """
    return hash_bytes("".join(p.content for p in parts).encode("ascii"))


def _no_constant(token: str) -> Any:
    """Refuse ``NaN``, ``Infinity`` and ``-Infinity``, which JSON does not have."""
    raise ValueError(f"{token} is not a JSON number")
