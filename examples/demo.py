"""The main job, end to end, on a local embedded store (what `make demo` runs).

1. generate a small physics-shaped dataset: simulation runs as HDF5 (a time series of
   2-D velocity and pressure fields, windowed into samples) and .npz, a tetrahedral mesh
   (VTU) and a CAD part (STEP);
2. ingest it and snapshot; change a few samples and snapshot again;
3. print `log` and `diff`;
4. stream one epoch through SimDataset and print throughput.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "demo-data")
STORE = os.path.join(ROOT, ".simstore-demo")


def simstore(*args: str) -> str:
    """Run a simstore command the way a user would, echoing it and its output."""
    cmd = [sys.executable, "-m", "simstore.cli", "--store", STORE, *args]
    print(f"$ simstore {' '.join(args)}", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    print(out.rstrip() + "\n", flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"demo failed: simstore {' '.join(args)} exited {proc.returncode}")
    return proc.stdout


def taylor_green(t: np.ndarray, n: int, nu: float) -> tuple[np.ndarray, np.ndarray]:
    """Decaying Taylor-Green vortex on an n x n periodic grid: velocity and pressure."""
    x = np.linspace(0, 2 * np.pi, n, endpoint=False, dtype=np.float32)
    xx, yy = np.meshgrid(x, x, indexing="ij")
    decay = np.exp(-2 * nu * t)[:, None, None].astype(np.float32)
    u = np.sin(xx) * np.cos(yy) * decay
    v = -np.cos(xx) * np.sin(yy) * decay
    p = 0.25 * (np.cos(2 * xx) + np.cos(2 * yy)) * decay**2
    return np.stack([u, v], axis=-1), p.astype(np.float32)


def make_runs(rng: np.random.Generator, steps: int = 64, n: int = 64) -> None:
    """Four Taylor-Green runs with different viscosities, as HDF5 files."""
    import h5py

    os.makedirs(os.path.join(DATA, "runs"), exist_ok=True)
    for i, nu in enumerate([0.01, 0.02, 0.05, 0.1]):
        t = np.linspace(0, 2, steps)
        vel, p = taylor_green(t, n, nu)
        vel += rng.normal(0, 1e-3, vel.shape).astype(np.float32)
        with h5py.File(os.path.join(DATA, "runs", f"tgv_{i:02d}.h5"), "w") as f:
            f.create_dataset("velocity", data=vel, chunks=(8, n, n, 2))
            f.create_dataset("pressure", data=p, chunks=(8, n, n))
            f.attrs["viscosity"] = nu
            f.attrs["solver"] = "spectral"


def make_sweep(rng: np.random.Generator, count: int = 48) -> None:
    """A parameter sweep: one .npz per case with a 3-channel field and a Reynolds number."""
    os.makedirs(os.path.join(DATA, "sweep"), exist_ok=True)
    for i in range(count):
        field = rng.normal(0, 1, (3, 32, 32)).astype(np.float32)
        np.savez(os.path.join(DATA, "sweep", f"case_{i:03d}.npz"),
                 field=field, reynolds=np.float64(100 + 10 * i))


def make_mesh() -> None:
    """A two-tetrahedron mesh with a temperature field, as VTU."""
    import meshio

    os.makedirs(os.path.join(DATA, "meshes"), exist_ok=True)
    pts = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 1]], dtype=np.float64)
    cells = [("tetra", np.array([[0, 1, 2, 3], [1, 2, 3, 4]]))]
    mesh = meshio.Mesh(pts, cells, point_data={"temperature": pts[:, 0] * 300.0})
    mesh.write(os.path.join(DATA, "meshes", "bracket.vtu"))


def make_cad() -> None:
    """A plate with a hole, built with OpenCASCADE through gmsh, as STEP."""
    import gmsh

    os.makedirs(os.path.join(DATA, "cad"), exist_ok=True)
    gmsh.initialize(["-nopopup"])
    import signal

    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # gmsh resets it; keep Python's default
    gmsh.option.setNumber("General.Terminal", 0)
    try:
        gmsh.model.add("part")
        box = gmsh.model.occ.addBox(0, 0, 0, 1, 0.5, 0.2)
        hole = gmsh.model.occ.addCylinder(0.5, 0.25, -0.1, 0, 0, 0.4, 0.1)
        gmsh.model.occ.cut([(3, box)], [(3, hole)])
        gmsh.model.occ.synchronize()
        # OpenCASCADE's STEP writer prints transfer statistics on fd 1: silence it
        sys.stdout.flush()
        saved = os.dup(1)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        try:
            gmsh.write(os.path.join(DATA, "cad", "plate.step"))
        finally:
            os.dup2(saved, 1)
            os.close(devnull)
            os.close(saved)
    finally:
        gmsh.finalize()


def stream_one_epoch() -> None:
    """One epoch of the sweep through SimDataset, with throughput."""
    import torch
    from simstore.loaders import SimDataLoader

    from simstore import SimDataset

    ds = SimDataset(STORE, "sweep@main", fields=["field"], shuffle=True, seed=0)
    loader = SimDataLoader(ds, batch_size=8, num_workers=0)
    t0 = time.perf_counter()
    samples = nbytes = 0
    first_batch_s = None
    for batch in loader:
        if first_batch_s is None:
            first_batch_s = time.perf_counter() - t0
        field = batch["field"]
        assert isinstance(field, torch.Tensor)
        samples += field.shape[0]
        nbytes += field.numel() * field.element_size()
    dt = time.perf_counter() - t0
    print(
        f"streamed one epoch of sweep@main: {samples} samples, {nbytes / 2**20:.1f} MiB in "
        f"{dt:.2f} s: {samples / dt:.0f} samples/s, {nbytes / 2**20 / dt:.1f} MiB/s, "
        f"first batch after {first_batch_s:.3f} s"
    )
    print(f"loader stats: {ds.stats()}")


def main() -> None:
    """Run the whole demo."""
    t_start = time.perf_counter()
    shutil.rmtree(DATA, ignore_errors=True)
    shutil.rmtree(STORE, ignore_errors=True)
    rng = np.random.default_rng(7)
    make_runs(rng)
    make_sweep(rng)
    make_mesh()
    make_cad()
    print(f"generated demo data in {DATA}\n")

    simstore("init")
    simstore("ingest", os.path.join(DATA, "runs"), "--dataset", "tgv", "--time-window", "8",
             "--stride", "8", "--snapshot", "-m", "Taylor-Green runs, 8-step windows")
    simstore("ingest", os.path.join(DATA, "sweep"), "--dataset", "sweep", "--snapshot",
             "-m", "parameter sweep")
    simstore("ingest", os.path.join(DATA, "meshes"), os.path.join(DATA, "cad"),
             "--dataset", "geometry", "--snapshot", "-m", "meshes and CAD parts")
    simstore("tag", "sweep", "v1")

    # change a few samples: re-run three cases, add one, then snapshot again
    for i in (3, 17, 40):
        path = os.path.join(DATA, "sweep", f"case_{i:03d}.npz")
        np.savez(path, field=rng.normal(0, 2, (3, 32, 32)).astype(np.float32),
                 reynolds=np.float64(100 + 10 * i))
    np.savez(os.path.join(DATA, "sweep", "case_999.npz"),
             field=rng.normal(0, 1, (3, 32, 32)).astype(np.float32), reynolds=np.float64(5000))
    simstore("ingest", os.path.join(DATA, "sweep"), "--dataset", "sweep")
    simstore("snapshot", "sweep", "-m", "re-ran cases 3, 17, 40; added case 999")

    simstore("log", "sweep")
    simstore("diff", "sweep@v1", "sweep@main")
    simstore("show", "geometry")
    simstore("stats", "sweep")
    simstore("verify", "sweep", "--deep")
    stream_one_epoch()
    print(f"\ndemo finished in {time.perf_counter() - t_start:.1f} s")


if __name__ == "__main__":
    main()
