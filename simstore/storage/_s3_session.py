"""The S3 store's botocore session, and the hook that adds request parameters to its calls.

The session's data loader knows S3 without listing botocore's service folders and parses
its JSON data into plain dicts (:class:`_S3Loader`); other services that botocore's
credential providers need (STS, SSO, SSO-OIDC) are found as botocore finds them.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import botocore.loaders
import botocore.session

__all__ = ["add_parameters", "s3_session"]


class _Services:
    """botocore's known services, listed only when a name other than S3 is asked about.

    The store's session makes S3 clients; botocore's credential providers make STS, SSO
    and SSO-OIDC clients from the same session (assumed roles, web identities, SSO
    profiles), and those names still find their models.
    """

    def __init__(self, list_all: Callable[[], list[str]]) -> None:
        self._list_all = list_all
        self._all: list[str] | None = None

    def _names(self) -> list[str]:
        if self._all is None:
            self._all = list(self._list_all())
        return self._all

    def __contains__(self, name: object) -> bool:
        return name == "s3" or name in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())


class _S3Loader(botocore.loaders.Loader):  # type: ignore[misc]
    """botocore's data loader for a session that makes S3 clients (and what they need).

    Making a fresh process's first client took 56 ms on the test machine, nearly all of it
    botocore's data: before loading a service model botocore lists every service it knows
    to check the name (some 400 folders, each listed and its files stat'ed: 12 ms), and
    it parses its JSON files into ``OrderedDict`` (the endpoints of every service, 1.2 MB,
    the S3 model and its endpoint rules: 19 ms). Here S3 is known without a listing (other
    services, which credential providers ask for, are listed as before) and the files
    parse into plain dicts (which keep their order too). Models are still found on the
    same search paths, ``AWS_DATA_PATH`` included.
    """

    def list_available_services(self, type_name: str) -> _Services:
        return _Services(
            lambda: botocore.loaders.Loader.list_available_services(self, type_name)
        )


class _JSONFiles(botocore.loaders.JSONFileLoader):  # type: ignore[misc]
    """botocore's ``.json`` / ``.json.gz`` data files, parsed into plain dicts."""

    def load_file(self, file_path: str) -> Any:
        for ext, opener in ((".json", open), (".json.gz", gzip.open)):
            path = file_path + ext
            if os.path.isfile(path):
                with opener(path, "rb") as fp:
                    return json.loads(fp.read().decode("utf-8"))
        return super().load_file(file_path)  # any other form botocore knows


def s3_session(profile: str | None) -> Any:
    """A botocore session whose data loader is :class:`_S3Loader` (``AWS_DATA_PATH`` kept)."""
    session = botocore.session.Session(profile=profile)
    paths = session.get_config_variable("data_path")
    extra = ([os.path.expanduser(os.path.expandvars(p)) for p in paths.split(os.pathsep)]
             if paths else [])
    session.register_component(
        "data_loader", _S3Loader(extra_search_paths=extra, file_loader=_JSONFiles()))
    return session


def add_parameters(extra: Mapping[str, Any], params: dict[str, Any], model: Any,
                    **_: Any) -> None:
    """Add ``extra``'s parameters that the operation takes and the call did not set.

    A ``provide-client-params`` hook of the store's botocore client.
    """
    shape = model.input_shape
    members = shape.members if shape is not None else {}
    for name, value in extra.items():
        if name in members:
            params.setdefault(name, value)
