"""Real source files written by the libraries users write them with, for adapter tests.

Each writer returns what a reader should get back, so tests compare values read through
simstore with the source.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

RNG_SEED = 7


def trajectory(t=12, nx=6, ny=5, seed=RNG_SEED):
    """Smooth [time, x, y] and [time, x, y, 2] fields, The Well style."""
    rng = np.random.default_rng(seed)
    x = np.linspace(0, 1, nx)
    y = np.linspace(0, 1, ny)
    time = np.linspace(0, 1, t)
    base = np.sin(2 * np.pi * (x[:, None] + y[None, :]))
    density = (base[None] * np.cos(time)[:, None, None]).astype(np.float32)
    velocity = np.stack([density, -density], axis=-1) + rng.normal(0, 0.01, (t, nx, ny, 2)).astype(
        np.float32
    )
    return {
        "time": time,
        "x": x,
        "y": y,
        "density": density,
        "velocity": velocity.astype(np.float32),
    }


def write_h5(path: Path, *, t=12, big_endian=False) -> dict[str, Any]:
    import h5py

    d = trajectory(t)
    with h5py.File(path, "w") as f:
        f.attrs["Re"] = 250.0
        f.attrs["solver"] = "demo-solver"
        f.attrs["n_steps"] = np.int64(t)
        f.attrs["field_names"] = np.array(["density", "velocity"], dtype="S")
        f["time"] = d["time"]
        g = f.create_group("grid")
        g["x"] = d["x"]
        g["y"] = d["y"]
        g.attrs["units"] = "m"
        fields = f.create_group("fields")
        dens = d["density"].astype(">f4") if big_endian else d["density"]
        fields.create_dataset("density", data=dens, chunks=(1, 6, 5))
        fields["velocity"] = d["velocity"]
        fields["velocity"].attrs["units"] = "m/s"
    return d


def write_nc(path: Path, *, t=12) -> dict[str, Any]:
    import netCDF4

    d = trajectory(t)
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", None)
        ds.createDimension("x", d["x"].size)
        ds.createDimension("y", d["y"].size)
        ds.title = "demo"
        ds.Re = 250.0
        tv = ds.createVariable("time", "f8", ("time",))
        tv[:] = d["time"]
        xv = ds.createVariable("x", "f8", ("x",))
        xv[:] = d["x"]
        g = ds.createGroup("fields")
        p = g.createVariable("pressure", "f4", ("time", "x", "y"))
        p.units = "Pa"
        p[:] = d["density"]
    return d


def write_npz(path: Path, *, compressed=False, seed=RNG_SEED) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = {
        "u": rng.standard_normal((16, 16)).astype(np.float32),
        "mask": rng.random(10) > 0.5,
        "ids": np.arange(5, dtype=np.int32),
        "fortran": np.asfortranarray(rng.random((3, 4))),
    }
    (np.savez_compressed if compressed else np.savez)(path, **arrays)
    return arrays


def write_zarr_group(path: Path) -> dict[str, Any]:
    import zarr

    d = trajectory()
    g = zarr.open_group(str(path), mode="w", zarr_format=3)
    g.attrs["Re"] = 250.0
    g.create_array("time", data=d["time"], chunks=(4,))
    f = g.create_group("fields")
    f.create_array("density", data=d["density"], chunks=(2, 3, 5))
    return d


def small_mesh():
    points = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 1]], dtype=np.float64)
    triangles = np.array([[0, 1, 2], [0, 1, 3], [1, 2, 4]], dtype=np.int64)
    tetra = np.array([[0, 1, 2, 3]], dtype=np.int64)
    return points, triangles, tetra


def write_mesh(path: Path, fmt: str | None = None) -> dict[str, np.ndarray]:
    import meshio

    points, triangles, tetra = small_mesh()
    suffix = path.suffix.lower()
    if suffix in (".stl", ".obj", ".ply"):
        mesh = meshio.Mesh(points, [("triangle", triangles)])
        expected = {"points": points, "cells/triangle": triangles}
    else:
        mesh = meshio.Mesh(
            points,
            [("triangle", triangles), ("tetra", tetra)],
            point_data={"temperature": np.arange(5, dtype=np.float64)},
            cell_data={"pressure": [np.array([1.0, 2.0, 3.0]), np.array([4.0])]},
        )
        expected = {
            "points": points,
            "cells/tetra": tetra,
            "cells/triangle": triangles,
            "point_data/temperature": np.arange(5, dtype=np.float64),
            # rows follow sorted cell types: tetra first, then triangle
            "cell_data/pressure": np.array([4.0, 1.0, 2.0, 3.0]),
        }
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mesh.write(path, file_format=fmt)
    return expected


@contextmanager
def gmsh_model(name: str) -> Iterator[Any]:
    """gmsh with a new model ``name``, quiet; initialised here unless already, then
    finalised (or, when it was already, the model removed)."""
    import gmsh

    owned = not gmsh.isInitialized()
    if owned:
        gmsh.initialize(argv=["t"], readConfigFiles=False, run=False, interruptible=False)
    try:
        gmsh.option.setNumber("General.Terminal", 0)
        gmsh.model.add(name)
        yield gmsh
    finally:
        if owned:
            gmsh.finalize()
        else:
            gmsh.model.remove()


def write_msh_with_gmsh(path: Path) -> None:
    with gmsh_model("square") as gmsh:
        gmsh.model.occ.addRectangle(0, 0, 0, 1, 1)
        gmsh.model.occ.synchronize()
        gmsh.option.setNumber("Mesh.MeshSizeMax", 0.5)
        gmsh.model.mesh.generate(2)
        gmsh.option.setNumber("Mesh.MshFileVersion", 4.1)
        gmsh.write(str(path))


def write_step(path: Path, *, overlapping=False) -> dict[str, float]:
    """A 1 x 2 x 3 box (and, overlapping it, a cylinder) written as STEP by gmsh's OCC."""
    with gmsh_model("part") as gmsh:
        gmsh.model.occ.addBox(0, 0, 0, 1, 2, 3)
        if overlapping:
            gmsh.model.occ.addCylinder(0.5, 1.0, -0.5, 0, 0, 4, 0.3)
        gmsh.model.occ.synchronize()
        gmsh.write(str(path))
    return {"volume": 6.0, "surface_area": 22.0}


