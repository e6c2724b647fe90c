"""Handles collected by the garbage collector: a database, its storages and writers that refer
to each other form a cycle, which the collector finalizes in any order after clearing every weak
reference into it. Each shape runs in a child process (a handle closed after its parent is a
use after free in C: a crash, not an exception), collected by gc.collect() and at interpreter
exit; then the file opens again with a writer, so the cycle's writer was closed, not leaked.
And the interpreter's exit while calls are running."""

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

BUSY = r"""
import os, sys, threading
import bucketstore as bs

how, path = sys.argv[1:3]
db = bs.open(path, nosync=True)
st = db.storage(db.create_stream("s"))
with st.writer() as w:
    w.snapshot_done("0")
    for i in range(100):
        w.save("t", "update" if i else "insert", "a", [("b", "todos", "a", '{"i":%d}' % i)])
        w.commit("%04d" % (i + 1))
started = threading.Semaphore(0)
forever = threading.Event()


def compact():  # waits in its progress callback
    def progress(_):
        started.release()
        forever.wait()
    st.compact(min_bucket_changes=1, max_ops_per_txn=2, progress=progress)


def wait():  # waits in C for a checkpoint that never comes
    cp = st.checkpoint()
    started.release()
    st.wait_checkpoint(cp, 3_600_000)


def export():  # an export's snapshot and thread, the iterator half read
    it = db.export()
    next(it)
    started.release()
    forever.wait()


def waiting_progress(_):
    started.release()
    forever.wait()


def backup():  # waits in its progress callback, with its snapshot
    db.backup(path + ".copy", progress=waiting_progress)


def load():  # waits in its progress callback, its file half written
    bs.load(path + ".loaded", db.export(), progress=waiting_progress)


def load_input():  # waits for its next record
    def records():
        it = db.export()
        yield next(it)
        started.release()
        forever.wait()
    bs.load(path + ".loaded2", records())


def cancellable_wait():  # a wait in slices, with a token that is never cancelled
    cp = st.checkpoint()
    started.release()
    st.wait_checkpoint(cp, 3_600_000, cancel=bs.CancelToken())


def read():  # a bucket_data iterator half read
    it = st.bucket_data(st.checkpoint().op_id, {"b": 0}, limit=1)
    next(it)
    started.release()
    forever.wait()


def read_raw():  # a bucket_data_raw iterator half read
    it = st.bucket_data_raw(st.checkpoint().op_id, {"b": 0}, limit=1)
    next(it)
    started.release()
    forever.wait()


CALLS = (compact, wait, export, backup, load, load_input, cancellable_wait, read, read_raw)
for fn in CALLS:
    threading.Thread(target=fn, daemon=True).start()
for _ in CALLS:
    started.acquire()
w = st.writer()  # and a writer with work queued
w.save("t", "update", "a", [("b", "todos", "a", "{}")])
print("ok", flush=True)
if how == "exit":
    sys.exit(3)
if how == "raise":
    raise RuntimeError("uncaught")
"""


@pytest.mark.parametrize("how", ["end", "exit", "raise"])
def test_no_hang_at_exit(tmp_path, how):
    """The interpreter exits (end of the script, sys.exit, an uncaught exception) while a
    compaction, a backup and a load wait in their progress callbacks, another load waits for
    its next record, two wait_checkpoint wait in C (one with a cancel token), an export, a
    bucket_data and a bucket_data_raw iterator are half read and a writer has work queued: it
    ends, in a child process with a time limit (a guard only: each call is known to be under
    way first)."""
    r = subprocess.run([sys.executable, "-c", BUSY, how, str(tmp_path / "t.bsdb")],
                       capture_output=True, text=True, timeout=120)
    assert r.stdout == "ok\n", r.stderr[-3000:]
    assert r.returncode == {"end": 0, "exit": 3, "raise": 1}[how], r.stderr[-3000:]
