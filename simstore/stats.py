"""Per-field statistics that merge exactly across blocks, files, shards and snapshots. Pure.

For each numeric field (tensor or scalar) a *summary* holds, per component: ``count`` (finite
values), ``nan_count``, ``inf_count``, ``mean``, ``m2`` (sum of squared deviations from the
mean, for the standard deviation), ``min`` and ``max``, all over finite values only, so a
summary is always valid JSON (snapshots are canonical JSON, which refuses NaN). ``components``
says how many there are. Finite values so large that a mean or an m2 overflows float64
(beyond about 1.8e308) saturate at the largest float64; min and max stay exact.

Components: a tensor whose last axis is short (``2 <= shape[-1] <= MAX_COMPONENTS``, with at
least two axes) is a vector field, such as mesh ``points`` (N x 3) or a velocity field
``[t, x, y, 2]``, and gets one summary entry per component of that axis; every other field
has one component. When two summaries of one field disagree on the number of components,
both are collapsed to one component before merging, so the merge stays exact.

Summaries merge with Chan et al.'s parallel update, in float64. That is what makes a
snapshot's statistics exact for the whole revision without re-reading old shards: a commit
merges the new files' summaries into its parent's.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from simstore.snapshot import Snapshot

__all__ = [
    "MAX_COMPONENTS",
    "StatsAccumulator",
    "collapse_components",
    "components_of",
    "field_table",
    "merge_field_stats",
    "merge_stats",
    "normalisation",
    "std_of",
    "summarise_array",
    "summarise_scalar",
]

MAX_COMPONENTS = 9
_FLOAT_MAX = sys.float_info.max
_SUB_BLOCK_ELEMENTS = 1 << 18  # float64 temporaries of 2 MiB: they stay in cache
_LISTS = ("count", "nan_count", "inf_count", "mean", "m2", "min", "max")


def components_of(shape: Sequence[int]) -> int:
    """How many components a tensor of this shape has (its last axis when short)."""
    if len(shape) >= 2 and 2 <= int(shape[-1]) <= MAX_COMPONENTS:
        return int(shape[-1])
    return 1


def _empty(k: int) -> dict[str, Any]:
    return {
        "count": [0] * k,
        "nan_count": [0] * k,
        "inf_count": [0] * k,
        "mean": [0.0] * k,
        "m2": [0.0] * k,
        "min": [None] * k,
        "max": [None] * k,
        "components": k,
    }


def _py(value: Any) -> Any:
    """A JSON-safe Python number from a numpy scalar (ints stay ints)."""
    if isinstance(value, np.bool_ | bool):
        return int(bool(value))
    if isinstance(value, np.integer):
        return int(value)
    return float(value)


def _finite_block(x: np.ndarray) -> dict[str, Any]:
    """Summary of a 2-D block (rows x components) known to hold only finite values."""
    n, k = x.shape
    # reduce along contiguous rows of a (components x values) copy: numpy reduces a long
    # contiguous axis with SIMD, but an (n, 1) or (n, 3) array's axis 0 one value at a time
    cols = np.ascontiguousarray(x.T) if k > 1 else x.reshape(1, n)
    d = cols.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        mean = d.sum(axis=1) / n
        d -= mean[:, None]
        m2 = np.einsum("ij,ij->i", d, d)
    if not (np.isfinite(mean).all() and np.isfinite(m2).all()):
        mean, m2 = _scaled_moments(cols)
    lo, hi = cols.min(axis=1), cols.max(axis=1)
    return {
        "count": [n] * k,
        "nan_count": [0] * k,
        "inf_count": [0] * k,
        "mean": [_bounded(float(v)) for v in mean],
        "m2": [_bounded(float(v)) for v in m2],
        "min": [_py(v) for v in lo],
        "max": [_py(v) for v in hi],
        "components": k,
    }


def _scaled_moments(cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and m2 of finite values so large that their sum or squares overflow float64.

    Each component is scaled by a power of two near its largest magnitude (exact), so the
    mean is right; an m2 beyond float64's range saturates (see :func:`_bounded`).
    """
    d = cols.astype(np.float64)
    peak = np.abs(d).max(axis=1)
    exponent = np.minimum(np.floor(np.log2(np.where(peak > 0, peak, 1.0))), 1023.0)
    scale = np.exp2(exponent)
    d /= scale[:, None]
    mean = d.sum(axis=1) / d.shape[1]
    d -= mean[:, None]
    squares = np.einsum("ij,ij->i", d, d)
    with np.errstate(over="ignore"):
        m2 = np.where(squares > 0, squares * scale * scale, 0.0)
        return mean * scale, m2


