"""The sync service's storage-interface calls in the binding's idiom, on both backends:
request_hint, clear_checksum_cache, supports_incremental_parameter_compaction, datetimes where
the service has Dates, terminate(clear_storage=), writer(zero_lsn=, store_current_data=), the
compaction options (those the engine has no use for accepted and checked),
compact_initial_replication, managed and custom write checkpoints with their request fields,
set_write_checkpoint_mode(event_name=), status(); edge values (empty, one byte, non-ASCII, a
datetime with and without tzinfo, 1 vs 1.0)."""

from datetime import date, datetime, timedelta, timezone

import pytest

import bucketstore as bs
from conftest import commit_all, read_all, row

UTC = timezone.utc


def put(w, bucket, rid, params):
    w.save("t", "update", rid, [row(bucket, rid, "{}")],
           [([params], ['{"p":"%s"}' % params])])


@pytest.fixture
def filled(st):
    """Three versions of rows x and y (buckets bx, by; lookups k0, k1, k2), committed."""
    with st.writer() as w:
        for v in range(3):
            for rid in ("x", "y"):
                put(w, "b" + rid, rid, f"k{v}")
        cp = commit_all(w)
    return st, cp


@pytest.mark.parametrize("hint", [None, "bulk", "incremental"])
def test_request_hint_changes_nothing(filled, hint):
    st, cp = filled
    sums = st.checksums(cp, ["bx", "by"])
    assert st.checksums(cp, ["bx", "by"], request_hint=hint) == sums
    ops = read_all(st, cp, {"bx": 0, "by": 0})
    assert read_all(st, cp, {"bx": 0, "by": 0}, request_hint=hint) == ops
    assert st.bucket_data_batch(cp, {"bx": 0}, request_hint=hint).chunks[0].ops == ops[:3]


@pytest.mark.parametrize("hint,err", [
    ("", bs.InvalidArgumentError), ("b", bs.InvalidArgumentError),
    ("Bulk", bs.InvalidArgumentError), ("bülk", bs.InvalidArgumentError),
    (1, TypeError), (b"bulk", TypeError)])
def test_request_hint_other_values_refused(filled, hint, err):
    st, cp = filled
    for call in (lambda: st.checksums(cp, ["bx"], request_hint=hint),
                 lambda: st.bucket_data_batch(cp, {"bx": 0}, request_hint=hint),
                 lambda: next(st.bucket_data(cp, {"bx": 0}, request_hint=hint))):
        with pytest.raises(err, match="request_hint"):
            call()


def test_clear_checksum_cache_and_incremental_parameter_compaction(filled):
    st, cp = filled
    sums = st.checksums(cp, ["bx", "by"])
    assert st.clear_checksum_cache() is None
    assert st.checksums(cp, ["bx", "by"]) == sums
    assert st.supports_incremental_parameter_compaction() is True
    stats = st.compact(incremental_only=True, compact_parameter_data=True, min_age_ms=0,
                       move_batch_byte_limit=1 << 20, move_batch_limit=2000,
                       clear_batch_limit=5000)
    assert stats.parameter_entries_removed > 0, stats
    assert len(st.parameter_sets(cp, [["k2"]])) == 2
    assert st.parameter_sets(cp, [["k0"]]) == []
    after = st.checksums(cp, ["bx", "by"])  # the ops folded: the counts may shrink
    assert {b: c.checksum for b, c in after.items()} == {b: c.checksum for b, c in sums.items()}
    st.close()
    with pytest.raises(bs.StateError):
        st.clear_checksum_cache()


@pytest.mark.parametrize("name", ["move_batch_byte_limit", "move_batch_limit",
                                  "clear_batch_limit"])
def test_unused_compaction_options_are_checked(st, name):
    for v in (0, 1, 2**63):
        st.compact(**{name: v})
    with pytest.raises(TypeError, match=name):
        st.compact(**{name: 1.0})
    with pytest.raises(TypeError, match=name):
        st.compact(**{name: "1"})
    with pytest.raises(bs.InvalidArgumentError, match=name):
        st.compact(**{name: -1})


