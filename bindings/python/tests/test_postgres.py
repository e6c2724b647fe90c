"""The PostgreSQL backend through the binding: bs.open(url) with nomigrate and
pg_max_connections (storage.h bs_open_postgres), against the server that BS_TEST_PG_URL names
(make py-test starts one: tests/pg_server.sh run). Each test has a schema of its own, named in
the URL's search_path, and its sessions an application_name of its own, counted in
pg_stat_activity with psql."""

import itertools
import os
import shutil
import subprocess
import threading

import pytest

import bucketstore as bs

URL = os.environ.get("BS_TEST_PG_URL")
PSQL = shutil.which("psql")
pytestmark = pytest.mark.skipif(
    not URL or not PSQL, reason="no PostgreSQL server (BS_TEST_PG_URL; make py-test starts one) "
    "or no psql")
_names = itertools.count()


def sql(query):
    out = subprocess.run([PSQL, "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-d", URL,
                          "-c", query], check=True, capture_output=True, text=True).stdout
    return out.strip()


@pytest.fixture
def schema():
    """A new empty schema, dropped after the test."""
    name = f"bs_py_{os.getpid()}_{next(_names)}"
    sql(f"CREATE SCHEMA {name}")
    yield name
    sql(f"DROP SCHEMA {name} CASCADE")


def url_of(schema, app="x"):
    """The server's URL for schema, its sessions named application_name=<schema>_<app>."""
    sep = "&" if "?" in URL else "?"
    return f"{URL}{sep}options=-csearch_path%3D{schema}&application_name={schema}_{app}"


def tables(schema):
    return int(sql(f"SELECT count(*) FROM pg_tables WHERE schemaname = '{schema}'"))


def sessions(schema, app):
    return int(sql("SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                   f"'{schema}_{app}'"))


def test_nomigrate_opens_only_a_schema_that_exists(schema):
    url = url_of(schema)
    with pytest.raises(bs.NotFoundError) as e:
        bs.open(url, nomigrate=True)
    assert "bucketstore migrate" in e.value.message
    assert tables(schema) == 0  # refused: nothing created
    with bs.open(url) as db:  # without the flag the open creates the schema
        sid = db.create_stream("v1")
        with db.storage(sid) as st, st.writer() as w:
            w.snapshot_done("0")
            w.save("t", "insert", "a", [bs.Row("b", "todos", "a", '{"x":1}')])
            cp = w.commit("1").checkpoint
    n = tables(schema)
    assert n > 0
    with bs.open(url, nomigrate=True) as db, db.storage(sid) as st:  # a current schema: opens
        assert st.checksums(cp, ["b"])["b"].count == 1
        with st.writer() as w:  # and writes: the flag only keeps the schema as it is
            w.save("t", "update", "a", [bs.Row("b", "todos", "a", '{"x":2}')])
            w.commit("2")
    assert tables(schema) == n
    with pytest.raises(TypeError):
        bs.open(url, nomigrate="yes")


def fill(db, streams, updates=40):
    """Streams whose one row was updated many times: work for a compaction's transactions."""
    ids = []
    for k in range(streams):
        sid = db.create_stream(f"s{k}")
        with db.storage(sid) as st, st.writer() as w:
            w.snapshot_done("0")
            for i in range(updates):
                w.save("t", "update" if i else "insert", "a",
                       [bs.Row("b", "todos", "a", '{"i":%d}' % i)])
                w.commit("%04d" % (i + 1))
        ids.append(sid)
    return ids


def test_pg_max_connections_bounds_the_pool(schema):
    """Compactions that wait in their progress callback hold the pool's connections: with
    pg_max_connections=2, two hold both, and a read started then waits (no third session
    opens) until they are released; with 3, three hold a session each at once. The handle
    that counts runs no writer (a writer's session is not the pool's)."""
    with pytest.raises(bs.InvalidArgumentError):
        bs.open(url_of(schema), pg_max_connections=0)
    with bs.open(url_of(schema, "fill")) as db:
        ids = fill(db, 5)  # a compaction's work for each of the five that hold
    for size, streams in ((2, ids[:2]), (3, ids[2:])):
        app = f"pool{size}"
        with bs.open(url_of(schema, app), pg_max_connections=size) as db:
            sts = [db.storage(i) for i in streams]
            inside, release = threading.Semaphore(0), threading.Event()
            errors = []

            def compact(st):
                first = [True]

                def progress(_):
                    if first[0]:
                        first[0] = False
                        inside.release()
                        release.wait()

                try:
                    st.compact(min_bucket_changes=1, max_ops_per_txn=5, progress=progress)
                except Exception as e:  # noqa: B902 - reported below
                    errors.append(e)

            done = threading.Event()
            threads = [threading.Thread(target=compact, args=(st,)) for st in sts]
            reader = threading.Thread(target=lambda: (sts[0].checkpoint(), done.set()))
            try:
                for t in threads:
                    t.start()
                for _ in sts:
                    inside.acquire()  # every compaction holds a connection, waiting
                assert sessions(schema, app) == size
                reader.start()
                for _ in range(5):  # the read waits for a connection; the pool opens no more
                    assert sessions(schema, app) == size and not done.is_set()
            finally:
                release.set()
                for t in threads + [reader]:
                    if t.ident is not None:
                        t.join()
            assert done.is_set() and not errors, errors
            assert sessions(schema, app) == size  # idle in the pool, no more
            for st in sts:
                st.close()
