"""Op ids above 2^53 from a real store, read exactly as Python ints. A stream's op head cannot be
moved through the API (writing 2^53 ops is out of reach), so the LMDB store is prepared by the C
helper tests/op_head_set.c (make py-test builds it and names it in BS_TEST_OP_HEAD_SET), the
PostgreSQL one by an UPDATE of its stream row. Its ops then take the last ids below 2^63 (the
contract's bound): 2^63 - 3, 2^63 - 2, 2^63 - 1, none of which a float holds (each rounds to
2^63); the next one is refused with BS_ELIMIT."""

import itertools
import os
import pathlib
import shutil
import subprocess

import pytest

import bucketstore as bs
from conftest import read_all

HEAD = 2**63 - 4
IDS = [HEAD + 1, HEAD + 2, HEAD + 3]
PG_URL = os.environ.get("BS_TEST_PG_URL")
PSQL = shutil.which("psql")
_names = itertools.count()


def helper():
    """BS_TEST_OP_HEAD_SET, else the one a `make` in this tree built."""
    p = os.environ.get("BS_TEST_OP_HEAD_SET") or str(
        pathlib.Path(__file__).parents[3] / "build" / "tests" / "op_head_set")
    if not os.path.exists(p):
        raise AssertionError(f"no {p}: run make py-test, or make build/tests/op_head_set and "
                             "set BS_TEST_OP_HEAD_SET")
    return p


def prepared(open_db, set_head):
    """Stream 1 created, nothing written; its op head set to HEAD by set_head; reopened."""
    db = open_db()
    assert db.create_stream("high") == 1
    db.close()
    set_head()
    return open_db()


def check_ids(db):
    row = lambda i: ("b", "t", f"r{i}", '{"i":%d}' % i)  # noqa: E731
    with db.storage() as st, st.writer() as w:
        for i in range(2):
            w.save("t", "insert", f"r{i}", [row(i)])
        assert w.flush() == IDS[1]
        w.save("t", "insert", "r2", [row(2)])
        w.snapshot_done("1")
        r = w.commit("1")
        assert r.checkpoint_created and r.checkpoint == IDS[2]
        cp = st.checkpoint()
        assert cp.op_id == IDS[2] and type(cp.op_id) is int
        assert st.status().last_persisted_op == IDS[2]
        ops = read_all(st, IDS[2], {"b": 0})
        assert [o.op_id for o in ops] == IDS
        # reads at and from op ids above 2^53: exact, not rounded to 2^63
        assert [o.op_id for o in read_all(st, IDS[1], {"b": 0})] == IDS[:2]
        (chunk,) = list(st.bucket_data(IDS[2], {"b": IDS[0]}))
        assert (chunk.after, chunk.next_after, [o.op_id for o in chunk.ops]) == (
            IDS[0], IDS[2], IDS[1:])
        assert st.checksums(IDS[1], ["b"])["b"].count == 2
        assert st.checkpoint_changes(IDS[1], IDS[2]).updated_buckets == ["b"]
        # the id after 2^63 - 1 does not exist: the next flush is refused and the head stays
        w.save("t", "insert", "r3", [row(3)])
        with pytest.raises(bs.BucketstoreError) as e:
            w.flush()
        assert e.value.code == bs.ELIMIT
        assert st.status().last_persisted_op == IDS[2]
        w.close()  # discards the save that cannot be written


def test_lmdb_op_ids_up_to_the_bound(tmp_path):
    path = tmp_path / "high.bsdb"

    def set_head():
        r = subprocess.run([helper(), str(path), "1", str(HEAD)], capture_output=True, text=True)
        assert r.returncode == 0, f"op_head_set: {r.stderr}"

    db = prepared(lambda: bs.open(path, nosync=True), set_head)
    try:
        check_ids(db)
    finally:
        db.close()


@pytest.mark.skipif(not PG_URL or not PSQL, reason="no PostgreSQL server (BS_TEST_PG_URL; make "
                    "py-test starts one) or no psql")
def test_postgres_op_ids_up_to_the_bound():
    schema = f"bs_py_opids_{os.getpid()}_{next(_names)}"

    def sql(query):
        subprocess.run([PSQL, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", PG_URL, "-c", query],
                       check=True, capture_output=True)

    sql(f"CREATE SCHEMA {schema}")
    url = f"{PG_URL}{'&' if '?' in PG_URL else '?'}options=-csearch_path%3D{schema}"
    try:
        db = prepared(lambda: bs.open(url, nosync=True),
                      lambda: sql(f"UPDATE {schema}.bs_streams SET op_head = {HEAD} WHERE id = 1"))
        try:
            check_ids(db)
        finally:
            db.close()
    finally:
        sql(f"DROP SCHEMA {schema} CASCADE")
