"""The binding's API on both backends: writing, every read, write checkpoints, compaction,
lifecycle, edge values (empty strings, one byte, maximum lengths, non-ASCII, 1 vs 1.0)."""

import threading

import pytest

import bucketstore as bs
from conftest import commit_all, read_all, row


def test_golden_sha256_checksums(db):
    # contract.md section 3: the reference service's PUT checksums
    assert bs.checksum_put("test", "t1", '{"id":"t1"}', hash="sha256") == 2634521662
    assert bs.checksum_put("test", "t2", '{"id":"t2"}', hash="sha256") == 4243212114
    with db.storage(db.create_stream("v1", hash="sha256")) as st, st.writer() as w:
        w.save("todos", "insert", "t1", [row("b", "t1", otype="test")])
        w.save("todos", bs.Tag.INSERT, "t2", [row("b", "t2", otype="test")])
        cp = commit_all(w)
        assert cp == 2
        # bucket checksum: the wrapping sum, signed 32-bit as the protocol carries it (op
        # checksums stay unsigned)
        assert (2634521662 + 4243212114) % 2**32 == 2582766480 == -1712200816 + 2**32
        assert st.checksums(cp, ["b"])["b"] == bs.Checksum(-1712200816, 2)
        assert next(st.list_buckets()).checksum == -1712200816
        ops = read_all(st, cp, {"b": 0})
        assert [(o.op_id, o.op, o.checksum) for o in ops] == [
            (1, bs.OpType.PUT, 2634521662), (2, bs.OpType.PUT, 4243212114)]
        assert ops[0].subkey == bs.subkey(1, "t1") == "00000001/a94d750d3a17fbe5c03234fac12ac33c"


EDGE = ["", "x", "ü", "日本語 🙂", "a" * 1000, "\u0000nul"]


@pytest.mark.parametrize("value", EDGE)
def test_edge_values_round_trip(st, value):
    with st.writer() as w:
        w.save("t", "insert", "r1", [("b", value, value, value)], store=value)
        assert w.source_row("t", "r1") == value
        cp = commit_all(w)
    (op,) = read_all(st, cp, {"b": 0})
    assert (op.object_type, op.object_id, op.data) == (value, value, value)
    assert op.checksum == bs.checksum_put(value, value, value)


def test_empty_string_is_not_absent(st):
    with st.writer() as w:
        w.save("t", "insert", "r1", [("b", "", "", "")], store="")
        assert w.source_row("t", "r1") == ""
        w.save("t", "insert", "r2", [("b", "o", "i2", "{}")])
        assert w.source_row("t", "r2") is None  # no data stored: None, not ""
        w.save("t", "delete", "r2")
        cp = commit_all(w)
    put, _, rem = read_all(st, cp, {"b": 0})
    assert (put.object_type, put.object_id, put.data) == ("", "", "")
    assert put.checksum == bs.checksum_put("", "", "")
    assert rem.op == bs.OpType.REMOVE and rem.data is None and rem.target_op is None
    assert rem.checksum == bs.checksum_remove(rem.subkey)


def test_non_utf8_bytes_round_trip(st):
    raw = b"\xff\xfe-\x80"
    with st.writer() as w:
        w.save(b"t", "insert", raw, [(raw, b"o", raw, b"{}")])
        cp = commit_all(w)
    chunks = list(st.bucket_data(cp, {raw: 0}))
    assert chunks[0].bucket.encode("utf-8", "surrogateescape") == raw
    assert chunks[0].ops[0].object_id.encode("utf-8", "surrogateescape") == raw
    assert st.checksums(cp, [raw])[raw.decode("utf-8", "surrogateescape")].count == 1


def test_limits_at_and_over_the_maximum(st):
    with st.writer() as w:
        w.save("t", "insert", "r" * 256, [("b" * 480, "o", "i", "{}")])
        with pytest.raises(bs.TooBigError) as e:
            w.save("t", "insert", "r2", [("b" * 481, "o", "i", "{}")])
        assert e.value.code == bs.ETOOBIG and "481" in e.value.message
        with pytest.raises(bs.TooBigError):
            w.save("t", "insert", "r" * 257, [])
        cp = commit_all(w)  # the failed saves left nothing queued
    assert st.checksums(cp, ["b" * 480])["b" * 480].count == 1
    assert st.status().last_persisted_op == 1


