"""The package's shape: import direction, a light `import simstore`, pinned exports."""

import ast
import pathlib
import subprocess
import sys

import simstore

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORE = ROOT / "simstore"
FORBIDDEN_IN_CORE = ("simstore.formats", "simstore.loaders", "simstore.cli", "torch", "click")
PURE = ["errors", "hashing", "names", "sample", "manifest", "snapshot", "diff", "stats"]


def _imports(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def test_core_never_imports_upper_layers():
    offenders = []
    for path in CORE.rglob("*.py"):
        if "testing" in path.parts:
            continue
        for mod in _imports(path):
            if any(mod == f or mod.startswith(f + ".") for f in FORBIDDEN_IN_CORE):
                if path.name == "__init__.py" and path.parent == CORE:
                    continue  # lazy re-export through __getattr__ only
                if path == CORE / "_launch.py" and mod == "simstore.cli":
                    continue  # the console script: loads the command line inside main()
                offenders.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert not offenders, offenders


def test_pure_modules_do_no_io():
    banned = {"os", "fsspec", "time", "random", "datetime", "simstore.storage", "simstore.catalog"}
    for name in PURE:
        mods = set(_imports(CORE / f"{name}.py"))
        assert not mods & banned, f"{name} imports {mods & banned}"


def test_formats_and_loaders_do_not_import_cli():
    for folder in ("formats", "loaders"):
        for path in (ROOT / folder).rglob("*.py"):
            for mod in _imports(path):
                assert not mod.startswith("simstore.cli"), f"{path} imports {mod}"
                assert mod != "click", f"{path} imports click"


def test_import_simstore_is_light():
    # the console command imports simstore before it can catch Ctrl-C (simstore._launch):
    # milliseconds, not the command line's few hundred
    code = (
        "import sys, simstore; "
        "heavy = [m for m in ('torch', 'h5py', 'netCDF4', 'meshio', 'gmsh', 'lance', 'click', "
        "'pyarrow', 'numpy') "
        "if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_exports_are_pinned():
    assert sorted(simstore.__all__) == simstore.__all__
    assert simstore.__all__ == [
        "AlreadyExistsError",
        "Catalog",
        "CommitResult",
        "ConflictError",
        "DiffResult",
        "FieldSpec",
        "FormatError",
        "IntegrityError",
        "InvalidInputError",
        "NotFoundError",
        "NotWritableError",
        "ObjectStore",
        "ReadOnlyError",
        "Ref",
        "Sample",
        "SimDataLoader",
        "SimDataset",
        "SimstoreError",
        "Snapshot",
        "SourceError",
        "StorageError",
        "UnsupportedFormatError",
        "gc",
        "ingest",
        "open_store",
        "parse_ref",
        "verify",
    ]


def test_every_package_directory_is_listed_for_the_wheel():
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = set()
    for name, folder in config["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            if "__pycache__" not in rel:
                found.add(".".join((name, *rel)))
    assert found - listed == set(), f"packages missing from pyproject.toml: {sorted(found - listed)}"
    assert listed - found == set(), f"listed packages with no folder: {sorted(listed - found)}"
