"""The CLI's contract (docs/cli.md) where commands broke it.

A failed ``delete --snapshot`` left its deletion staged for the next snapshot; ``delete -m``
without ``--snapshot`` dropped the message; ``pull`` printed a traceback for a ``--cache``
under a file, made the cache folder when it refused, and exited 3 for a missing object;
Ctrl-C printed click's ``Aborted!`` with exit 1; ``ingest --branch TYPO`` staged against a
branch that does not exist; ``SIMSTORE_DEBUG=0`` turned debug on; and smaller ones: an
empty ``--store``, ``file://`` URLs with escapes, ``--price`` for an unknown tier,
``--tmp-dir`` that is no folder, empty snapshot messages and authors, and paths that are
not UTF-8 in the ingest summary.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import pytest
from cli_helpers import cli
from click.testing import CliRunner
from simstore.cli import main

from simstore.catalog import Catalog
from simstore.errors import ConflictError
from simstore.hashing import object_key
from simstore.ingest import ingest
from simstore.storage import open_store


@pytest.fixture
def sources(tmp_path):
    folder = tmp_path / "src"
    folder.mkdir()
    for i in range(3):
        np.savez(folder / f"run{i}.npz", fields=np.full((2, 3), i, np.float32))
    return str(folder)


@pytest.fixture
def store(sources):
    """A store with dataset ``d`` (samples run0..run2) on ``main`` and tag ``v1``."""
    url = f"memory://contract-{uuid.uuid4().hex}"
    Catalog.init(url)
    cli("--store", url, "ingest", sources, "--dataset", "d", "--snapshot", "-m", "a", code=0)
    cli("--store", url, "tag", "d", "v1", code=0)
    return url


def _keys(url: str) -> list[str]:
    return sorted(open_store(url).list(""))


def _staged(url: str) -> int:
    return len(Catalog.open(url).staged("d"))


# -- 1, 2: delete ----------------------------------------------------------------------


@pytest.mark.parametrize("rev", ["tag", "id", "typo"])
@pytest.mark.parametrize("snapshot", [True, False])
def test_delete_on_a_branch_that_is_not_one_stages_nothing(store, rev, snapshot):
    sid = Catalog.open(store).resolve("d")
    branch = {"tag": "v1", "id": sid, "typo": "mian"}[rev]
    before = _keys(store)
    args = ["--snapshot", "-m", "x"] if snapshot else []
    line = cli("--store", store, "delete", "d", "run0", "--branch", branch, *args, code=3)
    assert f"has no branch {branch!r}" in line and "branches: main" in line
    assert _keys(store) == before and _staged(store) == 0
    # and the next snapshot has nothing to commit: run0 stays
    cli("--store", store, "snapshot", "d", "-m", "next", code=2)
    assert Catalog.open(store).snapshot(Catalog.open(store).resolve("d")).samples == 3


def test_a_failed_delete_commit_removes_its_staged_deletion(store, monkeypatch):
    def lose(self, *args, **kwargs):
        raise ConflictError("gave up after 8 lost swaps")

    monkeypatch.setattr(Catalog, "commit", lose)
    line = cli("--store", store, "delete", "d", "run0", "--snapshot", "-m", "x", code=5)
    assert "lost swaps" in line
    monkeypatch.undo()
    assert _staged(store) == 0
    cli("--store", store, "snapshot", "d", "-m", "next", code=2)  # nothing staged


def test_delete_message_needs_snapshot(store):
    before = _keys(store)
    line = cli("--store", store, "delete", "d", "run0", "-m", "drop", code=2)
    assert "-m/--message" in line and "--snapshot" in line
    assert _keys(store) == before


def test_delete_on_a_branch_still_stages_and_commits(store):
    out = json.loads(cli("--store", store, "delete", "d", "run0", "--json", code=0))
    assert out["deleted"] == 1 and _staged(store) == 1
    cli("--store", store, "snapshot", "d", "-m", "drop", code=0)
    assert Catalog.open(store).snapshot(Catalog.open(store).resolve("d")).samples == 2


def _head_keys(url: str) -> list[str]:
    return sorted(cli("--store", url, "keys", "d", code=0).split())


def test_delete_snapshot_takes_an_earlier_staged_change_of_its_key(store, tmp_path):
    """An upsert of run0 staged before ``delete run0 --snapshot`` once stayed staged and
    brought run0 back at the next snapshot; one of another key (run9) still stays."""
    changed, other = tmp_path / "changed", tmp_path / "other"
    changed.mkdir(), other.mkdir()
    np.savez(changed / "run0.npz", fields=np.full((2, 3), 7, np.float32))
    np.savez(other / "run9.npz", fields=np.full((2, 3), 9, np.float32))
    cli("--store", store, "ingest", str(changed), "--dataset", "d", code=0)
    cli("--store", store, "ingest", str(other), "--dataset", "d", code=0)
    (kept,) = [e.id for e in Catalog.open(store).staged("d") if "run9" in
               Catalog.open(store).staged_keys("d")[e.id]]
    out = json.loads(cli("--store", store, "delete", "d", "run0", "--snapshot", "--json",
                         code=0))
    assert _head_keys(store) == ["run1", "run2"]
    assert len(out["commit"]["staged"]) == 2  # the upsert of run0, then the deletion
    assert [e.id for e in Catalog.open(store).staged("d")] == [kept]
    cli("--store", store, "snapshot", "d", "-m", "next", code=0)
    assert _head_keys(store) == ["run1", "run2", "run9"]


def test_replace_snapshot_takes_and_discards_the_entries_staged_before_it(store, tmp_path):
    """An entry staged before ``ingest --mode replace --snapshot`` once stayed staged and
    applied over the replace at the next snapshot."""
    other, new = tmp_path / "other", tmp_path / "new"
    other.mkdir(), new.mkdir()
    np.savez(other / "run9.npz", fields=np.full((2, 3), 9, np.float32))
    np.savez(new / "a.npz", fields=np.full((2, 3), 1, np.float32))
    cli("--store", store, "ingest", str(other), "--dataset", "d", code=0)
    cli("--store", store, "ingest", str(new), "--dataset", "d", "--mode", "replace",
        "--snapshot", code=0)
    assert _head_keys(store) == ["a"] and _staged(store) == 0
    cli("--store", store, "snapshot", "d", "-m", "next", code=2)  # nothing staged
    assert _head_keys(store) == ["a"]


# -- 3, 4: pull ------------------------------------------------------------------------


@pytest.fixture
def local_store(tmp_path, sources):
    url = str(tmp_path / "store")
    cli("--store", url, "init", code=0)
    cli("--store", url, "ingest", sources, "--dataset", "d", "--snapshot", "-m", "a", code=0)
    return url


def test_pull_cache_under_a_file_is_one_line_naming_the_flag(local_store, tmp_path):
    (tmp_path / "file").write_bytes(b"keep")
    cache = str(tmp_path / "file" / "x" / "y")
    line = cli("--store", local_store, "pull", "d", "--cache", cache, code=2)
    assert line == f"error: --cache {cache}: {tmp_path / 'file'} is a file, not a directory"
    assert (tmp_path / "file").read_bytes() == b"keep"


def test_a_refused_pull_creates_no_cache_directory(local_store, tmp_path):
    cache = tmp_path / "new" / "cache"
    line = cli("--store", local_store, "pull", "d", "--cache", str(cache), "--limit", "0",
               code=2)  # fmt: skip
    assert "needs" in line
    assert not (tmp_path / "new").exists()
    cli("--store", local_store, "pull", "d", "--cache", str(cache), code=0)
    assert cache.is_dir()


def test_pull_of_a_snapshot_missing_an_object_is_an_integrity_error(local_store, tmp_path):
    cat = Catalog.open(local_store)
    sid = cat.resolve("d")
    shard = next(cat.iter_parts(cat.snapshot(sid))).column("shard")[0].as_py()
    cat.store.delete(object_key(shard))
    line = cli("--store", local_store, "pull", "d", "--cache", str(tmp_path / "c"), code=6)
    assert object_key(shard) in line and sid in line and "missing" in line


# -- 5: Ctrl-C -------------------------------------------------------------------------

_RUNNER = textwrap.dedent(
    """
    import signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    import simstore.ingest._driver as driver
    from simstore.catalog import Catalog

    def hang(*args, **kwargs):
        sys.stderr.write("READY\\n")
        sys.stderr.flush()
        time.sleep(120)

    where = sys.argv.pop(1)
    if where == "engine":  # interrupted after the shards are written, before staging
        real = driver.run_local

        def run_local(*args, **kwargs):
            run = real(*args, **kwargs)
            hang()
            return run

        driver.run_local = run_local
    else:  # interrupted in the commit, after staging
        Catalog.commit = hang
    from simstore.cli import main
    main(prog_name="simstore")
    """
)


def _interrupt(tmp_path, where: str, *args: str) -> subprocess.CompletedProcess[str]:
    runner = tmp_path / "runner.py"
    runner.write_text(_RUNNER)
    p = subprocess.Popen(
        [sys.executable, str(runner), where, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stderr is not None
        assert p.stderr.readline() == "READY\n"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
        p.wait()
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


@pytest.mark.parametrize(
    ("where", "command"),
    [
        ("engine", ["ingest", "{src}", "--dataset", "e", "--no-progress"]),
        ("commit", ["ingest", "{src}", "--dataset", "e", "--snapshot", "--no-progress"]),
        ("commit", ["delete", "d", "run0", "--snapshot"]),
    ],
)
def test_an_interrupt_is_one_line_exit_130_and_leaves_nothing_staged(
    local_store, sources, tmp_path, where, command
):
    args = [a.replace("{src}", sources) for a in command]
    before = _keys(local_store) if command[0] == "delete" else None
    res = _interrupt(tmp_path, where, "--store", local_store, *args)
    assert res.returncode == 130, res.stderr
    assert res.stdout == ""
    assert res.stderr == "error: interrupted\n"
    cat = Catalog.open(local_store)
    dataset = "e" if command[0] == "ingest" else "d"
    assert cat.staged(dataset) == []
    assert cat.branches("e").names() == []
    if before is not None:
        assert cat.snapshot(cat.resolve("d")).samples == 3


# -- 6: ingest --branch ----------------------------------------------------------------


@pytest.mark.parametrize("snapshot", [True, False])
def test_ingest_to_a_branch_the_dataset_does_not_have_is_refused(store, sources, snapshot):
    before = _keys(store)
    args = ["--snapshot"] if snapshot else []
    line = cli("--store", store, "ingest", sources, "--dataset", "d", "--branch", "mian",
               *args, code=3)  # fmt: skip
    assert "no branch 'mian'" in line and "branches: main" in line
    assert _keys(store) == before


def test_first_ingest_into_a_new_dataset_may_name_any_branch(store, sources):
    cli("--store", store, "ingest", sources, "--dataset", "n", "--branch", "dev", code=0)
    cli("--store", store, "snapshot", "n", "-m", "first", "--branch", "dev", code=0)
    assert Catalog.open(store).branches("n").names() == ["dev"]


# -- 7: SIMSTORE_DEBUG -----------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "false", "No", "off", "", " OFF "])
def test_simstore_debug_false_values_print_no_traceback(store, value):
    cli("--store", store, "log", "nope", code=3, env={"SIMSTORE_DEBUG": value})


@pytest.mark.parametrize("value", ["1", "true", "yes"])
def test_simstore_debug_true_values_print_the_traceback(store, value):
    result = CliRunner().invoke(
        main, ["--store", store, "log", "nope"], env={"SIMSTORE_DEBUG": value}
    )
    assert result.exit_code == 3
    assert "Traceback" in result.stderr and result.stderr.rstrip().endswith(
        "error: " + result.stderr.rstrip().rsplit("error: ", 1)[1]
    )


# -- 8: smaller ones -------------------------------------------------------------------


def test_an_empty_store_names_the_flag():
    assert cli("--store", "", "ls", code=2) == "error: --store '': empty store URL"


def test_a_file_url_is_percent_decoded(tmp_path):
    folder = tmp_path / "with space"
    folder.mkdir()
    url = f"file://{str(folder / 'st').replace(' ', '%20')}"
    cli("--store", url, "init", code=0)
    assert (folder / "st" / "simstore.json").is_file()
    assert cli("--store", f"file://localhost{folder / 'st'}", "ls", code=0).strip() == (
        "(no datasets)"
    )
    # a plain path is taken as it is: %20 is three characters of a name
    plain = tmp_path / "a%20b"
    cli("--store", str(plain), "init", code=0)
    assert (plain / "simstore.json").is_file()


def test_a_price_for_an_unknown_tier_is_refused(tmp_path):
    line = cli("prices", "--price", "nosuchtier.storage_per_gib_month=1", code=2)
    assert "unknown tier 'nosuchtier'" in line and "s3-standard" in line
    # a tier a --prices file adds may be priced by flag
    extra = tmp_path / "p.toml"
    extra.write_text("format_version = 1\n[tiers.wasabi]\nstorage_per_gib_month = 0.0068\n")
    out = json.loads(cli("prices", "--prices", str(extra), "--json",
                         "--price", "wasabi.storage_per_gib_month=0.007", code=0))  # fmt: skip
    assert out["tiers"]["wasabi"]["storage_per_gib_month"] == 0.007


def test_a_tmp_dir_that_is_no_folder_is_a_usage_error(store, sources, tmp_path):
    before = _keys(store)
    missing = str(tmp_path / "nonexistent")
    line = cli("--store", store, "ingest", sources, "--dataset", "d", "--tmp-dir", missing,
               code=2)  # fmt: skip
    assert line == f"error: invalid --tmp-dir {missing}: no such directory"
    (tmp_path / "f").write_bytes(b"")
    line = cli("--store", store, "ingest", sources, "--dataset", "d", "--tmp-dir",
               str(tmp_path / "f"), code=2)  # fmt: skip
    assert "--tmp-dir" in line and "not a directory" in line
    assert _keys(store) == before


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["snapshot", "d", "-m", ""], "-m/--message"),
        (["snapshot", "d", "-m", "  "], "-m/--message"),
        (["snapshot", "d", "-m", "x", "--author", ""], "--author"),
        (["delete", "d", "run0", "--snapshot", "-m", ""], "-m/--message"),
        (["ingest", "{src}", "--dataset", "d", "--snapshot", "-m", ""], "-m/--message"),
    ],
)
def test_an_empty_message_or_author_is_refused(store, sources, args, flag):
    cli("--store", store, "delete", "d", "run1", code=0)  # something staged
    before = _keys(store)
    line = cli("--store", store, *[a.replace("{src}", sources) for a in args], code=2)
    assert line.startswith(f"error: invalid {flag} ")
    assert _keys(store) == before


# -- 9: names that are not UTF-8 -------------------------------------------------------


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS refuses names that are not UTF-8")
def test_a_skipped_path_that_is_not_utf8_is_shown_escaped(store, tmp_path):
    folder = tmp_path / "odd"
    folder.mkdir()
    np.savez(folder / "good.npz", fields=np.ones((2, 3), np.float32))
    bad = os.path.join(os.fsencode(folder), b"caf\xe9.npz")
    with open(bad, "wb") as f, open(folder / "good.npz", "rb") as g:
        f.write(g.read())
    base = ["--store", store, "ingest", str(folder), "--dataset", "u", "--on-error", "skip"]
    runner = CliRunner()
    result = runner.invoke(main, [*base, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    result.stdout_bytes.decode("utf-8")  # strict: no lone surrogates
    (skipped,) = json.loads(result.stdout)["skipped"]
    assert skipped["path"] == f"{os.fsdecode(folder)}/caf\\xe9.npz"
    result = runner.invoke(main, [*base, "--no-resume"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    text = result.stdout_bytes.decode("utf-8")
    assert f"skipped {os.fsdecode(folder)}/caf\\xe9.npz: " in text
    # the reason, which names the file first, is not shown after the path a second time
    assert text.count("caf\\xe9.npz") == 1, text


def test_log_of_no_snapshots_prints_nothing(store):
    assert cli("--store", store, "log", "d", "-n", "0", code=0) == ""
    assert cli("--store", store, "log", "d", "-n", "1", code=0).count("\n") == 1


def test_log_shows_times_in_utc_and_says_so(store):
    # it cut the stored time's "+00:00" off: a UTC time that read like a local one
    created = Catalog.open(store).snapshot(Catalog.open(store).resolve("d@main")).created
    line = cli("--store", store, "log", "d", code=0).splitlines()[0]
    assert line.split()[1] == f"{created[:19]}Z"
    assert json.loads(cli("--store", store, "log", "d", "--json", code=0))[0]["created"] \
        == created


def test_a_line_break_in_a_path_is_escaped_not_split_nor_made_a_space(tmp_path):
    """An error naming ``a<LF>b.npz`` is one line naming that file: the break as ``\\n``
    (turned into a space, it named ``a b.npz``, a good file beside it)."""
    store = str(tmp_path / "store")
    cli("--store", store, "init", code=0)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a\nb.npz").write_bytes(b"junk")
    np.savez(src / "a b.npz", u=np.arange(3.0))
    line = cli("--store", store, "ingest", str(src), "--dataset", "x", code=8)
    assert "a\\nb.npz: not a readable .npz" in line and "a b.npz" not in line
    line = cli("--store", str(tmp_path / "x\ny"), "ls", code=3)
    assert "x\\ny: not a simstore store" in line
    line = cli("--store", store, "ingest", str(tmp_path / "no\tfile"), "--dataset", "x",
               code=2)
    assert "no\\tfile" in line


def test_one_line_escapes_only_what_breaks_a_line():
    from simstore.errors import one_line

    assert one_line("plain text, é ü 漢字") == "plain text, é ü 漢字"
    assert one_line("a\nb\r\tc") == "a\\nb\\r\\tc"
    assert one_line("x\x1by\u2028z\x7f") == "x\\x1by\\u2028z\\x7f"
    assert one_line("a\\b\nc") == "a\\\\b\\nc"  # with escapes, a backslash is doubled
    assert one_line("\U000e0001") == "\\U000e0001"  # beyond U+FFFF: eight digits


def test_an_interrupt_while_the_command_line_loads_is_one_line(monkeypatch, capsys):
    import builtins

    from simstore import _launch

    real_import = builtins.__import__

    def interrupted(name, *args, **kwargs):
        if name == "simstore.cli":
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", interrupted)
    monkeypatch.delenv("SIMSTORE_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["simstore", "ingest", "src", "--dataset", "d"])
    with pytest.raises(SystemExit) as stopped:
        _launch.main()
    assert stopped.value.code == 130
    assert capsys.readouterr().err == "error: interrupted\n"
    # with --debug (or SIMSTORE_DEBUG), the traceback too, as cli.md says
    for argv, env in ((["simstore", "--debug", "ls"], None), (["simstore", "ls"], "1")):
        monkeypatch.setattr(sys, "argv", argv)
        if env is not None:
            monkeypatch.setenv("SIMSTORE_DEBUG", env)
        with pytest.raises(SystemExit) as stopped:
            _launch.main()
        assert stopped.value.code == 130
        err = capsys.readouterr().err
        assert err.startswith("Traceback") and "KeyboardInterrupt" in err, err
        assert err.endswith("error: interrupted\n")


def test_an_interrupt_after_the_command_returned_is_ignored():
    """Past the command (a commit may have landed), the process's exit is not a failure."""
    code = textwrap.dedent("""
        import signal, sys
        from simstore._launch import main
        sys.argv = ["simstore", "--version"]
        try:
            main()
        except SystemExit as done:
            print(done.code, signal.getsignal(signal.SIGINT) is signal.SIG_IGN)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.split()[-2:] in (["0", "True"], ["None", "True"])


def test_a_sigterm_after_the_command_returned_is_ignored(tmp_path):
    """A SIGTERM in the instant after the command returned (its output printed, a commit
    landed) exited 1 with a traceback, or click's "Aborted!"."""
    code = textwrap.dedent("""
        import os, signal, sys
        import simstore._launch as launch
        real = launch.command_returned
        def returned():
            real()
            os.kill(os.getpid(), signal.SIGTERM)  # the scheduler's stop, just too late
        launch.command_returned = returned
        sys.argv = ["simstore", "--store", sys.argv[1], "init"]
        launch.main()
    """)
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "store")],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    assert Catalog.open(str(tmp_path / "store")) is not None


