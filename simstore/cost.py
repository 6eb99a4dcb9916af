"""The cost model: price tables, storage footprints, snapshot figures and run pricing. Pure.

Nothing here reads a file, a clock or the environment: the price table arrives as TOML
text or a mapping, object sizes and snapshot contents arrive as values, and every result
is a frozen value. :mod:`simstore.accounting` walks a store to produce the inputs.

Units: bytes are integers; prices are US dollars per GiB-month of storage, per GiB moved
and per 1,000 requests. Cloud price lists say "GB": AWS bills a GB as 2**30 bytes and
Google's price list states GiB, so both are read as per GiB.

Three groups of functions:

- **Prices**: :func:`parse_price_table` (TOML text or a mapping), :func:`check_price_data`
  and :func:`merge_price_data` (a partial override file), :func:`apply_price_overrides`
  (``tier.field=value``).
- **Storage**: a :class:`Footprint` is the objects, bytes and small-object padding of a
  set of objects; :func:`summarise_history` turns the object sets of snapshots, in order,
  into :class:`SnapshotFigures` (new, shared, stored after dedup, dedup ratio).
- **Runs**: :func:`price_run` prices a :class:`RunUsage` (bytes and requests per tier of a
  loader run) per run and per epoch, and what its cache hits saved.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, TypedDict

from simstore.errors import FormatError, InvalidInputError

__all__ = [
    "DEFAULT_TIER_PRICES",
    "Footprint",
    "FootprintTally",
    "GIB",
    "HOT_TIERS",
    "OpClass",
    "OpUsage",
    "PRICE_TABLE_FORMAT_VERSION",
    "PriceTable",
    "RUN_REPORT_FORMAT_VERSION",
    "RUN_REPORT_KIND",
    "RunCost",
    "RunUsage",
    "SnapshotFigures",
    "SnapshotObjects",
    "TierPrice",
    "TierRunCost",
    "TierUsage",
    "amortised_per_gib_month",
    "apply_price_overrides",
    "check_price_data",
    "dedup_ratio",
    "footprint_of",
    "merge_price_data",
    "merge_run_usage",
    "month_fraction",
    "parse_price_table",
    "parse_run_report",
    "price_run",
    "storage_prices",
    "summarise_history",
]

GIB = 1024**3
PRICE_TABLE_FORMAT_VERSION = 1
_DAYS_PER_MONTH = 365.25 / 12
_SECONDS_PER_MONTH = _DAYS_PER_MONTH * 86400


# -- request classes and usage ---------------------------------------------------------


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
            ops[op] = OpUsage(
                requests=_count(value.get("requests", 0), f"{at}{tier}.{name}.requests"),
                bytes=_count(value.get("bytes", 0), f"{at}{tier}.{name}.bytes"),
            )
        return cls(tier=tier, ops=ops)


_MAX_COUNT = 2**63 - 1
"""The largest count a report may give: counts are int64 wherever they are made, and a
larger one (JSON numbers have no bound) would overflow float prices."""


def _count(value: object, what: str) -> int:
    # NaN compares false with everything, so finiteness is checked before the sign
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FormatError(f"{what} must be a non-negative number, got {value!r}")
    if isinstance(value, float) and not _is_finite(value):
        raise FormatError(f"{what} must be a finite, non-negative number, got {value!r}")
    if value < 0:
        raise FormatError(f"{what} must be a non-negative number, got {value!r}")
    if isinstance(value, float) and not value.is_integer():
        raise FormatError(f"{what} must be a whole number, got {value!r}")
    if value > _MAX_COUNT:
        raise FormatError(f"{what} is too large: {value!r} is over 2**63 - 1")
    return int(value)


# -- price tables ----------------------------------------------------------------------

_PRICE_FIELDS = (
    "storage_per_gib_month",
    "put_per_1000",
    "get_per_1000",
    "list_per_1000",
    "head_per_1000",
    "delete_per_1000",
    "retrieval_per_gib",
    "egress_per_gib",
)
_INT_FIELDS = ("min_object_bytes", "min_storage_days")
_AMORTISED_FIELDS = ("drive_usd", "drive_capacity_bytes", "life_months")
_TEXT_FIELDS = ("description", "source", "as_of", "assumption")


@dataclass(frozen=True, slots=True, kw_only=True)
class TierPrice:
    """List prices of one storage tier, in US dollars.

    Storage is per GiB-month; ``retrieval_per_gib`` is what the tier charges for reading
    (Standard-IA, Glacier Instant Retrieval); ``egress_per_gib`` is what leaving the
    provider's network costs (charged only when a run is priced with ``egress=True``).
    Objects smaller than ``min_object_bytes`` are billed as that size, and objects are
    billed for at least ``min_storage_days``. A local tier may give the amortised price
    of a drive (``drive_usd``, ``drive_capacity_bytes``, ``life_months``) instead of
    ``storage_per_gib_month``, which is then derived from them.
    """

    name: str
    description: str = ""
    storage_per_gib_month: float = 0.0
    put_per_1000: float = 0.0
    get_per_1000: float = 0.0
    list_per_1000: float = 0.0
    head_per_1000: float = 0.0
    delete_per_1000: float = 0.0
    retrieval_per_gib: float = 0.0
    egress_per_gib: float = 0.0
    min_object_bytes: int = 0
    min_storage_days: int = 0
    source: str = ""
    as_of: str = ""
    assumption: str = ""

    def request_price(self, op: OpClass) -> float:
        """Dollars per 1,000 requests of class ``op`` (ranged GETs are GETs)."""
        return {
            OpClass.GET: self.get_per_1000,
            OpClass.RANGE_GET: self.get_per_1000,
            OpClass.PUT: self.put_per_1000,
            OpClass.LIST: self.list_per_1000,
            OpClass.HEAD: self.head_per_1000,
            OpClass.DELETE: self.delete_per_1000,
        }[op]

    def storage_usd_per_month(self, footprint: Footprint) -> float:
        """Dollars a month to hold ``footprint`` here, small objects padded to the minimum."""
        return footprint.billable_bytes(self.min_object_bytes) / GIB * self.storage_per_gib_month

    def to_json(self) -> dict[str, Any]:
        """Every field, for ``--json`` and for writing a table back out."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, slots=True, kw_only=True)
