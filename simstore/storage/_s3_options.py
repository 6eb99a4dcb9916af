"""The options of an S3 store: what :class:`S3Options` accepts, checked and masked.

The client options (endpoint, credentials, botocore's own keyword arguments) go to
botocore as they are; the behaviour options (retries, timeouts, multipart sizes,
conditional writes) are checked here into a :class:`Tuning`. Credentials never reach a
repr or an error message.
"""

from __future__ import annotations

import math
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, TypedDict

from simstore.errors import InvalidInputError

__all__ = [
    "ADDITIONAL_PARAMETERS",
    "CLIENT_ARGS",
    "DAY_S",
    "MaskedOptions",
    "S3Options",
    "Tuning",
    "extra_parameters",
    "parse_tuning",
    "secrets_of",
]

_MiB = 1024 * 1024

# s3fs options that tune s3fs's own caches and loop; they mean nothing here and are ignored.
_IGNORED_S3FS_OPTIONS = frozenset(
    {
        "use_listings_cache", "listings_expiry_time", "max_paths", "skip_instance_cache",
        "default_block_size", "default_fill_cache", "default_cache_type", "cache_regions",
        "asynchronous", "loop",
    }
)  # fmt: skip
_SECRET_OPTIONS = frozenset(
    {"key", "secret", "token", "aws_access_key_id", "aws_secret_access_key", "aws_session_token"}
)
class S3Options(TypedDict, total=False):
    """``storage_options`` of :class:`S3Store`; s3fs's names where s3fs has one.

    Endpoint and credentials (each falls back to the AWS environment and config files):
        endpoint_url: the server, e.g. ``http://127.0.0.1:9000`` (else ``AWS_ENDPOINT_URL``).
        key, secret, token: access key id, secret key, session token.
        profile: a profile of ``~/.aws/config`` (else ``AWS_PROFILE``).
        region_name: the region (else ``AWS_REGION``/``AWS_DEFAULT_REGION``).
        anon: send unsigned requests (public buckets).
        use_ssl: whether to use TLS where the endpoint does not say.
        client_kwargs: more keyword arguments of botocore's ``create_client``
            (``endpoint_url``, ``region_name``, ``verify``, ...).
        config_kwargs: keyword arguments of ``botocore.config.Config``
            (``max_pool_connections``, ``s3={"addressing_style": "path"}``,
            ``request_checksum_calculation="when_required"`` for older servers, ...).

    Request parameters (s3fs's names; added to every request whose operation takes them):
        requester_pays: the reader pays for requests and transfer of a Requester Pays
            bucket (``x-amz-request-payer: requester``).
        s3_additional_kwargs: more parameters of S3's API, from
            :data:`ADDITIONAL_PARAMETERS`, e.g. ``{"ServerSideEncryption": "aws:kms",
            "SSEKMSKeyId": "alias/data"}`` for buckets whose policy requires SSE-KMS,
            ``{"ACL": "bucket-owner-full-control"}`` across accounts.

    Behaviour:
        conditional_writes: whether the server enforces If-None-Match/If-Match (default
            True; record :func:`probe_conditional_writes`). False makes compare-and-swap
            raise ``StorageError`` and put-if-absent check-then-write.
        max_attempts: attempts per request, transient failures included (default 5).
        backoff_base_s, backoff_max_s: retry ``n`` (from 1) sleeps a uniform random time
            in ``[0, min(backoff_max_s, backoff_base_s * 2**(n-1)))`` (defaults 0.25 and 20).
        retry_deadline_s: no retry starts later than this after the first attempt (120).
        connect_timeout_s, read_timeout_s: socket timeouts per attempt (10 and 60).
        min_read_bytes_per_second: a body still arriving once its read has taken longer
            than both ``retry_deadline_s`` and its size at this rate is cut off, so one
            that trickles in (a few bytes inside every read timeout) fails (32 KiB).
        multipart_threshold_bytes: uploads above this are multipart (64 MiB).
        multipart_part_bytes: part size (16 MiB; grown to stay within 10,000 parts;
            S3 needs at least 5 MiB for every part but the last).
        multipart_concurrency: parts uploaded at once by one upload (4).
    """

    endpoint_url: str
    key: str
    secret: str
    token: str
    profile: str
    region_name: str
    anon: bool
    use_ssl: bool
    client_kwargs: Mapping[str, Any]
    config_kwargs: Mapping[str, Any]
    requester_pays: bool
    s3_additional_kwargs: Mapping[str, Any]
    conditional_writes: bool
    max_attempts: int
    backoff_base_s: float
    backoff_max_s: float
    retry_deadline_s: float
    connect_timeout_s: float
    read_timeout_s: float
    min_read_bytes_per_second: float
    multipart_threshold_bytes: int
    multipart_part_bytes: int
    multipart_concurrency: int


@dataclass(frozen=True, slots=True)
class Tuning:
    """The behaviour options of :class:`S3Options`, checked, with their defaults."""

    conditional_writes: bool = True
    max_attempts: int = 5
    backoff_base_s: float = 0.25
    backoff_max_s: float = 20.0
    retry_deadline_s: float = 120.0
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    min_read_bytes_per_second: float = 32 * 1024
    multipart_threshold_bytes: int = 64 * _MiB
    multipart_part_bytes: int = 16 * _MiB
    multipart_concurrency: int = 4


