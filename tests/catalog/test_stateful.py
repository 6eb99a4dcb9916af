"""The real catalog against a dict model: commit, branch, tag, reset and gc in any order."""

import shutil
import tempfile

import hypothesis.strategies as st
import pytest
from catalog_helpers import content, expected_hash, stage_samples
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from simstore.catalog import Catalog, gc, verify
from simstore.errors import AlreadyExistsError, NotFoundError

KEYS = st.sampled_from([f"k{i}" for i in range(8)])
PAYLOADS = st.binary(min_size=1, max_size=8)
BRANCHES = st.sampled_from(["main", "dev", "exp"])
TAGS = st.sampled_from(["v1", "v2", "v3"])


class CatalogMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="simstore-test-catalog-")
        self.cat = Catalog.init(self.root)
        # model: branch -> {key: sample hash}; tag -> {key: sample hash}
        self.branches: dict[str, dict[str, str]] = {}
        self.tags: dict[str, dict[str, str]] = {}
        self.ids: dict[str, str] = {}
        self.tag_ids: dict[str, str] = {}

    @rule(
        branch=BRANCHES,
        upserts=st.dictionaries(KEYS, PAYLOADS, max_size=4),
        deletes=st.sets(KEYS, max_size=2),
    )
    def commit(self, branch, upserts, deletes):
        deletes = sorted(set(deletes) - set(upserts))
        entry = stage_samples(self.cat, "ds", upserts, deleted=deletes)
        if self.branches and branch not in self.branches:
            # only a dataset's first commit creates its branch; the entry stays staged
            with pytest.raises(NotFoundError, match=f"has no branch '{branch}'"):
                self.cat.commit("ds", message="m", branch=branch, staging_ids=[entry.id])
            self.cat.discard_staged("ds", [entry.id])
            return
        res = self.cat.commit("ds", message="m", branch=branch, staging_ids=[entry.id])
        state = dict(self.branches.get(branch, {}))
        for k in deletes:
            state.pop(k, None)
        state.update({k: expected_hash(v) for k, v in upserts.items()})
        self.branches[branch] = state
        self.ids[branch] = res.snapshot_id

    @precondition(lambda self: bool(self.branches))
    @rule(src=BRANCHES, dst=BRANCHES)
    def branch(self, src, dst):
        if src not in self.branches or dst in self.branches:
            return
        self.cat.branches("ds").create(dst, self.ids[src])
        self.branches[dst] = dict(self.branches[src])
        self.ids[dst] = self.ids[src]

    @precondition(lambda self: bool(self.branches))
    @rule(src=BRANCHES, tag=TAGS)
    def tag(self, src, tag):
        if src not in self.branches:
            return
        if tag in self.tags:
            if self.tag_ids[tag] == self.ids[src]:
                # Creating a tag where it already points is done already (idempotent).
                self.cat.tags("ds").create(tag, self.ids[src])
                return
            try:
                self.cat.tags("ds").create(tag, self.ids[src])
            except AlreadyExistsError:
                return
            raise AssertionError("tag was overwritten")
        self.cat.tags("ds").create(tag, self.ids[src])
        self.tags[tag] = dict(self.branches[src])
        self.tag_ids[tag] = self.ids[src]

    @precondition(lambda self: len(self.branches) >= 2)
    @rule(a=BRANCHES, b=BRANCHES)
    def reset(self, a, b):
        if a not in self.branches or b not in self.branches or a == b:
            return
        _, version = self.cat.branches("ds").get_versioned(a)
        self.cat.branches("ds").move(a, version, self.ids[b])
        self.branches[a] = dict(self.branches[b])
        self.ids[a] = self.ids[b]

    @rule()
    def collect(self):
        gc(self.cat, grace_s=0)

    @invariant()
    def matches_model(self):
        for b, state in self.branches.items():
            assert content(self.cat, f"ds@{b}") == state
        for t, state in self.tags.items():
            assert content(self.cat, f"ds@{t}") == state

    @invariant()
    def everything_verifies(self):
        for b in self.branches:
            assert verify(self.cat, f"ds@{b}", deep=True).ok

    def teardown(self):
        shutil.rmtree(self.root, ignore_errors=True)


TestCatalogMachine = CatalogMachine.TestCase
TestCatalogMachine.settings = settings(max_examples=25, stateful_step_count=15, deadline=None)