def test_chunking_invariance(st):
    with st.writer() as w:
        for i in range(30):
            w.save("t", "insert", f"r{i}", [row(f"b{i % 3}", f"r{i}", "x" * (i * 7))])
        cp = commit_all(w)
    want = read_all(st, cp, {"b0": 0, "b1": 0, "b2": 0}, limit=100000)
    assert len(want) == 30
    for limit in (1, 2, 7):
        for chunk_bytes in (None, 1, 64):
            got = read_all(st, cp, {"b0": 0, "b1": 0, "b2": 0}, limit=limit,
                           chunk_bytes=chunk_bytes)
            assert got == want, (limit, chunk_bytes)
    # chunk_bytes cuts chunks (the service's chunkLimitBytes, not only accepted): at 1 byte
    # every chunk is one op; without it, one chunk per bucket
    every = {"b0": 0, "b1": 0, "b2": 0}
    assert [len(c.ops) for c in st.bucket_data(cp, every, chunk_bytes=1)] == [1] * 30
    assert [len(c.ops) for c in st.bucket_data(cp, every)] == [10, 10, 10]
    # one batch: has_more when cut by the limit
    b = st.bucket_data_batch(cp, {"b0": 0}, limit=3)
    assert b.has_more and sum(len(c.ops) for c in b.chunks) == 3
    assert b.chunks[0].after == 0 and b.chunks[-1].next_after == b.chunks[-1].ops[-1].op_id
    # from a middle position: exactly the ops above it
    mid = want[10].op_id
    assert [o for o in read_all(st, cp, {"b1": mid})] == [
        o for o in want if o.op_id > mid and o.object_id in {f"r{i}" for i in range(1, 30, 3)}]


def test_commit_blocked_below_snapshot_lsn(st):
    with st.writer(create_empty=False) as w:
        w.save("t", "insert", "r1", [row("b", "r1")])
        assert w.commit("00000003") == bs.CommitResult(True, False, 0,
                                                      bs.BlockedReason.SNAPSHOT)
        w.snapshot_done("00000005")
        r = w.commit("00000004")
        assert r == bs.CommitResult(True, False, 0, bs.BlockedReason.NO_CHECKPOINT_BEFORE)
        assert w.flush() == 1
        r = w.commit("00000005")
        assert r.checkpoint_created and r.checkpoint == 1 and r.blocked_reason is None
        assert w.commit("00000006") == bs.CommitResult(False, False, 1)  # nothing new
        assert w.keepalive("00000007").checkpoint_created
        # LSNs compare byte-wise: "0000001" sorts above "00000007", "00000006" below
        assert w.commit("00000006").blocked_reason == bs.BlockedReason.CHECKPOINT_LSN
        assert w.commit("0000001").checkpoint_blocked is False
    assert st.checkpoint() == bs.Checkpoint(1, "00000007")
    assert bs.library_version() == bs.__version__


def test_update_and_key_change(st):
    with st.writer() as w:
        w.save("t", "insert", "a", [row("b1", "a"), row("b2", "a")])
        w.save("t", "update", "a", [row("b1", "a", '{"v":2}')])  # left b2
        w.save("t", "update", "c", [row("b1", "c")], old_id="a")  # key a -> c
        cp = commit_all(w)
    b1 = read_all(st, cp, {"b1": 0})
    b2 = read_all(st, cp, {"b2": 0})
    assert [o.op for o in b2] == [bs.OpType.PUT, bs.OpType.REMOVE]
    assert [(o.op, o.object_id) for o in b1] == [
        (bs.OpType.PUT, "a"), (bs.OpType.PUT, "a"), (bs.OpType.REMOVE, "a"), (bs.OpType.PUT, "c")]


def test_truncate_and_drop(st):
    with st.writer() as w:
        w.save("t", "insert", "a", [row("b", "a")])
        w.save("u", "insert", "a", [row("b", "a")])
        cp = commit_all(w)
        w.truncate("t")
        w.drop("u")
        cp = w.commit("2").checkpoint
    assert [o.op for o in read_all(st, cp, {"b": 0})][-2:] == [bs.OpType.REMOVE] * 2
    assert st.checksums(cp, ["b"])["b"].count == 4


