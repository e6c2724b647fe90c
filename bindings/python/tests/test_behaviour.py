"""The behaviour the binding promises beyond the library's: strings that are not valid Unicode
are refused and bytes round-trip, leaving a writer's with block with queued work raises,
parameter rows come back parsed, and every long call cancels the same way."""

import os
import threading

import pytest

import bucketstore as bs
from conftest import commit_all, read_all, row


@pytest.mark.parametrize("bad", ["a\ud800", "a\udc00", "a\udc80"])
def test_lone_surrogates_are_refused(st, bad):
    with st.writer() as w:
        for save in ((bad, "insert", "r"), ("t", "insert", bad), ("t", "insert", "r", [row(bad, "r")]),
                     ("t", "insert", "r", [("b", bad, "r", "{}")]),
                     ("t", "insert", "r", [], [(["k"], [bad])])):
            with pytest.raises(ValueError, match="not valid Unicode") as e:
                w.save_many([save])
            assert isinstance(e.value, bs.InvalidArgumentError)
        with pytest.raises(ValueError, match=r"buckets\[0\]: not valid Unicode"):
            st.checksums(0, [bad])
        with pytest.raises(ValueError, match="not valid Unicode"):
            list(st.bucket_data(0, {bad: 0}))
        w.close()  # nothing was queued; close anyway
    with pytest.raises(ValueError, match="name: not valid Unicode"):
        st.db.create_stream(bad)


L = "a\ud800"


def string_arguments(db, st, w, d):
    """Every string argument of every call but the save fields and reads above (paths, LSNs,
    tables, write-checkpoint users, events and heads, filters, records, URLs, messages, zero
    LSN): (what, the argument's name in the error, the call with L there)."""
    r = row("b", "r")
    return [
        ("open path", "path", lambda: bs.open(os.path.join(d, L))),
        ("open postgresql URL", "path", lambda: bs.open("postgresql://127.0.0.1:1/" + L)),
        ("backup path", "path", lambda: db.backup(os.path.join(d, L))),
        ("load path", "path", lambda: bs.load(os.path.join(d, L), db.export())),
        ("load record table", "records[0].table",
         lambda: bs.load(os.path.join(d, "l1"), [(L, 0, b"k", b"v")])),
        ("load record key", "records[0].key",
         lambda: bs.load(os.path.join(d, "l2"), [("meta", 0, L, b"v")])),
        ("checksum_put object_type", "object_type", lambda: bs.checksum_put(L, "i", "{}")),
        ("checksum_put object_id", "object_id", lambda: bs.checksum_put("t", L, "{}")),
        ("checksum_put data", "data", lambda: bs.checksum_put("t", "i", L)),
        ("subkey replica_id", "replica_id", lambda: bs.subkey(1, L)),
        ("save old_id", "old_id", lambda: w.save("t", "update", "r", [r], old_id=L)),
        ("save store", "store", lambda: w.save("t", "insert", "r", [r], store=L)),
        ("truncate", "table", lambda: w.truncate(L)),
        ("drop", "table", lambda: w.drop(L)),
        ("snapshot_done", "lsn", lambda: w.snapshot_done(L)),
        ("resume_lsn", "lsn", lambda: w.resume_lsn(L)),
        ("commit", "lsn", lambda: w.commit(L)),
        ("keepalive", "lsn", lambda: w.keepalive(L)),
        ("source_row table", "table", lambda: w.source_row(L, "r")),
        ("source_row id", "id", lambda: w.source_row("t", L)),
        ("custom_write_checkpoint user_id", "user_id", lambda: w.custom_write_checkpoint(L, 1)),
        ("custom_write_checkpoint event_id", "event_id",
         lambda: w.custom_write_checkpoint("u", 1, event_id=L)),
        ("set_write_checkpoint_mode event_name", "event_name",
         lambda: st.set_write_checkpoint_mode("custom", event_name=L)),
        ("create_managed_write_checkpoints user_id", "requests[0].user_id",
         lambda: st.create_managed_write_checkpoints([bs.ManagedRequest(L, {"1": "0"})])),
        ("create_managed_write_checkpoints head", "requests[0].heads['1']",
         lambda: st.create_managed_write_checkpoints([bs.ManagedRequest("u", {"1": L})])),
        ("create_managed_write_checkpoints connection", "requests[0].heads connection",
         lambda: st.create_managed_write_checkpoints([bs.ManagedRequest("u", {L: "0"})])),
        ("last_write_checkpoint user_id", "user_id",
         lambda: st.last_write_checkpoint(L, {"1": "0"})),
        ("last_write_checkpoint head", "heads['1']",
         lambda: st.last_write_checkpoint("u", {"1": L})),
        ("bucket_data_batch", "buckets[0] name", lambda: st.bucket_data_batch(0, {L: 0})),
        ("bucket_data_raw", "buckets[0] name", lambda: next(st.bucket_data_raw(0, {L: 0}))),
        ("bucket_data_batch_raw", "buckets[0] name", lambda: st.bucket_data_batch_raw(0, {L: 0})),
        ("list_buckets start_after", "start_after", lambda: next(st.list_buckets(L))),
        ("parameter_sets", "lookups[0][0]", lambda: st.parameter_sets(0, [[L]])),
        ("report_error", "message", lambda: st.report_error(L)),
        ("writer zero_lsn", "zero_lsn", lambda: st.writer(zero_lsn=L)),
    ]