@pytest.mark.parametrize("name", ["min_bucket_changes", "memory_limit_mb", "max_ops_per_txn",
                                  "op_budget", "min_age_ms", "min_change_ratio"])
def test_explicit_compaction_options(st, name):
    """Where the library reads 0 (or a negative value) as its default, an explicit such value is
    refused (None is the default), as in Node."""
    bad = -1 if name in ("min_age_ms", "min_change_ratio") else 0
    with pytest.raises(bs.InvalidArgumentError, match=name):
        st.compact(**{name: bad})
    st.compact(**{name: bad + 2})
    if name == "min_bucket_changes":
        with pytest.raises(bs.InvalidArgumentError, match=name):
            st.compact_initial_replication(min_bucket_changes=0)


@pytest.mark.parametrize("ratio", [1, 1.0])
def test_compaction_thresholds_take_1_and_1_0(st, ratio):
    with st.writer() as w:
        for v in range(3):
            w.save("t", "insert" if v == 0 else "update", "r", [row("b", "r", '{"v":%d}' % v)])
        cp = commit_all(w)
    before = st.checksums(cp, ["b"])["b"].checksum
    with pytest.raises(TypeError, match="min_bucket_changes"):
        st.compact(min_bucket_changes=1.0)
    # every op of the bucket changed: a ratio of 1 (or 1.0) selects it
    assert st.compact(min_bucket_changes=1, min_change_ratio=ratio).buckets_compacted == 1
    assert st.checksums(cp, ["b"])["b"].checksum == before


def test_compact_initial_replication_returns_the_buckets(st):
    with st.writer() as w:
        for v in range(3):
            for b in ("b1", "b2", "b3"):
                w.save("t", "insert" if v == 0 else "update", b, [row(b, b, '{"v":%d}' % v)])
        w.save("t", "insert", "one", [row("b4", "one")])
        w.flush()
        with pytest.raises(TypeError):
            st.compact_initial_replication(0)  # type: ignore[misc]  # keyword-only
        assert st.compact_initial_replication(min_bucket_changes=2) == 3  # b4 has one op
        cp = commit_all(w)
    assert [o.op_id for o in read_all(st, cp, {"b1": 0})] == [7]
    with pytest.raises(bs.StateError):  # after the first checkpoint
        st.compact_initial_replication()


def test_compact_initial_replication_up_to_max_op_id(st):
    with st.writer() as w:
        for b in ("b1", "b2"):  # ops 1..3 in b1, 4..6 in b2
            for v in range(3):
                w.save("t", "insert" if v == 0 else "update", b, [row(b, b, '{"v":%d}' % v)])
        w.flush()
        st.compact_initial_replication(max_op_id=3)  # (its count: every bucket it examined)
        cp = commit_all(w)
    assert [o.op_id for o in read_all(st, cp, {"b1": 0})] == [3]
    assert [o.op_id for o in read_all(st, cp, {"b2": 0})] == [4, 5, 6]


def test_status_has_resume_lsn_and_snapshot_done(st):
    s = st.status()
    assert (s.resume_lsn, s.snapshot_done) == (None, False)
    with st.writer() as w:
        w.resume_lsn("")
        w.save("t", "insert", "r", [row("b", "r")])
        w.flush()
        assert st.status().resume_lsn == "" and not st.status().snapshot_done
        w.resume_lsn("0/ü")
        commit_all(w, "0/1")
    s = st.status()
    assert (s.resume_lsn, s.snapshot_done, s.lsn) == ("0/ü", True, "0/1")


@pytest.mark.parametrize("zero_lsn", [None, "", "0", "0/0", "ü", b"\xff"])
@pytest.mark.parametrize("store_current_data", [None, True, False])
def test_writer_service_options_accepted(st, zero_lsn, store_current_data):
    with st.writer(zero_lsn=zero_lsn, store_current_data=store_current_data) as w:
        w.save("t", "insert", "r", [row("b", "r")], store="kept")
        assert w.source_row("t", "r") == "kept"  # stored as store= says, whatever the option
        commit_all(w)


