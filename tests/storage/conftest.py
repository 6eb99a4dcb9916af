"""Fixtures of the storage tests: the S3 ones are registered in tests/conftest.py."""
