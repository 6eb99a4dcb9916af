"""``python -m simstore`` runs the command line, as ``simstore`` does."""

import subprocess
import sys


def test_python_dash_m_simstore_is_the_command(tmp_path):
    store = tmp_path / "st"
    run = subprocess.run([sys.executable, "-m", "simstore", "--store", str(store), "init"],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert (store / "simstore.json").is_file()
    bad = subprocess.run([sys.executable, "-m", "simstore", "--store", str(tmp_path / "no"),
                          "ls"], capture_output=True, text=True, check=False)
    assert bad.returncode == 3 and "not a simstore store" in bad.stderr