def test_parameter_sets_canonical_numbers(st):
    with st.writer() as w:
        w.save("t", "insert", "r1", [], [([314, "u1"], ['{"list":"a"}']),
                                         ([3.14], ['{"list":"pi"}']), ([True], ['{"b":1}'])])
        w.save("t", "insert", "r2", [], [([314.0, "u1"], ['{"list":"b"}', '{"list":"c"}'])])
        cp = commit_all(w)
    assert sorted(p["list"] for p in st.parameter_sets(cp, [[314, "u1"]])) == ["a", "b", "c"]
    assert st.parameter_sets(cp, [[314.0, "u1"]]) == st.parameter_sets(cp, [[314, "u1"]])
    assert st.parameter_sets(cp, [[3]]) == [] and st.parameter_sets(cp, [[3.14]]) == [
        {"list": "pi"}]
    assert st.parameter_sets(cp, [[1]]) == []  # True is not 1
    with pytest.raises(bs.LimitError) as e:
        st.parameter_sets(cp, [[314, "u1"]], limit=2)
    assert "limit was 2" in e.value.message
    with pytest.raises(bs.LimitError):  # 0 is a limit (no row), not the default
        st.parameter_sets(cp, [[314, "u1"]], limit=0)
    assert st.parameter_sets(cp, [[3]], limit=0) == []
    assert bs.decode_lookup(bs.encode_lookup([None, True, -5, 2.5, "ü", 7.0])) == [
        None, True, -5, 2.5, "ü", 7]
    assert bs.encode_lookup([2**63 - 1]) != bs.encode_lookup([-(2**63)])
    ch = st.checkpoint_changes(0, cp)
    assert [314, "u1"] in ch.updated_lookups and [3.14] in ch.updated_lookups
    # a lookup key over the limit is refused by save, before anything is queued
    with st.writer() as w, pytest.raises(bs.TooBigError):
        w.save("t", "insert", "r3", [], [(["x" * 600], ["{}"])])


def test_checkpoint_changes_and_list_buckets(st):
    with st.writer() as w:
        for i in range(5):
            w.save("t", "insert", f"r{i}", [row(f"b{i}", f"r{i}")])
        cp1 = commit_all(w)
        w.save("t", "update", "r3", [row("b3", "r3", "{}")])
        cp2 = w.commit("2").checkpoint
    ch = st.checkpoint_changes(cp1, cp2)
    assert "b3" in ch.updated_buckets and not ch.invalidate_data_buckets
    assert "b0" not in ch.updated_buckets  # extra entries are allowed; here there are none
    names = [b.name for b in st.list_buckets(page=2)]
    assert names == ["b0", "b1", "b2", "b3", "b4"]
    assert [b.name for b in st.list_buckets(start_after="b2")] == ["b3", "b4"]
    b3 = [b for b in st.list_buckets() if b.name == "b3"][0]
    assert (b3.count, b3.last_op) == (2, cp2)
    assert st.checksums(cp2, ["b3"])["b3"] == bs.Checksum(b3.checksum, b3.count)


def test_write_checkpoints(st):
    ids, adv = st.create_managed_write_checkpoints([
        bs.ManagedRequest("u1", {"1": "00000010"}),
        bs.ManagedRequest("u2/c", {"1": "00000020"}, checkpoint_request_id=41)])
    assert ids == {"u1": 1, "u2/c": 41} and adv
    assert st.last_write_checkpoint("u1", {"1": "00000009"}) is None
    assert st.last_write_checkpoint("u1", {"1": "00000010"}) == 1
    assert st.last_write_checkpoint("nobody", {"1": "00000010"}) is None
    ids, _ = st.create_managed_write_checkpoints([bs.ManagedRequest("u1", {"1": "00000011"})])
    assert ids == {"u1": 2}
    st.set_write_checkpoint_mode("custom")
    with pytest.raises(bs.StateError):
        st.create_managed_write_checkpoints([bs.ManagedRequest("u1", {})])
    with st.writer() as w:
        w.custom_write_checkpoint("u9", 2**63 - 1)
        w.custom_write_checkpoint("u8", 5, checkpoint_requested_at=1000)
        w.custom_write_checkpoint("u7", 6, event_id="ev", checkpoint_requested_at=3000)
        w.flush()
    assert st.last_write_checkpoint("u9") == 2**63 - 1
    assert st.delete_checkpoint_requests_before(2000) == 1  # u8 only: u9 is persistent
    assert st.last_write_checkpoint("u8") is None and st.last_write_checkpoint("u9") == 2**63 - 1