class PriceTable:
    """Named tiers of prices; ``currency`` is always USD."""

    tiers: tuple[TierPrice, ...]
    currency: str = "USD"

    @property
    def names(self) -> tuple[str, ...]:
        """Tier names in table order."""
        return tuple(t.name for t in self.tiers)

    def tier(self, name: str) -> TierPrice:
        """The tier called ``name``; InvalidInputError lists the known ones."""
        for t in self.tiers:
            if t.name == name:
                return t
        raise InvalidInputError(
            f"no price tier {name!r}; the price table has {', '.join(self.names) or 'none'}"
        )

    @property
    def thresholds(self) -> tuple[int, ...]:
        """The distinct positive ``min_object_bytes`` of the tiers (for :class:`Footprint`)."""
        return tuple(sorted({t.min_object_bytes for t in self.tiers if t.min_object_bytes > 0}))

    def to_json(self) -> dict[str, Any]:
        """JSON (and TOML-able) shape: ``{"currency": ..., "tiers": {name: fields}}``."""
        tiers = {}
        for t in self.tiers:
            body = t.to_json()
            del body["name"]
            tiers[t.name] = body
        return {
            "format_version": PRICE_TABLE_FORMAT_VERSION,
            "currency": self.currency,
            "tiers": tiers,
        }


def parse_price_table(
    source: str | Mapping[str, Any], *, origin: str = "price table"
) -> PriceTable:
    """Parse a price table from TOML text or an already-parsed mapping.

    The shape is ``format_version = 1``, ``currency = "USD"`` and one ``[tiers.<name>]``
    table per tier with the fields of :class:`TierPrice`. ``origin`` names the source in
    error messages. Raises :class:`FormatError` for malformed tables and unknown fields.
    """
    data = _load(source, origin)
    raw_tiers = _check_header(data, origin)
    if not raw_tiers:
        raise FormatError(f"{origin} has no [tiers.<name>] tables")
    return PriceTable(
        tiers=tuple(_parse_tier(str(n), body, origin) for n, body in raw_tiers.items()),
        currency=str(data.get("currency", "USD")),
    )


def check_price_data(data: Mapping[str, Any], *, origin: str) -> None:
    """Check a partial price table (a ``--prices`` file) on its own, before it is merged.

    A later file or flag may set the same field again, so a check of the merged table
    alone would let a bad value through (and name the whole chain of files). Checked
    here: the shape, ``format_version`` and ``currency`` when given, and each field's
    name, type and range, and that no tier gives both a direct storage price and the
    drive fields. Whether an amortised tier has all three drive fields can only be
    known once merged (a file may change one), so :func:`parse_price_table` checks that.
    Raises :class:`FormatError` starting with ``origin``.
    """
    for name, body in _check_header(data, origin).items():
        _parse_tier(str(name), body, origin, partial=True)


