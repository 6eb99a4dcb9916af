"""A staging entry: the changes an ingest or delete has stored, awaiting a commit."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from simstore.errors import FormatError, version_error
from simstore.hashing import ObjectId
from simstore.sample import FieldSpec, Schema, canonical_json

__all__ = ["STAGING_FORMAT_VERSION", "Mode", "StagedEntry"]

STAGING_FORMAT_VERSION = 1
Mode = Literal["upsert", "replace"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StagedEntry:
    """Changes an ingest or delete has staged for a dataset, awaiting a commit."""

    id: str
    dataset: str
    created: str
    mode: Mode
    changes: ObjectId
    rows: int
    deletions: int
    shards: tuple[str, ...]
    schema: Schema
    stats: Mapping[str, Any]
    lineage: Mapping[str, Any]

    def to_bytes(self) -> bytes:
        """Canonical JSON bytes."""
        return canonical_json(
            {
                "format_version": STAGING_FORMAT_VERSION,
                "kind": "staging",
                "id": self.id,
                "dataset": self.dataset,
                "created": self.created,
                "mode": self.mode,
                "changes": self.changes,
                "rows": self.rows,
                "deletions": self.deletions,
                "shards": list(self.shards),
                "schema": [s.to_json() for s in self.schema],
                "stats": dict(self.stats),
                "lineage": dict(self.lineage),
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes, key: str) -> StagedEntry:
        """Parse; raise FormatError naming the key when bad."""
        try:
            obj = json.loads(data)
            if obj.get("kind") != "staging":
                raise ValueError("not a staging entry")
            if obj.get("format_version") != STAGING_FORMAT_VERSION:
                raise version_error(
                    f"staging entry {key} has", obj.get("format_version"), STAGING_FORMAT_VERSION
                )
            return cls(
                id=str(obj["id"]),
                dataset=str(obj["dataset"]),
                created=str(obj["created"]),
                mode="replace" if obj["mode"] == "replace" else "upsert",
                changes=ObjectId(str(obj["changes"])),
                rows=int(obj["rows"]),
                deletions=int(obj["deletions"]),
                shards=tuple(str(s) for s in obj["shards"]),
                schema=tuple(FieldSpec.from_json(s) for s in obj["schema"]),
                stats=dict(obj.get("stats", {})),
                lineage=dict(obj.get("lineage", {})),
            )
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            # RecursionError: JSON nested too deeply for the parser (a crafted object)
            raise FormatError(f"staging entry {key} is malformed: {exc}") from exc

    def referenced_objects(self) -> list[str]:
        """Every object this entry keeps alive: its change set, shards, lineage objects."""
        extra = [str(o) for o in self.lineage.get("objects", [])]
        return [self.changes, *self.shards, *extra]