def test_every_string_argument_refuses_lone_surrogates(tmp_path):
    """The calls above cover the fields of saves and reads; this table is every other string
    argument (Node's unicode.test.js has the same table): each raises InvalidArgumentError (a
    ValueError) naming the argument, before anything is done."""
    d = str(tmp_path)
    with bs.open(tmp_path / "t.bsdb", nosync=True) as db, \
            db.storage(db.create_stream("v1")) as st, st.writer() as w:
        for what, name, call in string_arguments(db, st, w, d):
            with pytest.raises(ValueError) as e:
                call()
            assert isinstance(e.value, bs.InvalidArgumentError), what
            assert f"{name}: not valid Unicode" in str(e.value), (what, str(e.value))
        # nothing was done: no file, no stream, no record, no error, no queued work
        assert sorted(os.listdir(d)) == ["t.bsdb", "t.bsdb-lock"]
        assert [s.name for s in db.streams()] == ["v1"]
        assert st.status().last_error == ""  # report_error stored nothing
        assert w.flush() == 0
        w.close()


def test_surrogates_do_not_merge_and_bytes_round_trip(st):
    # the bytes an encoder that lets surrogates through would write for 'a\ud800' and 'a\udc00'
    names = [b"a\xed\xa0\x80", b"a\xed\xb0\x80", b"a\x80", b"a\xef\xbf\xbd"]
    with st.writer() as w:
        for i, n in enumerate(names):
            w.save("t", "insert", b"r%d" % i, [(n, b"o\xff", b"r%d" % i, b"{}")])
        cp = commit_all(w)
    got = {b.name.encode("utf-8", "surrogateescape") for b in st.list_buckets()}
    assert got == set(names)  # four buckets, none merged
    for n in names:
        (op,) = read_all(st, cp, {n: 0})
        assert op.object_type.encode("utf-8", "surrogateescape") == b"o\xff"


def test_writer_block_with_queued_work_raises_and_discards(st):
    with pytest.raises(bs.StateError, match="queued since the last commit"):
        with st.writer() as w:
            w.save("t", "insert", "a", [row("b", "a")])
    assert w.closed
    with st.writer() as w:
        assert w.flush() == 0  # the save was discarded
    with pytest.raises(KeyError):  # an exception leaving the block: that one, work discarded
        with st.writer() as w:
            w.save("t", "insert", "a", [row("b", "a")])
            raise KeyError("mine")
    with st.writer() as w:  # committed, flushed or closed: no error
        w.save("t", "insert", "a", [row("b", "a")])
        cp = commit_all(w)
        w.save("t", "insert", "c", [row("b", "c")])
        assert w.flush() == cp + 1
        w.save("t", "insert", "d", [row("b", "d")])
        w.truncate("other")  # flushes the queue first
    with st.writer() as w:
        w.save("t", "insert", "e", [row("b", "e")])
        w.close()  # discarding on purpose
    assert [op.object_id for op in read_all(st, cp, {"b": 0})] == ["a"]


