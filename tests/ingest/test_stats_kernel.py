"""The compiled sub-block moments give NumPy's numbers, bit for bit.

Shards embed their fields' statistics, so a store ingested where ``simstore._moments`` was
built and one ingested where it was not (no C compiler) must hold the same bytes. Every
summary here is computed twice, with the module and with NumPy alone, and compared as the
JSON a shard would embed.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simstore import stats as stats_module
from simstore.stats import StatsAccumulator, summarise_array


def _instruction_sets() -> list[str]:
    """The module's instruction sets this CPU runs: each is checked against NumPy."""
    kernel = stats_module._kernel
    if kernel is None:
        return ["none"]
    found = []
    for name in ("avx2", "sse2", "c"):
        try:
            kernel.isa(kernel.isa(name))
        except ValueError:
            continue
        found.append(name)
    return found


@pytest.fixture(autouse=True, params=_instruction_sets())
def instruction_set(request):
    """Every test here once with each instruction set the module can use on this CPU."""
    kernel = stats_module._kernel
    if kernel is None:
        yield request.param
        return
    before = kernel.isa(request.param)
    try:
        yield request.param
    finally:
        kernel.isa(before)


def test_the_module_uses_avx2_where_the_cpu_has_it(instruction_set):
    kernel = stats_module._kernel
    assert kernel is not None
    flags: list[str] | None = None  # unknown off Linux: then only what the module says
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    has_avx2 = "avx2" in _instruction_sets()
    assert flags is None or has_avx2 == ("avx2" in flags)
    kernel.isa("sse2")
    if has_avx2:
        assert kernel.isa("avx2") == "sse2"
        assert kernel.isa() == "avx2"
    with pytest.raises(ValueError, match="not available"):
        kernel.isa("avx512-nonesuch")


def _both(monkeypatch, values, components=None):
    with_kernel = summarise_array(values, components)
    with monkeypatch.context() as m:
        m.setattr(stats_module, "_kernel", None)
        numpy_only = summarise_array(values, components)
    return with_kernel, numpy_only


def _same(a, b) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_the_install_built_the_kernel():
    # make test installs the project, which compiles it: the benchmarks measure this path
    assert stats_module._kernel is not None
    assert stats_module._kernel_for(np.zeros(3, np.float32)) is stats_module._kernel
    assert stats_module._kernel_for(np.zeros(3, ">f4")) is None  # not native: NumPy's path
    assert stats_module._kernel_for(np.zeros(3, np.float16)) is None


_SIZES = [1, 2, 7, 8, 9, 127, 128, 129, 1000, 4097, 131_071, 131_072, 131_073, 400_001]


@pytest.fixture(params=["default", "small"])
def sub_blocks(request, monkeypatch):
    """The default sub-blocks, and small ones (many per array, ragged tails)."""
    if request.param == "small":
        monkeypatch.setattr(stats_module, "_SUB_BLOCK_ELEMENTS", 1000)
    return request.param


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("size", _SIZES)
@pytest.mark.parametrize("k", [1, 2, 3, 9])
def test_equal_to_numpy_on_smooth_fields_and_offsets(monkeypatch, sub_blocks, dtype, size, k):
    rng = np.random.default_rng(size)
    for shift, scale in ((0.0, 1.0), (300.0, 2.0), (-7e6, 1e-3), (1e30, 1e28), (0.0, 1e-30)):
        x = (rng.standard_normal((size, k)) * scale + shift).astype(dtype)
        x[:, -1] *= 3  # components apart
        a, b = _both(monkeypatch, x if k > 1 else x[:, 0])
        assert _same(a, b), (shift, scale)
        assert a["count"] == [size] * k and a["components"] == k


