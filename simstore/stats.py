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
import threading
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from simstore.errors import InvalidInputError
from simstore.snapshot import Snapshot

_kernel: types.ModuleType | None
try:  # the compiled sub-block moments; without them, NumPy gives the same numbers
    from simstore import _moments as _kernel
except ImportError:  # pragma: no cover (built by every install with a C compiler)
    _kernel = None

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
_SUB_BLOCK_ELEMENTS = 1 << 17
"""Values per sub-block: a float64 scratch of 1 MiB, which with its 512 KiB of float32
source stays in a 2 MiB L2. Part of the shard format in effect: the statistics embedded in
a shard depend on where the sub-blocks split, so this is fixed, never tuned per machine
(see :func:`_sum_squares`)."""
_SCRATCH = threading.local()
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
    """A JSON-safe Python number from a numpy scalar (ints stay ints, a zero is +0.0).

    A bound that is zero is always written as +0.0: which of -0.0 and +0.0 a minimum or a
    maximum of values holding both returns depends on the order they are compared in (so
    on NumPy's SIMD code for this CPU, and on whether :mod:`simstore._moments` is built).
    """
    if isinstance(value, np.bool_ | bool):
        return int(bool(value))
    if isinstance(value, np.integer):
        return int(value)
    return float(value) + 0.0


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
        m2 = _sum_squares(d)
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
    squares = _sum_squares(d)
    with np.errstate(over="ignore"):
        m2 = np.where(squares > 0, squares * scale * scale, 0.0)
        return mean * scale, m2


def _spread(delta: float, ca: int, cb: int, n: int) -> float:
    """``delta**2 * ca * cb / n``: what two parts' means apart add to their M2.

    Evaluated left to right, as always (the stored bytes stay what they were); where that
    overflows but the true value does not (means about 1e150 apart over many values),
    the weight ``ca * cb / n`` is taken first, so the M2 saturates only when it must.
    """
    term = delta * delta * ca * cb / n
    if math.isfinite(term) or not math.isfinite(delta):
        return term
    return (delta * delta) * (ca * cb / n)


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


def _kernel_for(flat: np.ndarray) -> types.ModuleType | None:
    """:mod:`simstore._moments` where it summarises these values (native float32 / float64)."""
    if (flat.dtype in _KERNEL_DTYPES and flat.dtype.isnative and flat.flags.c_contiguous):
        return _kernel
    return None


_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _exact_in_float64(dtype: np.dtype[Any]) -> bool:
    """Whether every value of ``dtype`` converts to float64 exactly (so min/max survive it)."""
    return dtype.kind == "f" or dtype.itemsize <= 4


def _sum_squares(rows: np.ndarray) -> np.ndarray:
    """Per row, the sum of squares of a C-contiguous float64 (k, n) array (squared in place).

    Squares, then numpy's pairwise sum: plain C whose order of additions is fixed, so the
    result is the same on every CPU. Statistics are embedded in shards, and equal samples
    must give equal bytes wherever they are ingested; a BLAS dot product (faster by about
    a fifth) rounds differently per CPU, as OpenBLAS picks its kernel at run time (its
    Sandy Bridge and Haswell kernels differ in the last bit), and ``np.einsum`` sums in
    SIMD loops whose order may depend on how numpy was built for the platform.
    """
    np.multiply(rows, rows, out=rows)
    return np.asarray(np.add.reduce(rows, axis=1))


def _fast_block(
    flat: np.ndarray, k: int, buf: np.ndarray
) -> tuple[int, list[float], list[float], list[Any], list[Any]] | None:
    """(rows, means, m2s, mins, maxs) of a contiguous 1-D run of ``rows x k`` values.

    One cast of the values into the float64 scratch ``buf`` (laid out component by
    component, so every reduction runs along a contiguous row with SIMD), then a pairwise
    sum, the deviations in place and their sum of squares; min and max on the values (or
    on their exact float64 copies). None when the run holds NaN or Inf, or a moment
    overflows: the caller then takes the careful path.
    """
    m = flat.size
    n = m // k
    kernel = _kernel_for(flat)
    if kernel is not None:
        sums, m2s = np.empty(k), np.empty(k)
        mins, maxs = np.empty(k, flat.dtype), np.empty(k, flat.dtype)
        if not kernel.sub_blocks(flat, m, k, sums, m2s, mins, maxs, buf):
            return None
        return (n, [float(v) for v in sums / n], [float(v) for v in m2s],
                [_py(v) for v in mins], [_py(v) for v in maxs])
    b = buf[:m].reshape(k, n)
    with np.errstate(invalid="ignore"):  # a signalling NaN's cast: found just below
        if k == 1:
            np.copyto(b[0], flat, casting="unsafe")
        else:
            np.copyto(b, flat.reshape(n, k).T, casting="unsafe")
    if k == 1:
        lo, hi = [np.minimum.reduce(flat)], [np.maximum.reduce(flat)]
    elif _exact_in_float64(flat.dtype):
        # the scratch holds the values exactly: reduce its contiguous rows, convert back
        kind = flat.dtype.type
        lo = [kind(v) for v in np.minimum.reduce(b, axis=1)]
        hi = [kind(v) for v in np.maximum.reduce(b, axis=1)]
    else:
        cols = flat.reshape(n, k)
        lo, hi = list(cols.min(axis=0)), list(cols.max(axis=0))
    with np.errstate(over="ignore", invalid="ignore"):
        totals = np.add.reduce(b, axis=1)
        if not np.isfinite(totals).all():
            return None
        means = totals / n
        b -= means[:, None]
        m2 = [float(v) for v in _sum_squares(b)]
    if not all(math.isfinite(v) for v in m2):
        return None
    return n, [float(v) for v in means], m2, [_py(v) for v in lo], [_py(v) for v in hi]


