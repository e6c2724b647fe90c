"""Fixtures: every test that takes `db` runs on both backends (LMDB file, memory store).

The package under test is the installed one (`make py-test`: tests/py_package_check.sh installs
it into a fresh venv and runs these tests from an unrelated folder). REPO is a copy of the
source tree (for storage.h and the README), BUCKETSTORE_REPO when set."""

import os
import pathlib

import pytest

import bucketstore as bs

REPO = pathlib.Path(os.environ.get("BUCKETSTORE_REPO", pathlib.Path(__file__).parents[3]))


@pytest.fixture(params=["lmdb", "memory"])
def backend(request):
    return request.param


@pytest.fixture
def db(backend, tmp_path):
    d = bs.open(tmp_path / "t.bsdb", nosync=True) if backend == "lmdb" else bs.open_memory()
    yield d
    d.close()


@pytest.fixture
def st(db):
    with db.storage(db.create_stream("v1")) as s:
        yield s


def row(bucket, oid, data=None, otype="todos"):
    return bs.Row(bucket, otype, oid, data if data is not None else '{"id":"%s"}' % oid)


def commit_all(w, lsn="1"):
    """snapshot_done + commit at lsn; returns the checkpoint."""
    w.snapshot_done(lsn)
    r = w.commit(lsn)
    assert r.checkpoint_created
    return r.checkpoint


def read_all(st, cp, buckets, **kw):
    """Every op of the buckets {name: after} up to cp, through the iterator."""
    return [op for c in st.bucket_data(cp, buckets, **kw) for op in c.ops]
