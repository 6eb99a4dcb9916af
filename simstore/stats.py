"""Per-field statistics that merge exactly across shards and snapshots. Pure.

For each numeric field: count, NaN count, mean, M2 (sum of squared deviations, for the
standard deviation), min and max, per component. Two summaries merge with Chan et al.'s
parallel update, so a snapshot that adds a shard merges its summary without re-reading
old shards.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["merge_field_stats", "merge_stats", "std_of"]


def merge_field_stats(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Merge two per-field summaries (dicts of equal-length per-component lists)."""
    na, nb = list(a["count"]), list(b["count"])
    if len(na) != len(nb):
        # component count changed (schema change allowed): keep the newer summary
        return dict(b)
    out: dict[str, list[Any]] = {k: [] for k in ("count", "nan_count", "mean", "m2", "min", "max")}
    for i in range(len(na)):
        ca, cb = int(na[i]), int(nb[i])
        n = ca + cb
        ma, mb = float(a["mean"][i]), float(b["mean"][i])
        if n == 0:
            mean, m2 = 0.0, 0.0
        else:
            delta = mb - ma
            mean = ma + delta * cb / n
            m2 = float(a["m2"][i]) + float(b["m2"][i]) + delta * delta * ca * cb / n
        out["count"].append(n)
        out["nan_count"].append(int(a["nan_count"][i]) + int(b["nan_count"][i]))
        out["mean"].append(mean)
        out["m2"].append(m2)
        out["min"].append(_pick(a["min"][i], b["min"][i], min))
        out["max"].append(_pick(a["max"][i], b["max"][i], max))
    merged: dict[str, Any] = dict(out)
    for extra in ("components",):
        if extra in b:
            merged[extra] = b[extra]
    return merged


def _pick(x: Any, y: Any, fn: Any) -> Any:
    if x is None:
        return y
    if y is None:
        return x
    return fn(x, y)


def merge_stats(summaries: Sequence[Mapping[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """Merge whole-sample-set summaries ({field: summary}) in order."""
    out: dict[str, Any] = {}
    for summary in summaries:
        for name, fs in summary.items():
            out[name] = merge_field_stats(out[name], fs) if name in out else dict(fs)
    return out


def std_of(summary: Mapping[str, Any]) -> list[float]:
    """Population standard deviation per component."""
    return [
        math.sqrt(float(m2) / int(n)) if int(n) else float("nan")
        for m2, n in zip(summary["m2"], summary["count"], strict=True)
    ]
