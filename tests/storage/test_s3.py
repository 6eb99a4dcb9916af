"""S3Store against moto in server mode, directly and through a fault-injecting proxy."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from simstore.errors import (
    ConflictError,
    InvalidInputError,
    NotFoundError,
    ReadOnlyError,
    SimstoreError,
    StorageError,
)
from simstore.storage import ObjectStore, _s3_upload, open_store
from simstore.storage._s3 import S3Store, probe_conditional_writes
from simstore.testing import ObjectStoreTests
from simstore.testing.s3 import FAKE_SECRET_KEY, FaultProxy, make_s3_client

pytestmark = pytest.mark.s3

MiB = 1024 * 1024
# Fast retries for tests: the defaults back off for seconds.
FAST: dict[str, Any] = {"backoff_base_s": 0.01, "backoff_max_s": 0.05, "read_timeout_s": 5}
BucketFactory = Callable[[], str]


def raw_client() -> Any:
    return make_s3_client(os.environ["AWS_ENDPOINT_URL"])


def raw_object(store: S3Store, key: str) -> dict[str, Any]:
    client = raw_client()
    try:
        obj = f"{store.root}/{key}" if store.root else key
        response = client.get_object(Bucket=store.bucket, Key=obj)
        return {"data": response["Body"].read(), "etag": response["ETag"]}
    finally:
        client.close()


@pytest.fixture
def store(s3_bucket: BucketFactory) -> Iterator[S3Store]:
    s = S3Store(f"s3://{s3_bucket()}/data/root", storage_options=dict(FAST))
    yield s
    s.close()


@pytest.fixture
def proxied(s3_bucket: BucketFactory, fault_proxy: FaultProxy) -> Iterator[S3Store]:
    """A store whose every request goes through the fault proxy."""
    options = {**FAST, "endpoint_url": fault_proxy.endpoint_url, "max_attempts": 4}
    s = S3Store(f"s3://{s3_bucket()}/p", storage_options=options)
    yield s
    s.close()


class TestS3Store(ObjectStoreTests):
    @pytest.fixture
    def store(self, s3_bucket: BucketFactory) -> Iterator[ObjectStore]:
        s = S3Store(f"s3://{s3_bucket()}/some/prefix", storage_options=dict(FAST))
        yield s
        s.close()

    def raw_get(self, store: ObjectStore, key: str) -> bytes:
        return cast(bytes, raw_object(cast(S3Store, store), key)["data"])

    def raw_put(self, store: ObjectStore, key: str, data: bytes) -> None:
        s3 = cast(S3Store, store)
        client = raw_client()
        try:
            client.put_object(Bucket=s3.bucket, Key=f"{s3.root}/{key}", Body=data)
        finally:
            client.close()

    def read_only_copy(self, store: ObjectStore) -> ObjectStore:
        s3 = cast(S3Store, store)
        return S3Store(s3.url, storage_options=s3.storage_options, read_only=True)

    def test_open_store_dispatches_s3_and_s3a(self, store: ObjectStore) -> None:
        for scheme in ("s3", "s3a"):
            opened = open_store(store.url.replace("s3://", f"{scheme}://"))
            assert isinstance(opened, S3Store) and opened.url == store.url
        assert store.local_path("anything") is None
        assert store.supports_atomic_cas is True


# -- reads -----------------------------------------------------------------------------
def test_ranges_clamp_and_validate(store: S3Store) -> None:
    store.put("r", b"0123456789")
    assert store.get("r", byte_range=(8, 100)) == b"89"
    assert store.get("r", byte_range=(20, 30)) == b""
    assert store.get("r", byte_range=(3, 3)) == b""
    with pytest.raises(InvalidInputError):
        store.get("r", byte_range=(5, 2))
    with pytest.raises(NotFoundError, match="gone"):
        store.get("gone", byte_range=(0, 0))


def test_get_many_keeps_order_and_ranges(store: S3Store) -> None:
    for i in range(6):
        store.put(f"m/{i}", bytes([i]) * 10)
    got = store.get_many(["m/3", ("m/1", (2, 5)), ("m/5", None), "m/0"], max_workers=4)
    assert got == [b"\x03" * 10, b"\x01" * 3, b"\x05" * 10, b"\x00" * 10]
    with pytest.raises(NotFoundError, match="m/missing"):
        store.get_many(["m/0", "m/missing"], max_workers=2)


def test_list_skips_folder_markers_and_pages(store: S3Store) -> None:
    client = raw_client()
    try:
        client.put_object(Bucket=store.bucket, Key=f"{store.root}/dir/", Body=b"")
    finally:
        client.close()
    for i in range(5):
        store.put(f"dir/{i}", b"x")
    assert list(store.list("dir/")) == [f"dir/{i}" for i in range(5)]


def test_missing_bucket_is_a_storage_error_naming_it(s3_env: str) -> None:
    s = S3Store("s3://simstore-no-such-bucket/x", storage_options=dict(FAST))
    with pytest.raises(StorageError, match="simstore-no-such-bucket.*NoSuchBucket"):
        s.get("k")
    with pytest.raises(StorageError, match="NoSuchBucket"):
        list(s.list())
    s.close()


# -- options ---------------------------------------------------------------------------
def test_options_are_checked(s3_env: str) -> None:
    with pytest.raises(InvalidInputError, match="unknown S3 storage options.*bogus"):
        S3Store("s3://b", storage_options={"bogus": 1})
    with pytest.raises(InvalidInputError, match="max_attempts"):
        S3Store("s3://b", storage_options={"max_attempts": 0})
    bad = [({"max_attempts": float("nan")}, "max_attempts must be a positive finite"),
           ({"retry_deadline_s": float("inf")}, "retry_deadline_s must be a positive finite"),
           ({"max_attempts": 2.5}, "max_attempts must be a whole number"),
           ({"connect_timeout_s": 1e300}, "connect_timeout_s must be at most 86400 seconds"),
           ({"multipart_part_bytes": 1}, "multipart_part_bytes must be at least 5 MiB"),
           ({"client_kwargs": "x"}, "client_kwargs must be a mapping"),
           ({"key": 12345678}, "key must be text, got int 12345678"),
           ({"secret": None, "token": True}, "token must be text"),
           # "false" was true: requests went out unsigned and failed with a bare 403
           ({"anon": "false"}, "anon must be True or False"),
           ({"use_ssl": "maybe"}, "use_ssl must be True or False"),
           # config_kwargs that say other than the store's options
           ({"config_kwargs": {"read_timeout": 1}, "read_timeout_s": 2},
            "read_timeout_s=2 and config_kwargs .*1.* disagree"),
           ({"config_kwargs": {"retries": {"max_attempts": -1}}}, "retries max_attempts must"),
           ({"config_kwargs": {"retries": {"total_max_attempts": True}}}, "total_max_attempts"),
           ({"config_kwargs": {"retries": {"max_atempts": 3}}}, "retries must be a mapping of"),
           ({"config_kwargs": {"connect_timeout": 0}}, "connect_timeout_s must be a positive"),
           # client_kwargs that say other than the store's options: the option won, silently
           ({"endpoint_url": "http://127.0.0.1:1",
             "client_kwargs": {"endpoint_url": "http://127.0.0.1:2"}},
            "endpoint_url='http://127.0.0.1:1' and client_kwargs endpoint_url=.*:2' disagree"),
           ({"region_name": "eu-west-1", "client_kwargs": {"region_name": "us-east-1"}},
            "region_name='eu-west-1' and client_kwargs region_name='us-east-1' disagree"),
           ({"key": "AKIA1", "secret": "s", "client_kwargs": {"aws_access_key_id": "AKIA2"}},
            r"key=\.\.\. and client_kwargs aws_access_key_id=\.\.\. disagree"),
           ({"use_ssl": "false", "client_kwargs": {"use_ssl": False}}, "use_ssl must be True"),
           ({"use_ssl": True, "client_kwargs": {"use_ssl": False}},
            "use_ssl=True and client_kwargs use_ssl=False disagree"),
           # botocore drops a session token given without its key and secret
           ({"token": "tok"}, "token needs key and secret"),
           ({"token": "tok", "key": "AKIA0000"}, "token needs key and secret")]
    for options, message in bad:  # NaN retried for ever; the rest failed later or raw
        with pytest.raises(InvalidInputError, match=message):
            S3Store("s3://b", storage_options=options)
    with pytest.raises(InvalidInputError):
        S3Store("gs://b/x")
    for url in ("s3://bad bucket/x", "s3://b?x=1", "s3://b#frag"):
        with pytest.raises(InvalidInputError, match="invalid bucket name"):
            S3Store(url)
    assert S3Store("s3://my.bkt_x-1/p").bucket == "my.bkt_x-1"
    # the same endpoint spelled with a trailing slash agrees
    S3Store("s3://b", storage_options={"endpoint_url": "http://127.0.0.1:9/",
                                       "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}})
    S3Store("s3://b", storage_options={"endpoint_url": "HTTP://LocalHost:9",
                                       "client_kwargs": {"endpoint_url": "http://localhost:9"}})
    with pytest.raises(InvalidInputError) as info:
        S3Store("s3://AKIA:hunter22@bucket/x")
    assert "hunter22" not in str(info.value)
    # s3fs cache options mean nothing here and are accepted.
    assert S3Store("s3://b/", storage_options={"use_listings_cache": False}).url == "s3://b"


def test_config_kwargs_timeouts_and_retries_become_the_store_options(s3_env: str) -> None:
    """An s3fs-style dict carries over: the store sets botocore's timeouts and makes its own
    retries, so these were silently replaced by its defaults."""
    s = S3Store("s3://b", storage_options={"config_kwargs": {
        "connect_timeout": 3, "read_timeout": 7, "retries": {"max_attempts": 9, "mode": "adaptive"},
        "max_pool_connections": 50}})
    tuning = s._tuning
    assert (tuning.connect_timeout_s, tuning.read_timeout_s, tuning.max_attempts) == (3, 7, 10)
    config = s._api.meta.config
    assert (config.connect_timeout, config.read_timeout, config.max_pool_connections) == (3, 7, 50)
    assert config.retries["total_max_attempts"] == 1  # botocore's: the store retries itself
    s.close()
    total = S3Store("s3://b", storage_options={"config_kwargs": {
        "retries": {"total_max_attempts": 4}}, "max_attempts": 4})
    assert total._tuning.max_attempts == 4
    total.close()


def test_aws_region_wins_over_aws_default_region(
    s3_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As in the AWS CLI and SDKs (botocore itself reads only AWS_DEFAULT_REGION)."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_REGION", "eu-west-2")
    s = S3Store("s3://b", storage_options=dict(FAST))
    assert s._api.meta.region_name == "eu-west-2"
    s.close()
    given = S3Store("s3://b", storage_options={**FAST, "region_name": "ap-south-1"})
    assert given._api.meta.region_name == "ap-south-1"  # the option wins
    given.close()
    monkeypatch.delenv("AWS_REGION")
    plain = S3Store("s3://b", storage_options=dict(FAST))
    assert plain._api.meta.region_name == "us-east-1"
    plain.close()


def test_endpoint_from_storage_options_wins_over_environment(
    s3_bucket: BucketFactory, fault_proxy: FaultProxy
) -> None:
    s = S3Store(f"s3://{s3_bucket()}", storage_options={"endpoint_url": fault_proxy.endpoint_url})
    s.put("via-proxy", b"x")
    s.close()
    assert fault_proxy.count(None, "PUT") == 1


@pytest.mark.parametrize("how", ["AWS_PROFILE", "storage_options"])
def test_profile_from_config_file(
    how: str,
    s3_bucket: BucketFactory,
    fault_proxy: FaultProxy,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bucket = s3_bucket()
    config = tmp_path / "aws-config"
    config.write_text(
        "[profile simtest]\n"
        f"endpoint_url = {fault_proxy.endpoint_url}\n"
        "aws_access_key_id = PROFILEKEY\n"
        "aws_secret_access_key = profile-secret\n"
    )
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.delenv("AWS_ENDPOINT_URL")  # the environment would win over the profile
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    options: dict[str, Any] = {}
    if how == "AWS_PROFILE":
        monkeypatch.setenv("AWS_PROFILE", "simtest")
    else:
        options["profile"] = "simtest"
    s = S3Store(f"s3://{bucket}", storage_options=options)
    s.put("k", b"v")
    s.close()
    assert fault_proxy.count(None, "PUT") == 1  # the endpoint came from the profile


def test_client_is_made_without_listing_every_service(
    store: S3Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """botocore lists its ~400 service folders before loading a model; the store's
    session knows only S3 and still finds its model (and AWS_DATA_PATH's folders)."""
    import botocore.loaders

    def listed(*_args: Any, **_kwargs: Any) -> list[str]:
        raise AssertionError("every service listed")

    with monkeypatch.context() as patched:  # the fixtures' own clients list as usual
        patched.setattr(botocore.loaders.Loader, "list_available_services", listed)
        patched.setenv("AWS_DATA_PATH", str(tmp_path))
        store.put("k", b"v")
        assert store.get("k") == b"v"
    loader = store._session.get_component("data_loader")
    assert str(tmp_path) in loader.search_paths
    # botocore's data parses into plain dicts (not OrderedDict: twice as slow to parse)
    assert type(loader.load_data("_retry")) is dict


def test_credentials_from_a_web_identity_role(
    s3_bucket: BucketFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A role assumed with a web identity token (EKS service accounts) makes botocore
    create an STS client from the store's own session: that session must know STS too."""
    bucket = s3_bucket()
    token = tmp_path / "token"
    token.write_text("a-web-identity-token")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/simstore-reader")
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
    s = S3Store(f"s3://{bucket}", storage_options=FAST)
    s.put("k", b"v")
    assert s.get("k") == b"v"
    credentials = s._session.get_credentials()
    assert credentials.method == "assume-role-with-web-identity"
    s.close()


def test_requester_pays_goes_with_every_request(
    s3_bucket: BucketFactory, fault_proxy: FaultProxy, tmp_path: Path
) -> None:
    bucket = s3_bucket()
    opts = {**FAST, "endpoint_url": fault_proxy.endpoint_url, "requester_pays": True,
            "multipart_threshold_bytes": 6 * MiB, "multipart_part_bytes": 5 * MiB}
    s = S3Store(f"s3://{bucket}/rp", storage_options=opts)
    s.put("a", b"1")
    big = tmp_path / "big"
    big.write_bytes(b"z" * (11 * MiB))
    s.put_file("objects/big", str(big))  # CreateMultipartUpload, UploadPart, Complete
    assert s.put_if_absent("a", b"1") is False  # and the copy onto itself
    assert s.get("a") == b"1" and s.info("a").size_bytes == 1
    assert sorted(s.list("")) == ["a", "objects/big"]
    s.delete("a")
    s.close()
    assert len(fault_proxy.records) >= 9
    assert [r for r in fault_proxy.records if r.header("x-amz-request-payer") != "requester"] == []


def test_additional_parameters_encrypt_every_write(
    s3_bucket: BucketFactory, tmp_path: Path
) -> None:
    bucket = s3_bucket()
    sse = {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "alias/simstore-data"}
    opts = {**FAST, "s3_additional_kwargs": sse,
            "multipart_threshold_bytes": 6 * MiB, "multipart_part_bytes": 5 * MiB}
    s = S3Store(f"s3://{bucket}/sse", storage_options=opts)
    s.put("small", b"x")
    big = tmp_path / "big"
    big.write_bytes(b"y" * (11 * MiB))
    s.put_file("objects/big", str(big))
    assert s.put_if_absent("small", b"x") is False  # refreshed by a copy onto itself
    assert s.get("objects/big") == big.read_bytes()  # reads take none of them
    s.close()
    client = raw_client()
    try:
        for key in ("sse/small", "sse/objects/big"):
            head = client.head_object(Bucket=bucket, Key=key)
            assert (head["ServerSideEncryption"], head["SSEKMSKeyId"]) == (
                "aws:kms", "alias/simstore-data"), key
        plain = S3Store(f"s3://{bucket}/plain", storage_options=FAST)
        plain.put("k", b"v")
        plain.close()
        assert "SSEKMSKeyId" not in client.head_object(Bucket=bucket, Key="plain/k")
    finally:
        client.close()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"s3_additional_kwargs": {"IfMatch": "*"}}, "'IfMatch' is not a parameter"),
        ({"s3_additional_kwargs": {"Bucket": "other"}}, "'Bucket' is not a parameter"),
        ({"s3_additional_kwargs": {"ServerSideEncyption": "AES256"}}, "'ServerSideEncyption'"),
        ({"s3_additional_kwargs": "aws:kms"}, "must be a mapping"),
        ({"requester_pays": "yes"}, "requester_pays must be True or False"),
    ],
)
def test_bad_request_parameters_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        S3Store("s3://b/p", storage_options=options)


