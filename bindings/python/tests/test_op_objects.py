"""Op objects: the binding frees an Op with a deallocator of its own and keeps up to 2000 freed
Ops for the next read (bucketstore._native: op_dealloc, op_new), each with the object_id, subkey
and data str that nobody else holds, whose characters the next read writes over when they fit
(op_str); and a chunk's ops share one object_type str while it repeats (object_type). What it must
keep doing: Ops made by Python code (tracked by the collector, holding anything, nested ever so
deep) and subclasses of Op are freed as tuples are; a read's Ops keep their values while later
reads reuse freed ones; a str written over is a new str to everyone (its hash, its type, the
caller's references and interned strings untouched, edge lengths and bytes that are not ASCII or
not UTF-8); and an Op is a tuple to everyone."""

import gc
import subprocess
import sys
import weakref

import pytest

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


def fill(st, buckets):
    """Saves {bucket: [(object_id, data, object_type)]} in that order, each from a source row of
    its own; returns the checkpoint."""
    with st.writer(snapshot=True) as w:
        for b, ops in buckets.items():
            for i, (oid, data, otype) in enumerate(ops):
                w.save(otype, "insert", "%s/%d" % (b, i), [row(b, oid, data, otype)])
        return commit_all(w)


@pytest.fixture
def no_free_ops(db):
    """The free list emptied (its Ops held by a read kept alive), so that the Ops a test drops
    are kept there and the next read is made from them, whatever the tests before left."""
    with db.storage(db.create_stream("held")) as st, st.writer(snapshot=True) as w:
        w.save_many([("todos", "insert", "h%d" % i, [row("held", "h%d" % i)]) for i in range(2100)])
        held = read_all(st, commit_all(w), {"held": 0})
    yield
    del held


def test_written_over_str_are_new_str(st, no_free_ops, monkeypatch):
    """The second read's ops have the first's field lengths, op for op, so its Ops are made from
    the first's and its str written over: each must be what a new str would be."""
    n = 300

    def ops(b):
        return [("%s%04d" % (b, i), ('{"n":"%s%04d"}' % (b, i)) + "." * 40, "todos")
                for i in range(n)]

    cp = fill(st, {"a": ops("a"), "b": ops("b")})
    first = read_all(st, cp, {"a": 0})
    kept = [first[i].data for i in range(0, n, 3)]  # the caller's: never written over
    for op in first[1:n:3]:
        hash(op.data), hash(op.object_id)  # hashes computed and cached in the str
    for op in first[2:n:3]:  # interned; before 3.12 the table's references are not counted
        sys.intern(op.object_id)
    # the same values interned as other str: an equal str that is new is interned as these
    interned = [sys.intern("".join(["b", "%04d" % i])) for i in range(2, n, 3)]
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(u.exc_value))
    del first
    second = read_all(st, cp, {"b": 0})
    want = [("b%04d" % i, ('{"n":"b%04d"}' % i) + "." * 40) for i in range(n)]
    assert [(o.object_id, o.data) for o in second] == want
    # a cached hash that was not reset finds no equal str that is new
    assert {o.data for o in second} == {d for _, d in want}
    assert {o.object_id: i for i, o in enumerate(second)} == {oid: i for i, (oid, _) in
                                                              enumerate(want)}
    assert kept == [('{"n":"a%04d"}' % i) + "." * 40 for i in range(0, n, 3)]
    # an interned str written over would still say it is interned, and be its own
    assert all(sys.intern(o.object_id) is s for o, s in zip(second[2:n:3], interned))
    assert [sys.intern("a%04d" % i) for i in range(2, n, 3)] == ["a%04d" % i for i in
                                                                range(2, n, 3)]
    assert all(type(o.object_id) is str and type(o.data) is str for o in second)
    del second, interned
    gc.collect()
    assert unraisable == []


