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

from ._prices import (
    PriceTable,
    TierPrice,
    amortised_per_gib_month,
    apply_price_overrides,
    check_new_tiers,
    check_price_data,
    merge_price_data,
    parse_price_table,
)
from ._runs import (
    DEFAULT_TIER_PRICES,
    HOT_TIERS,
    RUN_REPORT_FORMAT_VERSION,
    RUN_REPORT_KIND,
    RunCost,
    RunUsage,
    TierRunCost,
    merge_run_usage,
    parse_run_report,
    price_run,
)
from ._storage import (
    Footprint,
    FootprintTally,
    SnapshotFigures,
    SnapshotObjects,
    dedup_ratio,
    footprint_of,
    storage_prices,
    summarise_history,
)
from ._usage import (
    OpClass,
    OpUsage,
    TierUsage,
)
from ._values import (
    GIB,
    PRICE_TABLE_FORMAT_VERSION,
    month_fraction,
)

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
    "check_new_tiers",
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