# -- uploads ---------------------------------------------------------------------------
def multipart_store(bucket: str, **extra: Any) -> S3Store:
    options = {**FAST, "multipart_threshold_bytes": 6 * MiB, "multipart_part_bytes": 5 * MiB}
    return S3Store(f"s3://{bucket}/mp", storage_options={**options, **extra})


def test_a_whole_number_given_as_a_float_is_a_part_size(
    s3_bucket: BucketFactory, tmp_path: Path
) -> None:
    # --storage-option multipart_part_bytes=6e6 parses as a float: a whole one is a size
    s = multipart_store(s3_bucket(), multipart_part_bytes=6e6)
    assert s._tuning.multipart_part_bytes == 6_000_000
    assert isinstance(s._tuning.multipart_part_bytes, int)
    data = random.Random(2).randbytes(13 * MiB)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    s.put("objects/a", data)
    assert s.put_file("objects/b", str(src)) is True
    assert raw_object(s, "objects/a")["data"] == data
    assert raw_object(s, "objects/b")["data"] == data
    s.close()


def test_put_file_above_threshold_is_multipart(s3_bucket: BucketFactory, tmp_path: Path) -> None:
    s = multipart_store(s3_bucket())
    data = random.Random(1).randbytes(12 * MiB + 123)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    assert s.put_file("objects/big", str(src)) is True
    stored = raw_object(s, "objects/big")
    assert stored["data"] == data
    assert stored["etag"].strip('"').endswith("-3")  # three parts: 5 + 5 + 2 MiB
    assert s.put_file("objects/big", str(src)) is False
    s.put("objects/big-bytes", data)  # bytes above the threshold go in parts too
    assert raw_object(s, "objects/big-bytes")["etag"].strip('"').endswith("-3")
    s.close()


