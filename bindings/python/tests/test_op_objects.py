"""Op objects: the binding frees an Op with a deallocator of its own and keeps up to 2000 freed
Ops for the next read (bucketstore._native: op_dealloc, op_new). What it must keep doing: Ops made
by Python code (tracked by the collector, holding anything, nested ever so deep) and subclasses
of Op are freed as tuples are; a read's Ops keep their values while later reads reuse freed
ones; and an Op is a tuple to everyone."""

import gc
import subprocess
import sys
import weakref

import bucketstore as bs
from conftest import commit_all, read_all, row


def test_ops_stay_what_they_were_across_reads(db, st):
    with st.writer(snapshot=True) as w:
        w.save_many([("todos", "insert", "t%d" % i, [row("b", "t%d" % i)]) for i in range(3000)])
        cp = commit_all(w)
    first = read_all(st, cp, {"b": 0}, limit=1000)
    want = [(o.op_id, o.object_id, o.data, o.checksum) for o in first]
    assert [o.object_id for o in first] == ["t%d" % i for i in range(3000)]
    for _ in range(3):  # reads that free their Ops (into the free list) and make new ones
        again = read_all(st, cp, {"b": 0}, limit=700)
        assert [(o.op_id, o.object_id, o.data, o.checksum) for o in again] == want
        del again
    assert [(o.op_id, o.object_id, o.data, o.checksum) for o in first] == want
    assert type(first[0]) is bs.Op and isinstance(first[0], tuple)
    assert first[0] == tuple(first[0]) and first[0]._replace(checksum=0).checksum == 0


def test_ops_made_by_python_code():
    class Sub(bs.Op):  # a subclass with a __dict__
        pass

    class Canary:
        pass

    made = [bs.Op(i, bs.OpType.PUT, "t", str(i), "s", "{}", i, None) for i in range(1000)]
    made += [bs.Op([i], bs.OpType.PUT, "t", {"x": [i]}, None, None, 0, None) for i in range(10)]
    cycle = [Canary()]  # a list -> an Op -> the list: only the collector frees it
    cycle.append(bs.Op(cycle, bs.OpType.MOVE, None, None, None, None, 0, 7))
    s = Sub(1, bs.OpType.CLEAR, None, None, None, None, 0, 1)
    s.note = Canary()  # type: ignore[attr-defined]
    freed = [weakref.ref(s.note), weakref.ref(cycle[0])]  # type: ignore[attr-defined]
    gc.collect()
    assert made[999].object_id == "999" and type(s) is Sub and s[0] == 1
    del made, cycle, s
    gc.collect()  # the cycle through the list freed by the collector
    assert [r() for r in freed] == [None, None]  # the Sub's dict freed with it; the cycle


def test_deeply_nested_ops_are_freed_without_recursing():
    """An Op holding an Op holding an Op...: freed through the trashcan as tuples are (a
    deallocator that recursed would overflow the C stack: the child dies of SIGSEGV)."""
    code = ("import bucketstore as bs\n"
            "x = None\n"
            "for i in range(1000000):\n"
            "    x = bs.Op(x, bs.OpType.PUT, None, None, None, None, 0, None)\n"
            "del x\n"
            "print('freed')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout) == (0, "freed\n"), r.stderr[-2000:]