def test_custom_write_checkpoint_is_queued_work(st):
    st.set_write_checkpoint_mode("custom")
    with pytest.raises(bs.StateError):
        with st.writer() as w:
            w.custom_write_checkpoint("u1", 5)
    assert st.last_write_checkpoint("u1") is None


def test_parameter_rows_are_parsed_exactly(st):
    big = 12345678901234567890123456789
    with st.writer() as w:
        w.save("t", "insert", "r", [], [(["k"], ['{"n":%d,"f":1.5,"s":"\\u00fc"}' % big])])
        with pytest.raises(bs.InvalidArgumentError, match=r"params\[1\]: not JSON text"):
            w.save("t", "insert", "r2", [], [(["k"], ["{}", "{oops"])])
        cp = commit_all(w)
    assert st.parameter_sets(cp, [["k"]]) == [{"n": big, "f": 1.5, "s": "ü"}]
    assert type(st.parameter_sets(cp, [["k"]])[0]["n"]) is int


@pytest.fixture
def filled(tmp_path):
    db = bs.open(tmp_path / "src.bsdb", nosync=True)
    with db.storage(db.create_stream("v1")) as st, st.writer() as w:
        for v in range(3):
            for i in range(300):
                w.save("t", "update" if v else "insert", f"r{i}", [row("b", f"r{i}", str(v))])
            w.snapshot_done("0")
            w.commit(str(v))
    yield db
    db.close()


def long_calls(db, tmp_path):
    """Each long call with its progress callback: compaction, backup, load."""
    def compact(progress, cancel=None):
        with db.storage() as st:
            st.compact(min_bucket_changes=1, max_ops_per_txn=10, progress=progress, cancel=cancel)

    def backup(progress, cancel=None):
        db.backup(tmp_path / "copy.bsdb", progress=progress, cancel=cancel)

    def load(progress, cancel=None):
        bs.load(tmp_path / "loaded.bsdb", db.export(), progress=progress, cancel=cancel)

    return [compact, backup, load]


def test_every_long_call_cancels_the_same_way(filled, tmp_path):
    for call in long_calls(filled, tmp_path):
        with pytest.raises(bs.CanceledError) as e:  # a truthy return cancels
            call(lambda *_: True)
        assert e.value.code == bs.ECANCELED

        def boom(*_):
            raise KeyError(call.__name__)

        with pytest.raises(KeyError, match=call.__name__):  # an exception is re-raised
            call(boom)
        seen = []
        call(lambda *a: seen.append(a))  # a falsy return goes on
        assert seen, call.__name__
    assert filled.verify() == []