def test_multipart_complete_is_conditional(
    s3_bucket: BucketFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = multipart_store(s3_bucket())
    s.put("objects/shard", b"first writer")
    src = tmp_path / "other.bin"
    src.write_bytes(b"y" * (7 * MiB))
    # Play the race: this writer's HEAD ran before the other writer's upload completed.
    monkeypatch.setattr(s, "_head", lambda key: None)
    assert s.put_file("objects/shard", str(src)) is False
    assert raw_object(s, "objects/shard")["data"] == b"first writer"
    client = raw_client()
    try:
        assert client.list_multipart_uploads(Bucket=s.bucket).get("Uploads", []) == []
    finally:
        client.close()
    s.close()


def test_racing_put_if_absent_one_writer_wins(store: S3Store) -> None:
    results: dict[int, bool] = {}
    barrier = threading.Barrier(8)

    def writer(i: int) -> None:
        barrier.wait()
        results[i] = store.put_if_absent("objects/race", f"writer {i}".encode())

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, won in results.items() if won]
    assert len(results) == 8 and len(winners) == 1
    assert store.get("objects/race") == f"writer {winners[0]}".encode()


def test_refresh_of_objects_over_copy_limit_copies_in_parts(
    s3_bucket: BucketFactory,
    fault_proxy: FaultProxy,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_s3_upload, "MAX_COPY_BYTES", 6 * MiB)
    s = multipart_store(s3_bucket(), endpoint_url=fault_proxy.endpoint_url)
    data = random.Random(2).randbytes(11 * MiB)
    src = tmp_path / "shard.bin"
    src.write_bytes(data)
    assert s.put_file("objects/s", str(src)) is True
    before = {r.path for r in fault_proxy.records}
    assert s.put_file("objects/s", str(src)) is False
    copies = [r for r in fault_proxy.records if r.path not in before and "partNumber=" in r.path]
    assert len(copies) == 2  # two UploadPartCopy requests, no CopyObject of 11 MiB
    assert raw_object(s, "objects/s")["data"] == data
    s.close()


