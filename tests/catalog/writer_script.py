"""Run as a process: stage and commit samples to a store, for crash and race tests.

usage: writer_script.py STORE WRITER_ID COMMITS
Each commit adds key w<WRITER_ID>-<i> and rewrites key 'shared'.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from catalog_helpers import stage_samples  # noqa: E402

from simstore.catalog import Catalog  # noqa: E402


def main() -> None:
    store, writer, commits = sys.argv[1], sys.argv[2], int(sys.argv[3])
    cat = Catalog.open(store)
    for i in range(commits):
        payload = f"{writer}-{i}".encode() * 50
        entry = stage_samples(cat, "ds", {f"w{writer}-{i:04d}": payload, "shared": payload})
        cat.commit("ds", message=f"{writer}:{i}", staging_ids=[entry.id])
        print(f"committed {writer}:{i}", flush=True)


if __name__ == "__main__":
    main()
