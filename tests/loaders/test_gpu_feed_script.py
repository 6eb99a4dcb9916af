"""benchmarks/gpu_feed.py on a machine without a device: the loader part runs and its
stall agrees with the loop's own measurement; a store without the field is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _feed(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "benchmarks.gpu_feed", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})


@pytest.mark.multiprocess
@pytest.mark.parametrize("persistent", [False, True])
def test_gpu_feed_reports_the_loaders_stall_as_the_loop_measures_it(tmp_path, persistent):
    out = tmp_path / "feed.json"
    done = _feed("--samples", "8", "--batch", "2", "--workers", "2", "--epochs", "2",
                 "--step-ms", "5", "--json", str(out),
                 *(["--persistent-workers"] if persistent else []))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["persistent_workers"] is persistent
    assert result["device"] == "cpu (device part skipped)" and result["h2d_gib_per_s"] is None
    assert result["steps"] == 8
    assert len(result["first_batch_waits_s"]) == 2  # one per epoch, iter() included
    # the same quantity, counted by the loader's metrics and around the loop
    assert result["data_stall"] == pytest.approx(result["data_stall_loop"], abs=0.05)
    assert 0 <= result["data_stall_after_first_batch"] <= result["data_stall_loop"]


def test_gpu_feed_names_a_missing_field(tmp_path):
    done = _feed("--samples", "2", "--batch", "2", "--workers", "0", "--field", "velocity")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].startswith(
        "error: feed has no tensor field 'velocity'")