# -- compare and swap ------------------------------------------------------------------
def test_cas_conflict_names_ref_and_keeps_value(store: S3Store) -> None:
    v1 = store.compare_and_swap("refs/main", None, b"one")
    assert v1 == raw_object(store, "refs/main")["etag"]
    v2 = store.compare_and_swap("refs/main", v1, b"two")
    with pytest.raises(ConflictError, match="refs/main") as info:
        store.compare_and_swap("refs/main", v1, b"three")
    assert "earlier attempt" not in str(info.value)  # sent once: nothing to doubt
    assert store.get_versioned("refs/main") == (b"two", v2)
    store.delete("refs/main")
    with pytest.raises(ConflictError):  # If-Match on a ref that is gone
        store.compare_and_swap("refs/main", v2, b"four")
    with pytest.raises(ConflictError):
        store.compare_and_swap("refs/main", v2, None)
    assert not store.exists("refs/main")


def test_lost_response_retry_gets_conflict_and_value_landed(
    proxied: S3Store, fault_proxy: FaultProxy
) -> None:
    v1 = proxied.compare_and_swap("refs/main", None, b"old")
    fault_proxy.fail_next("drop_response", methods=["PUT"], path_contains="refs/main")
    with pytest.raises(ConflictError, match="earlier attempt may have landed"):
        proxied.compare_and_swap("refs/main", v1, b"new")
    assert fault_proxy.count("drop_response", "PUT") == 1
    assert raw_object(proxied, "refs/main")["data"] == b"new"
    data, _version = proxied.get_versioned("refs/main")  # what the catalog does next
    assert data == b"new"


