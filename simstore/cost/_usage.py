"""Request classes and the bytes and requests of one storage tier. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypedDict

from simstore.errors import FormatError

from ._values import _count


class OpClass(StrEnum):
    """Request classes as object stores bill them.

    ``RANGE_GET`` is billed as a GET; it is counted apart because a loader that reads
    byte ranges makes many more requests than one that reads whole shards.
    """

    GET = "get"
    RANGE_GET = "range_get"
    PUT = "put"
    LIST = "list"
    HEAD = "head"
    DELETE = "delete"


class OpUsageJSON(TypedDict):
    """JSON shape of an :class:`OpUsage`."""

    requests: int
    bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class OpUsage:
    """Requests of one class and the bytes they moved (read for GETs, sent for PUTs)."""

    requests: int = 0
    bytes: int = 0

    def __add__(self, other: OpUsage) -> OpUsage:
        return OpUsage(requests=self.requests + other.requests, bytes=self.bytes + other.bytes)

    def to_json(self) -> OpUsageJSON:
        """The JSON shape."""
        return {"requests": self.requests, "bytes": self.bytes}


@dataclass(frozen=True, slots=True, kw_only=True)
class TierUsage:
    """Requests and bytes by request class on one tier (``s3``, ``local``, ``cache``...)."""

    tier: str
    ops: Mapping[OpClass, OpUsage] = field(default_factory=dict)

    def usage(self, op: OpClass) -> OpUsage:
        """The usage of one request class (zero when absent)."""
        return self.ops.get(op, OpUsage())

    @property
    def requests(self) -> int:
        """Requests of every class."""
        return sum(u.requests for u in self.ops.values())

    @property
    def bytes_read(self) -> int:
        """Bytes read by GETs and ranged GETs."""
        return self.usage(OpClass.GET).bytes + self.usage(OpClass.RANGE_GET).bytes

    @property
    def bytes_written(self) -> int:
        """Bytes sent by PUTs."""
        return self.usage(OpClass.PUT).bytes

    def __add__(self, other: TierUsage) -> TierUsage:
        ops = dict(self.ops)
        for op, u in other.ops.items():
            ops[op] = ops.get(op, OpUsage()) + u
        return TierUsage(tier=self.tier, ops=ops)

    def to_json(self) -> dict[str, OpUsageJSON]:
        """``{op: {"requests": n, "bytes": b}}`` for each class used, in enum order."""
        return {op.value: self.ops[op].to_json() for op in OpClass if op in self.ops}

    @classmethod
    def from_json(cls, tier: str, obj: object, *, origin: str = "") -> TierUsage:
        """Parse ``{op: {"requests": n, "bytes": b}}``; FormatError names what is wrong.

        ``origin`` (a run report's name) starts each message, so an error in one of
        several rank reports says which.
        """
        at = f"{origin}: " if origin else ""
        if not isinstance(obj, Mapping):
            raise FormatError(f"{at}usage of tier {tier!r} must be an object, got {obj!r}")
        ops: dict[OpClass, OpUsage] = {}
        for name, value in obj.items():
            try:
                op = OpClass(name)
            except ValueError:
                known = ", ".join(o.value for o in OpClass)
                raise FormatError(
                    f"{at}usage of tier {tier!r}: unknown request class {name!r} (known: {known})"
                ) from None
            if not isinstance(value, Mapping):
                raise FormatError(f"{at}usage of tier {tier!r}, {name}: expected an object")
            if not value or set(value) - {"requests", "bytes"}:
                # an empty class priced nothing; an unknown field (a typo) was dropped
                extra = sorted(set(value) - {"requests", "bytes"})
                raise FormatError(
                    f"{at}usage of tier {tier!r}, {name}: " + (
                        f"unknown fields {', '.join(map(repr, extra))} beside requests and "
                        "bytes" if extra else "gives neither requests nor bytes"))
            ops[op] = OpUsage(
                requests=_count(value.get("requests", 0), f"{at}{tier}.{name}.requests"),
                bytes=_count(value.get("bytes", 0), f"{at}{tier}.{name}.bytes"),
            )
        return cls(tier=tier, ops=ops)
