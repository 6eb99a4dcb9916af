"""Price tables and run reports read from files, and a run's cost from them."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

from simstore.cost import (
    DEFAULT_TIER_PRICES,
    PriceTable,
    RunCost,
    RunUsage,
    apply_price_overrides,
    check_new_tiers,
    check_price_data,
    merge_price_data,
    merge_run_usage,
    parse_price_table,
    parse_run_report,
    price_run,
)
from simstore.errors import FormatError, InvalidInputError


def default_price_text() -> str:
    """The TOML of the price table shipped with simstore (``simstore/prices.toml``)."""
    return resources.files("simstore").joinpath("prices.toml").read_text(encoding="utf-8")


def read_price_table(files: Sequence[str] = (), overrides: Sequence[str] = ()) -> PriceTable:
    """The shipped price table, with each of ``files`` and then ``overrides`` laid over it.

    A file may be partial: it changes the fields it names and may add tiers (see
    :func:`~simstore.cost.merge_price_data`). ``overrides`` are ``TIER.FIELD=VALUE``
    strings. A missing or unreadable file is an :class:`InvalidInputError` naming it.

    Each file is checked on its own before it is merged (a later file or flag setting
    the same field must not hide a bad value), so an error names the one file that
    holds it; a file that is not UTF-8 TOML is a :class:`FormatError` too.
    """
    import tomllib

    data: dict[str, Any] = tomllib.loads(default_price_text())
    origins = ["the default price table"]
    added: dict[str, str] = {}  # a tier the defaults lack -> the file that added it
    for path in files:
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as exc:
            raise InvalidInputError(f"cannot read price table {path}: {exc.strerror}") from exc
        try:
            extra = tomllib.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise FormatError(
                f"price table {path} is not valid TOML: not UTF-8 text ({exc.reason} at byte "
                f"{exc.start})"
            ) from exc
        except tomllib.TOMLDecodeError as exc:
            raise FormatError(f"price table {path} is not valid TOML: {exc}") from exc
        except RecursionError as exc:
            raise FormatError(
                f"price table {path} is not valid TOML: nested too deeply"
            ) from exc
        check_price_data(extra, origin=f"price table {path}")
        for name in extra.get("tiers", {}):  # a table: check_price_data says so
            if str(name) not in data.get("tiers", {}):
                added.setdefault(str(name), f"price table {path}")
        data = merge_price_data(data, extra)
        origins.append(path)
    data = apply_price_overrides(data, overrides)
    check_new_tiers(data, added)
    if overrides:
        origins.append("--price flags")
    return parse_price_table(data, origin=" + ".join(origins))


def read_run_reports(paths: Sequence[str],
                     priced: Mapping[str, str | None] | None = None) -> RunUsage:
    """The merged :class:`~simstore.cost.RunUsage` of the run reports at ``paths``.

    Several reports are the ranks of one run (see :func:`~simstore.cost.merge_run_usage`).
    ``priced``: the run tiers a price tier is mapped to; a report naming another is an
    :class:`InvalidInputError` naming the report and the tier.
    """
    usages = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                obj = json.load(f)
        except OSError as exc:
            raise InvalidInputError(f"cannot read run report {path}: {exc.strerror}") from exc
        except ValueError as exc:
            raise FormatError(f"run report {path} is not valid JSON: {exc}") from exc
        except RecursionError as exc:
            raise FormatError(f"run report {path} is not valid JSON: nested too deeply") from exc
        usage = parse_run_report(obj, origin=f"run report {path}")
        for tier in usage.tiers:
            if priced is not None and tier.tier not in priced:
                raise InvalidInputError(
                    f"run report {path}: run tier {tier.tier!r} has no price tier; map "
                    f"it, e.g. --tier {tier.tier}=s3-standard"
                )
        usages.append(usage)
    return merge_run_usage(usages)


def run_cost(
    paths: Sequence[str],
    table: PriceTable,
    *,
    tier_prices: Mapping[str, str | None] | None = None,
    cold_tier: str | None = None,
    egress: bool = False,
) -> RunCost:
    """Price the run reports at ``paths`` (one per rank) with ``table``.

    ``tier_prices`` adds to (and overrides) :data:`~simstore.cost.DEFAULT_TIER_PRICES`;
    ``cold_tier`` names the tier cache hits would otherwise have been read from, when the
    report has several remote tiers or none.
    """
    import dataclasses

    mapping = {**DEFAULT_TIER_PRICES, **dict(tier_prices or {})}
    if cold_tier is not None and mapping.get(cold_tier) is None:
        # a tier no price tier is mapped to would price nothing, and say only that no
        # cold tier was given: the name given is the mistake
        raise InvalidInputError(
            f"cold tier {cold_tier!r} has no price tier; name a priced tier "
            f"({', '.join(sorted(k for k, v in mapping.items() if v is not None))}) or map "
            f"it, e.g. --tier {cold_tier}=s3-standard"
        )
    usage = read_run_reports(paths, mapping)
    _check_tier_prices(dict(tier_prices or {}), usage, table, cold_tier)
    if cold_tier is not None:
        usage = dataclasses.replace(usage, cold_tier=cold_tier)
    return price_run(usage, table, mapping, egress=egress)


def _check_tier_prices(given: Mapping[str, str | None], usage: RunUsage,
                       table: PriceTable, cold_tier: str | None) -> None:
    """Refuse a ``--tier RUN=PRICE`` that would price nothing: a typo must not pass.

    ``PRICE`` must be a tier of the table (or none); ``RUN`` a tier the reports name, the
    ``--cold`` tier, or one the defaults know (a mapping kept for runs that read it).
    """
    in_reports = {t.tier for t in usage.tiers} | ({cold_tier} if cold_tier else set())
    for run_tier, price_tier in given.items():
        if price_tier is not None and price_tier not in table.names:
            raise InvalidInputError(
                f"--tier {run_tier}={price_tier}: no price tier {price_tier!r} (tiers: "
                f"{', '.join(table.names)}, or none)"
            )
        if run_tier not in in_reports and run_tier not in DEFAULT_TIER_PRICES:
            raise InvalidInputError(
                f"--tier {run_tier}={price_tier or 'none'}: the run reports have no tier "
                f"{run_tier!r} (their tiers: {', '.join(sorted(in_reports)) or 'none'})"
            )