def test_writer_service_options_checked(st):
    with pytest.raises(TypeError, match="zero_lsn"):
        st.writer(zero_lsn=0)  # type: ignore[arg-type]
    with pytest.raises(bs.InvalidArgumentError, match="zero_lsn"):
        st.writer(zero_lsn="a\ud800")
    with pytest.raises(TypeError, match="store_current_data"):
        st.writer(store_current_data="yes")  # type: ignore[arg-type]
    with st.writer():  # no writer was left open by the refusals
        pass


@pytest.mark.parametrize("clear_storage", [False, True])
def test_terminate_clear_storage(st, clear_storage):
    with st.writer() as w:
        w.save("t", "insert", "r", [row("b", "r")])
        cp = commit_all(w)
    with pytest.raises(TypeError):
        st.terminate(True)  # type: ignore[misc]  # keyword-only, as the service's option
    st.terminate(clear_storage=clear_storage)
    assert st.status().state == bs.StreamState.TERMINATED
    assert st.checkpoint().op_id == (0 if clear_storage else cp)
    with pytest.raises(bs.StateError):
        st.writer()


LOCAL = datetime(2026, 9, 1, 12, 0, 0, 999)  # no tzinfo: local time, as timestamp() reads it


@pytest.mark.parametrize("when", [
    1_000,
    datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC),
    datetime(1970, 1, 1, 2, 0, 1, tzinfo=timezone(timedelta(hours=2))),
    datetime(1970, 1, 1, 0, 0, 1, 999, tzinfo=UTC),  # sub-milliseconds dropped
])
def test_times_as_datetime_or_ms(st, when):
    """A request made at 1 s (or 1000 ms) is deleted by a cleanup before 1.001 s, not by one
    before 1 s, whichever way either time is written."""
    st.set_write_checkpoint_mode("custom")
    with st.writer() as w:
        w.custom_write_checkpoint("u", 5, checkpoint_requested_at=when)
        w.flush()
    assert st.delete_checkpoint_requests_before(datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)) == 0
    assert st.delete_checkpoint_requests_before(1_000) == 0
    assert st.last_write_checkpoint("u") == 5
    assert st.delete_checkpoint_requests_before(
        datetime(1970, 1, 1, 0, 0, 1, 1000, tzinfo=UTC)) == 1
    assert st.last_write_checkpoint("u") is None


def test_naive_datetime_is_local_time(st):
    ms = int(LOCAL.timestamp() * 1000)
    st.set_write_checkpoint_mode("custom")
    with st.writer() as w:
        w.custom_write_checkpoint("naive", 1, checkpoint_requested_at=LOCAL)
        w.custom_write_checkpoint("aware", 2, checkpoint_requested_at=LOCAL.astimezone())
        w.flush()
    assert st.delete_checkpoint_requests_before(ms) == 0
    assert st.delete_checkpoint_requests_before(LOCAL.astimezone(UTC)) == 0
    assert st.delete_checkpoint_requests_before(ms + 1) == 2


@pytest.mark.parametrize("bad,err", [
    (1.0, TypeError), (1000.5, TypeError), (True, TypeError), ("1000", TypeError),
    (date(1970, 1, 2), TypeError), (-1, bs.InvalidArgumentError),
    (datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC), bs.InvalidArgumentError),
])
def test_times_refused(st, bad, err):
    st.set_write_checkpoint_mode("custom")
    with st.writer() as w, pytest.raises(err, match="checkpoint_requested_at"):
        w.custom_write_checkpoint("u", 1, checkpoint_requested_at=bad)
    if err is TypeError:
        with pytest.raises(TypeError, match="before"):
            st.delete_checkpoint_requests_before(bad)
        with pytest.raises(TypeError, match="delete_checkpoint_requests_before"):
            st.compact(delete_checkpoint_requests_before=bad)