def test_a_program_that_runs_the_command_line_gets_its_sigterm_back(tmp_path):
    """main() called by another program left SIGTERM ignored for the rest of it."""
    code = textwrap.dedent("""
        import signal, sys
        import simstore._launch as launch
        sys.argv = ["simstore", "--store", sys.argv[1], "init"]
        try:
            launch.main()
        except SystemExit:
            pass
        print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
    """)
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "store")],
                       capture_output=True, text=True)
    assert p.stdout.split()[-1] == "True", (p.stdout, p.stderr)


def test_the_console_script_runs_the_launcher():
    import importlib.metadata

    (script,) = [e for e in importlib.metadata.entry_points(group="console_scripts")
                 if e.name == "simstore"]
    assert script.value == "simstore._launch:main"


def test_snapshot_reports_keys_that_several_staged_entries_wrote(tmp_path):
    """Array tasks ingesting folders whose files share names stage the same keys: the
    commit keeps the entry staged last, and now says which keys it decided."""
    store = str(tmp_path / "store")
    cli("--store", store, "init", code=0)
    for part in (0, 1):
        folder = tmp_path / f"part-{part}"
        folder.mkdir()
        for i in range(3):
            np.savez(folder / f"run{i}.npz", u=np.full(2, part * 10 + i, np.float32))
        np.savez(folder / f"only{part}.npz", u=np.zeros(2, np.float32))
        cli("--store", store, "ingest", str(folder), "--dataset", "d", "--no-progress",
            code=0)
    out = json.loads(cli("--store", store, "snapshot", "d", "-m", "both", "--json", code=0))
    assert out["overwritten_staged"] == ["run0", "run1", "run2"]
    assert out["samples"] == 5
    cli("--store", store, "ingest", str(tmp_path / "part-0"), "--dataset", "e",
        "--no-progress", code=0)
    cli("--store", store, "ingest", str(tmp_path / "part-1"), "--dataset", "e",
        "--no-progress", code=0)
    text = cli("--store", store, "snapshot", "e", "-m", "both", code=0)
    assert "note: 3 keys were written by more than one staged entry" in text


