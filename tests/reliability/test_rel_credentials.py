"""Credentials never appear in logs, errors, run reports or ``--json`` output.

An S3 store is used with a distinctive access key and secret, given as storage options
(the CLI's ``--storage-option``), in the environment, or pasted into the URL. Every
command's text and ``--json`` output, every error (a dead endpoint, a missing bucket, a
throttling endpoint, a bad option, with ``--debug`` tracebacks), ``repr`` of stores,
the loader's stats and run report, and everything logged at DEBUG by simstore's loggers
and at INFO and above by any logger must hold neither. botocore's own DEBUG log carries
the access key id and a session token in signed headers (never the secret key); that is
botocore's, documented in docs/reliability.md.
"""

from __future__ import annotations

import json
import logging
import socket

import pytest
import rel_harness as h
from click.testing import CliRunner
from simstore.cli import main

from simstore.catalog import Catalog, verify
from simstore.errors import SimstoreError
from simstore.ingest import ingest
from simstore.storage import open_store

pytestmark = pytest.mark.s3

KEY = "AKIARELIABILITYKEY42"
SECRET = "s3cr3t/RELIABILITY+never-print-me"
TOKEN = "session-token-RELIABILITY-never-print"


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append((record.name, record.levelno, self.format(record)))


@pytest.fixture
def logs():
    handler = _Capture()
    root = logging.getLogger()
    old = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield handler
    root.removeHandler(handler)
    root.setLevel(old)


def _clean(text, *, signed_headers=False):
    assert SECRET not in text
    if not signed_headers:
        assert KEY not in text
        assert TOKEN not in text
    return text


def _check_logs(handler):
    debug_leaks = 0
    for name, level, text in handler.records:
        if name.startswith("simstore") or level >= logging.INFO:
            _clean(text)
        else:
            # botocore's own DEBUG log prints the canonical request: the key id and the
            # session token are signed headers there; the secret key never is
            _clean(text, signed_headers=True)
            debug_leaks += KEY in text or TOKEN in text
    return debug_leaks


def _dead_endpoint():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _cli(*args, ok=True):
    result = CliRunner().invoke(main, list(args))
    if ok:
        assert result.exit_code == 0, result.output
    out = result.output + (result.stderr if hasattr(result, "stderr") else "")
    return _clean(out), result.exit_code


def test_cli_output_and_errors_hold_no_credentials(tmp_path, s3_bucket, moto_server, logs):
    bucket = s3_bucket()
    url = f"s3://{bucket}/store"
    opts = [
        "--storage-option",
        f"endpoint_url={moto_server}",
        "--storage-option",
        f"key={KEY}",
        "--storage-option",
        f"secret={SECRET}",
        "--storage-option",
        f"token={TOKEN}",
    ]
    src = str(tmp_path / "src")
    h.write_sources(src, 0, count=4, seed=2)
    base = ["--store", url, *opts]
    _cli(*base, "init")
    out, _ = _cli(*base, "ingest", src, "--dataset", "ds", "--snapshot", "-m", "x", "--json")
    assert json.loads(out)["samples"] == 4
    for command in (
        ["ls"],
        ["log", "ds"],
        ["show", "ds"],
        ["verify", "ds", "--deep"],
        ["diff", "ds", "ds"],
        ["gc", "--grace", "0s"],
        ["stats", "ds"],
        ["cost", "ds"],
        ["du"],
        ["pull", "ds", "--cache", str(tmp_path / "c")],
    ):
        _cli(*base, *command)
        out, _ = _cli(*base, *command, "--json")
        json.loads(out)
    # errors, with and without tracebacks
    dead = [
        "--store",
        url,
        "--storage-option",
        f"endpoint_url={_dead_endpoint()}",
        "--storage-option",
        f"key={KEY}",
        "--storage-option",
        f"secret={SECRET}",
        "--storage-option",
        "max_attempts=2",
        "--storage-option",
        "backoff_base_s=0.01",
    ]
    for extra in ([], ["--debug"]):
        out, code = _cli(*extra, *dead, "ls", ok=False)
        assert code != 0 and "error" in out.lower()
        out, code = _cli(
            *extra, "--store", f"s3://no-such-bucket-{bucket}/x", *opts, "log", "ds", ok=False
        )
        assert code != 0
        out, code = _cli(*extra, *base, "--storage-option", f"sekret={SECRET}", "ls", ok=False)
        assert code != 0
        out, code = _cli(*extra, "--store", f"s3://{KEY}:{SECRET}@{bucket}/x", "ls", ok=False)
        assert code != 0
    _check_logs(logs)
    assert logs.records  # logging was captured


