"""Writer.save and save_many, which are C (bucketstore._native's WriterBase): their arguments
bound as the typed signature says, and the caller's lists changed by Python code in the middle
of a call (a lookup's values are any Sequence, whose methods the encoder calls)."""

import collections.abc

import pytest

import bucketstore as bs
from conftest import commit_all, read_all


def test_save_binds_arguments_as_its_signature_says(st):
    with st.writer() as w:
        w.save(table="t", tag="insert", id="a", rows=[("b", "o", "a", "{}")], store="s")
        w.save("t", "update", "c", [("b", "o", "c", "{}")], (), old_id="a")
        w.save("t", bs.Tag.INSERT, "d", lookups=[([1], ["{}"])])
        w.save("t", "delete", id="d")
        for bad in (lambda: w.save("t", "insert"),                       # id missing
                    lambda: w.save("t", "insert", "x", [], [], "old"),   # old_id is keyword-only
                    lambda: w.save("t", "insert", "x", table="t"),       # table twice
                    lambda: w.save("t", "insert", "x", other=1),
                    lambda: w.save_many(5),
                    lambda: w.save_many([["t", "insert", "x"]])):        # a save is a tuple
            with pytest.raises(TypeError):
                bad()
        w.save_many(s for s in [("t", "insert", "e", [("b", "o", "e", "{}")])])  # any iterable
        cp = commit_all(w)
    ops = read_all(st, cp, {"b": 0})
    assert [(op.op.name, op.object_id) for op in ops] == [
        ("PUT", "a"), ("REMOVE", "a"), ("PUT", "c"), ("PUT", "e")]


class Emptying(collections.abc.Sequence):
    """A lookup's values (a Sequence) that, when the encoder asks their length, empty a list
    of the caller's and churn the allocator, so that whatever the list alone held is freed and
    its memory written over."""

    def __init__(self, victim):
        self.victim = victim
        self.junk = []

    def __len__(self):
        self.victim.clear()
        self.junk = ["".join(["z"] * 120) for _ in range(2000)]
        return 1

    def __getitem__(self, i):
        if i != 0:
            raise IndexError(i)
        return 7


def fresh(prefix, i):
    """A str made at run time (no literal or interned copy keeps it alive)."""
    return "".join([prefix, str(i), "x" * 100])


def test_save_many_list_emptied_by_a_lookup(st):
    batch = [("t", "insert", fresh("r", i), [(fresh("b", 0), "o", fresh("r", i), '"%d"' % i)])
             for i in range(5)]
    want = [(s[2], s[3][0][3]) for s in batch]
    batch.insert(1, ("t", "insert", "lk", [], [(Emptying(batch), ["{}"])]))
    with st.writer() as w:
        w.save_many(batch)  # every save as the call found it, though batch is now empty
        assert batch == []
        cp = commit_all(w)
    ops = read_all(st, cp, {fresh("b", 0): 0})
    assert [(op.object_id, op.data) for op in ops] == want


def test_save_rows_list_emptied_by_a_lookup(st):
    rows = [(fresh("b", 0), "o", fresh("r", i), fresh("d", i)) for i in range(20)]
    want = [(r[2], r[3]) for r in rows]
    with st.writer() as w:
        w.save("t", "insert", "a", rows, [(Emptying(rows), ["{}"])])
        assert rows == []
        cp = commit_all(w)
    ops = read_all(st, cp, {fresh("b", 0): 0})
    assert [(op.object_id, op.data) for op in ops] == want