def cancellable(db, tmp_path):
    """Every call that takes cancel= (Node's calls that take a signal), as
    run(cancel, started) -> what it did: started() runs once the call is under way (from its
    progress callback, or as its iterator hands out the first chunk), None where the call has
    no step to stop at."""
    st = db.storage()
    copy, loaded = tmp_path / "copy.bsdb", tmp_path / "loaded.bsdb"

    def compacted():
        s = db.stat()
        return s.ops_move + s.ops_clear > 0

    def compact(cancel, started):
        st.compact(min_bucket_changes=1, max_ops_per_txn=10, cancel=cancel,  # once ops moved
                   progress=started and (lambda s: s.ops_moved and started()))
        return compacted()

    def backup(cancel, started):
        db.backup(copy, cancel=cancel, progress=started and (lambda _: started()))
        return copy.exists()

    def load(cancel, started):
        bs.load(loaded, db.export(), cancel=cancel, progress=started and (lambda _: started()))
        return loaded.exists()

    def bucket_data(cancel, started):
        got = []
        for chunk in st.bucket_data(st.checkpoint().op_id, {"b": 0}, limit=100, cancel=cancel):
            got.append(chunk)
            if started:
                started()
        return got

    def bucket_data_batch(cancel, started):
        return st.bucket_data_batch(st.checkpoint().op_id, {"b": 0}, cancel=cancel).chunks

    def bucket_data_raw(cancel, started):
        got = []
        for chunk in st.bucket_data_raw(st.checkpoint().op_id, {"b": 0}, limit=100,
                                        cancel=cancel):
            got.append(chunk)
            if started:
                started()
        return got

    def bucket_data_batch_raw(cancel, started):
        return st.bucket_data_batch_raw(st.checkpoint().op_id, {"b": 0}, cancel=cancel).chunks

    def wait_checkpoint(cancel, started):
        if started:  # from another thread: whether the wait began first or not
            threading.Thread(target=started).start()
        return st.wait_checkpoint(st.checkpoint(), 600_000 if started else 0, cancel=cancel)

    def compact_initial_replication(cancel, started):
        with db.storage(db.create_stream("initial", exist_ok=True)) as s2, s2.writer() as w:
            w.save("t", "insert", "a", [row("b", "a", "1")])
            w.save("t", "update", "a", [row("b", "a", "2")])
            w.flush()
            return s2.compact_initial_replication(cancel=cancel)

    def writer(cancel, started):
        with st.writer(cancel=cancel) as w:
            return w.flush() >= 0

    def terminate(cancel, started):
        with db.storage(db.create_stream("ends", exist_ok=True)) as s2:
            s2.terminate(cancel=cancel)
            return s2.status().state == bs.StreamState.TERMINATED

    calls = [compact, backup, load, bucket_data, bucket_data_batch, bucket_data_raw,
             bucket_data_batch_raw, wait_checkpoint, compact_initial_replication, writer,
             terminate]
    return st, {c.__name__: c for c in calls}, compacted


CANCELLABLE = ["compact", "backup", "load", "bucket_data", "bucket_data_batch",
               "bucket_data_raw", "bucket_data_batch_raw", "wait_checkpoint",
               "compact_initial_replication", "writer", "terminate"]
DURING = ["compact", "backup", "load", "bucket_data", "bucket_data_raw", "wait_checkpoint"]


@pytest.mark.parametrize("name", CANCELLABLE)
def test_cancel_before_the_call_raises_its_reason(filled, tmp_path, name):
    """As an AbortSignal aborted before a Node call: the token's reason, nothing done."""
    st, calls, compacted = cancellable(filled, tmp_path)
    why = KeyError("stop " + name)
    for token, want in ((bs.CancelToken(), why), (bs.CancelToken(), None), (threading.Event(),
                                                                             None)):
        if isinstance(token, bs.CancelToken):
            token.cancel(want)
            token.cancel(ValueError("later"))  # the first reason stays
            assert token.cancelled and token.is_set()
        else:
            token.set()
        with pytest.raises(BaseException) as e:
            calls[name](token, None)
        if want is not None:
            assert e.value is want
        else:  # no reason given: a CanceledError, as Node's AbortError
            assert isinstance(e.value, bs.CanceledError) and e.value.code == bs.ECANCELED
    assert not compacted() and sorted(os.listdir(tmp_path)) == ["src.bsdb", "src.bsdb-lock"]
    assert [s.name for s in filled.streams()] == ["v1"] or name in (
        "compact_initial_replication", "terminate")
    for s in filled.streams():
        assert s.state != bs.StreamState.TERMINATED
    # not cancelled: the call runs as without a token
    assert calls[name](bs.CancelToken(), None) not in (None, False, [])
    with pytest.raises(TypeError, match="cancel"):
        calls[name](object(), None)
    st.close()


