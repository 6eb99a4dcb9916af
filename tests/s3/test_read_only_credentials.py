"""A store on S3 read with read-only credentials, as a training job's role usually is.

A moto server that enforces IAM (its own process: moto reads the switch when imported)
holds the store; a "writer" user may do anything to the bucket, a "reader" only get and
list. With the reader's keys every reading command and the loader work (none needs a
write); every writing command fails with one line and exit 9 (``NotWritableError``, as a
local store refusing a write), and the bucket is left as it was.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import boto3
import numpy as np
import pytest
from click.testing import CliRunner
from simstore.cli import main

from simstore.testing.s3 import end_helper

pytestmark = pytest.mark.s3

# the requests moto answers before it enforces IAM: the bucket, then for each of the two
# users its creation, its policy and its access key
SETUP_REQUESTS = 7

SERVER = textwrap.dedent("""
    import os, sys, time
    os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = sys.argv[2]  # read when moto is imported
    import logging
    from moto.server import ThreadedMotoServer
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=int(sys.argv[1]), verbose=False)
    server.start()
    print("ready", flush=True)
    sys.stdin.read()  # until the test closes the pipe
    server.stop()
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _policy(actions: list[str]) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Action": actions,
        "Resource": ["arn:aws:s3:::bucket", "arn:aws:s3:::bucket/*"]}]})


@pytest.fixture(scope="module")
def iam_server() -> Iterator[tuple[str, dict[str, dict[str, str]]]]:
    """An IAM-enforcing moto on 127.0.0.1; its URL and the two users' environments."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(SETUP_REQUESTS)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        url = f"http://127.0.0.1:{port}"
        anyone = {"endpoint_url": url, "region_name": "us-east-1",
                  "aws_access_key_id": "AKIASETUP0000000TEST", "aws_secret_access_key": "x"}
        boto3.client("s3", **anyone).create_bucket(Bucket="bucket")
        iam = boto3.client("iam", **anyone)
        users = {}
        for name, actions in (("writer", ["s3:*"]),
                              ("reader", ["s3:GetObject", "s3:ListBucket"])):
            iam.create_user(UserName=name)
            iam.put_user_policy(UserName=name, PolicyName="s3", PolicyDocument=_policy(actions))
            key = iam.create_access_key(UserName=name)["AccessKey"]
            users[name] = {"AWS_ACCESS_KEY_ID": key["AccessKeyId"],
                           "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
        yield url, users
    finally:
        end_helper(proc, timeout_s=30)


def _as(monkeypatch, url: str, user: dict[str, str]) -> None:
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name, value in user.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", url)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/simstore-test-aws-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/simstore-test-aws-creds")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def _cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["--store", "s3://bucket/store", *args])
    return r.exit_code, r.output


def _listing(url: str, user: dict[str, str]) -> list[tuple[str, str]]:
    client = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                          aws_access_key_id=user["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=user["AWS_SECRET_ACCESS_KEY"])
    out = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket="bucket"):
        out += [(o["Key"], o["ETag"]) for o in page.get("Contents", [])]
    return sorted(out)


def test_a_reader_reads_everything_and_writes_nothing(iam_server, monkeypatch, tmp_path):
    url, users = iam_server
    client = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                          aws_access_key_id=users["reader"]["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=users["reader"]["AWS_SECRET_ACCESS_KEY"])
    with pytest.raises(client.exceptions.ClientError, match="AccessDenied"):
        client.put_object(Bucket="bucket", Key="enforced", Body=b"x")  # the policy holds

    src, more = tmp_path / "src", tmp_path / "more"
    src.mkdir()
    more.mkdir()
    for i in range(4):
        np.savez(src / f"r{i}.npz", x=np.full(8, float(i)))
    np.savez(more / "n.npz", x=np.arange(3.0))
    _as(monkeypatch, url, users["writer"])
    assert _cli("init")[0] == 0
    assert _cli("ingest", str(src), "--dataset", "d", "--snapshot")[0] == 0
    assert _cli("tag", "d", "v1")[0] == 0
    before = _listing(url, users["writer"])

    _as(monkeypatch, url, users["reader"])
    for args in (("log", "d"), ("show", "d@v1"), ("verify", "d", "--deep"), ("stats", "d"),
                 ("du", "d"), ("tag", "d", "v1"), ("pull", "d", "--cache", str(tmp_path / "c"))):
        code, out = _cli(*args)
        assert code == 0, (args, out)
    code, out = _cli("gc", "--dry-run", "--json")
    assert code == 0, out
    assert json.loads(out)["clock"] == "store"  # the server's, read with no write
    from simstore.loaders import SimDataLoader, SimDataset

    for cache in (None, str(tmp_path / "c2")):
        ds = SimDataset("s3://bucket/store", "d", cache_dir=cache)
        keys = sorted(k for b in SimDataLoader(ds, batch_size=2) for k in b["__key__"])
        assert keys == [f"r{i}" for i in range(4)]

    writes = {
        "ingest": ("ingest", str(more), "--dataset", "d", "--snapshot"),
        "new tag": ("tag", "d", "v2"),
        "new branch": ("branch", "d", "dev"),
        "delete": ("delete", "d", "r0"),
        "gc": ("gc", "--grace", "0s"),
    }
    for name, args in writes.items():
        code, out = _cli(*args)
        assert code == 9, (name, out)
        assert out.startswith("error: ") and out.count("\n") == 1, (name, out)
        assert "AccessDenied" in out and "may not write the store" in out, (name, out)
    assert _listing(url, users["writer"]) == before  # nothing half-written


def test_unknown_credentials_are_said_to_be_the_problem(iam_server, monkeypatch):
    # found by an audit: `init` (whose first request is a HEAD, whose reply has no body)
    # said "stat failed: 403 (HTTP 403): Forbidden", where the other commands quote the
    # server's reason (InvalidAccessKeyId)
    url, _users = iam_server
    _as(monkeypatch, url, {"AWS_ACCESS_KEY_ID": "AKIANOSUCHUSER000000",
                           "AWS_SECRET_ACCESS_KEY": "wrong"})
    for args in (("init",), ("log", "d")):
        code, out = _cli(*args)
        assert code == 10, (args, out)
        assert out.startswith("error: s3://bucket/store") and out.count("\n") == 1, out
        assert "InvalidAccessKeyId" in out or "credentials are wrong" in out, (args, out)