def test_lost_response_on_create_and_put_if_absent(
    proxied: S3Store, fault_proxy: FaultProxy
) -> None:
    fault_proxy.fail_next("drop_response", methods=["PUT"])
    with pytest.raises(ConflictError):
        proxied.compare_and_swap("refs/dev", None, b"created")
    assert raw_object(proxied, "refs/dev")["data"] == b"created"
    fault_proxy.fail_next("drop_response", methods=["PUT"], path_contains="objects/")
    proxied.put_if_absent("objects/ab", b"payload")  # True or False; never an error
    assert raw_object(proxied, "objects/ab")["data"] == b"payload"


def test_lost_response_on_multipart_complete(
    s3_bucket: BucketFactory, fault_proxy: FaultProxy, tmp_path: Path
) -> None:
    s = multipart_store(s3_bucket(), endpoint_url=fault_proxy.endpoint_url)
    data = random.Random(3).randbytes(7 * MiB)
    src = tmp_path / "f.bin"
    src.write_bytes(data)
    fault_proxy.fail_next("drop_response", methods=["POST"], path_contains="uploadId=")
    s.put_file("objects/mp", str(src))
    assert fault_proxy.count("drop_response") == 1
    assert raw_object(s, "objects/mp")["data"] == data
    s.close()


# -- retries ---------------------------------------------------------------------------
def test_transient_faults_are_retried(proxied: S3Store, fault_proxy: FaultProxy) -> None:
    fault_proxy.fail_next("slowdown", "slowdown", "slowdown", methods=["PUT"])
    proxied.put("k", b"v")
    assert fault_proxy.count("slowdown", "PUT") == 3
    assert fault_proxy.count(None, "PUT") == 1
    fault_proxy.fail_next("drop", "slowdown", methods=["GET"])
    assert proxied.get("k") == b"v"
    fault_proxy.fail_next("slowdown", "drop", methods=["HEAD"])
    assert proxied.exists("k")
    fault_proxy.fail_next("slowdown", methods=["GET"])
    assert list(proxied.list("")) == ["k"]
    assert fault_proxy.count("slowdown") == 6 and fault_proxy.count("drop") == 2