def _bounded(value: float) -> float:
    """A moment that overflowed float64 saturates at its largest finite value.

    Finite inputs can only overflow (never give NaN honestly), and summaries must stay
    valid JSON: snapshots, staging entries and the ingest journal are canonical JSON.
    """
    if math.isfinite(value):
        return value
    return -_FLOAT_MAX if value < 0 else _FLOAT_MAX


def _masked_block(x: np.ndarray) -> dict[str, Any]:
    """Summary of a 2-D float block holding NaN or Inf: moments over finite values only."""
    k = x.shape[1]
    out = _empty(k)
    for j in range(k):
        col = x[:, j]
        nan = np.isnan(col)
        inf = np.isinf(col)
        finite = col[~(nan | inf)]
        out["nan_count"][j] = int(nan.sum())
        out["inf_count"][j] = int(inf.sum())
        if finite.size:
            part = _finite_block(finite.reshape(-1, 1))
            for name in ("count", "mean", "m2", "min", "max"):
                out[name][j] = part[name][0]
    return out


def summarise_array(values: np.ndarray, components: int | None = None) -> dict[str, Any]:
    """The summary of a numeric array (bool counts as 0/1).

    ``components`` defaults to :func:`components_of` the array's shape; it must divide the
    array's size (the array's last axis). Work happens in float64 sub-blocks of bounded size,
    so the temporary memory does not grow with the array. Cost: one pass, plus a masked pass
    over sub-blocks that hold NaN or Inf.
    """
    arr = np.asarray(values)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"cannot summarise an array of dtype {arr.dtype}")
    k = components if components is not None else components_of(arr.shape)
    if arr.dtype.kind == "b":
        arr = arr.astype(np.uint8)
    flat = arr.reshape(-1, k) if arr.size else arr.reshape(0, k)
    result = _empty(k)
    rows = max(1, _SUB_BLOCK_ELEMENTS // k)
    for start in range(0, flat.shape[0], rows):
        block = flat[start : start + rows]
        if block.dtype.kind == "f":
            with np.errstate(over="ignore", invalid="ignore"):
                total = block.sum(axis=0, dtype=np.float64)
            part = _finite_block(block) if np.isfinite(total).all() else _masked_block(block)
        else:
            part = _finite_block(block)
        result = merge_field_stats(result, part)
    return result


def summarise_scalar(value: bool | int | float | np.generic) -> dict[str, Any]:
    """The one-component summary of a scalar parameter."""
    return summarise_array(np.asarray([value]).reshape(1, 1), components=1)


def collapse_components(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The same values summarised as a single component (exact)."""
    k = len(summary["count"])
    out = _empty(1)
    for j in range(k):
        part = {name: [summary[name][j]] for name in _LISTS if name in summary}
        part.setdefault("inf_count", [0])
        out = merge_field_stats(out, part)
    return out


def merge_field_stats(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Merge two per-field summaries (dicts of equal-length per-component lists).

    Exact (up to float64 rounding) and associative. When the component counts differ
    (a field's last axis changed under ``--allow-schema-change``), both sides are first
    collapsed to one component.
    """
    na, nb = list(a["count"]), list(b["count"])
    if len(na) != len(nb):
        return merge_field_stats(collapse_components(a), collapse_components(b))
    out: dict[str, list[Any]] = {k: [] for k in _LISTS}
    zeros = [0] * len(na)
    for i in range(len(na)):
        ca, cb = int(na[i]), int(nb[i])
        n = ca + cb
        ma, mb = float(a["mean"][i]), float(b["mean"][i])
        if n == 0:
            mean, m2 = 0.0, 0.0
        elif ca == 0:
            mean, m2 = mb, float(b["m2"][i])
        elif cb == 0:
            mean, m2 = ma, float(a["m2"][i])
        else:
            delta = mb - ma
            mean = ma + delta * cb / n
            if not math.isfinite(mean):  # delta overflowed: weigh the means instead
                mean = ma * (ca / n) + mb * (cb / n)
            m2 = _bounded(float(a["m2"][i]) + float(b["m2"][i]) + delta * delta * ca * cb / n)
            mean = _bounded(mean)
        out["count"].append(n)
        out["nan_count"].append(int(a["nan_count"][i]) + int(b["nan_count"][i]))
        out["inf_count"].append(
            int(a.get("inf_count", zeros)[i]) + int(b.get("inf_count", zeros)[i])
        )
        out["mean"].append(mean)
        out["m2"].append(m2)
        out["min"].append(_pick(a["min"][i], b["min"][i], min))
        out["max"].append(_pick(a["max"][i], b["max"][i], max))
    merged: dict[str, Any] = dict(out)
    merged["components"] = len(na)
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
    """Population standard deviation per component (NaN where the count is 0)."""
    return [
        math.sqrt(max(float(m2), 0.0) / int(n)) if int(n) else float("nan")
        for m2, n in zip(summary["m2"], summary["count"], strict=True)
    ]


class StatsAccumulator:
    """Accumulates ``{field: summary}`` over samples and blocks of one file or shard.

    The component count of a field is fixed by the first array seen, so blocks of one
    large array (split along its first axis) summarise like the whole array.
    """

    def __init__(self) -> None:
        self._fields: dict[str, dict[str, Any]] = {}
        self._components: dict[str, int] = {}

    def add_array(self, name: str, values: np.ndarray, shape: Sequence[int] | None = None) -> None:
        """Add a numeric array (or one block of it; ``shape`` is then the whole array's)."""
        k = self._components.setdefault(name, components_of(shape or values.shape))
        if values.size and k > 1 and values.shape[-1] != k:
            k = 1
        self.merge_field(name, summarise_array(values, components=k))

    def add_scalar(self, name: str, value: bool | int | float | np.generic) -> None:
        """Add one scalar parameter value."""
        self.merge_field(name, summarise_scalar(value))

    def merge_field(self, name: str, summary: Mapping[str, Any]) -> None:
        """Merge a ready summary of one field."""
        prev = self._fields.get(name)
        self._fields[name] = merge_field_stats(prev, summary) if prev else dict(summary)

    def merge(self, fields: Mapping[str, Mapping[str, Any]]) -> None:
        """Merge another ``{field: summary}`` mapping."""
        for name, summary in fields.items():
            self.merge_field(name, summary)

    def to_json(self) -> dict[str, dict[str, Any]]:
        """The summaries, sorted by field name."""
        return {name: dict(self._fields[name]) for name in sorted(self._fields)}


def _fields_of(source: Snapshot | Mapping[str, Any]) -> Mapping[str, Any]:
    stats = source.stats if isinstance(source, Snapshot) else source
    fields = stats.get("fields", stats)
    return fields if isinstance(fields, Mapping) else {}


def normalisation(
    snapshot: Snapshot | Mapping[str, Any], fields: Iterable[str] | None = None
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{field: (mean, std)}`` from a snapshot's merged statistics, for normalising.

    Each value is a pair of float64 arrays of shape ``(components,)``, so ``(x - mean) / std``
    broadcasts over a vector field's last axis and over any scalar field. A component with
    no finite values or a zero standard deviation gets mean 0 and std 1, so the expression
    is always safe. ``snapshot`` may also be a snapshot's ``stats`` mapping.
    """
    stats = _fields_of(snapshot)
    wanted = set(fields) if fields is not None else None
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name in sorted(stats):
        if wanted is not None and name not in wanted:
            continue
        summary = stats[name]
        mean = np.array([float(m) for m in summary["mean"]], dtype=np.float64)
        std = np.array(std_of(summary), dtype=np.float64)
        empty = np.array([int(c) == 0 for c in summary["count"]])
        mean[empty] = 0.0
        std[~np.isfinite(std) | (std == 0.0)] = 1.0
        out[name] = (mean, std)
    return out


def field_table(snapshot: Snapshot | Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per field component: field, component, count, NaN/Inf counts, mean, std, min, max."""
    stats = _fields_of(snapshot)
    rows: list[dict[str, Any]] = []
    for name in sorted(stats):
        s = stats[name]
        stds = std_of(s)
        k = len(s["count"])
        for j in range(k):
            count = int(s["count"][j])
            rows.append(
                {
                    "field": name,
                    "component": j if k > 1 else None,
                    "count": count,
                    "nan_count": int(s["nan_count"][j]),
                    "inf_count": int(s.get("inf_count", [0] * k)[j]),
                    "mean": float(s["mean"][j]) if count else None,
                    "std": stds[j] if count else None,
                    "min": s["min"][j],
                    "max": s["max"][j],
                }
            )
    return rows