def test_edge_fields_over_reused_str(st, no_free_ops):
    """Fields of the same byte lengths as the op's before, whose str cannot be written over or
    must not be: empty, one byte, not ASCII, not UTF-8 (a surrogate escape), the longest object
    id and a long row, the longest str kept and one more (463/464 characters before 3.12,
    471/472 after); then ASCII over the str of those."""
    big_id, big = "i" * 65535, "d" * (4 << 20)
    first = [("a", "x", "todos"), ("b" * 3, "y" * 3, "todos"), ("c" * 8, "z" * 9, "todos"),
             ("e1", "[1]", "todos"), (big_id, big, "todos"), ("f" * 4, "q" * 7, "todos"),
             ("g", "", "todos"), ("L" * 463, "M" * 464, "todos"),
             ("N" * 471, "O" * 472, "todos")]
    second = [("h", "", "todos"), ("é1", "é1", "todos"),  # 3 bytes over 3 ASCII characters
              ("\udcff" + "k" * 7, "\udcff" + "m" * 8, "todos"), ("e2", "[\u00e9]", "todos"),
              ("I" * 65535, "D" * (4 << 20), "todos"), ("\udcff\udcfe" + "xy", "x" * 7, "todos"),
              ("1", "2", "todos"), ("l" * 463, "m" * 464, "todos"),
              ("n" * 471, "o" * 472, "todos")]
    third = [("r", "s", "todos"), ("t" * 3, "u" * 3, "todos"), ("v" * 8, "w" * 9, "todos"),
             ("e3", "[2]", "todos"), ("j" * 65535, big, "todos"), ("AbCd", "1234567", "todos"),
             ("X", "Y", "todos"), ("P" * 463, "Q" * 464, "todos"),
             ("R" * 471, "S" * 472, "todos")]

    def enc(s):
        return s.encode("utf-8", "surrogateescape")

    cp = fill(st, {k: [(enc(o), enc(d), t) for o, d, t in ops]
                   for k, ops in (("p", first), ("q", second), ("r", third))})
    for bucket, ops in (("p", first), ("q", second), ("r", third), ("q", second)):
        got = read_all(st, cp, {bucket: 0})
        assert [(o.object_id, o.data) for o in got] == [(o, d) for o, d, _ in ops], bucket
        assert all(type(o.object_id) is str for o in got)
        del got


def test_str_subclasses_and_shared_str_are_not_written_over(st, no_free_ops):
    """Ops made by Python code, freed into the free list: a str subclass they hold (not compact:
    its characters apart from its header), or a str something else holds, stays what it is."""
    class S(str):
        pass

    cp = fill(st, {"b": [("o%d" % i, "d" * 20, "todos") for i in range(3)]})
    shared = "".join(["s"] * 20)
    made = [bs.Op(i, bs.OpType.PUT, "todos", S("o%d" % i), S("k" * 40), shared, 0, None)
            for i in range(3)]
    del made
    got = read_all(st, cp, {"b": 0})
    assert [(o.object_id, o.data) for o in got] == [("o%d" % i, "d" * 20) for i in range(3)]
    assert all(type(o.object_id) is str and type(o.subkey) is str for o in got)
    assert shared == "s" * 20


def test_object_types_alike_are_told_apart(st):
    """A chunk's ops share the object_type str of the op before while the bytes repeat: object
    types of one length that differ in one byte only, at each place, for lengths 1 to 24."""
    ops = []
    for n in range(1, 25):
        base = "".join(chr(97 + i % 26) for i in range(n))
        for k in range(n):
            other = base[:k] + base[k].upper() + base[k + 1:]
            ops += [("%d-%d-%d" % (n, k, j), "{}", t) for j, t in enumerate((base, other, base))]
    cp = fill(st, {"b": ops})
    for limit in (1000, 7):
        got = read_all(st, cp, {"b": 0}, limit=limit)
        assert [(o.object_id, o.object_type) for o in got] == [(o, t) for o, _, t in ops]
