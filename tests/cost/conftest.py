"""Fixtures of the cost tests: the S3 ones are registered in tests/conftest.py."""