def _check_header(data: Mapping[str, Any], origin: str) -> Mapping[str, Any]:
    """Check a price table's top level; return its ``tiers`` mapping (maybe empty)."""
    version = data.get("format_version", PRICE_TABLE_FORMAT_VERSION)
    # ``true == 1`` and ``1.0 == 1`` in Python; neither is a format version
    if type(version) is not int or version != PRICE_TABLE_FORMAT_VERSION:
        raise FormatError(
            f"{origin} has format_version {version!r}, this simstore reads "
            f"{PRICE_TABLE_FORMAT_VERSION}"
        )
    currency = data.get("currency", "USD")
    if currency != "USD":
        raise FormatError(f"{origin}: currency {currency!r} is not supported, only USD")
    unknown_top = set(data) - {"format_version", "currency", "tiers"}
    if unknown_top:
        raise FormatError(f"{origin}: unknown top-level keys {sorted(unknown_top)}")
    raw_tiers = data.get("tiers", {})
    if not isinstance(raw_tiers, Mapping):
        raise FormatError(
            f"{origin}: tiers must be [tiers.<name>] tables, got {type(raw_tiers).__name__} "
            f"{raw_tiers!r}"
        )
    return raw_tiers


def _load(source: str | Mapping[str, Any], origin: str) -> Mapping[str, Any]:
    if isinstance(source, str):
        try:
            return tomllib.loads(source)
        except tomllib.TOMLDecodeError as exc:
            raise FormatError(f"{origin} is not valid TOML: {exc}") from exc
    return source


_KNOWN_FIELDS = frozenset({*_PRICE_FIELDS, *_INT_FIELDS, *_AMORTISED_FIELDS, *_TEXT_FIELDS})


def _field_value(key: str, value: object, what: str) -> Any:
    """One tier field checked on its own and converted; ``what`` starts the message.

    Shared by price files and ``--price`` flags, so both refuse the same values.
    """
    if key in _TEXT_FIELDS:
        return str(value)
    if key in _INT_FIELDS:
        return _whole(value, what)
    if key == "drive_capacity_bytes":
        capacity = _whole(value, what)
        if capacity <= 0:
            raise FormatError(f"{what} must be positive, got {value!r}")
        return capacity
    price = _price(value, what)
    if key == "life_months" and price <= 0:
        raise FormatError(f"{what} must be positive, got {value!r}")
    return price


def _parse_tier(name: str, body: object, origin: str, *, partial: bool = False) -> TierPrice:
    """One tier; ``partial`` (an override file) skips the check that needs the whole table."""
    where = f"{origin}, tier {name!r}"
    if not isinstance(body, Mapping):
        raise FormatError(f"{where}: expected a table of prices, got {body!r}")
    unknown = set(body) - _KNOWN_FIELDS
    if unknown:
        raise FormatError(
            f"{where}: unknown fields {sorted(unknown)}; known: {sorted(_KNOWN_FIELDS)}"
        )
    checked = {key: _field_value(key, body[key], f"{where}, {key}") for key in body}
    given = [k for k in _AMORTISED_FIELDS if k in body]
    if given and "storage_per_gib_month" in body:
        raise FormatError(
            f"{where}: give either storage_per_gib_month or the drive fields "
            f"{list(_AMORTISED_FIELDS)}, not both"
        )
    values: dict[str, Any] = {"name": name}
    values.update({k: v for k, v in checked.items() if k not in _AMORTISED_FIELDS})
    if partial:
        return TierPrice(**values)
    if given:
        if len(given) != len(_AMORTISED_FIELDS):
            missing = sorted(set(_AMORTISED_FIELDS) - set(given))
            raise FormatError(f"{where}: an amortised drive price also needs {missing}")
        usd = checked["drive_usd"]
        capacity = checked["drive_capacity_bytes"]
        months = checked["life_months"]
        values["storage_per_gib_month"] = amortised_per_gib_month(usd, capacity, months)
        if "assumption" not in body:
            values["assumption"] = (
                f"a {capacity / 1e12:g} TB drive at {usd:g} USD over {months:g} months"
            )
    return TierPrice(**values)


def amortised_per_gib_month(drive_usd: float, capacity_bytes: int, life_months: float) -> float:
    """Dollars per GiB-month of a drive bought for ``drive_usd`` and used ``life_months``."""
    return drive_usd / (capacity_bytes / GIB) / life_months


