"""Branch and tag refs: small JSON objects moved only by compare-and-swap."""

from __future__ import annotations

import json
from collections.abc import Iterator

from simstore.catalog._caps import read_capped, read_capped_versioned
from simstore.errors import (
    AlreadyExistsError,
    ConflictError,
    FormatError,
    InvalidInputError,
    NotFoundError,
    ReadOnlyError,
    SimstoreError,
    StorageError,
    version_error,
)
from simstore.hashing import is_object_id, object_key
from simstore.names import Ref, check_name, check_ref_name
from simstore.sample import canonical_json
from simstore.snapshot import SNAPSHOT_HEAD, Snapshot
from simstore.storage import ObjectStore

__all__ = [
    "Branches",
    "Tags",
    "dataset_prefix",
    "decode_ref",
    "encode_ref",
    "gone_after_all",
    "is_snapshot_object",
    "misplaced_refs",
    "ref_key",
    "staging_key",
]

REF_FORMAT_VERSION = 1


def is_snapshot_object(store: ObjectStore, oid: str) -> bool:
    """Whether object ``oid`` begins as every snapshot does (docs/format.md).

    One small ranged read, so a shard is never read whole to find out; False when absent.
    """
    try:
        return store.get(object_key(oid), byte_range=(0, len(SNAPSHOT_HEAD))) == SNAPSHOT_HEAD
    except NotFoundError:
        return False


def dataset_prefix(dataset: str) -> str:
    """``datasets/<name>/``."""
    return f"datasets/{check_name(dataset, 'dataset name')}/"


def staging_key(dataset: str, entry_id: str = "") -> str:
    """Key of a staging entry (``datasets/<name>/staging/<id>``); with no id, its folder."""
    name = check_name(entry_id, "staging id") if entry_id else ""
    return f"{dataset_prefix(dataset)}staging/{name}"


def ref_key(dataset: str, kind: str, name: str) -> str:
    """Key of a branch (``heads``) or tag (``tags``) ref."""
    what = "branch name" if kind == "heads" else "tag name"
    return f"{dataset_prefix(dataset)}refs/{kind}/{check_name(name, what)}"


def gone_after_all(store: ObjectStore, key: str) -> bool:
    """Whether ``key`` is gone all the same after its delete raised a StorageError.

    Every attempt's response lost, the retries used up: a delete that landed. False when
    that cannot be read either (the error stands).
    """
    try:
        return not store.exists(key)
    except SimstoreError:
        return False


def misplaced_refs(store: ObjectStore) -> list[tuple[str, str]]:
    """Where a branch or tag belongs but a folder stands: ``(DATASET@NAME, one line)``.

    On a local store a ref is a file, and a folder at its path (made by hand, or left by
    a restore) reads as no ref: a listing passes over it as if the ref had been deleted,
    and gc would take its history for unreachable. An object store has no folders: a
    key below a ref's name (``refs/heads/main/x``) stands beside the ref, not in its
    place, and is no ref either way. One listing of the folders under ``datasets/``.
    """
    folders = getattr(store, "folders", None)
    if not callable(folders):
        return []
    lines: list[tuple[str, str]] = []
    for key in folders("datasets/"):
        parts = key.split("/")
        if len(parts) != 5 or parts[2] != "refs" or parts[3] not in ("heads", "tags"):
            continue
        _, dataset, _, kind, name = parts
        what = "branch" if kind == "heads" else "tag"
        lines.append((f"{dataset}@{name}", (
            f"{store.url}/{key}: a folder stands where {what} {dataset}@{name} belongs, "
            f"so it reads as no {what}: remove the folder (and, if the {what} is lost, "
            f"make it again: simstore {what})"
        )))  # fmt: skip
    return lines


def encode_ref(snapshot_id: str) -> bytes:
    """Bytes of a ref pointing at ``snapshot_id``."""
    return canonical_json({"format_version": REF_FORMAT_VERSION, "snapshot": snapshot_id})


