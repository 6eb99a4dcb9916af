"""Bad price files, bad --price flags and bad run reports: one line, the right exit code.

Each case is a bug that was reached from the command line: a bad file hidden by a later
one, a traceback on a malformed file, a flag checked more loosely than a file, a foreign
JSON priced as a $0 run, and NaN written into ``--json``.
"""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner
from simstore.cli import main

from simstore.cost import apply_price_overrides, parse_run_report
from simstore.errors import FormatError, InvalidInputError

OK = "format_version = 1\n[tiers.s3-standard]\nstorage_per_gib_month = 0.02\n"
REPORT = {
    "format_version": 1,
    "kind": "simstore-loader-report",
    "epochs": [0],
    "seconds": 60.0,
    "tiers": {"s3": {"bytes": 2**20, "requests": 10}},
    "cache": {"hits": 1, "misses": 1, "fill_bytes": 100},
}


def cli(*args: str, code: int) -> str:
    """Run simstore; the error must be one ``error:`` line (a traceback would raise here)."""
    result = CliRunner().invoke(main, ["--store", "memory://unused", *args], catch_exceptions=False)
    assert result.exit_code == code, result.output
    if code:
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return result.output


@pytest.fixture
def files(tmp_path):
    def write(name: str, text: str | bytes) -> str:
        path = tmp_path / name
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)
        return str(path)

    return write


def report_file(files, obj: object) -> str:
    return files("r.json", obj if isinstance(obj, str) else json.dumps(obj))


# -- price files are checked one by one ------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ("format_version = 1\n[tiers.s3-standard]\nstorage_per_gib_month = -1\n", "non-negative"),
        ("format_version = 7\n[tiers.s3-standard]\nstorage_per_gib_month = 0.01\n", "version 7"),
        ("[tiers.s3-standard]\nmin_object_bytes = 1.5\n", "whole number"),
        ("[tiers.s3-standard]\ncolour = 1\n", "unknown fields"),
    ],
)
def test_a_bad_price_file_is_refused_even_when_a_later_file_covers_it(files, bad, match):
    bad_path, ok_path = files("badb.toml", bad), files("ok.toml", OK)
    p1 = files("p1.toml", "[tiers.gcs-standard]\nget_per_1000 = 0.0005\n")
    for command in (["prices"], ["cost", "--run", report_file(files, REPORT)]):
        out = cli(*command, "--prices", p1, "--prices", bad_path, "--prices", ok_path, code=7)
        assert match in out and "badb.toml" in out
        assert "p1.toml" not in out and "ok.toml" not in out and "default" not in out


def test_a_bad_price_file_is_refused_even_when_a_flag_covers_it(files):
    bad = files("bad.toml", "[tiers.s3-standard]\nstorage_per_gib_month = -1\n")
    out = cli(
        "prices", "--prices", bad, "--price", "s3-standard.storage_per_gib_month=0.02", code=7
    )
    assert "bad.toml" in out and "storage_per_gib_month" in out


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("format_version = 1\ntiers = 3\n", "tiers"),
        ('tiers = ["s3-standard"]\n', "tiers"),
        ("[tiers]\ns3-standard = 3\n", "s3-standard"),
        (b"\x00\xff\xfe", "not valid TOML"),
        ("format_version = true\n", "format_version"),
        ('currency = "EUR"\n', "EUR"),
        ("[tiers.s3-standard]\nstorage_per_gib_month = nan\n", "finite"),
        ("[tiers.local-nvme]\ndrive_capacity_bytes = 0\n", "positive"),
        ("[tiers.x]\nstorage_per_gib_month = 1\ndrive_usd = 1\n", "not both"),
    ],
)
def test_malformed_price_files_are_one_line_format_errors(files, content, match):
    out = cli("prices", "--prices", files("t.toml", content), code=7)
    assert match in out and "t.toml" in out


def test_a_partial_price_file_is_still_accepted(files):
    path = files("p.toml", "[tiers.local-nvme]\ndrive_usd = 2000\n")
    out = json.loads(cli("prices", "--json", "--prices", path, code=0))
    assert out["tiers"]["local-nvme"]["storage_per_gib_month"] == pytest.approx(0.00777, rel=1e-3)


def test_check_price_data_names_the_origin():
    from simstore.cost import check_price_data

    check_price_data({"tiers": {"s3-standard": {"get_per_1000": 0.1}}}, origin="p.toml")
    with pytest.raises(FormatError, match="p.toml, tier 'a', get_per_1000"):
        check_price_data({"tiers": {"a": {"get_per_1000": -1}}}, origin="p.toml")


# -- --price flags are checked like files ----------------------------------------------


