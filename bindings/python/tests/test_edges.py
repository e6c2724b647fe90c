"""Edge values through every string field and every number the binding takes, generated from
tables (test/edges.test.js has the same tables for Node): the empty value, one byte, one byte
that is not UTF-8, a NUL byte, non-ASCII and astral text, the field's maximum length in bytes
(ASCII and two-byte characters) and one over, lone surrogates; 1 against 1.0 and True where a
number is taken; big integers in parameter rows."""

import json

import pytest

import bucketstore as bs
import bucketstore._ffi as F

LONE = ["a\ud800", "a\udc00"]


def raw(v):
    """The bytes a value is stored as."""
    return v if isinstance(v, bytes) else v.encode("utf-8")


def back(got):
    """The bytes of a value read back (str decoded with surrogateescape, or None)."""
    return None if got is None else got.encode("utf-8", "surrogateescape")


def values(limit, least):
    """(name, value, expected exception or None) for a field of at most limit bytes and at
    least `least`."""
    two = "é" * (limit // 2) + "x" * (limit % 2)  # limit bytes of two-byte characters
    over2 = "é" * ((limit + 1) // 2) + "x" * ((limit + 1) % 2)
    return [
        ("empty", "", None if least == 0 else bs.InvalidArgumentError),
        ("one byte", "x", None),
        ("one non-UTF-8 byte", b"\xff", None),
        ("bytes", b"\x00\xfe-\x80", None),
        ("non-ASCII", "ü", None),
        ("astral", "日本語 🙂", None),
        ("maximum", "x" * limit, None),
        ("maximum, two-byte characters", two, None),
        ("one over", "x" * (limit + 1), bs.TooBigError),
        ("one over, two-byte characters", over2, bs.TooBigError),
    ] + [(f"lone surrogate {s!r}", s, bs.InvalidArgumentError) for s in LONE]


def row(bucket="b", otype="o", oid="i", data="{}"):
    return bs.Row(bucket, otype, oid, data)


def save_and_read(st, **fields):
    """One save of a row whose fields are the defaults but for `fields`, committed; the op
    read back."""
    with st.writer() as w:
        w.save(fields.get("table", "t"), "insert", fields.get("rid", "r"),
               [row(**{k: v for k, v in fields.items() if k in ("bucket", "otype", "oid",
                                                                  "data")})],
               store="kept")
        w.snapshot_done("")
        cp = w.commit("1").checkpoint
    bucket = fields.get("bucket", "b")
    (chunk,) = list(st.bucket_data(cp, {bucket: 0}))
    assert back(chunk.bucket) == raw(bucket)
    assert [back(b.name) for b in st.list_buckets()] == [raw(bucket)]
    assert st.checksums(cp, [bucket]).popitem()[1].count == 1
    return chunk.ops[0]


def lookup_limit():
    """The longest string a lookup of one value takes (BS_MAX_LOOKUP_KEY is of the encoded
    key), measured."""
    n = 1
    while True:
        try:
            bs.encode_lookup(["x" * (n + 1)])
        except bs.TooBigError:
            return n
        n += 1


# field -> (limit in bytes, least, write-and-read: (st, value) -> the bytes read back)
def _bucket(st, v):
    save_and_read(st, bucket=v)  # which reads the name back three ways
    return back(next(st.list_buckets()).name)


def _otype(st, v):
    return back(save_and_read(st, otype=v).object_type)


def _oid(st, v):
    return back(save_and_read(st, oid=v).object_id)


def _data(st, v):
    return back(save_and_read(st, data=v).data)


def _table(st, v):
    save_and_read(st, table=v)
    with st.writer() as w:
        return raw(v) if w.source_row(v, "r") == "kept" else None


def _replica_id(st, v):
    op = save_and_read(st, rid=v)
    assert op.subkey == bs.subkey(1, v)
    with st.writer() as w:
        return raw(v) if w.source_row("t", v) == "kept" else None


def _lsn(st, v):
    with st.writer() as w:
        w.snapshot_done("")
        assert w.commit(v).checkpoint_created
    assert st.status().lsn == st.checkpoint().lsn
    return back(st.checkpoint().lsn)


def _stream_name(st, v):
    sid = st.db.create_stream(v)
    return back([s.name for s in st.db.streams() if s.id == sid][0])


def _user_id(st, v):
    ids, _ = st.create_managed_write_checkpoints([bs.ManagedRequest(v, {"1": "0"})])
    assert list(ids.values()) == [1] and [back(k) for k in ids] == [raw(v)]
    assert st.last_write_checkpoint(v, {"1": "0"}) == 1
    return raw(v)


def _lookup_value(st, v):
    with st.writer() as w:
        w.save("t", "insert", "r", [], [([v], ['{"found":1}'])])
        w.snapshot_done("")
        cp = w.commit("1").checkpoint
    assert st.parameter_sets(cp, [[v]]) == [{"found": 1}]
    (got,) = st.checkpoint_changes(0, cp).updated_lookups
    return back(got[0])


FIELDS = {
    "bucket": (F.BS_MAX_BUCKET_NAME, 1, _bucket),
    "object_type": (F.BS_MAX_OBJECT_NAME, 0, _otype),
    "object_id": (F.BS_MAX_OBJECT_NAME, 0, _oid),
    "data": (F.BS_MAX_OP_DATA, 0, _data),
    "table": (F.BS_MAX_TABLE_NAME, 1, _table),
    "replica_id": (F.BS_MAX_REPLICA_ID, 0, _replica_id),
    "lsn": (F.BS_MAX_LSN, 0, _lsn),
    "stream name": (F.BS_MAX_STREAM_NAME, 1, _stream_name),
    "user_id": (F.BS_MAX_USER_ID, 0, _user_id),
    "lookup value": (lookup_limit(), 0, _lookup_value),
}
CASES = [(f, name, v, exc) for f, (limit, least, _) in FIELDS.items()
         for name, v, exc in values(limit, least)]


@pytest.mark.parametrize("field,name,value,exc", CASES,
                         ids=[f"{f}: {n}" for f, n, _, _ in CASES])
def test_string_fields(st, field, name, value, exc):
    limit, least, run = FIELDS[field]
    if field == "stream name" and isinstance(value, bytes) and b"\x00" in value:
        exc = bs.InvalidArgumentError  # a C string
    if exc is None:
        assert run(st, value) == raw(value)
    else:
        with pytest.raises(exc) as e:
            run(st, value)
        assert isinstance(e.value, ValueError)  # InvalidArgumentError, TooBigError
        if exc is bs.TooBigError:
            assert "over BS_MAX_" in e.value.message  # the library's message names the limit


def test_the_table_reaches_every_limit():
    assert F.BS_MAX_BUCKET_NAME == 480 and F.BS_MAX_OBJECT_NAME == 65535
    n = FIELDS["lookup value"][0]
    assert len(bs.encode_lookup(["x" * n])) == F.BS_MAX_LOOKUP_KEY
    assert len(raw(values(480, 1)[7][1])) == 480 and len(raw(values(480, 1)[9][1])) == 481
    assert len(raw(values(255, 1)[7][1])) == 255 and len(raw(values(255, 1)[9][1])) == 256


# ---- numbers: 1 against 1.0 and True -------------------------------------------------------

def _filled(st):
    with st.writer() as w:
        for v in range(2):
            w.save("t", "update", "r", [row(data='{"v":%d}' % v)])
        w.snapshot_done("")
        w.commit("1")


# (name, call(st, n)): where an int is taken, 1 works and 1.0 and True are TypeErrors
INTS = [
    ("checksums checkpoint", lambda st, n: st.checksums(n, ["b"])),
    ("bucket_data_batch checkpoint", lambda st, n: st.bucket_data_batch(n, {"b": 0})),
    ("bucket_data_batch after", lambda st, n: st.bucket_data_batch(2, {"b": n})),
    ("bucket_data_batch limit", lambda st, n: st.bucket_data_batch(2, {"b": 0}, limit=n)),
    ("bucket_data_batch chunk_bytes", lambda st, n: st.bucket_data_batch(2, {"b": 0},
                                                                         chunk_bytes=n)),
    ("wait_checkpoint timeout_ms", lambda st, n: st.wait_checkpoint(st.checkpoint(), n)),
    ("list_buckets page", lambda st, n: list(st.list_buckets(page=n))),
    ("parameter_sets limit", lambda st, n: st.parameter_sets(2, [["k"]], limit=n)),
    ("checkpoint_changes", lambda st, n: st.checkpoint_changes(n, 2)),
    ("compact max_op_id", lambda st, n: st.compact(max_op_id=n)),
    ("compact min_bucket_changes", lambda st, n: st.compact(min_bucket_changes=n)),
    ("compact op_budget", lambda st, n: st.compact(incremental_only=True, op_budget=n)),
    ("compact min_age_ms", lambda st, n: st.compact(incremental_only=True, min_age_ms=n)),
    ("compact max_ops_per_txn", lambda st, n: st.compact(max_ops_per_txn=n)),
    ("compact memory_limit_mb", lambda st, n: st.compact(memory_limit_mb=n)),
    ("compact move_batch_limit", lambda st, n: st.compact(move_batch_limit=n)),
    ("compact delete_checkpoint_requests_before",
     lambda st, n: st.compact(delete_checkpoint_requests_before=n)),
    ("delete_checkpoint_requests_before", lambda st, n: st.delete_checkpoint_requests_before(n)),
    ("storage stream_id", lambda st, n: st.db.storage(n).close()),
    ("export stream", lambda st, n: st.db.export(n).close()),
    ("writer max_records", lambda st, n: st.writer(max_records=n).close()),
    ("writer max_bytes", lambda st, n: st.writer(max_bytes=n).close()),
    ("custom_write_checkpoint checkpoint", lambda st, n: _custom(st, n, None)),
    ("custom_write_checkpoint checkpoint_requested_at", lambda st, n: _custom(st, 1, n)),
    ("ManagedRequest checkpoint_request_id", lambda st, n: st.create_managed_write_checkpoints(
        [bs.ManagedRequest("u", {}, checkpoint_request_id=n)])),
    ("ManagedRequest checkpoint_requested_at", lambda st, n: st.create_managed_write_checkpoints(
        [bs.ManagedRequest("u", {}, checkpoint_requested_at=n)])),
    ("subkey table_id", lambda st, n: bs.subkey(n, "r")),
    ("strerror code", lambda st, n: bs.strerror(n)),
]


def _custom(st, cp, at):
    st.set_write_checkpoint_mode("custom")
    try:
        with st.writer() as w:
            w.custom_write_checkpoint("u", cp, checkpoint_requested_at=at)
            w.flush()
    finally:
        st.set_write_checkpoint_mode("managed")


@pytest.mark.parametrize("name,call", INTS, ids=[n for n, _ in INTS])
def test_int_arguments_take_1_not_1_0(st, name, call):
    _filled(st)
    call(st, 1)
    for bad in (1.0, True, 1.5, "1"):
        with pytest.raises(TypeError, match=r"expected (int|a datetime)"):
            call(st, bad)


FLOATS = [
    ("compact min_change_ratio", lambda st, x: st.compact(min_bucket_changes=1,
                                                          min_change_ratio=x)),
    ("compact defragment_ratio", lambda st, x: st.compact(defragment_ratio=x)),
]


@pytest.mark.parametrize("name,call", FLOATS, ids=[n for n, _ in FLOATS])
def test_float_arguments_take_1_and_1_0_alike(backend, tmp_path, name, call):
    got = []
    for x in (1, 1.0):
        db = bs.open(tmp_path / f"{x!r}.bsdb", nosync=True) if backend == "lmdb" \
            else bs.open_memory()
        with db, db.storage(db.create_stream("v")) as st:
            _filled(st)
            got.append(call(st, x)[:3])  # what was compacted
    assert got[0] == got[1]
    with bs.open_memory() as db, db.storage(db.create_stream("v")) as st:
        for bad in ("1", True, None if name.endswith("defragment_ratio") else -1.0):
            if bad is None:
                continue
            with pytest.raises((TypeError, bs.InvalidArgumentError)):
                call(st, bad)


@pytest.mark.parametrize("one,other,same", [(1, 1.0, True), (0, 0.0, True), (-5, -5.0, True),
                                            (2**53, 2.0**53, True), (1, True, False),
                                            (0, False, False), (1, "1", False),
                                            (1.5, 1, False)])
def test_lookup_numbers(st, one, other, same):
    """A lookup value's number is one number whether written as an int or a float (the
    canonical encoding); a bool or a string is another value."""
    assert (bs.encode_lookup([one]) == bs.encode_lookup([other])) is same
    with st.writer() as w:
        w.save("t", "insert", "r", [], [([one], ['{"v":1}'])])
        w.snapshot_done("")
        cp = w.commit("1").checkpoint
    assert st.parameter_sets(cp, [[other]]) == ([{"v": 1}] if same else [])


# ---- big integers in parameter rows ------------------------------------------------------

BIG = [0, -1, 2**31, 2**32 + 1, 2**53 - 1, 2**53, 2**53 + 1, -(2**53) - 1, 2**63 - 1, -(2**63),
       2**63, 2**64 + 1, -(10**30), 10**30 + 7]


def test_big_integers_in_parameter_rows_exact(st):
    rows = ['{"n":%d,"a":[%d,1.5],"o":{"k":%d}}' % (n, n, n) for n in BIG]
    with st.writer() as w:
        w.save("t", "insert", "r", [], [(["k"], rows)])
        w.snapshot_done("")
        cp = w.commit("1").checkpoint
    got = st.parameter_sets(cp, [["k"]])
    want = [{"n": n, "a": [n, 1.5], "o": {"k": n}} for n in BIG]
    assert sorted(got, key=json.dumps) == sorted(want, key=json.dumps)
    assert all(type(r["n"]) is int for r in got)


@pytest.mark.parametrize("n,ok", [(2**63 - 1, True), (-(2**63), True), (2**63, False),
                                  (-(2**63) - 1, False)])
def test_lookup_integers_at_the_int64_bounds(st, n, ok):
    if not ok:
        with pytest.raises(bs.InvalidArgumentError):
            bs.encode_lookup([n])
        return
    assert bs.decode_lookup(bs.encode_lookup([n])) == [n]
    with st.writer() as w:
        w.save("t", "insert", "r", [], [([n], ['{"v":1}'])])
        w.snapshot_done("")
        cp = w.commit("1").checkpoint
    assert st.parameter_sets(cp, [[n]]) == [{"v": 1}]
    assert st.parameter_sets(cp, [[n - 1 if n > 0 else n + 1]]) == []
