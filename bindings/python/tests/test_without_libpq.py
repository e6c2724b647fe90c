"""The package with and without the PostgreSQL backend. setup.py compiles the backend in when
pkg-config finds libpq (as make does); without it, a PostgreSQL URL (bs.open) or path (bs.load)
raises UnsupportedError whose message says what a package user does (install libpq-dev, then
reinstall the package: not the repository's `make PG=1`), and everything else works.

Which build is under test: BUCKETSTORE_EXPECT_PG (1 or 0; tests/py_package_check.sh sets it: 0
for the package it builds where pkg-config finds no libpq, where it runs this file and
test_api.py, 1 or 0 for the main one as pkg-config saw libpq), else what setup.py's rule gives
on this machine now (`pkg-config --exists libpq`)."""

import os
import subprocess

import pytest

import bucketstore as bs
from conftest import commit_all, read_all, row


def expect_pg():
    v = os.environ.get("BUCKETSTORE_EXPECT_PG")
    if v is not None:
        assert v in ("0", "1"), f"BUCKETSTORE_EXPECT_PG={v!r}"
        return v == "1"
    try:
        return subprocess.run(["pkg-config", "--exists", "libpq"]).returncode == 0
    except OSError:
        return False


URL = "postgresql://u@127.0.0.1:1/bucketstore_nopq?connect_timeout=2"


@pytest.mark.parametrize("how", ["open", "load"])
def test_postgres_url(how, tmp_path):
    def call():
        if how == "open":
            bs.open(URL).close()
        else:
            bs.load(URL, iter(()))

    with pytest.raises(bs.BucketstoreError) as e:
        call()  # port 1: no server, with the backend or without
    if expect_pg():
        # the backend is there: open tried to connect; load refuses the LMDB format's
        # records (UnsupportedError too); neither says that the build lacks the backend
        assert "no PostgreSQL backend" not in str(e.value), e.value
    else:
        assert isinstance(e.value, bs.UnsupportedError) and e.value.code == bs.EUNSUPPORTED
        msg = str(e.value)
        assert "no PostgreSQL backend" in msg, msg
        assert "built without libpq" in msg and "libpq-dev" in msg and "reinstall" in msg, msg
        assert "make PG=1" not in msg, msg


@pytest.mark.parametrize("where", ["file", "memory"])
def test_everything_else(where, tmp_path):
    """The LMDB file and the memory store: write, read, checksums, parameter sets, backup and
    load (the file), whether or not the PostgreSQL backend is compiled in."""
    db = bs.open(tmp_path / "a.bsdb", nosync=True) if where == "file" else bs.open_memory()
    with db:
        with db.storage(db.create_stream("v1")) as st:
            with st.writer(snapshot=True) as w:
                w.save("todos", "insert", "t1", [row("b", "t1")],
                       lookups=[(["u1"], ['{"list":"u1"}'])])
                cp = commit_all(w)
            ops = read_all(st, cp, {"b": 0})
            assert [(o.op, o.object_id, o.data) for o in ops] == \
                [(bs.OpType.PUT, "t1", '{"id":"t1"}')]
            assert st.checksums(cp, ["b"])["b"].count == 1
            assert st.parameter_sets(cp, [["u1"]]) == [{"list": "u1"}]
        if where == "file":
            db.backup(tmp_path / "b.bsdb")
            bs.load(tmp_path / "c.bsdb", db.export())
            with bs.open(tmp_path / "c.bsdb") as c, c.storage() as st:
                assert [o.object_id for o in read_all(st, cp, {"b": 0})] == ["t1"]
