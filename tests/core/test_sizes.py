"""The one rule for byte sizes (simstore._sizes), and that every reader of a size keeps it.

``KB``/``MB``/... are powers of 1000, ``KiB``/``MiB``/... and a bare ``K``/``M``/... powers
of 1024, a bare number is bytes, the unit's case does not matter, a fraction rounds down.
Before, ingest read ``1KB`` as 1024 bytes while the loader read it as 1000.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st
from simstore.loaders._checks import check_bytes

from simstore._sizes import MAX_SIZE, SizeError, parse_size
from simstore.errors import InvalidInputError
from simstore.ingest import parse_size as ingest_parse_size

UNITS = {
    "B": 1,
    "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4, "PB": 1000**5,
    "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4, "PiB": 1024**5,
    "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5,
}  # fmt: skip


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("0", 0),
        ("4096", 4096),
        ("1KB", 1000),
        ("1KiB", 1024),
        ("1K", 1024),
        ("20GB", 20 * 10**9),
        ("256MiB", 256 << 20),
        ("2TB", 2 * 10**12),
        ("2TiB", 2 << 40),
        ("1kb", 1000),
        ("1kib", 1024),
        ("1KIB", 1024),
        ("1gB", 10**9),
        ("  1.5 GiB  ", 3 << 29),
        ("1.5GB", 1_500_000_000),
        ("0.1KB", 100),  # exact: 0.1 * 1000 in floats is 100.00000000000001
        ("0.3KB", 300),  # and 0.3 * 1000 is 299.99999999999994
        ("1.5", 1),  # rounded down
        ("0.5", 0),
        (".5KiB", 512),
        ("1.KiB", 1024),
        ("1000B", 1000),
        ("9223372036854775807", MAX_SIZE),
        ("8388607.999999999999999999TiB", MAX_SIZE),
    ],
)
def test_the_rule(text, size):
    assert parse_size(text) == size
    assert type(parse_size(text)) is int


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("-1", "cannot be negative"),
        ("-1KiB", "cannot be negative"),
        ("+1", "not a size"),
        ("nan", "not a finite number"),
        ("NaN", "not a finite number"),
        ("inf", "not a finite number"),
        ("-inf", "not a finite number"),
        ("infGiB", "not a finite number"),
        ("1e9", "not a size"),
        ("1XB", "unknown unit 'XB'"),
        ("1 EiB", "unknown unit 'EiB'"),
        ("1Kb/s", "not a size"),
        ("lots", "not a size"),
        ("1,000", "not a size"),
        ("1 2", "not a size"),
        ("1..2KB", "not a size"),
        ("KB", "not a size"),
        ("\u0661KB", "not a size"),  # an Arabic-Indic digit: decimal digits are ASCII
        ("9223372036854775808", "too large"),
        ("9000000TiB", "too large"),
        ("1" * 101, "too many digits"),
    ],
)
def test_refusals_say_why_in_one_line(text, reason):
    with pytest.raises(SizeError) as info:
        parse_size(text)
    assert reason in str(info.value) and "\n" not in str(info.value)


def test_a_non_string_is_refused():
    with pytest.raises(SizeError, match="expected a string, got int"):
        parse_size(1024)  # type: ignore[arg-type]


sized = st.sampled_from(sorted(UNITS)).flatmap(
    lambda unit: st.tuples(st.integers(0, MAX_SIZE // UNITS[unit]), st.just(unit))
)


@given(sized)
def test_whole_numbers_round_trip(n_unit):
    n, unit = n_unit
    for text in (f"{n}{unit}", f"{n} {unit.lower()}", f" {n}{unit.upper()} "):
        assert parse_size(text) == n * UNITS[unit]


@given(
    st.integers(min_value=0, max_value=8000),
    st.integers(min_value=0, max_value=999),
    st.sampled_from(sorted(UNITS)),
)
def test_fractions_round_down_exactly(whole, thousandths, unit):
    exact = Fraction(whole * 1000 + thousandths, 1000) * UNITS[unit]
    got = parse_size(f"{whole}.{thousandths:03d}{unit}")
    assert got <= exact < got + 1


@given(st.integers(min_value=0, max_value=MAX_SIZE))
def test_every_byte_count_reads_back(n):
    assert parse_size(str(n)) == n


# -- each reader of a size applies the rule, and names its option --------------------


@pytest.mark.parametrize(("text", "size"), [("1KB", 1000), ("1KiB", 1024), ("1k", 1024)])
def test_ingest_reads_sizes_by_the_rule(text, size):
    assert ingest_parse_size(text) == size


def test_ingest_refusals_name_the_option():
    with pytest.raises(InvalidInputError, match=r"invalid size '1XB': unknown unit 'XB'"):
        ingest_parse_size("1XB")
    with pytest.raises(InvalidInputError, match=r"invalid shard_size '0.5': must be positive"):
        ingest_parse_size("0.5", "shard_size")
    with pytest.raises(InvalidInputError, match=r"invalid size 'inf': not a finite number"):
        ingest_parse_size("inf")


@pytest.mark.parametrize(
    ("text", "size"), [("1KB", 1000), ("1KiB", 1024), ("1K", 1024), ("1kib", 1024), ("512", 512)]
)
def test_the_loader_reads_sizes_by_the_rule(text, size):
    assert check_bytes(text, "cache_limit") == size


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("-5MiB", "invalid cache_limit '-5MiB': a size cannot be negative"),
        ("nanKB", "invalid cache_limit 'nanKB': not a finite number"),
        ("", "invalid cache_limit '': empty"),
        ("1 XB", "invalid cache_limit '1 XB': unknown unit 'XB'"),
        ("0.5", "cache_limit must be positive, got 0 bytes"),
    ],
)
def test_loader_refusals_name_the_parameter(text, message):
    with pytest.raises(InvalidInputError) as info:
        check_bytes(text, "cache_limit")
    assert message in str(info.value)
