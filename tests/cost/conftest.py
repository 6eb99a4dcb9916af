"""Fixtures of the cost tests: the S3 ones ship in :mod:`simstore.testing.s3`."""

from simstore.testing.s3 import fault_proxy, moto_server, s3_bucket, s3_env

__all__ = ["fault_proxy", "moto_server", "s3_bucket", "s3_env"]