@pytest.mark.parametrize(
    ("flag", "match"),
    [
        ("s3-standard.min_object_bytes=1.5", "whole number"),
        ("s3-standard.storage_per_gib_month=-1", "non-negative"),
        ("s3-standard.storage_per_gib_month=nan", "finite"),
        ("s3-standard.get_per_1000=inf", "finite"),
        ("s3-standard.colour=1", "unknown field"),
        ("local-nvme.drive_capacity_bytes=0", "positive"),
    ],
)
def test_price_flags_get_the_checks_of_a_file(flag, match):
    out = cli("prices", "--price", flag, code=2)
    assert match in out and f"--price {flag}" in out and "default" not in out


def test_whole_number_flags_keep_their_value():
    out = json.loads(
        cli("prices", "--json", "--price", "s3-standard.min_object_bytes=4096", code=0)
    )
    assert out["tiers"]["s3-standard"]["min_object_bytes"] == 4096
    with pytest.raises(InvalidInputError, match="whole number"):
        apply_price_overrides({"tiers": {"a": {}}}, ["a.min_storage_days=2.5"])


def test_price_flags_apply_in_order():
    base = {"tiers": {"a": {"drive_usd": 1, "drive_capacity_bytes": 2**30, "life_months": 1}}}
    data = apply_price_overrides(base, ["a.drive_usd=2", "a.storage_per_gib_month=0.5"])
    assert data["tiers"]["a"] == {"storage_per_gib_month": 0.5}


# -- run reports -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("report", "match"),
    [
        ({"name": "package", "version": "1.0"}, "kind"),
        ({k: v for k, v in REPORT.items() if k != "kind"}, "kind"),
        ({k: v for k, v in REPORT.items() if k != "format_version"}, "format_version"),
        ({**REPORT, "format_version": True}, "format_version"),
    ],
)
def test_a_report_without_kind_or_version_is_refused(files, report, match):
    path = report_file(files, report)
    out = cli("cost", "--run", path, code=7)
    assert match in out and path in out


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('"seconds": NaN', "seconds"),
        ('"seconds": Infinity', "seconds"),
        ('"seconds": -Infinity', "seconds"),
        ('"epochs": NaN', "epochs"),
        ('"tiers": {"s3": {"bytes": Infinity}}', "s3.bytes"),
        ('"tiers": {"s3": {"get": {"requests": NaN}}}', "s3.get.requests"),
        ('"cache": {"hits": 1, "misses": 1, "fill_bytes": NaN}', "cache.fill_bytes"),
        ('"cache": {"hits": 1, "hit_bytes": Infinity}', "cache.hit_bytes"),
        ('"tiers": {"s3": {"bytes": 1e400}}', "s3.bytes"),
        ('"tiers": {"s3": {"bytes": 100000000000000000000000000000}}', "s3.bytes"),
    ],
)
def test_non_finite_numbers_in_a_report_are_refused(files, text, match):
    body = {k: v for k, v in REPORT.items() if f'"{k}"' not in text}
    raw = json.dumps(body)[:-1] + ", " + text + "}"
    path = report_file(files, raw)
    for extra in ((), ("--json",)):
        out = cli("cost", "--run", path, *extra, code=7)
        assert match in out and path in out


def test_run_json_is_always_valid_json(files):
    out = cli("cost", "--run", report_file(files, REPORT), "--json", code=0)
    json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in --json output"))


def test_parse_run_report_refuses_nan_from_python():
    with pytest.raises(FormatError, match="r.json: seconds"):
        parse_run_report({**REPORT, "seconds": math.nan}, origin="r.json")


def test_non_finite_json_output_is_an_error_not_invalid_json(monkeypatch, files):
    import simstore.cost

    monkeypatch.setattr(simstore.cost.RunCost, "per_hour_usd", property(lambda self: math.nan))
    out = cli("cost", "--run", report_file(files, REPORT), "--json", code=2)
    assert "per_hour_usd" in out


def test_a_run_of_unknown_duration_or_no_epoch_has_no_such_figure(files):
    unknown = json.loads(cli("cost", "--run", report_file(files, {**REPORT, "seconds": 0}),
                             "--json", code=0))
    assert unknown["per_hour_usd"] is None and unknown["per_epoch_usd"] is not None
    text = cli("cost", "--run", report_file(files, {**REPORT, "seconds": 0}), code=0)
    assert "no per-hour figure (the report's duration is unknown)" in text
    assert "$0 per hour" not in text
    none = json.loads(cli("cost", "--run", report_file(files, {**REPORT, "epochs": []}),
                          "--json", code=0))
    assert none["per_epoch_usd"] is None and none["per_hour_usd"] is not None
    assert "no epoch read" in cli("cost", "--run", report_file(files, {**REPORT, "epochs": []}),
                                  code=0)