def decode_ref(data: bytes, key: str) -> str:
    """The snapshot id a ref holds; raise :class:`FormatError` naming the ref when bad."""
    try:
        obj = json.loads(data)
        version = obj.get("format_version")
        if version != REF_FORMAT_VERSION:
            raise version_error(f"ref {key} has", version, REF_FORMAT_VERSION)
        sid = obj["snapshot"]
    except (ValueError, KeyError, AttributeError, TypeError, RecursionError) as exc:
        # RecursionError: JSON nested too deeply for the parser (a crafted object)
        raise FormatError(f"ref {key} is malformed: {exc}") from exc
    if not isinstance(sid, str) or not is_object_id(sid):
        raise FormatError(f"ref {key} holds an invalid snapshot id {sid!r}")
    return sid


class _Refs:
    kind = ""

    def __init__(self, store: ObjectStore, dataset: str) -> None:
        self._store = store
        self.dataset = dataset

    def key(self, name: str) -> str:
        return ref_key(self.dataset, self.kind, name)

    def key_unchecked(self, name: str) -> str:
        """Where a listing found ``name``, which may break the name rules (to name it)."""
        return f"datasets/{self.dataset}/refs/{self.kind}/{name}"

    def new_key(self, name: str) -> str:
        """:meth:`key` of a ref about to be written: not a name that reads as a snapshot id.

        A REF whose revision is a full snapshot id (32 hex characters) names that snapshot
        before any branch or tag (:meth:`Catalog.resolve`), so no ref may take such a name.
        """
        check_ref_name(name, "branch name" if self.kind == "heads" else "tag name")
        return self.key(name)

    def get(self, name: str) -> str:
        """The snapshot id a ref points at; NotFoundError when absent."""
        key = self.key(name)
        try:
            return decode_ref(read_capped(self._store, key, "ref"), key)
        except NotFoundError:
            raise NotFoundError(
                f"{self.dataset}: no {'branch' if self.kind == 'heads' else 'tag'} {name!r}"
            ) from None

    def get_versioned(self, name: str) -> tuple[str | None, str | None]:
        """(snapshot id, version token), or (None, None) when absent."""
        key = self.key(name)
        try:
            data, version = read_capped_versioned(self._store, key, "ref")
        except NotFoundError:
            return None, None
        return decode_ref(data, key), version

    def names(self) -> list[str]:
        """The refs' names, sorted, from one listing (no ref is read)."""
        prefix = f"{dataset_prefix(self.dataset)}refs/{self.kind}/"
        names = (key[len(prefix) :] for key in self._store.list(prefix))
        return sorted(name for name in names if name and "/" not in name)

    def list(self) -> Iterator[tuple[str, str]]:
        """(name, snapshot id) pairs, sorted by name; a ref deleted since the listing is skipped."""
        prefix = f"{dataset_prefix(self.dataset)}refs/{self.kind}/"
        for key in self._store.list(prefix):
            name = key[len(prefix) :]
            if "/" in name:
                continue
            try:
                data = read_capped(self._store, key, "ref")
            except NotFoundError:
                continue
            yield name, decode_ref(data, key)

    def exists(self, name: str) -> bool:
        """Whether the ref exists."""
        return self._store.exists(self.key(name))

    def _what(self, name: str) -> str:
        return f"{'branch' if self.kind == 'heads' else 'tag'} {name!r}"

    def _create(self, name: str, snapshot_id: str) -> None:
        """Create a ref at ``snapshot_id`` unless it exists; idempotent.

        On a conflict the ref is read back, as :meth:`Catalog.commit` does after a lost
        swap: when the response to the create is lost, the store sends it again and the
        retry's 412 is against the first attempt's own write. If the ref now holds exactly
        the bytes this call writes, the create is done. Refs carry no writer identity (and
        on S3 the ETag of a PUT is the MD5 of the body), so this writer's earlier attempt
        cannot be told from another writer's create of the same ref at the same snapshot;
        both leave the state that was asked for, so both count as success. A ref at any
        other snapshot raises :class:`AlreadyExistsError`.
        """
        key = self.new_key(name)
        body = encode_ref(snapshot_id)
        # gc keeps a snapshot modified within its grace period (and all it reaches), so a
        # ref to a snapshot nothing else names refreshes it first; a gc that deleted it
        # anyway (between its check and its delete) is caught by the check after the write
        if not is_object_id(snapshot_id):
            raise InvalidInputError(
                f"{self.dataset}: {self._what(name)}: {snapshot_id!r} is not a snapshot id"
            )
        target = object_key(snapshot_id)
        # a ref that already exists is answered before anything is written (the refresh
        # below is a write): at the same snapshot the create is done, elsewhere refused,
        # as the conditional create would, and alike on a store this process may not write
        try:
            existing: bytes | None = read_capped(self._store, key, "ref")
        except NotFoundError:
            existing = None
        if existing is not None:
            if existing == body:
                return
            raise AlreadyExistsError(f"{self.dataset}: {self._what(name)} already exists")
        other = "tags" if self.kind == "heads" else "heads"
        if self._store.exists(ref_key(self.dataset, other, name)):
            # a branch is looked up before a tag: a branch named like a tag took the tag's
            # REF over (ds@v1 moved with the branch), and a tag named like a branch was one
            # nothing could read
            raise AlreadyExistsError(
                f"{self.dataset}: cannot create {self._what(name)}: "
                f"{'a tag' if other == 'tags' else 'a branch'} of that name exists, and "
                f"{self.dataset}@{name} names it (a name is a branch or a tag, not both)"
            )
        refresh = getattr(self._store, "refresh", None)
        try:
            found = refresh(target) if callable(refresh) else self._store.exists(target)
        except (ReadOnlyError, StorageError) as exc:  # the ref is what could not be made
            raise type(exc)(f"{self.dataset}: cannot create {self._what(name)}: {exc}") from exc
        if not found:
            raise NotFoundError(f"{self.dataset}: no snapshot {snapshot_id}")
        self._check_target(name, snapshot_id)
        try:
            self._store.compare_and_swap(key, None, body)
        except StorageError:
            # Every response lost (the retries used up): the create may have landed.
            if self._read_back(key) != body:
                raise
        except ConflictError as exc:
            try:
                now = read_capped(self._store, key, "ref")
            except NotFoundError:
                raise ConflictError(
                    f"{self.dataset}: {self._what(name)} was created and deleted concurrently"
                ) from exc
            if now != body:
                raise AlreadyExistsError(
                    f"{self.dataset}: {self._what(name)} already exists"
                ) from None
        if not self._store.exists(target):
            self._delete(name)
            raise NotFoundError(
                f"{self.dataset}: snapshot {snapshot_id} was deleted by a garbage collection "
                f"while {self._what(name)} was being created; the {self._what(name)} was "
                "not created"
            )

    def _check_target(self, name: str, snapshot_id: str) -> None:
        """Refuse a ref to an object that is not a snapshot of this dataset."""
        if not is_snapshot_object(self._store, snapshot_id):
            raise InvalidInputError(
                f"{self.dataset}: {self._what(name)}: object {snapshot_id} is not a snapshot"
            )
        try:
            data = read_capped(self._store, object_key(snapshot_id), "snapshot")
            dataset = Snapshot.from_bytes(data, object_id=snapshot_id).dataset
        except NotFoundError:
            raise NotFoundError(f"{self.dataset}: no snapshot {snapshot_id}") from None
        except FormatError:
            raise InvalidInputError(
                f"{self.dataset}: {self._what(name)}: object {snapshot_id} is not a snapshot"
            ) from None
        # an IntegrityError (a snapshot whose bytes no longer match its id) is damage, and
        # says so (exit 6), not that the object is no snapshot
        if dataset != self.dataset:
            raise InvalidInputError(
                f"{self.dataset}: {self._what(name)}: snapshot {snapshot_id} belongs to "
                f"dataset {dataset!r}"
            )

    def _delete(self, name: str) -> None:
        """Delete a ref by compare-and-swap against the version just read; idempotent.

        A retried conditional DELETE whose first attempt landed gets 404 (the ref is
        gone), which the store reports as a conflict. So on a conflict the ref is looked up
        again: gone means the delete is done (by this call or a concurrent one, the end
        state is the one asked for); still there means it changed meanwhile, and the
        :class:`ConflictError` stands. A :class:`StorageError` (every attempt's response
        lost, the retries used up) is checked the same way: the ref gone means done, and
        otherwise (or when that cannot be read either) the error stands.
        """
        key = self.key(name)
        try:
            # its bytes are not decoded: a damaged ref is deleted too (else only a hand
            # in the store could take it away, and it blocked the dataset's commands);
            # one larger than any ref is refused all the same (its version is its bytes')
            _, version = read_capped_versioned(self._store, key, "ref")
        except NotFoundError:
            raise NotFoundError(f"{self.dataset}: no {self._what(name)}") from None
        try:
            self._store.compare_and_swap(key, version, None)
        except ConflictError:
            if self._store.exists(key):
                raise
        except StorageError:
            if not gone_after_all(self._store, key):
                raise

    def _read_back(self, key: str) -> bytes | None:
        """The ref's bytes now, read (with the store's retries) after a write that failed.

        None when the ref is absent or cannot be read: the write's own error then stands.
        """
        try:
            return read_capped(self._store, key, "ref")
        except SimstoreError:
            return None