def test_delete_snapshot_takes_an_entry_staged_just_before_its_own(store, tmp_path,
                                                                   monkeypatch):
    """Another writer's upsert of run0 staged between the command's checks and its own
    staging sorts before the deletion: it is taken, not left to bring run0 back."""
    changed = tmp_path / "changed"
    changed.mkdir()
    np.savez(changed / "run0.npz", fields=np.full((2, 3), 7, np.float32))
    real = Catalog.stage

    def stage(self, dataset, **kwargs):
        if (kwargs.get("lineage") or {}).get("operation") == "delete":
            monkeypatch.setattr(Catalog, "stage", real)
            ingest([changed], dataset="d", store=store)  # the other writer
        return real(self, dataset, **kwargs)

    monkeypatch.setattr(Catalog, "stage", stage)
    cli("--store", store, "delete", "d", "run0", "--snapshot", code=0)
    assert _head_keys(store) == ["run1", "run2"] and _staged(store) == 0


def test_delete_snapshot_commits_a_type_change_it_takes_only_when_allowed(store, tmp_path):
    changed = tmp_path / "changed"
    changed.mkdir()
    np.savez(changed / "run0.npz", fields=np.full((2, 3), 7, np.float64))
    cli("--store", store, "ingest", str(changed), "--dataset", "d", "--allow-schema-change",
        code=0)
    line = cli("--store", store, "delete", "d", "run0", "--snapshot", code=2)
    assert "--allow-schema-change" in line and _staged(store) == 1  # the upsert stays
    line = cli("--store", store, "delete", "d", "run1", "--allow-schema-change", code=2)
    assert "needs --snapshot" in line
    cli("--store", store, "delete", "d", "run0", "--snapshot", "--allow-schema-change",
        code=0)
    assert _head_keys(store) == ["run1", "run2"] and _staged(store) == 0