def test_body_cut_mid_download_is_retried(proxied: S3Store, fault_proxy: FaultProxy) -> None:
    data = random.Random(4).randbytes(256 * 1024)
    proxied.put("big", data)
    fault_proxy.fail_next("truncate", "truncate", methods=["GET"])
    assert proxied.get("big") == data
    assert proxied.get("big", byte_range=(1000, 200_000)) == data[1000:200_000]
    assert fault_proxy.count("truncate") == 2


def test_read_timeout_is_retried(s3_bucket: BucketFactory, fault_proxy: FaultProxy) -> None:
    fault_proxy.stall_s = 3.0
    options = {**FAST, "endpoint_url": fault_proxy.endpoint_url, "read_timeout_s": 0.3}
    s = S3Store(f"s3://{s3_bucket()}", storage_options=options)
    s.put("k", b"v")
    fault_proxy.fail_next("stall", methods=["GET"])
    assert s.get("k") == b"v"
    assert fault_proxy.count("stall") == 1
    s.close()


def test_retries_are_bounded_and_name_the_key(
    s3_bucket: BucketFactory, fault_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = {**FAST, "endpoint_url": fault_proxy.endpoint_url, "max_attempts": 3}
    s = S3Store(f"s3://{s3_bucket()}/pre", storage_options=options)
    bounds: list[float] = []
    uniform = s._rng.uniform

    def recording_uniform(low: float, high: float) -> float:
        bounds.append(high)
        return uniform(low, high)

    monkeypatch.setattr(s._rng, "uniform", recording_uniform)
    fault_proxy.fail_share(1.0, "slowdown", seed=0)
    with pytest.raises(StorageError, match=r"s3://.*/pre/objects/x: write failed after 3 att"):
        s.put("objects/x", b"v")
    # One attempt per retry (botocore's own retries are off), exponential full-jitter bounds.
    assert fault_proxy.count("slowdown") == 3
    assert bounds == [0.01, 0.02]
    fault_proxy.clear()
    fault_proxy.fail_share(1.0, "drop", seed=0)
    with pytest.raises(StorageError, match="objects/y: read failed after 3 attempts"):
        s.get("objects/y")
    s.close()


def test_retry_deadline_bounds_total_time(
    s3_bucket: BucketFactory, fault_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = {
        "endpoint_url": fault_proxy.endpoint_url,
        "backoff_base_s": 50.0,
        "retry_deadline_s": 1.0,
    }
    s = S3Store(f"s3://{s3_bucket()}", storage_options=options)
    monkeypatch.setattr(s._rng, "uniform", lambda low, high: high)  # the longest backoff
    fault_proxy.fail_share(1.0, "slowdown", seed=0)
    with pytest.raises(StorageError, match=r"k: write failed after 1 attempts.*retry deadline"):
        s.put("k", b"v")
    assert fault_proxy.count("slowdown") == 1
    s.close()


# -- conditional-write probe -------------------------------------------------------------
def test_probe_finds_conditional_writes_on_moto(store: S3Store) -> None:
    assert probe_conditional_writes(store) is True
    assert store.supports_atomic_cas is True
    assert list(store.list("_probe/")) == []
    with pytest.raises(ReadOnlyError):
        probe_conditional_writes(S3Store(store.url, read_only=True))


def test_server_without_conditional_writes(
    s3_bucket: BucketFactory, fault_proxy: FaultProxy
) -> None:
    fault_proxy.strip_headers = frozenset({"If-None-Match", "If-Match"})
    bucket = s3_bucket()
    s = S3Store(f"s3://{bucket}", storage_options={"endpoint_url": fault_proxy.endpoint_url})
    assert s.supports_atomic_cas is True  # assumed until probed
    assert s.probe_conditional_writes() is False  # the catalog's init calls this method
    assert s.supports_atomic_cas is False
    with pytest.raises(StorageError, match="does not support conditional writes"):
        s.compare_and_swap("refs/main", None, b"x")
    assert not s.exists("refs/main") and list(s.list("_probe/")) == []
    s.close()
    options = {"endpoint_url": fault_proxy.endpoint_url, "conditional_writes": False}
    s = S3Store(f"s3://{bucket}", storage_options=options)
    assert s.supports_atomic_cas is False
    with pytest.raises(StorageError, match=r"refs/main: .*does not support conditional writes"):
        s.compare_and_swap("refs/main", None, b"x")
    assert s.put_if_absent("objects/a", b"1") is True  # check-then-write
    assert s.put_if_absent("objects/a", b"2") is False
    assert s.get("objects/a") == b"1"
    s.close()


# -- secrets, pickling, processes ----------------------------------------------------------
def test_secret_never_in_errors_or_reprs(s3_bucket: BucketFactory, fault_proxy: FaultProxy) -> None:
    secret = "sEcReT-never-show-me-0123456789"
    options = {
        **FAST,
        "key": "AKIDEXAMPLE",
        "secret": secret,
        "max_attempts": 2,
        "client_kwargs": {"endpoint_url": fault_proxy.endpoint_url},
    }
    s = S3Store(f"s3://{s3_bucket()}", storage_options=options)
    errors: list[SimstoreError] = []
    for action in (
        lambda: s.get("missing"),
        lambda: S3Store("s3://simstore-no-bucket", storage_options=options).get("k"),
        lambda: s.compare_and_swap("ref", '"0"', b"x"),
    ):
        with pytest.raises(SimstoreError) as info:
            action()
        errors.append(info.value)
    fault_proxy.fail_share(1.0, "slowdown", seed=0)
    with pytest.raises(StorageError) as retry_info:
        s.put("k", b"v")
    errors.append(retry_info.value)
    assert len({type(e) for e in errors}) == 3  # NotFound, Storage, Conflict
    for err in errors:
        for text in (
            str(err),
            repr(err),
            str(err.__cause__),
            repr(pickle.loads(pickle.dumps(err))),
        ):
            assert secret not in text and FAKE_SECRET_KEY not in text
    assert secret not in repr(s) and secret not in repr(s.storage_options)
    assert "AKIDEXAMPLE" not in repr(s.storage_options)
    s.close()


def _child_round_trip(store: S3Store) -> bytes:
    store.put("from-child", b"child wrote this")
    return store.get("from-parent")


def test_pickled_store_works_in_spawned_process(store: S3Store) -> None:
    store.put("from-parent", b"parent wrote this")
    store.get("from-parent")  # the parent's client exists and must not travel
    clone = pickle.loads(pickle.dumps(store))
    assert clone._client is None and clone.url == store.url
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        got = pool.apply(_child_round_trip, (store,))
    assert got == b"parent wrote this"
    assert store.get("from-child") == b"child wrote this"