def _fast_run(
    flat: np.ndarray, k: int, buf: np.ndarray, step: int
) -> tuple[dict[str, Any] | None, int]:
    """The summary of the leading finite sub-blocks of a run of values, and their length.

    Sub-block by sub-block (``step`` values each), up to the first one that holds NaN or
    Inf or whose moments overflow: each is cast once into the float64 scratch ``buf``
    (laid out component by component, so every reduction runs along a contiguous row
    with SIMD), its min and max are taken while it is in cache, then its sum, its
    deviations in place and their sum of squares. The sub-blocks' moments merge once at
    the end, vectorised (Chan et al.), where a merge and a dozen small Python steps per
    sub-block used to cost about a third of a 64 Ki-value sub-block's time. Returns the
    summary of the first ``used`` values (None when that is none of them) and ``used``;
    the caller summarises the rest the careful way.
    """
    m = flat.size
    count = -(-m // step)
    sums = np.empty((count, k))
    m2s = np.empty((count, k))
    sizes = np.empty(count)
    kernel = _kernel_for(flat)
    scratch_bounds = k > 1 and _exact_in_float64(flat.dtype) and kernel is None
    # per sub-block bounds: the values' type for a scalar field (or from the kernel),
    # float64 (exact) from the scratch for a vector field
    mins = np.empty((count, k), dtype=np.float64 if scratch_bounds else flat.dtype)
    maxs = np.empty_like(mins)
    if kernel is not None:
        lengths = np.minimum(step, m - np.arange(count) * step) // k
        done = kernel.sub_blocks(flat, step, k, sums.reshape(-1), m2s.reshape(-1),
                                 mins.reshape(-1), maxs.reshape(-1), buf)
        sizes[:done] = lengths[:done]
    else:
        done = _numpy_sub_blocks(flat, k, buf, step, (sums, m2s, mins, maxs, sizes),
                                 scratch_bounds)
    if not done:
        return None, 0
    with np.errstate(over="ignore", invalid="ignore"):
        used = min(m, done * step)
        n = used // k
        sums, m2s, sizes = sums[:done], m2s[:done], sizes[:done]
        means = sums / sizes[:, None]
        mean = np.add.reduce(sums, axis=0) / n
        spread = means - mean
        m2 = np.add.reduce(m2s, axis=0) + np.add.reduce(sizes[:, None] * spread * spread, axis=0)
    if not (np.isfinite(mean).all() and np.isfinite(m2).all()):
        return None, 0
    if k == 1 or scratch_bounds or kernel is not None:
        # a vector field's scratch held the values exactly: back to the values' type
        kind = flat.dtype.type
        lo: list[Any] = [kind(v) for v in np.minimum.reduce(mins[:done], axis=0)]
        hi: list[Any] = [kind(v) for v in np.maximum.reduce(maxs[:done], axis=0)]
    else:
        cols = flat[:used].reshape(n, k)
        lo, hi = list(cols.min(axis=0)), list(cols.max(axis=0))
    summary = {
        "count": [n] * k,
        "nan_count": [0] * k,
        "inf_count": [0] * k,
        "mean": [float(v) for v in mean],
        "m2": [float(v) for v in m2],
        "min": [_py(v) for v in lo],
        "max": [_py(v) for v in hi],
        "components": k,
    }
    return summary, used


def _numpy_sub_blocks(
    flat: np.ndarray, k: int, buf: np.ndarray, step: int,
    out: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    scratch_bounds: bool,
) -> int:
    """NumPy's moments of the leading finite sub-blocks of ``flat``; how many those are.

    Fills ``out = (sums, m2s, mins, maxs, sizes)`` row by row, each sub-block cast once into
    the float64 scratch ``buf`` (component by component), as :mod:`simstore._moments`'s
    ``sub_blocks`` does in C (the same numbers: it stands in for this loop where built).
    Stops at the first sub-block holding NaN or Inf or whose moments overflow.
    """
    sums, m2s, mins, maxs, sizes = out
    done = 0
    with np.errstate(over="ignore", invalid="ignore"):
        for i, start in enumerate(range(0, flat.size, step)):
            block = flat[start : start + step]
            rows = block.size // k
            b = buf[: block.size].reshape(k, rows)
            if k == 1:
                np.copyto(b[0], block, casting="unsafe")
                mins[i, 0] = np.minimum.reduce(block)
                maxs[i, 0] = np.maximum.reduce(block)
            else:
                np.copyto(b, block.reshape(rows, k).T, casting="unsafe")
                if scratch_bounds:
                    np.minimum.reduce(b, axis=1, out=mins[i])
                    np.maximum.reduce(b, axis=1, out=maxs[i])
            total = np.add.reduce(b, axis=1, out=sums[i])
            if not np.isfinite(total).all():
                break
            b -= (total / rows)[:, None]
            m2s[i] = _sum_squares(b)
            if not np.isfinite(m2s[i]).all():
                break
            sizes[i] = rows
            done = i + 1
    return done


def summarise_array(values: np.ndarray, components: int | None = None) -> dict[str, Any]:
    """The summary of a numeric array (bool counts as 0/1).

    ``components`` defaults to :func:`components_of` the array's shape; it must divide the
    array's size (the array's last axis). Work happens in float64 sub-blocks of bounded size,
    so the temporary memory does not grow with the array. Cost: one cast into a cache-sized
    float64 scratch per sub-block and a few in-cache passes over it (sum, deviations, squares),
    plus min and max over the values; a sub-block that holds NaN or Inf, or whose moments
    overflow, is summarised again the careful way (masked, scaled).
    """
    arr = np.asarray(values)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"cannot summarise an array of dtype {arr.dtype}")
    k = components if components is not None else components_of(arr.shape)
    if arr.dtype.kind == "b":
        arr = arr.view(np.uint8)
    flat = arr.reshape(-1)
    if flat.size % k:
        raise ValueError(f"{k} components do not divide an array of {flat.size} values")
    step = max(1, _SUB_BLOCK_ELEMENTS // k) * k
    buf = _scratch(min(step, flat.size))
    # the leading finite sub-blocks in one run (one sub-block: the loop below has less
    # to set up); from the first with NaN, Inf or an overflow on, sub-block by sub-block
    first = 0
    prefix: dict[str, Any] | None = None
    if flat.size > step:
        prefix, first = _fast_run(flat, k, buf, step)
        if prefix is not None and first == flat.size:
            return prefix
    # finite sub-blocks merge here (Chan et al.), careful ones into ``slow``
    count = 0
    mean = [0.0] * k
    m2 = [0.0] * k
    lo: list[Any] = [None] * k
    hi: list[Any] = [None] * k
    slow: dict[str, Any] | None = None
    for start in range(first, flat.size, step):
        block = flat[start : start + step]
        part = _fast_block(block, k, buf)
        if part is None:
            block2 = block.reshape(-1, k)
            with np.errstate(over="ignore", invalid="ignore"):
                total = block2.sum(axis=0, dtype=np.float64)
            fin = block.dtype.kind != "f" or bool(np.isfinite(total).all())
            careful = _finite_block(block2) if fin else _masked_block(block2)
            slow = careful if slow is None else merge_field_stats(slow, careful)
            continue
        n, pmean, pm2, plo, phi = part
        total_n = count + n
        for j in range(k):
            delta = pmean[j] - mean[j]
            mean[j] += delta * n / total_n
            m2[j] += pm2[j] + _spread(delta, count, n, total_n)
            lo[j] = plo[j] if lo[j] is None else min(lo[j], plo[j])
            hi[j] = phi[j] if hi[j] is None else max(hi[j], phi[j])
        count = total_n
    fast = _empty(k)
    if count:
        fast.update(
            count=[count] * k,
            mean=[_bounded(v) for v in mean],
            m2=[_bounded(v) for v in m2],
            min=lo,
            max=hi,
        )
    rest = fast if slow is None else merge_field_stats(fast, slow) if count else slow
    return rest if prefix is None else merge_field_stats(prefix, rest)


def _scratch(size: int) -> np.ndarray:
    """This thread's float64 scratch of at least ``size`` values.

    Kept between calls: fresh memory for each call cost a page fault per 4 KiB.
    """
    buf: np.ndarray | None = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.size < size:
        buf = np.empty(max(size, _SUB_BLOCK_ELEMENTS))
        _SCRATCH.buf = buf
    return buf[:size]


def summarise_scalar(value: bool | int | float | np.generic) -> dict[str, Any]:
    """The one-component summary of a scalar parameter."""
    if isinstance(value, bool | np.bool_):
        exact: int | float = int(value)
    elif isinstance(value, np.integer) or (type(value) is int and -(2**63) <= value < 2**63):
        exact = int(value)
    elif isinstance(value, float | np.floating) and math.isfinite(value):
        exact = float(value) + 0.0  # -0.0 is written +0.0, as an array's zero bound is
    else:  # NaN, Inf, unusual types: the array path says what they count as
        return summarise_array(np.asarray([value]).reshape(1, 1), components=1)
    return {
        "count": [1],
        "nan_count": [0],
        "inf_count": [0],
        "mean": [float(exact)],
        "m2": [0.0],
        "min": [exact],
        "max": [exact],
        "components": 1,
    }


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

    Exact up to float64 rounding, and associative in exact arithmetic only: merging the
    same summaries in another grouping can change the last bits of ``mean`` and ``std``
    (a snapshot's statistics depend on the shards and commits that built it, not only on
    its samples). When the component counts differ
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
            m2 = _bounded(float(a["m2"][i]) + float(b["m2"][i]) + _spread(delta, ca, cb, n))
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


def merge_stats(summaries: Iterable[Mapping[str, Mapping[str, Any]]]) -> dict[str, Any]:
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
    """The per-field summaries; of a snapshot, those of fields its schema has as numeric.

    A field whose kind changed keeps its old summary in the merged statistics.
    """
    stats = source.stats if isinstance(source, Snapshot) else source
    fields = stats.get("fields", stats)
    if not isinstance(fields, Mapping):
        return {}
    if isinstance(source, Snapshot):
        numeric = {s.name for s in source.schema if s.kind in ("tensor", "scalar")}
        return {name: s for name, s in fields.items() if name in numeric}
    return fields


def normalisation(
    snapshot: Snapshot | Mapping[str, Any], fields: Iterable[str] | None = None, *,
    allow_inexact: bool = False,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{field: (mean, std)}`` from a snapshot's merged statistics, for normalising.

    Each value is a pair of float64 arrays of shape ``(components,)``, so ``(x - mean) / std``
    broadcasts over a vector field's last axis and over any scalar field. A component with
    no finite values gets mean 0 and std 1; a constant (its minimum equal to its maximum,
    or zero spread) gets std 1 and the constant as its mean, so it normalises to 0
    exactly (its mean and std, rounded, need not say it is one). Either way the
    expression is always safe. ``snapshot`` may also be a snapshot's ``stats`` mapping.

    Given a :class:`Snapshot` with statistics, every numeric field of its schema has an
    entry: one whose arrays were all empty has no summary (ingest summarises values, and
    an empty array has none), so it gets ``([0.], [1.])``, one component, which
    broadcasts over any shape; a field the schema no longer has as numeric (its kind
    changed under ``--allow-schema-change``) has none.

    Statistics marked inexact (``"exact": false``: samples were overwritten or deleted
    since they were merged, and the old values still count) raise
    :class:`InvalidInputError` unless ``allow_inexact``: constants that still hold the
    values of samples the snapshot no longer has would normalise silently wrong.
    """
    source = snapshot.stats if isinstance(snapshot, Snapshot) else snapshot
    if not allow_inexact and isinstance(source, Mapping) and source.get("exact") is False:
        what = f"snapshot {snapshot.id}" if isinstance(snapshot, Snapshot) else "these statistics"
        raise InvalidInputError(
            f"{what}: statistics are not exact (samples were overwritten or deleted since "
            "they were merged, and their old values still count); ingest the dataset again "
            "with --mode replace for exact ones, or pass allow_inexact=True"
        )
    stats = dict(_fields_of(snapshot))
    if isinstance(snapshot, Snapshot) and "fields" in snapshot.stats:
        for spec in snapshot.schema:
            if spec.kind in ("tensor", "scalar") and spec.name not in stats:
                stats[spec.name] = _empty(1)
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
        # a constant: its bounds are exact, its mean and std need not be (the mean of
        # 0.1 taken 1,000 times is 0.10000000000000002, its std 1.4e-17, which would
        # make the constant -1): the constant itself and std 1, so it normalises to 0
        bounds = zip(summary.get("min") or (), summary.get("max") or (), strict=True)
        for j, (lo, hi) in enumerate(bounds):
            if not empty[j] and _is_constant(lo, hi):
                mean[j], std[j] = float(lo), 1.0
        std[~np.isfinite(std) | (std == 0.0)] = 1.0
        out[name] = (mean, std)
    return out


def _is_constant(lo: Any, hi: Any) -> bool:
    """Whether a component's bounds say all its values are one finite number."""
    try:
        a, b = float(lo), float(hi)
    except (TypeError, ValueError):
        return False
    return math.isfinite(a) and a == b


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