def _is_finite(value: float) -> bool:
    """``math.isfinite`` that says False, not OverflowError, for an int beyond a float."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _price(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FormatError(f"{what} must be a number, got {value!r}")
    if not _is_finite(value) or value < 0:
        raise FormatError(f"{what} must be a finite, non-negative number, got {value!r}")
    return float(value)


def _whole(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FormatError(f"{what} must be a non-negative whole number, got {value!r}")
    if value > _MAX_COUNT:
        raise FormatError(f"{what} is too large: {value!r} is over 2**63 - 1")
    return value


def merge_price_data(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``override`` laid over it, tier by tier and field by field.

    An override file may so change one price of one tier, or add a tier, without
    repeating the whole table. Setting any drive field of a tier drops a
    ``storage_per_gib_month`` inherited from ``base`` and vice versa, so the two ways of
    giving a local price never clash.
    """
    out: dict[str, Any] = {k: v for k, v in base.items() if k != "tiers"}
    out.update({k: v for k, v in override.items() if k != "tiers"})
    tiers: dict[str, dict[str, Any]] = {
        str(n): dict(body) for n, body in dict(base.get("tiers", {})).items()
    }
    raw_tiers = override.get("tiers", {})
    if not isinstance(raw_tiers, Mapping):
        raise FormatError(f"price override tiers must be a table, got {raw_tiers!r}")
    for name, body in raw_tiers.items():
        if not isinstance(body, Mapping):
            raise FormatError(f"price override for tier {name!r} must be a table")
        merged = tiers.setdefault(str(name), {})
        if any(k in body for k in _AMORTISED_FIELDS):
            merged.pop("storage_per_gib_month", None)
        if "storage_per_gib_month" in body:
            for k in _AMORTISED_FIELDS:
                merged.pop(k, None)
        merged.update(body)
    out["tiers"] = tiers
    return out


