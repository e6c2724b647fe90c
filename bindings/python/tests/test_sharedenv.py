"""One file opened twice in one process (storage.h bs_open: every open of a file shares one
environment). bs.open(p) twice: an export of the first handle keeps its snapshot while the file is
opened again and every row is rewritten and compacted; handles opened, read and closed from
several threads; a second open whose options cannot share the environment is refused. And the
file open in two processes at once."""

import subprocess
import sys
import threading

import pytest

import bucketstore as bs
from conftest import row

ROWS, ROUNDS = 2000, 4


def write_round(w, r):
    for i in range(ROWS):
        w.save("t", "update" if r else "insert", f"r{i}",
               [row(f"b{i % 10}", f"r{i}", '{"round":%d,"pad":"%s"}' % (r, "x" * 80))])
    assert w.commit("%08d" % (r + 1)).checkpoint_created


@pytest.fixture
def path(tmp_path):
    p = tmp_path / "t.bsdb"
    with bs.open(p, nosync=True) as db:
        with db.storage(db.create_stream("v1")) as st, st.writer() as w:
            w.snapshot_done("00000000")
            write_round(w, 0)
    return p


@pytest.mark.parametrize("name", ["same", "symlink"])
def test_open_twice_keeps_snapshot(path, tmp_path, name):
    db1 = bs.open(path, nosync=True)
    before = list(db1.export())
    it = db1.export()
    first = next(it)  # the export's snapshot is open from here on
    other = path
    if name == "symlink":
        other = tmp_path / "link.bsdb"
        other.symlink_to(path)
    db2 = bs.open(other, nosync=True)
    with db1.storage() as st1, db2.storage() as st2:
        with st1.writer(), pytest.raises(bs.BusyError, match="already has a streaming writer"):
            st2.writer()  # one writer per stream, whatever name opened the other handle
        for r in range(1, ROUNDS + 1):  # the two handles' writers in turn, compacting through the other
            with (st1 if r % 2 else st2).writer() as w:
                write_round(w, r)
            (st2 if r % 2 else st1).compact(min_bucket_changes=1)
        assert st2.checkpoint() == st1.checkpoint()
    assert [first] + list(it) == before
    db2.close()
    db1.close()


def test_threads_open_read_close(path):
    with bs.open(path, nosync=True) as db, db.storage() as st:
        want = st.checkpoint()
    failures = []

    def run():
        try:
            for _ in range(50):
                with bs.open(path, nosync=True) as d, d.storage() as s:
                    assert s.checkpoint() == want
        except Exception as e:  # reported by the main thread
            failures.append(e)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_threads_write_a_stream_each(path):
    """Threads open the file the main thread has open and write and commit a stream each at
    the same time (as Node's worker threads, test/threads.test.js); the main thread reads what
    each committed, through its own handle."""
    with bs.open(path, nosync=True) as db:
        sids = [db.create_stream(f"s{k}") for k in range(3)]
        barrier = threading.Barrier(len(sids))
        done, failures = {}, []

        def run(sid):
            try:
                with bs.open(path, nosync=True) as d, d.storage(sid) as s, s.writer() as w:
                    barrier.wait()  # every thread has the file open and its writer
                    for i in range(200):
                        w.save("t", "insert", f"r{i}", [row(f"b{sid}", f"r{i}")])
                    w.snapshot_done("1")
                    cp = w.commit("1").checkpoint
                    done[sid] = (cp, s.checksums(cp, [f"b{sid}"])[f"b{sid}"])
            except Exception as e:  # reported by the main thread
                failures.append(e)

        threads = [threading.Thread(target=run, args=(sid,)) for sid in sids]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == []
        for sid in sids:
            with db.storage(sid) as st:
                cp, sums = done[sid]
                assert st.checkpoint().op_id == cp == 200
                assert st.checksums(cp, [f"b{sid}"])[f"b{sid}"] == sums and sums.count == 200
        assert db.verify() == []


def test_conflicting_open_is_refused(path):
    with bs.open(path, nosync=True):
        with pytest.raises(bs.BusyError, match="BS_OPEN_NOSYNC"):
            bs.open(path)
        with bs.open(path, readonly=True) as ro, ro.storage() as st:
            assert st.checkpoint().op_id > 0


OTHER = r"""
import sys
import bucketstore as bs

# the other process: told what to do line by line on stdin, answers on stdout
with bs.open(sys.argv[1], nosync=True) as db, db.storage() as st:
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "commit":
            try:
                w = st.writer()
            except bs.BusyError:
                print("busy", flush=True)
                continue
            with w:
                w.save("t", "update", "r0", [("b0", "todos", "r0", '{"from":"child"}')])
                print("committed", w.commit(cmd[1]).checkpoint, flush=True)
        elif cmd[0] == "wait":
            known = st.checkpoint()
            print("waiting", flush=True)
            print("saw", st.wait_checkpoint(known, 600_000).op_id, flush=True)
"""


def test_two_processes_on_one_file(path):
    """Another process with the same file open: its writer is refused (BusyError) while this
    one's is open and opens once it is closed; each sees the other's commits, and a
    wait_checkpoint in it wakes on a commit in this one."""
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", OTHER, str(path)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)

    def ask(line):
        p.stdin.write(line + "\n")
        p.stdin.flush()
        return p.stdout.readline().split()

    try:
        with bs.open(path, nosync=True) as db, db.storage() as st:
            with st.writer():  # one writer per stream, across processes
                assert ask("commit 00000002") == ["busy"]
            reply = ask("commit 00000002")
            cp = int(reply[1])
            assert reply[0] == "committed" and st.checkpoint().op_id == cp
            chunk = next(st.bucket_data(cp, {"b0": 0}))
            assert chunk.ops[-1].data == '{"from":"child"}'
            assert ask("wait") == ["waiting"]
            with st.writer() as w:
                w.save("t", "update", "r1", [row("b1", "r1", '{"from":"parent"}')])
                mine = w.commit("00000003").checkpoint
            assert p.stdout.readline().split() == ["saw", str(mine)]
    finally:
        p.stdin.close()
        assert p.wait(timeout=120) == 0