def test_the_kernel_stops_where_numpy_does(monkeypatch, sub_blocks):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(300_000)
    x[150_000] = np.nan
    x[250_000] = -np.inf
    a, b = _both(monkeypatch, x)
    assert _same(a, b)
    assert a["nan_count"] == [1] and a["inf_count"] == [1] and a["count"] == [299_998]
    v = rng.standard_normal((200_000, 3)).astype(np.float32)  # one component's NaN
    v[120_000, 2] = np.nan
    a, b = _both(monkeypatch, v)
    assert _same(a, b) and a["nan_count"] == [0, 0, 1]
    big = np.full(300_000, 1e308)  # finite values whose sum overflows: the careful way
    big[::2] = -1e308
    big[7] = 1e308
    a, b = _both(monkeypatch, big)
    assert _same(a, b) and a["max"] == [1e308]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_a_bound_is_found_at_every_place_of_a_step(monkeypatch, dtype, k):
    # the module keeps several minima and maxima side by side (16 values a step for
    # float32, 8 for float64, 4 rows of pairs or triples): an extreme of any component
    # in any lane of any of them, in the unrolled part or the tail, is the bound
    n = 100
    for at in range(n):
        for c in range(k):
            for value, bound in ((-1e6, "min"), (1e6, "max")):
                x = np.linspace(-1.0, 1.0, n * k, dtype=dtype).reshape(n, k)
                x[at, c] = value
                a, b = _both(monkeypatch, x if k > 1 else x[:, 0])
                assert _same(a, b), (at, c, value)
                assert a[bound][c] == value, (at, c, value)


def test_a_zero_bound_is_positive_whatever_the_order(monkeypatch):
    # which zero min() keeps depends on comparison order: both paths write +0.0
    for values in ([0.0, -0.0, 1.0], [-0.0, 0.0, 1.0], [-0.0] * 20, [1.0, -0.0] * 9):
        for dtype in (np.float32, np.float64):
            a, b = _both(monkeypatch, np.asarray(values, dtype))
            assert _same(a, b)
            assert a["min"] == [0.0] and str(a["min"][0]) == "0.0"


def test_blocks_of_one_array_accumulate_alike(monkeypatch):
    # ingest summarises a large field block by block (StatsAccumulator.add_array)
    x = np.random.default_rng(5).standard_normal((12, 50_000)).astype(np.float32)

    def accumulate():
        acc = StatsAccumulator()
        for block in np.array_split(x, 5):
            acc.add_array("u", block, x.shape)
        return acc.to_json()

    with_kernel = accumulate()
    monkeypatch.setattr(stats_module, "_kernel", None)
    assert _same(with_kernel, accumulate())


def test_bad_arguments_are_refused_by_the_module():
    kernel = stats_module._kernel
    values = np.zeros(10, np.float32)
    out = np.empty(1)
    bounds = np.empty(1, np.float32)
    with pytest.raises(TypeError, match="float32 or float64 alike"):
        kernel.sub_blocks(values, 10, 1, out, out, np.empty(1), np.empty(1), np.empty(10))
    with pytest.raises(ValueError, match="do not fit"):  # scratch too short
        kernel.sub_blocks(values, 10, 1, out, out, bounds, bounds, np.empty(5))
    with pytest.raises(ValueError, match="do not fit"):
        kernel.sub_blocks(values, 0, 1, out, out, bounds, bounds, np.empty(10))
    with pytest.raises(ValueError, match="do not fit"):  # a step that splits a row
        kernel.sub_blocks(values, 5, 2, out, out, bounds, bounds, np.empty(10))
    with pytest.raises(ValueError, match="do not fit"):  # ten components
        kernel.sub_blocks(values, 10, 10, out, out, bounds, bounds, np.empty(10))


_floats32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
_floats64 = st.floats(allow_nan=True, allow_infinity=True)


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.lists(_floats32, min_size=1, max_size=300).map(lambda v: np.asarray(v, np.float32)),
        st.lists(_floats64, min_size=1, max_size=300).map(lambda v: np.asarray(v, np.float64)),
    ),
    st.sampled_from([1, 3, 8, 64, 1 << 17]),
    st.sampled_from([1, 2, 3, 5]),
)
def test_any_values_give_numpys_summary(values, step, k):
    values = values[: values.size // k * k].reshape(-1, k) if values.size >= k else values
    original = stats_module._SUB_BLOCK_ELEMENTS
    try:
        stats_module._SUB_BLOCK_ELEMENTS = step
        with np.errstate(all="ignore"):
            with_kernel = summarise_array(values)
            kernel, stats_module._kernel = stats_module._kernel, None
            try:
                numpy_only = summarise_array(values)
            finally:
                stats_module._kernel = kernel
    finally:
        stats_module._SUB_BLOCK_ELEMENTS = original
    assert _same(with_kernel, numpy_only)