@pytest.mark.parametrize("name", DURING)
def test_cancel_during_the_call_raises_its_reason(filled, tmp_path, name):
    """As an AbortSignal aborted while a Node call runs: it stops at its next step and raises
    the token's reason; the steps done stay, a backup or load leaves nothing."""
    st, calls, compacted = cancellable(filled, tmp_path)
    for reason in (RuntimeError("stop " + name), None):
        token = bs.CancelToken()
        with pytest.raises(BaseException) as e:
            calls[name](token, lambda: token.cancel(reason))
        if reason is not None:
            assert e.value is reason
        else:
            assert isinstance(e.value, bs.CanceledError) and e.value.code == bs.ECANCELED
        assert sorted(os.listdir(tmp_path)) == ["src.bsdb", "src.bsdb-lock"]
    if name == "compact":
        assert compacted()  # its first transaction stays
    assert filled.verify() == []
    st.close()


class CancelledOnceChecked:
    """A cancel= object (anything with is_set() and a reason) that is set from its second
    look on: a cancel that comes once the call has begun, for a call with no step to stop at."""

    def __init__(self, reason):
        self.reason, self.looks = reason, 0

    def is_set(self):
        self.looks += 1
        return self.looks > 1


def test_compact_initial_replication_cancelled_while_it_runs(db):
    """No step to stop at: a cancel during it raises the reason once it is done, the work
    staying (as Node's abort during compactInitialReplication)."""
    with db.storage(db.create_stream("initial")) as st, st.writer() as w:
        for v in range(3):
            w.save("t", "update" if v else "insert", "a", [row("b", "a", str(v))])
        w.flush()
        why = KeyError("stop")
        token = CancelledOnceChecked(why)
        with pytest.raises(KeyError) as e:
            st.compact_initial_replication(cancel=token)
        assert e.value is why and token.looks == 2
        assert st.compact_initial_replication() == 0  # its work was done
        cp = commit_all(w)
        assert [op.data for op in read_all(st, cp, {"b": 0})] == ["2"]


def test_stat_and_list_buckets_count_what_was_written(db):
    """As Node's behaviour.test.js "stat, verify, listBuckets ...": the figures, not only that
    the calls answer."""
    with db.storage(db.create_stream("s")) as st, st.writer() as w:
        for b in ("a", "b", "c"):
            w.save("t", "insert", b, [row(b, b)])
        w.save("t", "insert", "x", [(b"\xff", "todos", "x", "{}")])
        w.save("t", "update", "a", [row("a", "a", '{"v":2}')])
        cp = commit_all(w)
        s = db.stat()
        assert (s.streams, s.buckets, s.ops_put, s.source_records) == (1, 4, 5, 4), s
        listed = list(st.list_buckets(page=1))
        assert [b.name.encode("utf-8", "surrogateescape") for b in listed] == [
            b"a", b"b", b"c", b"\xff"]
        sums = st.checksums(cp, ["a", "b", "c"])
        for b in listed[:3]:
            assert (b.checksum, b.count) == tuple(sums[b.name]) and 0 < b.last_op <= cp
        assert listed[0].count == 2 and listed[0].last_op == cp
        assert db.verify() == []


def test_verify_reports_what_it_finds(tmp_path):
    """verify() is [] on a consistent file and names the problem on one whose op payload was
    changed on disk behind the library's back (LMDB has no page checksums: only verify sees it)."""
    p = tmp_path / "v.bsdb"
    with bs.open(p, nosync=True) as db, db.storage(db.create_stream("s")) as st, st.writer() as w:
        w.save("t", "insert", "r", [row("b", "r", '{"marker":"QQQQQQQQQQQQ"}')])
        commit_all(w)
        assert db.verify() == []
    data = p.read_bytes()
    assert data.count(b"QQQQQQQQQQQQ") == 1  # the op's payload, stored once
    p.write_bytes(data.replace(b"QQQQQQQQQQQQ", b"QQQQQQQQQQQR"))
    with bs.open(p) as db:
        (problem,) = db.verify()
        assert problem.startswith('bucket "b" op 1: PUT checksum') and "hashes to" in problem