def test_compaction_keeps_checksums(st):
    with st.writer() as w:
        for v in range(4):
            for i in range(10):
                w.save("t", "insert" if v == 0 else "update", f"r{i}",
                       [row("b", f"r{i}", '{"v":%d}' % v)])
        w.save("t", "delete", "r0")
        cp = commit_all(w)
    before = st.checksums(cp, ["b"])["b"]
    seen = []
    stats = st.compact(min_bucket_changes=1, progress=seen.append)
    assert stats.buckets_compacted == 1 and stats.ops_moved + stats.ops_cleared >= 30
    assert seen and isinstance(seen[-1], bs.CompactStats)
    after = st.checksums(cp, ["b"])["b"]
    assert after.checksum == before.checksum and after.count < before.count
    ops = read_all(st, cp, {"b": 0})
    assert ops[0].op in (bs.OpType.MOVE, bs.OpType.CLEAR) and ops[0].target_op
    assert st.db.verify() == []


def test_compact_initial_replication(st):
    with st.writer() as w:
        w.save("t", "insert", "a", [row("b", "a")])
        w.save("t", "update", "a", [row("b", "a", "{}")])
        w.flush()
        assert st.compact_initial_replication() == 1
        cp = commit_all(w)
        with pytest.raises(bs.StateError):
            st.compact_initial_replication()
    assert [o.op_id for o in read_all(st, cp, {"b": 0})] == [2]


def test_wait_checkpoint_and_listener(db):
    sid = db.create_stream("v1")
    seen = []
    db.set_checkpoint_listener(lambda s, c: seen.append((s, c)))
    with db.storage(sid) as st, st.writer() as w:
        known = st.checkpoint()
        got = []
        t = threading.Thread(target=lambda: got.append(st.wait_checkpoint(known, 60000)))
        t.start()  # whether it waits before or after the commit, it returns the new one
        w.save("t", "insert", "a", [row("b", "a")])
        cp = commit_all(w, "00000001")
        t.join()
        assert got == [bs.Checkpoint(cp, "00000001")] and seen == [(sid, cp)]
        assert st.wait_checkpoint(got[0], 0) == got[0]  # timeout: the current one
        db.set_checkpoint_listener(None)
        w.keepalive("00000002")
        assert len(seen) == 1


def test_lifecycle(db, backend, tmp_path):
    s1 = db.create_stream("one")
    with db.storage(s1) as st, st.writer() as w:
        w.save("t", "insert", "a", [row("b", "a")])
        commit_all(w)
    s2 = db.create_stream("two")
    assert [(s.id, s.state) for s in db.streams()] == [
        (s1, bs.StreamState.ACTIVE), (s2, bs.StreamState.PROCESSING)]
    with db.storage() as st:  # 0: the active stream
        assert st.stream_id == s1
        st.report_error("replication failed: ü")
        s = st.status()
        assert s.state == bs.StreamState.ERRORED and s.last_error == "replication failed: ü"
        assert s.snapshot_done and s.checkpoint == 1 and s.lsn == "1"
        st.clear()
        assert st.checkpoint() == bs.Checkpoint(0, None)
        st.terminate()
        with pytest.raises(bs.StateError):
            st.writer()
    assert db.stat().streams == 2
    with pytest.raises(bs.NotFoundError) as e:
        db.storage(99)
    assert e.value.code == bs.ENOTFOUND and str(e.value).startswith("BS_ENOTFOUND: ")


def test_reopen_persists(tmp_path):
    p = tmp_path / "x.bsdb"
    with bs.open(p) as db, db.storage(db.create_stream("v1")) as st, st.writer() as w:
        w.save("t", "insert", "a", [row("b", "a")])
        cp = commit_all(w)
        w.save("t", "insert", "z", [row("b", "z")])
        w.close()  # unflushed: discarded
    with bs.open(p, readonly=True) as db, db.storage() as st:
        assert st.checkpoint().op_id == cp and st.checksums(cp + 5, ["b"])["b"].count == 1
        with pytest.raises(bs.StateError):
            st.writer()
    with pytest.raises(bs.CorruptError):
        (tmp_path / "junk").write_bytes(b"not a database" * 1000)
        bs.open(tmp_path / "junk")


