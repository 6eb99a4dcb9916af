"""S3 on loopback for the benchmark: moto's server and a latency proxy, each in its own process.

    python -m benchmarks.suite.s3 moto                 # prints "ENDPOINT http://127.0.0.1:PORT"
    python -m benchmarks.suite.s3 proxy UPSTREAM SECONDS

Both bind 127.0.0.1 on an ephemeral port and run until their standard input closes, so
they never outlive the driver. They run in processes of their own so that serving S3
does not share a GIL with the driver that measures. The proxy is
``simstore.testing.s3.FaultProxy`` with a fixed latency per request (a remote region).

Facts that shape the S3 figures (docs/storage-s3.md): moto serves ranged GETs about 5x
slower than whole-object GETs, so figures with ranged reads (the loader without a cache)
overstate their cost against real S3; the proxy buffers each response whole.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

KEY = "FAKEACCESSKEYID0TEST"
SECRET = "fake-secret-key-0123456789-never-real"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def client_env(endpoint: str) -> dict[str, str]:
    """Environment for a subprocess that talks to the fake S3 (never a real account)."""
    env = dict(os.environ)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ROLE_ARN",
                 "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ENDPOINT_URL_S3"):
        env.pop(name, None)
    env.update({
        "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint, "S3_ENDPOINT_URL": endpoint,
        "AWS_CONFIG_FILE": "/nonexistent/simstore-bench-aws-config",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/simstore-bench-aws-creds",
        "AWS_EC2_METADATA_DISABLED": "true",
    })
    return env


@contextmanager
def _serve(args: list[str]) -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.suite.s3", *args], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("ENDPOINT "):
            raise RuntimeError(f"S3 helper {args[0]} did not start: {line!r}")
        yield line.split()[1]
    finally:
        from simstore.testing.s3 import end_helper

        end_helper(proc)


@contextmanager
def moto() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1; yields its endpoint URL."""
    with _serve(["moto"]) as endpoint:
        yield endpoint


@contextmanager
def latency_proxy(upstream: str, latency_s: float) -> Iterator[str]:
    """A proxy adding ``latency_s`` to every request; yields its endpoint URL."""
    with _serve(["proxy", upstream, str(latency_s)]) as endpoint:
        yield endpoint


def client(endpoint: str, pool: int = 16) -> Any:
    """A boto3 client for the fake server."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                        config=Config(max_pool_connections=pool))


def upload_tree(endpoint: str, bucket: str, prefix: str, root: str) -> tuple[int, float]:
    """Upload every file under ``root`` to ``bucket/prefix/<relative path>``; (bytes, s)."""
    s3 = client(endpoint)
    try:
        s3.create_bucket(Bucket=bucket)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    paths = [os.path.join(d, n) for d, _, files in os.walk(root) for n in files]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: s3.upload_file(
            p, bucket, f"{prefix}/{os.path.relpath(p, root)}"), paths))
    return sum(os.path.getsize(p) for p in paths), time.perf_counter() - t0


def parallel_get(endpoint: str, bucket: str, keys: list[str], threads: int = 8) -> float:
    """Whole-object GETs of ``keys`` from ``threads`` threads; MiB/s."""
    s3 = client(endpoint, pool=threads)

    def get(key: str) -> int:
        return len(s3.get_object(Bucket=bucket, Key=key)["Body"].read())

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(get, keys))
    return total / (time.perf_counter() - t0) / (1 << 20)


def list_keys(endpoint: str, bucket: str, prefix: str) -> list[str]:
    """Every key under ``prefix/`` (sorted)."""
    s3 = client(endpoint)
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        keys += [item["Key"] for item in page.get("Contents", [])]
    return sorted(keys)


def main(argv: list[str]) -> int:
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    if argv[0] == "moto":
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        print(f"ENDPOINT http://{host}:{port}", flush=True)
        sys.stdin.read()
        server.stop()
    elif argv[0] == "proxy":
        from simstore.testing.s3 import FaultProxy

        proxy = FaultProxy(argv[1], latency_s=float(argv[2]))
        print(f"ENDPOINT {proxy.endpoint_url}", flush=True)
        sys.stdin.read()
        proxy.close()
    else:
        raise SystemExit(f"unknown server {argv[0]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
