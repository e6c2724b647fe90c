"""Bad input from Python gets a Python exception, never a crash: wrong types, ints out of
range, closed handles, callbacks that raise or misbehave, one writer used by several threads."""

import sys
import threading

import pytest

import bucketstore as bs
from conftest import commit_all, read_all, row


@pytest.mark.parametrize("call", [
    lambda w: w.save(1, "insert", "a"),
    lambda w: w.save("t", "insert", None),
    lambda w: w.save("t", "insert", "a", [("b", "o", "i")]),
    lambda w: w.save("t", "insert", "a", [("b", "o", "i", 5)]),
    lambda w: w.save("t", "insert", "a", [5]),
    lambda w: w.save("t", "insert", "a", [], [("u1", ["{}"])]),
    lambda w: w.save("t", "insert", "a", [], [([{"x": 1}], ["{}"])]),
    lambda w: w.save("t", "insert", "a", [], [(["u"], "{}")]),
    lambda w: w.commit(3),
    lambda w: w.commit("1", create_empty="yes"),
    lambda w: w.custom_write_checkpoint("u", 1.0),
    lambda w: w.custom_write_checkpoint("u", True),
])
def test_wrong_types_raise_type_error(st, call):
    with st.writer() as w:
        with pytest.raises(TypeError):
            call(w)
        assert w.flush() == 0  # nothing was queued


@pytest.mark.parametrize("call", [
    lambda st: st.checksums(-1, ["b"]),
    lambda st: st.checksums(2**63, ["b"]),
    lambda st: st.bucket_data_batch(1, {"b": 2**64}),
    lambda st: st.bucket_data_batch(1, {"b": 0}, limit=0),
    lambda st: st.bucket_data_batch(1, {"b": 0}, limit=-1),
    lambda st: st.bucket_data_batch(1, {"b": 0}, limit=2**64),
    lambda st: st.parameter_sets(1, [[2**63]]),
    lambda st: st.parameter_sets(1, [[-(2**63) - 1]]),
    lambda st: st.wait_checkpoint(None, -1),
    lambda st: st.wait_checkpoint(None, 2**31),
    lambda st: st.compact(max_op_id=-5),
    lambda st: st.delete_checkpoint_requests_before(2**63),
    lambda st: st.db.storage(2**32),
    lambda st: st.writer(max_records=0),
    lambda st: st.last_write_checkpoint("u", {"1": "x" * 300}),
    lambda st: st.set_write_checkpoint_mode("other"),
    lambda st: st.report_error("a\0b"),
    lambda st: st.db.create_stream("a\0b"),
    lambda st: st.db.create_stream("v", hash="md5"),
])
def test_out_of_range_raises_bucketstore_error(st, call):
    with pytest.raises(bs.BucketstoreError) as e:
        call(st)
    assert isinstance(e.value, ValueError) and e.value.code in (bs.EINVAL, bs.ETOOBIG)
    assert e.value.message


def test_bad_tag_and_library_side_errors(st):
    with st.writer() as w:
        for tag in ("upsert", 0, 4, True):
            with pytest.raises(bs.InvalidArgumentError):
                w.save("t", tag, "a")
        with pytest.raises(bs.InvalidArgumentError) as e:  # checked by the library
            w.save("", "insert", "a")
        assert e.value.code == bs.EINVAL and "table" in e.value.message
    with pytest.raises(bs.InvalidArgumentError):
        bs.open("")


def test_closed_handles(db):
    st = db.storage(db.create_stream("v1"))
    w = st.writer()
    w.save("t", "insert", "a", [row("b", "a")])
    st.close()  # closes its writer first
    assert w.closed and st.closed and not db.closed
    for call in (lambda: w.save("t", "insert", "b"), w.flush, lambda: w.commit("1"),
                 lambda: st.checkpoint(), lambda: st.checksums(1, ["b"]),
                 lambda: list(st.bucket_data(1, {"b": 0})), st.writer, st.status,
                 lambda: list(st.list_buckets())):
        with pytest.raises(bs.StateError) as e:
            call()
        assert e.value.code == bs.ESTATE and "closed" in e.value.message
    w.close()
    st.close()  # closing twice is a no-op
    st2 = db.storage()
    db.close()
    assert st2.closed
    for call in (st2.checkpoint, db.streams, db.stat, lambda: db.storage(1)):
        with pytest.raises(bs.StateError):
            call()


def test_forgotten_handles_are_released(tmp_path):
    db = bs.open(tmp_path / "f.bsdb")
    st = db.storage(db.create_stream("v1"))
    st.writer().save("t", "insert", "a")  # the writer is garbage at once
    del st
    db.close()
    with bs.open(tmp_path / "f.bsdb") as db2:  # the file is not held by a leaked handle
        assert len(db2.streams()) == 1