def write_pvd(folder: Path, steps=3) -> list[dict[str, np.ndarray]]:
    import meshio

    points, triangles, _ = small_mesh()
    entries = []
    expected = []
    for i in range(steps):
        name = f"step_{i}.vtu"
        temp = np.arange(5, dtype=np.float64) + i
        meshio.Mesh(points, [("triangle", triangles)], point_data={"T": temp}).write(folder / name)
        entries.append(f'<DataSet timestep="{0.1 * i}" group="" part="0" file="{name}"/>')
        expected.append({"points": points, "cells/triangle": triangles, "point_data/T": temp})
    body = "\n".join(entries)
    (folder / "series.pvd").write_text(
        '<?xml version="1.0"?>\n<VTKFile type="Collection" version="0.1">\n'
        f"<Collection>\n{body}\n</Collection>\n</VTKFile>\n"
    )
    return expected


def write_xdmf_series(path: Path, steps=2) -> list[dict[str, np.ndarray]]:
    import meshio

    points, triangles, _ = small_mesh()
    expected = []
    cwd = os.getcwd()
    os.chdir(path.parent)  # meshio writes the .h5 next to the current directory's name
    try:
        with meshio.xdmf.TimeSeriesWriter(path.name) as w:
            w.write_points_cells(points, [("triangle", triangles)])
            for i in range(steps):
                temp = np.arange(5, dtype=np.float64) * (i + 1)
                w.write_data(0.5 * i, point_data={"T": temp})
                expected.append(
                    {"points": points, "cells/triangle": triangles, "point_data/T": temp}
                )
    finally:
        os.chdir(cwd)
    return expected
