"""The peers' virtualenv, ``.bench/peers-venv``: created once, checked, reused.

MosaicML Streaming and LitData depend on torchvision, whose PyPI wheel is a CUDA build
that cannot be imported beside the project's CPU torch, and whose unpinned resolution
drags in a newer torch and gigabytes of CUDA wheels. So the peers live in their own
virtualenv, driven as subprocesses (:mod:`.runner`), built like this:

1. ``python -m venv`` with the interpreter that runs the benchmark;
2. ``pip install`` the torchvision stub (:file:`torchvision_stub/`) and the exact torch
   build of the project's venv, under a constraints file made from the project's
   ``constraints.txt`` (minus numpy and xxhash, which mosaicml-streaming pins lower), plus
   ``torch==<that build>`` and ``torchvision==0.28.0``: pip can never swap either;
3. ``pip install -r benchmarks/peers-requirements.txt`` under the same constraints;
4. check that torch has no CUDA and that each peer imports; a peer that does not is
   skipped by the driver with the error as its note.

A stamp (a hash of the requirements, the constraints and the stub) makes later runs
reuse the virtualenv; a change rebuilds it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REQUIREMENTS = os.path.join(REPO, "benchmarks", "peers-requirements.txt")
STUB = os.path.join(REPO, "benchmarks", "suite", "torchvision_stub")
PEER_MODULES = {"mosaic": "streaming", "litdata": "litdata", "webdataset": "webdataset"}
EXCLUDED_CONSTRAINTS = ("numpy", "xxhash", "torch", "torchvision")


def venv_python(root: str) -> str:
    """The interpreter of the peers' virtualenv under ``root`` (``.bench``)."""
    return os.path.join(root, "peers-venv", "bin", "python")


def _constraints() -> str:
    """Project constraints minus the excluded names, plus exact torch and torchvision."""
    lines = []
    with open(os.path.join(REPO, "constraints.txt")) as f:
        for line in f:
            name = line.split("#")[0].strip().split("==")[0].strip().lower()
            if name and name not in EXCLUDED_CONSTRAINTS:
                lines.append(line.strip())
    lines.append(f"torch=={metadata.version('torch')}")
    lines.append("torchvision==0.28.0")
    return "\n".join(lines) + "\n"


def _stamp(constraints: str) -> str:
    h = hashlib.sha256(constraints.encode())
    with open(REQUIREMENTS, "rb") as f:
        h.update(f.read())
    for path in _stub_files():
        with open(path, "rb") as f:
            h.update(os.path.relpath(path, STUB).encode() + f.read())
    return h.hexdigest()


def _stub_files() -> list[str]:
    """The stub's sources (not what a build leaves beside them)."""
    files = [os.path.join(STUB, "pyproject.toml")]
    for root, _dirs, names in os.walk(os.path.join(STUB, "torchvision")):
        files += [os.path.join(root, n) for n in names if n.endswith(".py")]
    return sorted(files)


def _stub_copy(root: str) -> str:
    """A copy of the stub to build from, so pip's in-tree build leaves the repo clean."""
    dest = os.path.join(root, "torchvision-stub-build")
    shutil.rmtree(dest, ignore_errors=True)
    for path in _stub_files():
        target = os.path.join(dest, os.path.relpath(path, STUB))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(path, target)
    return dest


def _pip(python: str, args: list[str], log: str) -> None:
    with open(log, "a") as out:
        proc = subprocess.run([python, "-m", "pip", "install", "--disable-pip-version-check",
                               *args], stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise RuntimeError(f"pip install {' '.join(args)} failed; see {log}")


def ensure(root: str, *, log: Callable[[str], None] = print) -> tuple[str | None, dict[str, str]]:
    """Build or reuse the virtualenv; return (python or None, {peer: note if unusable})."""
    env_dir = os.path.join(root, "peers-venv")
    python = venv_python(root)
    constraints = _constraints()
    stamp = _stamp(constraints)
    stamp_path = os.path.join(env_dir, ".simstore-bench-stamp")
    pip_log = os.path.join(root, "peers-pip.log")
    try:
        if not (os.path.exists(stamp_path) and open(stamp_path).read() == stamp):
            log(f"peers: building {env_dir} (pip log: {pip_log}); about 1.5 minutes")
            subprocess.run([sys.executable, "-m", "venv", "--clear", env_dir], check=True)
            cons_path = os.path.join(root, "peers-constraints.txt")
            with open(cons_path, "w") as f:
                f.write(constraints)
            _pip(python, ["-q", "-c", cons_path, _stub_copy(root),
                          f"torch=={metadata.version('torch')}"],
                 pip_log)
            _pip(python, ["-q", "-c", cons_path, "-r", REQUIREMENTS], pip_log)
            with open(stamp_path, "w") as f:
                f.write(stamp)
    except (RuntimeError, subprocess.CalledProcessError, OSError) as exc:
        note = f"peers' virtualenv could not be built: {exc}"
        return None, {peer: note for peer in PEER_MODULES}
    return python, check(python)


_CHECK = """
import importlib, json, sys
import torch
out = {"torch": torch.__version__, "cuda": torch.version.cuda}
for peer, mod in json.loads(sys.argv[1]).items():
    try:
        m = importlib.import_module(mod)
        out[peer] = None
        out[peer + "_version"] = getattr(m, "__version__", "?")
    except Exception as exc:  # the note the report shows
        out[peer] = f"import {mod} failed: {type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def check(python: str) -> dict[str, str]:
    """{peer: why it cannot run} for the peers that fail to import (empty: all fine)."""
    proc = subprocess.run([python, "-c", _CHECK, json.dumps(PEER_MODULES)], capture_output=True,
                          text=True, cwd=REPO)
    if proc.returncode:
        note = f"peers' python failed: {proc.stderr.strip().splitlines()[-1:]}"
        return {peer: note for peer in PEER_MODULES}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    notes = {peer: out[peer] for peer in PEER_MODULES if out.get(peer)}
    if out.get("cuda"):
        notes = {peer: f"peers' torch is a CUDA build ({out['torch']})" for peer in PEER_MODULES}
    return notes


def versions(python: str) -> dict[str, str]:
    """Installed versions of the peers and torch in the virtualenv."""
    code = ("import json\nfrom importlib import metadata as m\nprint(json.dumps({n: m.version(n) "
            "for n in ('torch', 'torchvision', 'mosaicml-streaming', 'litdata', 'webdataset', "
            "'numpy')}))")
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return json.loads(proc.stdout) if proc.returncode == 0 else {}