def test_a_drive_field_after_an_explicit_local_price_needs_the_whole_drive():
    out = cli("prices", "--price", "local-nvme.storage_per_gib_month=0.01",
              "--price", "local-nvme.drive_usd=1500", code=2)
    assert "--price local-nvme.storage_per_gib_month=0.01 --price local-nvme.drive_usd=1500" \
        in out and "also needs ['drive_capacity_bytes', 'life_months']" in out
    whole = json.loads(cli("prices", "--price", "local-nvme.storage_per_gib_month=0.01",
                           "--price", "local-nvme.drive_usd=1500",
                           "--price", "local-nvme.drive_capacity_bytes=4000000000000",
                           "--price", "local-nvme.life_months=60", "--json", code=0))
    tiers = whole["tiers"]
    nvme = tiers["local-nvme"] if isinstance(tiers, dict) else next(
        t for t in tiers if t["name"] == "local-nvme")
    assert nvme["storage_per_gib_month"] == pytest.approx(1500 / (4e12 / 2**30) / 60)
    # the words describe the price in force, not the default drive's
    assert nvme["assumption"] == "a 4 TB drive at 1500 USD over 60 months"


def test_a_new_tier_without_a_storage_price_is_refused(files):
    # found by an audit: a new tier with no storage price read as free in every table
    path = files("new.toml", "format_version = 1\n[tiers.wasabi]\negress_per_gib = 0.0\n")
    out = cli("prices", "--prices", path, code=7)
    assert out.count("\n") == 1 and "new.toml" in out and "'wasabi'" in out
    assert "storage_per_gib_month" in out
    # a tier the table defines may still be changed one field at a time
    ok = files("old.toml", "[tiers.s3-standard]\negress_per_gib = 0.05\n")
    assert json.loads(cli("prices", "--json", "--prices", ok, code=0))["tiers"]["s3-standard"][
        "egress_per_gib"] == 0.05
    priced = files("priced.toml", "[tiers.wasabi]\nstorage_per_gib_month = 0.0068\n")
    assert json.loads(cli("prices", "--json", "--prices", priced, code=0))["tiers"]["wasabi"][
        "storage_per_gib_month"] == 0.0068
    # the price may come from a later file or a flag (a review: the first check refused it)
    for more in (["--prices", priced], ["--price", "wasabi.storage_per_gib_month=0.0068"]):
        table = json.loads(cli("prices", "--json", "--prices", path, *more, code=0))["tiers"]
        assert table["wasabi"]["storage_per_gib_month"] == 0.0068
        assert table["wasabi"]["egress_per_gib"] == 0.0


def test_a_count_of_hundreds_of_digits_is_refused_briefly(files):
    # found by an audit: the error quoted all 400 digits
    report = json.loads(json.dumps(REPORT))
    report["tiers"]["s3"]["requests"] = 10**400
    out = cli("cost", "--run", report_file(files, report), code=7)
    assert out.count("\n") == 1 and "too large: about 2**1328, over 2**63 - 1" in out
    assert len(out) < 300


@pytest.mark.parametrize(
    ("tiers", "match"),
    [
        # found by an audit: the unknown field was not the one named ('bytes' was)
        ({"s3": {"bytes": 1, "requests": 8, "foo": 1}}, "tier 's3' has unknown fields 'foo'"),
        # priced at $0 with exit 0
        ({"s3": {}}, "tier 's3' gives neither bytes nor requests"),
        (None, "has no tiers"),
        ({}, "tiers is empty"),
        ({"s3": {"get": {}}}, "tier 's3', get: gives neither requests nor bytes"),
        ({"s3": {"get": {"requests": 1, "bytes": 1, "x": 1}}},
         "tier 's3', get: unknown fields 'x' beside requests and bytes"),
        # no --tier RUN=PRICE can map them
        ({"": {"bytes": 1, "requests": 1}}, "tier name '' is empty or holds '='"),
        ({"a=b": {"bytes": 1, "requests": 1}}, "tier name 'a=b' is empty or holds '='"),
    ],
)
def test_a_reports_tiers_are_refused_naming_what_is_wrong(files, tiers, match):
    report = {k: v for k, v in REPORT.items() if k != "tiers"}
    if tiers is not None:
        report["tiers"] = tiers
    path = report_file(files, report)
    out = cli("cost", "--run", path, code=7)
    assert match in out and path in out


def test_an_unpriced_run_tier_names_the_report_that_has_it(files, tmp_path):
    # found by an audit: of several --run files, the error did not say which
    good = report_file(files, REPORT)
    odd = tmp_path / "rank1.json"
    odd.write_text(json.dumps({**REPORT, "tiers": {"azure": {"bytes": 1, "requests": 1}}}))
    out = cli("cost", "--run", good, "--run", str(odd), code=2)
    assert f"run report {odd}: run tier 'azure' has no price tier" in out
