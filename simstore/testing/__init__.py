"""Test doubles and conformance suites that ship with simstore.

``ObjectStoreTests`` is an abstract pytest class every ``ObjectStore`` implementation
subclasses (memory, local, S3). Importing this package needs pytest; simstore itself
never imports it.
"""

from simstore.testing.store import ObjectStoreTests

__all__ = ["ObjectStoreTests"]