def apply_price_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``tier.field=value`` overrides (from ``--price``) to raw price-table data.

    Values are numbers, except the text fields (``source``, ``as_of``...); a field of a
    new tier creates it. Each value gets the checks a price file's value gets (a whole
    number is given as one: ``min_object_bytes=1.5`` is refused, not truncated), and the
    overrides apply in order, like files, so a later one wins. Raises
    :class:`InvalidInputError` naming the flag (``--price TIER.FIELD=VALUE``).
    """
    out = dict(data)
    for item in overrides:
        target, sep, text = item.partition("=")
        tier, dot, name = target.strip().rpartition(".")
        if not sep or not dot or not tier or not name:
            raise InvalidInputError(
                f"invalid price override {item!r}: expected TIER.FIELD=VALUE, "
                "e.g. s3-standard.storage_per_gib_month=0.021"
            )
        flag = f"invalid price override --price {item}"
        if name not in _KNOWN_FIELDS:
            raise InvalidInputError(
                f"{flag}: unknown field {name!r}; known: {sorted(_KNOWN_FIELDS)}"
            )
        value: Any = text
        if name not in _TEXT_FIELDS:
            try:
                value = int(text)
            except ValueError:
                try:
                    value = float(text)
                except ValueError:
                    raise InvalidInputError(f"{flag}: {text!r} is not a number") from None
        try:
            value = _field_value(name, value, f"{flag}: {name}")
            out = merge_price_data(out, {"tiers": {tier: {name: value}}})
        except FormatError as exc:
            raise InvalidInputError(str(exc)) from None
    return out


# -- storage footprints ----------------------------------------------------------------


class FootprintJSON(TypedDict):
    """JSON shape of a :class:`Footprint`."""

    objects: int
    bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Footprint:
    """Objects and bytes of a set of stored objects.

    ``padding`` holds, for each minimum billable object size ``m`` a price table uses,
    the bytes that billing adds by rounding objects smaller than ``m`` up to ``m``.
    """

    objects: int = 0
    bytes: int = 0
    padding: tuple[tuple[int, int], ...] = ()

    def billable_bytes(self, min_object_bytes: int = 0) -> int:
        """Bytes billed by a tier that bills every object as at least ``min_object_bytes``.

        A threshold the footprint was not tallied for raises :class:`InvalidInputError`
        rather than silently ignoring the padding.
        """
        if min_object_bytes <= 0:
            return self.bytes
        for threshold, pad in self.padding:
            if threshold == min_object_bytes:
                return self.bytes + pad
        if self.objects == 0:
            return 0
        raise InvalidInputError(
            f"footprint was not tallied for a minimum object size of {min_object_bytes} bytes"
        )

    def __add__(self, other: Footprint) -> Footprint:
        pads = dict(self.padding)
        for threshold, pad in other.padding:
            pads[threshold] = pads.get(threshold, 0) + pad
        return Footprint(
            objects=self.objects + other.objects,
            bytes=self.bytes + other.bytes,
            padding=tuple(sorted(pads.items())),
        )

    def to_json(self) -> FootprintJSON:
        """The JSON shape (padding is reflected in the prices, not shown)."""
        return {"objects": self.objects, "bytes": self.bytes}


class FootprintTally:
    """Accumulates object sizes into a :class:`Footprint` for the given thresholds."""

    __slots__ = ("_bytes", "_objects", "_pads", "thresholds")

    def __init__(self, thresholds: Iterable[int] = ()) -> None:
        self.thresholds = tuple(sorted({t for t in thresholds if t > 0}))
        self._objects = 0
        self._bytes = 0
        self._pads = [0] * len(self.thresholds)

    def add(self, size_bytes: int) -> None:
        """Count one object of ``size_bytes``."""
        self._objects += 1
        self._bytes += size_bytes
        for i, t in enumerate(self.thresholds):
            if size_bytes < t:
                self._pads[i] += t - size_bytes

    def result(self) -> Footprint:
        """The footprint so far."""
        return Footprint(
            objects=self._objects,
            bytes=self._bytes,
            padding=tuple(zip(self.thresholds, self._pads, strict=True)),
        )


def footprint_of(
    objects: Iterable[str], sizes: Mapping[str, int], thresholds: Iterable[int] = ()
) -> tuple[Footprint, int]:
    """The footprint of the objects ``sizes`` knows, and how many it does not know."""
    tally = FootprintTally(thresholds)
    missing = 0
    for oid in objects:
        size = sizes.get(oid)
        if size is None:
            missing += 1
        else:
            tally.add(size)
    return tally.result(), missing


def dedup_ratio(full_copy_bytes: int, stored_bytes: int) -> float:
    """How many times smaller the deduplicated store is than full copies (1.0 when empty).

    ``full_copy_bytes`` is what keeping every snapshot as a complete, separate copy would
    store; ``stored_bytes`` what is stored with each object once. It is at least 1
    whenever ``stored_bytes`` counts a subset of ``full_copy_bytes``'s objects.
    """
    if stored_bytes <= 0:
        return 1.0
    return full_copy_bytes / stored_bytes


# -- snapshot figures ------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotObjects:
    """What one snapshot reaches: itself, its manifest parts, shards and lineage objects."""

    snapshot_id: str
    parent_id: str | None
    created: str
    samples: int
    logical_bytes: int
    objects: frozenset[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotFigures:
    """Storage figures of one snapshot.

    - ``reached``: every object the snapshot reaches, each once (what holding this
      snapshot alone stores);
    - ``new``/``shared``: objects it reaches that its parent does not / does
      (``new + shared == reached``; without a parent everything is new);
    - ``stored``: the dataset's objects once this snapshot exists: the objects of this
      and every earlier snapshot of the report, each once;
    - ``full_copy_bytes``: the reached bytes of those same snapshots, summed, as if each
      were a full copy; ``dedup_ratio`` is ``full_copy_bytes / stored.bytes``;
    - ``missing``: reached objects the store does not hold (not counted in any bytes).
    """

    snapshot_id: str
    parent_id: str | None
    created: str
    samples: int
    logical_bytes: int
    reached: Footprint
    new: Footprint
    shared: Footprint
    stored: Footprint
    full_copy_bytes: int
    missing: int

    @property
    def dedup_ratio(self) -> float:
        """``full_copy_bytes / stored.bytes`` (1.0 when nothing is stored)."""
        return dedup_ratio(self.full_copy_bytes, self.stored.bytes)


def summarise_history(
    snapshots: Iterable[SnapshotObjects],
    sizes: Mapping[str, int],
    *,
    thresholds: Iterable[int] = (),
    baselines: Mapping[str, frozenset[str]] | None = None,
    children: Mapping[str, int] | None = None,
) -> Iterator[SnapshotFigures]:
    """Figures of each snapshot, in the order given (parents before their children).

    ``sizes`` maps object ids to stored sizes; an id it lacks is counted as missing.
    ``baselines`` gives the object sets of parents outside the report (so the oldest
    reported snapshot's ``new`` is still relative to its real parent); a parent found in
    neither is treated as absent (everything new). ``children`` maps a snapshot id to how
    many of the given snapshots name it as parent: with it, a snapshot's object set is
    dropped once its last child is done, so memory holds the sets of the open branches,
    not of the whole history; without it, every set is kept.
    """
    thresholds = tuple(thresholds)
    kept: dict[str, frozenset[str]] = dict(baselines or {})
    pending = dict(children) if children is not None else None
    seen: set[str] = set()
    stored = FootprintTally(thresholds)
    full_copy = 0
    for snap in snapshots:
        parent_objects = kept.get(snap.parent_id) if snap.parent_id else None
        reached, missing = footprint_of(snap.objects, sizes, thresholds)
        if parent_objects is None:
            new, shared = reached, Footprint(padding=_zero_pads(thresholds))
        else:
            new, _ = footprint_of(snap.objects - parent_objects, sizes, thresholds)
            shared, _ = footprint_of(snap.objects & parent_objects, sizes, thresholds)
        for oid in snap.objects:
            if oid not in seen:
                seen.add(oid)
                size = sizes.get(oid)
                if size is not None:
                    stored.add(size)
        full_copy += reached.bytes
        yield SnapshotFigures(
            snapshot_id=snap.snapshot_id,
            parent_id=snap.parent_id,
            created=snap.created,
            samples=snap.samples,
            logical_bytes=snap.logical_bytes,
            reached=reached,
            new=new,
            shared=shared,
            stored=stored.result(),
            full_copy_bytes=full_copy,
            missing=missing,
        )
        if pending is None:
            kept[snap.snapshot_id] = snap.objects
            continue
        if pending.get(snap.snapshot_id, 0) > 0:
            kept[snap.snapshot_id] = snap.objects
        if snap.parent_id is not None and snap.parent_id in pending:
            pending[snap.parent_id] -= 1
            if pending[snap.parent_id] <= 0:
                kept.pop(snap.parent_id, None)


def _zero_pads(thresholds: Sequence[int]) -> tuple[tuple[int, int], ...]:
    return tuple((t, 0) for t in thresholds)


def storage_prices(table: PriceTable, footprint: Footprint) -> dict[str, float]:
    """Dollars a month to hold ``footprint`` on each tier of ``table``."""
    return {t.name: t.storage_usd_per_month(footprint) for t in table.tiers}


# -- runs ------------------------------------------------------------------------------


RUN_REPORT_KIND = "simstore-loader-report"
RUN_REPORT_FORMAT_VERSION = 1
HOT_TIERS = frozenset({"cache", "local", "file", "memory"})
DEFAULT_TIER_PRICES: Mapping[str, str | None] = {
    "s3": "s3-standard",
    "s3a": "s3-standard",
    "gs": "gcs-standard",
    "gcs": "gcs-standard",
    "local": "local-nvme",
    "file": "local-nvme",
    "cache": "local-nvme",
    "memory": None,
}
"""Which price tier a run report's tier names are priced at unless told otherwise."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunUsage:
    """What a loader run read, as its run report (or several, one per rank) gives it.

    ``tiers`` holds requests and bytes per tier; a report that gives only a tier's total
    ``requests`` and ``bytes`` has them counted as GETs (a loader only reads).
    ``cache_hits``/``cache_hit_bytes`` are reads the local cache served that would
    otherwise have been fetched from ``cold_tier``; ``hit_bytes_estimated`` says that
    the report gave no hit bytes and they were estimated (see :func:`parse_run_report`).
    """

    epochs: int
    seconds: float
    tiers: tuple[TierUsage, ...]
    cache_hits: int = 0
    cache_misses: int = 0
    cache_hit_bytes: int = 0
    cache_fill_bytes: int = 0
    hit_bytes_estimated: bool = False
    cold_tier: str | None = None
    reports: int = 1


def parse_run_report(obj: object, *, origin: str = "run report") -> RunUsage:
    """Parse one loader run report (the JSON of docs/loader.md, already decoded).

    Read: ``epochs`` (a list of epoch numbers, or a count), ``seconds``, ``tiers``
    (``{tier: {"bytes": b, "requests": n}}``, or per request class
    ``{tier: {"get": {"requests": n, "bytes": b}, ...}}`` as :class:`TierUsage` writes
    it) and ``cache`` (``hits``, ``misses``, ``fill_bytes`` and, when present,
    ``hit_bytes``). Other fields are ignored. Without ``hit_bytes``, the bytes a hit
    saved are estimated as the mean fill (``fill_bytes / misses``) times the hits, or,
    with no misses, as the bytes read from the ``cache`` tier. The cold tier is the one
    tier that is not local (``cache``, ``local``, ``file``, ``memory``), if there is
    exactly one. Raises :class:`FormatError` naming ``origin`` when malformed.
    """
    if not isinstance(obj, Mapping):
        raise FormatError(f"{origin} is not a JSON object")
    # no defaults: any JSON object would otherwise read as a valid run that cost $0
    if "kind" not in obj:
        raise FormatError(
            f"{origin} is not a loader run report: it has no kind (expected {RUN_REPORT_KIND!r})"
        )
    kind = obj["kind"]
    if kind != RUN_REPORT_KIND:
        raise FormatError(f"{origin} has kind {kind!r}, expected {RUN_REPORT_KIND!r}")
    if "format_version" not in obj:
        raise FormatError(
            f"{origin} has no format_version (this simstore reads {RUN_REPORT_FORMAT_VERSION})"
        )
    version = obj["format_version"]
    if type(version) is not int or version != RUN_REPORT_FORMAT_VERSION:
        raise FormatError(
            f"{origin} has format_version {version!r}, this simstore reads "
            f"{RUN_REPORT_FORMAT_VERSION}"
        )
    epochs_raw = obj.get("epochs", 1)
    if isinstance(epochs_raw, list):
        epochs = len(epochs_raw)
    else:
        epochs = _count(epochs_raw, f"{origin}: epochs")
    # a price's checks: a number, finite (JSON decoders accept NaN), not negative
    seconds = _price(obj.get("seconds", 0.0), f"{origin}: seconds")
    raw_tiers = obj.get("tiers", {})
    if not isinstance(raw_tiers, Mapping):
        raise FormatError(f"{origin}: tiers must be an object")
    tiers = tuple(_tier_usage(str(name), body, origin) for name, body in raw_tiers.items())
    cache = obj.get("cache", {})
    if not isinstance(cache, Mapping):
        raise FormatError(f"{origin}: cache must be an object")
    hits = _count(cache.get("hits", 0), f"{origin}: cache.hits")
    misses = _count(cache.get("misses", 0), f"{origin}: cache.misses")
    fill_bytes = _count(cache.get("fill_bytes", 0), f"{origin}: cache.fill_bytes")
    estimated = "hit_bytes" not in cache and hits > 0
    if "hit_bytes" in cache:
        hit_bytes = _count(cache["hit_bytes"], f"{origin}: cache.hit_bytes")
    elif misses > 0:
        hit_bytes = round(hits * fill_bytes / misses)
    else:
        hit_bytes = sum(t.bytes_read for t in tiers if t.tier == "cache") if hits else 0
    remote = [t.tier for t in tiers if t.tier not in HOT_TIERS]
    return RunUsage(
        epochs=epochs,
        seconds=float(seconds),
        tiers=tiers,
        cache_hits=hits,
        cache_misses=misses,
        cache_hit_bytes=hit_bytes,
        cache_fill_bytes=fill_bytes,
        hit_bytes_estimated=estimated,
        cold_tier=remote[0] if len(remote) == 1 else None,
    )


def _tier_usage(tier: str, body: object, origin: str) -> TierUsage:
    if not isinstance(body, Mapping):
        raise FormatError(f"{origin}: tier {tier!r} must be an object")
    if set(body) <= {"bytes", "requests"}:
        usage = OpUsage(
            requests=_count(body.get("requests", 0), f"{origin}: {tier}.requests"),
            bytes=_count(body.get("bytes", 0), f"{origin}: {tier}.bytes"),
        )
        return TierUsage(tier=tier, ops={OpClass.GET: usage})
    return TierUsage.from_json(tier, body, origin=origin)


def merge_run_usage(usages: Sequence[RunUsage]) -> RunUsage:
    """The reports of the ranks of one run as one: traffic and cache counts summed.

    Ranks run side by side, so the run lasts as long as its slowest rank and has as many
    epochs as the rank that saw most. The cold tier is kept when all reports agree.
    """
    if not usages:
        raise InvalidInputError("no run reports to merge")
    tiers: dict[str, TierUsage] = {}
    for u in usages:
        for t in u.tiers:
            tiers[t.tier] = tiers[t.tier] + t if t.tier in tiers else t
    colds = {u.cold_tier for u in usages}
    return RunUsage(
        epochs=max(u.epochs for u in usages),
        seconds=max(u.seconds for u in usages),
        tiers=tuple(tiers[name] for name in sorted(tiers)),
        cache_hits=sum(u.cache_hits for u in usages),
        cache_misses=sum(u.cache_misses for u in usages),
        cache_hit_bytes=sum(u.cache_hit_bytes for u in usages),
        cache_fill_bytes=sum(u.cache_fill_bytes for u in usages),
        hit_bytes_estimated=any(u.hit_bytes_estimated for u in usages),
        cold_tier=colds.pop() if len(colds) == 1 else None,
        reports=sum(u.reports for u in usages),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class TierRunCost:
    """What one tier's traffic in a run cost, split into requests, retrieval and egress."""

    tier: str
    price_tier: str | None
    requests: int
    bytes_read: int
    requests_usd: float
    retrieval_usd: float
    egress_usd: float

    @property
    def total_usd(self) -> float:
        """All three parts."""
        return self.requests_usd + self.retrieval_usd + self.egress_usd

    def to_json(self) -> dict[str, Any]:
        """JSON shape."""
        return {
            "tier": self.tier,
            "price_tier": self.price_tier,
            "requests": self.requests,
            "bytes_read": self.bytes_read,
            "requests_usd": self.requests_usd,
            "retrieval_usd": self.retrieval_usd,
            "egress_usd": self.egress_usd,
            "total_usd": self.total_usd,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCost:
    """A run priced: per tier, per run, per epoch, per hour, and what the cache saved.

    ``cache_saved_usd`` is what the cache hits would have cost as GETs (one per hit) and
    bytes read from the cold tier; ``cold_start_usd`` is the run's cost had every hit
    gone to the cold tier (``total_usd + cache_saved_usd``).
    """

    tiers: tuple[TierRunCost, ...]
    epochs: int
    seconds: float
    egress: bool
    cold_tier: str | None
    cold_price_tier: str | None
    cache_hits: int
    cache_hit_bytes: int
    cache_hit_rate: float
    cache_saved_usd: float
    hit_bytes_estimated: bool = False
    reports: int = 1

    @property
    def total_usd(self) -> float:
        """The whole run."""
        return sum(t.total_usd for t in self.tiers)

    @property
    def per_epoch_usd(self) -> float:
        """The run divided by its epochs (the run itself when it has none)."""
        return self.total_usd / self.epochs if self.epochs > 0 else self.total_usd

    @property
    def per_hour_usd(self) -> float:
        """The run's cost per hour of its duration (0 when the duration is unknown)."""
        return self.total_usd / (self.seconds / 3600) if self.seconds > 0 else 0.0

    @property
    def cold_start_usd(self) -> float:
        """What the run would have cost with a cold (empty) cache."""
        return self.total_usd + self.cache_saved_usd

    def to_json(self) -> dict[str, Any]:
        """JSON shape."""
        return {
            "tiers": [t.to_json() for t in self.tiers],
            "epochs": self.epochs,
            "seconds": self.seconds,
            "egress": self.egress,
            "reports": self.reports,
            "total_usd": self.total_usd,
            "per_epoch_usd": self.per_epoch_usd,
            "per_hour_usd": self.per_hour_usd,
            "cache": {
                "hits": self.cache_hits,
                "hit_bytes": self.cache_hit_bytes,
                "hit_rate": self.cache_hit_rate,
                "hit_bytes_estimated": self.hit_bytes_estimated,
                "cold_tier": self.cold_tier,
                "cold_price_tier": self.cold_price_tier,
                "saved_usd": self.cache_saved_usd,
                "cold_start_usd": self.cold_start_usd,
            },
        }


def price_run(
    usage: RunUsage,
    table: PriceTable,
    tier_prices: Mapping[str, str | None],
    *,
    egress: bool = False,
) -> RunCost:
    """Price a run's traffic.

    ``tier_prices`` maps each tier name of the run to a price tier of ``table`` (None: not
    priced, e.g. ``memory``); a run tier it does not map is an
    :class:`InvalidInputError` naming it. Requests are priced per class; bytes read pay
    the tier's retrieval price, and its egress price when ``egress`` is true (a job
    outside the provider's region or network; same-region reads carry no transfer fee).
    """
    costs = []
    for tu in usage.tiers:
        if tu.tier not in tier_prices:
            raise InvalidInputError(
                f"run tier {tu.tier!r} has no price tier; map it, e.g. --tier {tu.tier}=s3-standard"
            )
        name = tier_prices[tu.tier]
        if name is None:
            costs.append(
                TierRunCost(
                    tier=tu.tier,
                    price_tier=None,
                    requests=tu.requests,
                    bytes_read=tu.bytes_read,
                    requests_usd=0.0,
                    retrieval_usd=0.0,
                    egress_usd=0.0,
                )
            )
            continue
        price = table.tier(name)
        requests_usd = sum(u.requests / 1000 * price.request_price(op) for op, u in tu.ops.items())
        gib = tu.bytes_read / GIB
        costs.append(
            TierRunCost(
                tier=tu.tier,
                price_tier=name,
                requests=tu.requests,
                bytes_read=tu.bytes_read,
                requests_usd=requests_usd,
                retrieval_usd=gib * price.retrieval_per_gib,
                egress_usd=gib * price.egress_per_gib if egress else 0.0,
            )
        )
    cold_name = tier_prices.get(usage.cold_tier) if usage.cold_tier is not None else None
    saved = 0.0
    if cold_name is not None:
        cold = table.tier(cold_name)
        per_gib = cold.retrieval_per_gib + (cold.egress_per_gib if egress else 0.0)
        saved = usage.cache_hits / 1000 * cold.get_per_1000 + usage.cache_hit_bytes / GIB * per_gib
    looked_up = usage.cache_hits + usage.cache_misses
    return RunCost(
        tiers=tuple(costs),
        epochs=usage.epochs,
        seconds=usage.seconds,
        egress=egress,
        cold_tier=usage.cold_tier,
        cold_price_tier=cold_name,
        cache_hits=usage.cache_hits,
        cache_hit_bytes=usage.cache_hit_bytes,
        cache_hit_rate=usage.cache_hits / looked_up if looked_up else 0.0,
        cache_saved_usd=saved,
        hit_bytes_estimated=usage.hit_bytes_estimated,
        reports=usage.reports,
    )


def month_fraction(seconds: float) -> float:
    """``seconds`` as a fraction of an average month (365.25 / 12 days)."""
    return seconds / _SECONDS_PER_MONTH
