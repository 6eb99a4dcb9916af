"""A test adapter whose sources change while an ingest reads them.

``*.vals`` files are tables (``write_table``), one sample per row, keys ``<key>/r<row>``,
read in sample ranges (so a large one is planned as pieces). Each read of a file adds a
line to ``<name>.opened`` in ``options["marker_dir"]``. A file whose name starts with
``rewrite`` is rewritten by its own first piece (the one starting at row 0), right after
that piece yields its first sample, once (``<name>.rewritten`` marks it done): with
``options["how"]`` ``"replace"`` a new file is renamed over it (a new inode, another
size), with ``"inplace"`` its bytes are overwritten (same inode, same size).
"""

import os

import numpy as np

from simstore.sample import Sample

FMT = "%+.6e"  # every value the same width: a table of new values has the same size


def write_table(path, table):
    """Write ``table`` as text; its mtime set an hour back, so any rewrite shows in it."""
    np.savetxt(path, table, fmt=FMT)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - 3600 * 10**9))


def new_values(table):
    return -table + 0.5


def rewrite(path, how):
    table = np.loadtxt(path, dtype=np.float64, ndmin=2)
    if how == "inplace":
        tmp = path + ".text"
        np.savetxt(tmp, new_values(table), fmt=FMT)
        with open(tmp, "rb") as f:
            data = f.read()
        os.unlink(tmp)
        assert len(data) == os.path.getsize(path)
        with open(path, "r+b") as f:
            f.write(data)
    else:
        tmp = path + ".new"
        np.savetxt(tmp, np.vstack([new_values(table), table[:3]]), fmt=FMT)
        os.replace(tmp, path)


class RewritingAdapter:
    name = "rewrites"
    version = "1"
    extensions = (".vals",)
    supports_sample_ranges = True

    def count_samples(self, path, options):
        return len(np.loadtxt(path, ndmin=2))

    def can_read(self, path, head):
        return path.endswith(".vals")

    def iter_samples(self, path, key, options):
        markers = options["marker_dir"]
        name = os.path.basename(path)
        sample_range = options.get("sample_range")
        with open(os.path.join(markers, name + ".opened"), "a") as f:
            f.write(f"{sample_range}\n")
        table = np.loadtxt(path, dtype=np.float64, ndmin=2)
        start, stop = sample_range or (0, len(table))
        for i in range(start, stop):
            yield Sample(f"{key}/r{i:04d}", {"row": table[i]})
            done = os.path.join(markers, name + ".rewritten")
            if name.startswith("rewrite") and i == 0 and not os.path.exists(done):
                rewrite(path, options.get("how", "replace"))
                open(done, "w").close()