def test_library_errors_reprs_and_run_reports_hold_no_credentials(
    tmp_path, s3_bucket, moto_server, fault_proxy, logs
):
    bucket = s3_bucket()
    url = f"s3://{bucket}/store"
    options = {"endpoint_url": moto_server, "key": KEY, "secret": SECRET, "token": TOKEN}
    src = str(tmp_path / "src")
    h.write_sources(src, 0, count=6, seed=3)
    Catalog.init(url, storage_options=options)
    cat = Catalog.open(url, storage_options=options)
    ingest([src], dataset="ds", store=cat, snapshot=True, message="x")
    store = open_store(url, storage_options=options)
    _clean(repr(store))
    _clean(repr(store.storage_options))
    _clean(repr(cat.store))
    _clean(json.dumps(verify(cat, "ds", deep=True).to_json()))

    from simstore.loaders import SimDataLoader, SimDataset

    ds = SimDataset(
        url, "ds", storage_options=options, cache_dir=str(tmp_path / "cache"), log_every_s=0.001
    )
    loader = SimDataLoader(ds, batch_size=2)
    assert sum(len(b["__key__"]) for b in loader) == 6
    _clean(json.dumps(loader.report(), default=str))
    _clean(repr(loader.stats()))
    _clean(json.dumps(loader.state_dict()))
    _clean(repr(ds))

    errors = []
    failing = {
        **options,
        "endpoint_url": fault_proxy.endpoint_url,
        "max_attempts": 2,
        "backoff_base_s": 0.01,
    }
    fault_proxy.fail_share(1.0, "slowdown", seed=0)
    for attempt in (
        lambda: Catalog.open(url, storage_options=failing),
        lambda: list(SimDataset(url, "ds", storage_options=failing)),
    ):
        with pytest.raises(SimstoreError) as info:
            attempt()
        errors.append(info.value)
    fault_proxy.clear()
    dead = {**options, "endpoint_url": _dead_endpoint(), "max_attempts": 1}
    with pytest.raises(SimstoreError) as info:
        Catalog.open(url, storage_options=dead)
    errors.append(info.value)
    with pytest.raises(SimstoreError) as info:
        open_store(f"s3://{KEY}:{SECRET}@{bucket}/x")
    errors.append(info.value)
    with pytest.raises(SimstoreError) as info:
        open_store(url, storage_options={**options, "sekret": SECRET})
    errors.append(info.value)
    for exc in errors:
        _clean(str(exc))
        _clean(repr(exc))
        cause = exc.__cause__
        while cause is not None:  # chained backend errors too (printed by --debug)
            _clean(str(cause))
            cause = cause.__cause__
    _check_logs(logs)


def test_environment_credentials_stay_out_of_output(
    tmp_path, s3_bucket, moto_server, monkeypatch, logs
):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    bucket = s3_bucket()
    url = f"s3://{bucket}/env"
    base = ["--store", url, "--storage-option", f"endpoint_url={moto_server}"]
    _cli(*base, "init")
    src = str(tmp_path / "src")
    h.write_sources(src, 0, count=3, seed=4)
    _cli(*base, "ingest", src, "--dataset", "ds", "--snapshot", "-m", "x", "--json")
    _cli(*base, "show", "ds", "--json")
    out, code = _cli(
        "--debug",
        "--store",
        url,
        "--storage-option",
        f"endpoint_url={_dead_endpoint()}",
        "--storage-option",
        "max_attempts=1",
        "ls",
        ok=False,
    )
    assert code != 0
    _check_logs(logs)