_TUNING_NAMES = frozenset(f.name for f in fields(Tuning))
def _endpoint(url: str) -> str:
    """An endpoint URL as compared: scheme and host in lower case, no trailing slash."""
    parts = urllib.parse.urlsplit(url.rstrip("/"))
    return parts._replace(scheme=parts.scheme.lower(), netloc=parts.netloc.lower()).geturl()


CLIENT_ARGS = (("endpoint_url", "endpoint_url"), ("region_name", "region_name"),
                ("use_ssl", "use_ssl"),
                ("key", "aws_access_key_id"), ("secret", "aws_secret_access_key"),
                ("token", "aws_session_token"))
"""Options that set an argument of the client that ``client_kwargs`` may set too."""

TEXT_OPTIONS = ("endpoint_url", "key", "secret", "token", "profile", "region_name")
"""Options that are text: an access key of digits is a key, not a number (the command
line's ``--storage-option`` keeps these as typed)."""

_CLIENT_NAMES = frozenset(
    {"endpoint_url", "key", "secret", "token", "profile", "region_name", "anon", "use_ssl",
     "client_kwargs", "config_kwargs", "requester_pays", "s3_additional_kwargs"}
)  # fmt: skip

ADDITIONAL_PARAMETERS = frozenset(
    {
        "ServerSideEncryption", "SSEKMSKeyId", "SSEKMSEncryptionContext", "BucketKeyEnabled",
        "StorageClass", "ACL", "GrantFullControl", "GrantRead", "GrantReadACP",
        "GrantWriteACP", "ExpectedBucketOwner", "RequestPayer", "Tagging",
    }
)  # fmt: skip
"""S3 parameters ``s3_additional_kwargs`` may set: encryption with a KMS key, storage
class, ACLs and grants, the expected bucket owner, request payment, tags. Each goes to the
requests whose operation takes it (PutObject, CreateMultipartUpload and CopyObject for
encryption; every object request for ``ExpectedBucketOwner``). Parameters the store sets
itself (keys, bodies, conditions, ranges) cannot be overridden; customer-provided keys
(SSE-C) are not supported: a copy onto itself, which refreshes an object's age, would
need them twice."""


class MaskedOptions(dict[str, Any]):
    """The options dict, whose repr hides credentials."""

    def __repr__(self) -> str:
        return repr({k: _mask(k, v) for k, v in self.items()})


def _mask(name: str, value: Any) -> Any:
    if name in _SECRET_OPTIONS:
        return "***"
    if isinstance(value, Mapping):
        return {k: _mask(k, v) for k, v in value.items()}
    return value


DAY_S = 86_400
"""The longest time in seconds a storage option may give (a socket refuses 1e300 s)."""

_INTEGER_TUNING = frozenset({"max_attempts", "multipart_threshold_bytes", "multipart_part_bytes",
                             "multipart_concurrency"})