def test_managed_requests_and_cleanup_with_compaction(st):
    t0 = datetime(2026, 9, 1, tzinfo=UTC)
    ids, adv = st.create_managed_write_checkpoints([
        bs.ManagedRequest("", {"1": "0/10"}, checkpoint_request_id=7,
                          checkpoint_requested_at=t0),
        bs.ManagedRequest("ü", {"1": "0/10"}, checkpoint_request_id=1,
                          checkpoint_requested_at=t0 + timedelta(hours=1)),
        bs.ManagedRequest("x", {"1": "0/10"}),  # a generated id: no request time, kept
    ])
    assert ids == {"": 7, "ü": 1, "x": 1} and adv  # ids count per user
    with st.writer() as w:  # processed: a commit at or past the heads
        w.save("t", "insert", "r", [row("b", "r")])
        commit_all(w, "0/10")
    assert st.last_write_checkpoint("", {"1": "0/10"}) == 7
    stats = st.compact(delete_checkpoint_requests_before=t0 + timedelta(minutes=1))
    assert stats.checkpoint_requests_deleted == 1
    assert st.last_write_checkpoint("", {"1": "0/10"}) is None
    assert st.last_write_checkpoint("ü", {"1": "0/10"}) == 1
    assert st.delete_checkpoint_requests_before(datetime.now(UTC) + timedelta(hours=1)) == 1
    assert st.last_write_checkpoint("ü", {"1": "0/10"}) is None
    assert st.last_write_checkpoint("x", {"1": "0/10"}) == 1
    with pytest.raises(bs.InvalidArgumentError, match="checkpoint_requested_at"):
        st.create_managed_write_checkpoints([bs.ManagedRequest(
            "u", {}, checkpoint_requested_at=datetime(1970, 1, 1, tzinfo=UTC))])  # 0: "now"
    with pytest.raises(TypeError, match="checkpoint_request_id"):
        st.create_managed_write_checkpoints([bs.ManagedRequest(
            "u", {}, checkpoint_request_id=1.0)])  # type: ignore[arg-type]


@pytest.mark.parametrize("event", ["e", "ü", "", b"\x00"])
def test_custom_mode_event_name(st, event):
    st.set_write_checkpoint_mode("custom", event_name=event)
    with st.writer() as w:
        w.custom_write_checkpoint("u", 3, event_id=event)
        w.custom_write_checkpoint("u", 4, event_id="other")
        w.custom_write_checkpoint("v", 5)  # no event
        w.flush()
    none = event == ""  # an empty event name is no event, as in the C API
    assert st.last_write_checkpoint("u") == 3
    assert st.last_write_checkpoint("v") == (5 if none else None)
    st.set_write_checkpoint_mode("custom", event_name="other")
    assert st.last_write_checkpoint("u") == 4
    st.set_write_checkpoint_mode("custom")
    assert st.last_write_checkpoint("v") == 5
    assert st.last_write_checkpoint("u") == (3 if none else None)
    with pytest.raises(TypeError, match="event_name"):
        st.set_write_checkpoint_mode("custom", event_name=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("options,selected", [
    (dict(min_bucket_changes=2), 1), (dict(min_bucket_changes=3), 0),
    (dict(min_bucket_changes=1, min_change_ratio=0.15), 1),
    (dict(min_bucket_changes=1, min_change_ratio=0.2), 0),
    (dict(min_bucket_changes=1, incremental_only=True, min_age_ms=0), 1),
    (dict(min_bucket_changes=1, incremental_only=True, min_age_ms=3_600_000), 0),
    (dict(min_bucket_changes=1, incremental_only=False, min_age_ms=3_600_000), 1),
])
def test_compaction_thresholds_select_as_the_library_does(st, options, selected):
    """compact()'s thresholds reach the library, each as itself (one passed in another's place,
    or dropped, selects other buckets): a bucket of 12 ops, 2 of them changes since its last
    compaction (a ratio of 1/6). Node's service.test.js has the same table."""
    with st.writer() as w:
        for i in range(10):
            w.save("t", "insert", f"r{i}", [row("b", f"r{i}")])
        commit_all(w)
        st.compact(min_bucket_changes=1)  # the changes since this one count
        for v in (1, 2):
            w.save("t", "update", "r0", [row("b", "r0", '{"v":%d}' % v)])
        w.commit("2")
    assert st.compact(**options).buckets_compacted == selected