class Branches(_Refs):
    """Branches of one dataset: ``datasets/<name>/refs/heads/<branch>``, moved by CAS."""

    kind = "heads"

    def require(self, name: str) -> list[str]:
        """Refuse ``name`` when the dataset has branches and it is none of them (NotFoundError).

        A dataset without branches (new, or unknown) passes: its first snapshot creates
        its branch. Anywhere else a branch starts at a snapshot, so a mistyped name never
        takes staged changes off to an orphan history. One listing decides; returns the
        branch names it found (see ``Catalog.require_branch`` for a dataset whose branches
        were all deleted).
        """
        names = self.names()
        if names and name not in names:
            at = "main" if "main" in names else names[0]
            more = f" and {len(names) - 10} more" if len(names) > 10 else ""
            if Ref(dataset=self.dataset, rev=name).full_id is not None:
                # no branch may take such a name (check_ref_name): suggesting to create
                # one would name a command that is refused
                raise NotFoundError(
                    f"dataset {self.dataset!r} has no branch {name!r}: 32 hex characters "
                    f"name a snapshot, never a branch (branches: {', '.join(names[:10])}"
                    f"{more}); to change history from that snapshot, make a branch at it: "
                    f"simstore branch {self.dataset}@{name} NEW_NAME"
                )
            raise NotFoundError(
                f"dataset {self.dataset!r} has no branch {name!r} (branches: "
                f"{', '.join(names[:10])}{more}); create it at a snapshot first: "
                f"simstore branch {self.dataset}@{at} {name}"
            )
        return names

    def create(self, name: str, snapshot_id: str) -> None:
        """Create a branch at a snapshot; AlreadyExistsError when it exists elsewhere.

        A branch that already points at ``snapshot_id`` counts as created (see
        :meth:`_create`: a create retried after a lost response must not fail).
        """
        self._create(name, snapshot_id)

    def move(self, name: str, expected_version: str | None, snapshot_id: str) -> str | None:
        """Move a branch by compare-and-swap from the version read earlier.

        When the swap raises :class:`StorageError` (on S3: every attempt's response lost,
        the retries used up), the branch is read back: if it holds ``snapshot_id`` the
        move landed and its version is returned; otherwise the error stands. Snapshot ids
        are content hashes (a snapshot names its parent), so a branch at ``snapshot_id``
        is this move's state whoever wrote it. :meth:`Catalog.commit` relies on this.
        """
        key = self.new_key(name)
        body = encode_ref(snapshot_id)
        try:
            return self._store.compare_and_swap(key, expected_version, body)
        except StorageError:
            try:
                data, version = read_capped_versioned(self._store, key, "ref")
            except SimstoreError:
                data, version = None, None
            if data != body:
                raise
            return version

    def delete(self, name: str) -> None:
        """Delete a branch (CAS against its current version); see :meth:`_delete`."""
        self._delete(name)


class Tags(_Refs):
    """Tags of one dataset: ``datasets/<name>/refs/tags/<tag>``, written once."""

    kind = "tags"

    def create(self, name: str, snapshot_id: str) -> None:
        """Create a tag; AlreadyExistsError when it points elsewhere (tags never move).

        A tag that already points at ``snapshot_id`` counts as created (see
        :meth:`_create`: a create retried after a lost response must not fail).
        """
        self._create(name, snapshot_id)

    def delete(self, name: str) -> None:
        """Delete a tag; a tag gone after a conflict counts as deleted (:meth:`_delete`)."""
        self._delete(name)
