"""Shared fixtures: the S3 ones (moto server on 127.0.0.1, buckets, fault proxy)."""

pytest_plugins = ["simstore.testing.s3"]
