"""Handles collected by the garbage collector: a database, its storages and writers that refer
to each other form a cycle, which the collector finalizes in any order after clearing every weak
reference into it. Each shape runs in a child process (a handle closed after its parent is a
use after free in C: a crash, not an exception), collected by gc.collect() and at interpreter
exit; then the file opens again with a writer, so the cycle's writer was closed, not leaked."""

import os
import subprocess
import sys

import pytest

CHILD = r"""
import gc, os, sys
import bucketstore as bs

backend, mode, path = sys.argv[1:4]
SHAPES = ("db-storage", "storage-writer", "db-writer", "all")


def cycle(shape, i):
    db = bs.open(path, nosync=True) if backend == "lmdb" else bs.open_memory()
    # one stream per cycle kept alive together: one writer per stream
    st = db.storage(db.create_stream("s" if mode == "collect" else "s%d" % i, exist_ok=True))
    w = st.writer()
    w.save("t", "insert", "r%d" % i, [("b", "todos", "r%d" % i, "{}")])  # queued, not flushed
    if shape == "db-storage":
        db.ref = st
    elif shape == "storage-writer":
        st.ref = w
    elif shape == "db-writer":
        db.ref = w
    else:
        db.ref, st.ref, w.ref = w, db, st
    return db


if mode == "collect":
    for i in range(40):
        db = cycle(SHAPES[i % len(SHAPES)], i)
        del db
        gc.collect()
        if backend == "lmdb":  # the collected writer released the stream's writer lock
            with bs.open(path, nosync=True) as d, d.storage() as st, st.writer():
                pass
else:  # left in cycles for the interpreter's exit; with the collector off, in module globals
    if mode == "exit-nogc":
        gc.disable()
    kept = [cycle(shape, i) for i, shape in enumerate(SHAPES)]
print("ok")
"""


@pytest.mark.parametrize("mode", ["collect", "exit", "exit-nogc"])
def test_cycles_close_children_first(backend, tmp_path, mode):
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    r = subprocess.run([sys.executable, "-c", CHILD, backend, mode, str(tmp_path / "t.bsdb")],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and r.stdout == "ok\n", (r.returncode, r.stdout, r.stderr[-3000:])