def parse_tuning(options: Mapping[str, Any]) -> Tuning:
    """The behaviour options of ``options``, checked; an unknown option is an error."""
    unknown = set(options) - _TUNING_NAMES - _CLIENT_NAMES - _IGNORED_S3FS_OPTIONS
    if unknown:
        raise InvalidInputError(
            f"unknown S3 storage options {sorted(unknown)}; known: "
            f"{sorted(_TUNING_NAMES | _CLIENT_NAMES)}"
        )
    for name in ("client_kwargs", "config_kwargs"):
        if options.get(name) is not None and not isinstance(options[name], Mapping):
            raise InvalidInputError(f"S3 storage option {name} must be a mapping of "
                                    f"keyword arguments, got {options[name]!r}")
    client = options.get("client_kwargs") or {}
    for option, arg in CLIENT_ARGS:
        given, asked = options.get(option), client.get(arg)
        kind = bool if option == "use_ssl" else str
        if not isinstance(given, kind) or not isinstance(asked, kind):
            continue  # not given both ways, or of the wrong type: checked by its own rule
        if option == "endpoint_url" and isinstance(given, str) and isinstance(asked, str):
            given, asked = _endpoint(given), _endpoint(asked)
        if given != asked:
            shown = "..." if option in ("key", "secret", "token") else None
            raise InvalidInputError(
                f"S3 storage options {option}={shown or repr(options[option])} and "
                f"client_kwargs {arg}={shown or repr(client[arg])} disagree"
            )
    given = {k: v for k, v in options.items() if k in _TUNING_NAMES}
    for name, value in _from_config(options.get("config_kwargs") or {}).items():
        if name in given and given[name] != value:
            raise InvalidInputError(
                f"S3 storage options {name}={given[name]!r} and config_kwargs (which asks "
                f"for {value!r}) disagree"
            )
        given[name] = value
    tuning = Tuning(**given)
    if not isinstance(tuning.conditional_writes, bool):
        raise InvalidInputError("S3 storage option conditional_writes must be True or False")
    for name in _TUNING_NAMES - {"conditional_writes"}:
        value = getattr(tuning, name)
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not math.isfinite(value) or value <= 0:
            raise InvalidInputError(
                f"S3 storage option {name} must be a positive finite number, got {value!r}"
            )
        if name in _INTEGER_TUNING and not float(value).is_integer():
            raise InvalidInputError(f"S3 storage option {name} must be a whole number: {value!r}")
        if name.endswith("_s") and value > DAY_S:  # a socket refuses 1e300 s, mid-request
            raise InvalidInputError(
                f"S3 storage option {name} must be at most {DAY_S} seconds (a day), "
                f"got {value!r}"
            )
    # a whole number given as a float (6e6, as a flag's JSON value parses) counts as one:
    # sizes and counts are used as slice bounds and range sizes
    whole: dict[str, Any] = {n: int(getattr(tuning, n)) for n in _INTEGER_TUNING
                             if isinstance(getattr(tuning, n), float)}
    tuning = replace(tuning, **whole)
    if tuning.multipart_part_bytes < 5 * _MiB:
        raise InvalidInputError(
            "S3 storage option multipart_part_bytes must be at least 5 MiB (S3's smallest "
            f"part), got {tuning.multipart_part_bytes}"
        )
    for name in TEXT_OPTIONS:
        if options.get(name) is not None and not isinstance(options[name], str):
            raise InvalidInputError(
                f"S3 storage option {name} must be text, got {type(options[name]).__name__} "
                f"{options[name]!r}"
            )
    for name in ("anon", "use_ssl"):  # "false" would be true
        if options.get(name) is not None and not isinstance(options[name], bool):
            raise InvalidInputError(
                f"S3 storage option {name} must be True or False, got {options[name]!r}"
            )
    if options.get("token") and not (options.get("key") and options.get("secret")):
        raise InvalidInputError(
            "S3 storage option token needs key and secret as well (botocore ignores a "
            "session token given alone); or set AWS_SESSION_TOKEN with the key and secret"
        )
    return tuning


def _from_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The store's own options that an s3fs-style ``config_kwargs`` asks for.

    The store makes its own retries and sets botocore's timeouts from its options, so
    ``connect_timeout``, ``read_timeout`` and ``retries`` (botocore's ``max_attempts``
    counts retries, ``total_max_attempts`` attempts) become ``connect_timeout_s``,
    ``read_timeout_s`` and ``max_attempts``; a retry ``mode`` is the store's own backoff.
    """
    out: dict[str, Any] = {}
    for key, name in (("connect_timeout", "connect_timeout_s"), ("read_timeout", "read_timeout_s")):
        if key in config:
            out[name] = config[key]
    retries = config.get("retries")
    if retries is not None:
        if not isinstance(retries, Mapping) or set(retries) - {
            "max_attempts", "total_max_attempts", "mode"
        }:
            raise InvalidInputError(
                "S3 storage option config_kwargs: retries must be a mapping of max_attempts, "
                f"total_max_attempts and mode, got {retries!r}"
            )
        for key in ("max_attempts", "total_max_attempts"):
            value = retries.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 0):
                raise InvalidInputError(
                    f"S3 storage option config_kwargs: retries {key} must be a whole number "
                    f"of at least 0, got {value!r}"
                )
        if retries.get("total_max_attempts") is not None:
            out["max_attempts"] = retries["total_max_attempts"]
        elif retries.get("max_attempts") is not None:
            out["max_attempts"] = retries["max_attempts"] + 1  # the first attempt is no retry
    return out


def extra_parameters(options: Mapping[str, Any]) -> dict[str, Any]:
    """The request parameters ``requester_pays`` and ``s3_additional_kwargs`` ask for, checked."""
    extra: dict[str, Any] = {}
    given = options.get("s3_additional_kwargs")
    if given is not None:
        if not isinstance(given, Mapping):
            raise InvalidInputError(
                "S3 storage option s3_additional_kwargs must be a mapping of S3 parameters"
            )
        unknown = sorted(str(k) for k in given if k not in ADDITIONAL_PARAMETERS)
        if unknown:
            raise InvalidInputError(
                f"S3 storage option s3_additional_kwargs: {unknown[0]!r} is not a parameter "
                f"simstore adds to requests; allowed: {sorted(ADDITIONAL_PARAMETERS)}"
            )
        extra.update(given)
    payer = options.get("requester_pays", False)
    if not isinstance(payer, bool):
        raise InvalidInputError("S3 storage option requester_pays must be True or False")
    if payer:
        extra["RequestPayer"] = "requester"
    return extra


def secrets_of(options: Mapping[str, Any]) -> tuple[str, ...]:
    """The credentials in ``options`` (top level and ``client_kwargs``), to mask in errors."""
    found = [str(v) for k, v in options.items() if k in _SECRET_OPTIONS and v]
    for nested in ("client_kwargs",):
        found += [
            str(v) for k, v in (options.get(nested) or {}).items() if k in _SECRET_OPTIONS and v
        ]
    return tuple(s for s in found if len(s) >= 4)