def test_torn_and_stale_reads_raise_their_codes(st):
    with st.writer() as w:
        w.save("t", "insert", "a", [row("b", "a")], [(["k"], ['{"p":1}'])])  # ops 1, 2
        w.save("t", "insert", "c", [row("b", "c")])  # op 3
        cp = commit_all(w)
        w.save("t", "update", "a", [row("b", "a", "{}")], [(["k"], ['{"p":2}'])])  # ops 4, 5
        w.save("t", "delete", "c")  # op 6
        cp2 = w.commit("2").checkpoint
    assert (cp, cp2) == (3, 6)
    st.compact(min_bucket_changes=1, compact_parameter_data=True)
    # the leading run (ops 1 and 3, now MOVEs) folded into a CLEAR with id 3: a read at 1 or
    # 2 is torn (contract.md 5.5)
    with pytest.raises(bs.InvalidatedError) as e:
        st.checksums(1, ["b"])
    assert e.value.code == bs.EINVALIDATED and "compacted" in e.value.message
    with pytest.raises(bs.InvalidatedError):
        list(st.bucket_data(2, {"b": 0}))
    assert st.checksums(cp, ["b"])["b"].count >= 1  # at the CLEAR's id and above: fine
    with pytest.raises(bs.StaleError) as e:  # below the parameter-compaction horizon
        st.parameter_sets(2, [["k"]])
    assert e.value.code == bs.ESTALE
    assert st.parameter_sets(cp2, [["k"]]) == [{"p": 2}]


def test_save_many_is_save_in_one_call(st):
    with st.writer() as w:
        w.save_many([
            ("t", "insert", "r1", [row("b", "r1")]),
            bs.Save("t", bs.Tag.INSERT, b"r2", (r for r in [("b", "o", bytearray(b"r2"), "{}")]),
                    lookups=[(["k"], ['{"p":1}'])], store=memoryview(b"s2")),
            ("t", "update", "r3", [row("b", "r3")], (), "r1"),  # r1's key changed to r3
            ("t", "delete", "r2"),
        ])
        assert w.source_row("t", "r3") is None
        cp = commit_all(w)
    ops = read_all(st, cp, {"b": 0})
    assert [(o.op.name, o.object_id) for o in ops] == [
        ("PUT", "r1"), ("PUT", "r2"), ("REMOVE", "r1"), ("PUT", "r3"), ("REMOVE", "r2")]
    assert st.parameter_sets(cp, [["k"]]) == []  # r2 was deleted with its lookup


def test_save_many_checks_every_save_before_queueing(st):
    with st.writer() as w:
        with pytest.raises(TypeError, match=r"rows\[0\].data: expected str or bytes, got int"):
            w.save_many([("t", "insert", "r1", [row("b", "r1")]),
                         ("t", "insert", "r2", [("b", "o", "r2", 5)])])
        with pytest.raises(bs.InvalidArgumentError, match=r"saves\[1\].tag"):
            w.save_many([("t", "insert", "r1"), ("t", "upsert", "r2")])
        assert w.flush() == 0  # nothing was queued
        # the library's rules refuse the third: none is queued, the error names it with the
        # library's message (as Node's saveMany)
        with pytest.raises(bs.InvalidArgumentError, match=r"saves\[2\]: rows\[0\].bucket"):
            w.save_many([("t", "insert", "r1", [row("b", "r1")]),
                         ("t", "insert", "r2", [row("b", "r2")]),
                         ("t", "insert", "r3", [row("", "r3")])])
        with pytest.raises(bs.TooBigError, match=r"saves\[1\]: rows\[0\].bucket is 481 bytes"):
            w.save_many([("t", "insert", "r1", [row("b", "r1")]),
                         ("t", "insert", "r2", [row("b" * 481, "r2")])])
        assert w.flush() == 0
        w.save_many([("t", "insert", "r1", [row("b", "r1")])])
        assert w.flush() == 1


def test_all_names_every_public_name():
    """`from bucketstore import *` and type checkers see what the package imports: __all__ is a
    second list of the names, so this keeps the two equal (Save and EUSER were once missing from it)."""
    public = {n for n in vars(bs) if not n.startswith("_")} | {"__version__"}
    assert set(bs.__all__) == public, set(bs.__all__) ^ public
    assert len(bs.__all__) == len(set(bs.__all__))