def test_progress_callback_that_raises(st):
    w = st.writer()
    rounds = iter(range(10))

    def more_work():  # a round of updates, so that every compaction has work to report
        v = next(rounds)
        for i in range(50):
            w.save("t", "insert" if v == 0 else "update", f"r{i}", [row("b", f"r{i}", str(v))])
        w.snapshot_done("0")
        cp = w.commit(str(v)).checkpoint
        return cp, st.checksums(cp, ["b"])["b"].checksum

    def boom(stats):
        raise ValueError("stop here")

    def writes(stats):  # only reads are allowed inside a callback
        st.clear()

    more_work()
    for progress, exc in ((boom, ValueError), (lambda s: True, bs.CanceledError),
                          (writes, bs.StateError)):
        cp, before = more_work()
        with pytest.raises(exc) as e:
            st.compact(min_bucket_changes=1, max_ops_per_txn=10, progress=progress)
        if exc is bs.CanceledError:  # the library's message names the callback that cancelled
            assert "bs_compact's opts->progress returned 1" in e.value.message
        assert st.checksums(cp, ["b"])["b"].checksum == before and st.db.verify() == []
    with pytest.raises(TypeError):
        st.compact(progress=5)
    cp, before = more_work()
    reads = []
    st.compact(min_bucket_changes=1, progress=lambda s: reads.append(st.checkpoint()))
    assert reads and st.checksums(cp, ["b"])["b"].checksum == before
    w.close()


def test_listener_that_raises_or_misbehaves(db, monkeypatch):
    # the listener runs after the commit succeeded: its exception goes to sys.unraisablehook
    # and the commit returns its result
    caught = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: caught.append(u.exc_value))
    with db.storage(db.create_stream("v1")) as st, st.writer() as w:
        w.save("t", "insert", "a", [row("b", "a")])
        w.snapshot_done("1")

        def boom(s, c):
            raise RuntimeError(f"listener saw {c}")

        db.set_checkpoint_listener(boom)
        r = w.commit("1")
        assert r.checkpoint_created and r.checkpoint == 1 == st.checkpoint().op_id
        assert len(caught) == 1 and isinstance(caught[0], RuntimeError)
        assert str(caught[0]) == "listener saw 1"
        for i, bad in enumerate((lambda s, c: w.save("t", "insert", "x"), lambda s, c: w.close(),
                                 lambda s, c: db.close(), lambda s, c: st.writer())):
            db.set_checkpoint_listener(bad)
            assert w.keepalive("2").checkpoint_created
            assert len(caught) == i + 2 and isinstance(caught[-1], bs.StateError)
            assert "inside a callback" in str(caught[-1])
        assert not w.closed and not db.closed
        db.set_checkpoint_listener(lambda s, c: st.checksums(c, ["b"]))  # reads are fine
        w.keepalive("3")
        with pytest.raises(TypeError):
            db.set_checkpoint_listener(42)


def test_one_writer_from_several_threads(st):
    w = st.writer()
    errors = []

    def work(k):
        try:
            for i in range(300):
                w.save("t", "insert", f"{k}-{i}", [row(f"b{k}", f"{k}-{i}")])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    cp = commit_all(w)
    w.close()
    assert cp == 1200
    assert {k: v.count for k, v in st.checksums(cp, [f"b{k}" for k in range(4)]).items()} == {
        f"b{k}": 300 for k in range(4)}


def test_iterator_abandoned_midway(st):
    with st.writer() as w:
        for i in range(20):
            w.save("t", "insert", f"r{i}", [row("b", f"r{i}")])
        cp = commit_all(w)
    it = st.bucket_data(cp, {"b": 0}, limit=3)
    first = next(it)
    del it  # holds no snapshot: the storage closes normally
    assert first.ops[0].op_id == 1
    assert len(read_all(st, cp, {"b": 0}, limit=3)) == 20


def test_close_while_another_thread_waits(db):
    st = db.storage(db.create_stream("v1"))
    got = []

    def wait():
        try:
            got.append(st.wait_checkpoint(None, 300))
        except bs.StateError as e:  # the close came first
            got.append(e)

    t = threading.Thread(target=wait)
    t.start()
    db.close()  # waits for a call in flight (up to its timeout), then closes: never a crash
    t.join()
    assert st.closed and repr(st) == "<bucketstore.Storage stream 1 closed>"
    assert got == [bs.Checkpoint(0, None)] or isinstance(got[0], bs.StateError)


def test_password_never_in_an_exception():
    # a PostgreSQL URL's password: a closed port, URLs libpq refuses by quoting them
    pw = "Zq7secretPW"
    for url in (f"postgresql://u:{pw}@127.0.0.1:1/db", f"postgresql://u:{pw}%zz@127.0.0.1:1/db",
                f"postgresql://u:{pw}@[::1:1/db", f"postgres://u@127.0.0.1:1/db?password={pw}&x=1"):
        with pytest.raises(bs.BucketstoreError) as e:
            bs.open(url)
        assert pw not in str(e.value) and pw not in repr(e.value) and pw not in e.value.message
