"""Price tables: parsed from TOML or a mapping, merged, overridden. Pure."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from simstore.errors import FormatError, InvalidInputError, version_error

from ._usage import OpClass
from ._values import GIB, PRICE_TABLE_FORMAT_VERSION, _price, _whole

if TYPE_CHECKING:
    from ._storage import Footprint

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
    known once merged (a file may change one), so :func:`parse_price_table` checks that,
    and :func:`check_new_tiers` that a tier the files add has a storage price.
    Raises :class:`FormatError` starting with ``origin``.
    """
    for name, body in _check_header(data, origin).items():
        _parse_tier(str(name), body, origin, partial=True)


def check_new_tiers(data: Mapping[str, Any], added: Mapping[str, str]) -> None:
    """Refuse a tier a price file added (``added``: tier -> that file) with no storage price.

    Checked on the table as the files and flags leave it (a later file or a ``--price``
    flag may give the price): else every figure of the tier would read as free.
    """
    tiers = data.get("tiers", {})
    for name, origin in added.items():
        body = tiers.get(name, {})
        if "storage_per_gib_month" not in body and not any(k in body for k in _AMORTISED_FIELDS):
            raise FormatError(
                f"{origin}, tier {name!r}: a new tier needs its storage price "
                f"(storage_per_gib_month, or the drive fields {list(_AMORTISED_FIELDS)}) in "
                "this file, a later one or a --price flag"
            )


def _check_header(data: Mapping[str, Any], origin: str) -> Mapping[str, Any]:
    """Check a price table's top level; return its ``tiers`` mapping (maybe empty)."""
    version = data.get("format_version", PRICE_TABLE_FORMAT_VERSION)
    # ``true == 1`` and ``1.0 == 1`` in Python; neither is a format version
    if type(version) is not int or version != PRICE_TABLE_FORMAT_VERSION:
        raise version_error(f"{origin} has", version, PRICE_TABLE_FORMAT_VERSION)
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
        except RecursionError as exc:
            raise FormatError(f"{origin} is not valid TOML: nested too deeply") from exc
    return source


_KNOWN_FIELDS = frozenset({*_PRICE_FIELDS, *_INT_FIELDS, *_AMORTISED_FIELDS, *_TEXT_FIELDS})


def _field_value(key: str, value: object, what: str) -> Any:
    """One tier field checked on its own and converted; ``what`` starts the message.

    Shared by price files and ``--price`` flags, so both refuse the same values.
    """
    if key in _TEXT_FIELDS:
        isoformat = getattr(value, "isoformat", None)
        if key == "as_of" and callable(isoformat):
            return str(isoformat())  # a TOML date, as a price file would write one
        if not isinstance(value, str):
            raise FormatError(f"{what} must be text, got {value!r}")
        return value
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
        if "assumption" not in body and any(
                k in body for k in (*_AMORTISED_FIELDS, "storage_per_gib_month")):
            # the base's words describe the base's price (a drive's is written anew)
            merged.pop("assumption", None)
        merged.update(body)
    out["tiers"] = tiers
    return out


def apply_price_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``tier.field=value`` overrides (from ``--price``) to raw price-table data.

    Values are numbers, except the text fields (``source``, ``as_of``...). The tier must
    be one ``data`` defines (the defaults, or a price file): a mistyped name would add a
    tier that prices nothing, so a new tier comes from a file. Each value gets the checks
    a price file's value gets (a whole
    number is given as one: ``min_object_bytes=1.5`` is refused, not truncated), and the
    overrides apply in order, like files, so a later one wins. Raises
    :class:`InvalidInputError` naming the flag (``--price TIER.FIELD=VALUE``).
    """
    out = dict(data)
    touched: dict[str, list[str]] = {}  # tier -> the flags that set its fields
    for item in overrides:
        target, sep, text = item.partition("=")
        tier, dot, name = target.strip().rpartition(".")
        if not sep or not dot or not tier or not name:
            raise InvalidInputError(
                f"invalid price override --price {item!r}: expected TIER.FIELD=VALUE, "
                "e.g. s3-standard.storage_per_gib_month=0.021"
            )
        flag = f"invalid price override --price {item}"
        if name not in _KNOWN_FIELDS:
            raise InvalidInputError(
                f"{flag}: unknown field {name!r}; known: {sorted(_KNOWN_FIELDS)}"
            )
        known_tiers = out.get("tiers", {})
        if tier not in known_tiers:
            raise InvalidInputError(
                f"{flag}: unknown tier {tier!r}; known: {', '.join(sorted(known_tiers))} "
                "(a --prices file may add a tier)"
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
        touched.setdefault(tier, []).append(item)
    for tier, items in touched.items():
        # the flags' tier as they leave it: a drive field after storage_per_gib_month (or
        # a file's) starts the drive price afresh, which needs all three drive fields
        try:
            _parse_tier(tier, out["tiers"][tier], "price table")
        except FormatError as exc:
            flags = " ".join(f"--price {i}" for i in items)
            raise InvalidInputError(
                f"invalid price override {flags}: {exc}; storage_per_gib_month and the "
                f"drive fields {list(_AMORTISED_FIELDS)} replace each other, the later "
                "winning, so give the drive fields together"
            ) from None
    return out
