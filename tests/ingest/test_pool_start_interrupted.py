"""A Ctrl-C while the ingest's process pool starts: the interrupt, and no process left.

A SIGINT that lands between the pool forking its processes and starting the thread that
manages them made the pool's own shutdown fail ("cannot join thread before it is
started"): that error replaced the KeyboardInterrupt, and the forked workers stayed, idle,
for as long as the calling process lived (a pipeline's worker, a notebook). The signal is
real, sent by the process to itself as the pool's manager thread is about to start; the
case runs in a fresh interpreter.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import concurrent.futures.process as cfp, os, signal, sys, time
    # as in a terminal: a job started in the background by a shell inherits SIGINT
    # ignored, and the interrupt sent below would then be lost before Python sees it
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import numpy as np
    import simstore
    from simstore.catalog import Catalog

    tmp = sys.argv[1]
    src = os.path.join(tmp, "src")
    os.makedirs(src)
    for i in range(6):
        np.savez(os.path.join(src, f"r{i}.npz"), u=np.arange(20000, dtype="f4") + i)
    store = os.path.join(tmp, "store")
    Catalog.init(store)

    def children():
        me = str(os.getpid())
        out = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[1] == me:
                        out.append(pid)
            except OSError:
                pass
        return out

    fds = len(os.listdir("/proc/self/fd"))
    start = cfp._ExecutorManagerThread.start

    def interrupted_start(self):
        os.kill(os.getpid(), signal.SIGINT)  # handled on entering the real start
        return start(self)

    cfp._ExecutorManagerThread.start = interrupted_start
    try:
        simstore.ingest([src], dataset="d", store=store, workers=2, start_method="fork",
                        shard_size="64KiB")
    except BaseException as exc:
        print("raised", type(exc).__name__)
    else:
        print("raised nothing")
    cfp._ExecutorManagerThread.start = start
    print("children", len(children()))
    r = simstore.ingest([src], dataset="d", store=store, workers=2, start_method="fork",
                        shard_size="64KiB", snapshot=True)
    print("files", r.files_ingested + r.files_reused)
    print("children after", len(children()))
    import gc
    gc.collect()
    print("descriptors left", len(os.listdir("/proc/self/fd")) - fds)
""")


def test_an_interrupt_while_the_pool_starts_is_raised_and_leaves_no_process(tmp_path):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = dict(line.rsplit(" ", 1) for line in out.stdout.strip().splitlines())
    assert lines["raised"] == "KeyboardInterrupt", out.stdout
    assert lines["children"] == "0", out.stdout
    assert lines["files"] == "6", out.stdout
    assert lines["children after"] == "0", out.stdout
    assert lines["descriptors left"] == "0", out.stdout
