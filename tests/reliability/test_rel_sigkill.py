"""SIGKILL of ingest, snapshot, gc and a training loop at random points.

Each trial kills a child process at a random write (just before or after the k-th put,
swap or delete) or a random instant, then checks the promises: every ref and every
snapshot in every history verifies and references no missing object, every staging entry
names objects that exist, the branch holds the old or the new content and never a mix,
and finishing the work converges to the content a clean run gives. The stress run
(tests/stress/run.py) runs the same trials by the hundred.
"""

from __future__ import annotations

import random

import pytest
import rel_harness as h

pytestmark = pytest.mark.multiprocess


def _run(scenario, trials, seed):
    rng = random.Random(seed)
    results = [scenario.trial(rng) for _ in range(trials)]
    failures = [r.to_json() for r in results if r.problems or r.lost or not r.converged]
    assert failures == []
    return results


@pytest.mark.parametrize(("name", "trials"), [("ingest", 12), ("snapshot", 10), ("gc", 8)])
def test_sigkill_store_operations(tmp_path, forkserver, name, trials):
    scenario = h.SCENARIOS[name](str(tmp_path), forkserver)
    results = _run(scenario, trials, seed=len(name))
    assert any(r.outcome == "killed" for r in results)  # the kills did land


@pytest.mark.slow
def test_sigkill_training_loop_then_resume(tmp_path, trainserver):
    scenario = h.TrainScenario(str(tmp_path), trainserver)
    results = _run(scenario, 4, seed=7)
    assert any(r.outcome == "killed" for r in results)