@pytest.mark.parametrize("group", [False, True])
def test_sigterm_stops_a_command_as_ctrl_c_does_one_line_exit_143(tmp_path, group):
    # a scheduler's stop (SIGTERM to the command, or to its whole process group as Slurm
    # sends it): Python's default ended the process at once, with no message, and left the
    # ingest's scratch folders in the store
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    for i in range(48):
        np.save(src / f"f{i:02d}.npy", rng.standard_normal((1 << 20,)).astype(np.float32))
    for attempt in range(3):
        store = str(tmp_path / f"store{attempt}")
        cli("--store", store, "init", code=0)
        p = subprocess.Popen(
            [sys.executable, "-m", "simstore", "--store", store, "ingest", str(src),
             "--dataset", "d", "--workers", "2", "--snapshot", "--no-progress"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        scratch = os.path.join(store, ".scratch")
        try:
            deadline = time.monotonic() + 120  # a liveness bound
            while not (os.path.isdir(scratch) and os.listdir(scratch)):
                assert p.poll() is None and time.monotonic() < deadline, p.communicate()
                time.sleep(0.01)
            if group:
                os.killpg(p.pid, signal.SIGTERM)
            else:
                p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if p.returncode == 0 and err == "" and Catalog.open(store).branches("d").names():
            # on a loaded machine this test's process ran again only once the ingest had
            # committed and returned, after which a SIGTERM is ignored by design (see
            # simstore._launch.command_returned): the signal came too late, not unheeded
            continue
        break
    assert p.returncode == 143, err
    assert out == ""
    assert err.endswith("error: terminated\n"), err
    cat = Catalog.open(store)
    assert cat.staged("d") == []
    assert cat.branches("d").names() == []
    assert [n for n in os.listdir(scratch) if n.startswith("simstore-ingest-")] == []
