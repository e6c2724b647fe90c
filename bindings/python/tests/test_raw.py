"""Raw reads (Storage.bucket_data_raw, bucket_data_batch_raw: a chunk's ops one RawOps) give
what the default mode gives, field by field; and the default mode's str fields, made by
_native.c's ASCII fast path or by the decoder, are the stored bytes decoded with
surrogateescape wherever a non-ASCII byte lies."""

import pytest

import bucketstore as bs
from conftest import commit_all, row

FIELDS = ("object_type", "object_id", "subkey", "data")


def mixed_bucket(st):
    """Bucket "b" with PUTs (ASCII, UTF-8, non-UTF-8 bytes, empty strings), REMOVEs, and after a
    compaction a CLEAR or MOVEs; returns the checkpoint."""
    with st.writer() as w:
        for v in range(3):
            for i in range(8):
                w.save("t", "insert" if v == 0 else "update", f"r{i}",
                       [row("b", f"r{i}", '{"v":%d,"s":"é€😀"}' % v)])
        w.save(b"t", "insert", b"\xff", [(b"b", b"o\x80", b"\xff\xfe", b"{\"x\":\"\xc3\"}")])
        w.save("t", "insert", "e", [("b", "", "", "")])
        w.save("t", "delete", "r3")
        cp = commit_all(w)
    st.compact(min_bucket_changes=1)
    with st.writer() as w:
        w.save("t", "update", "r1", [row("b", "r1", '{"after":"compaction"}')])
        w.save("t", "delete", "r2")
        cp = w.commit("2").checkpoint
    return cp


def check_same(raw_chunks, chunks):
    assert len(raw_chunks) == len(chunks) > 0
    for rc, c in zip(raw_chunks, chunks):
        assert isinstance(rc, bs.RawChunk) and isinstance(rc.ops, bs.RawOps)
        assert rc[:5] == c[:5]  # bucket, after, next_after, has_more, target_op
        ops = rc.ops
        assert len(ops) == len(c.ops) and list(ops) == c.ops
        for i, op in enumerate(c.ops):
            assert ops[i] == op and ops[i - len(ops)] == op
            assert (ops.op_id(i), ops.op(i), ops.checksum(i), ops.target_op(i)) == \
                (op.op_id, op.op, op.checksum, op.target_op)
            assert type(ops.op(i)) is bs.OpType
            for f in FIELDS:
                want = getattr(op, f)
                assert getattr(ops, f)(i) == want, (i, f)
                b = ops.bytes(i, f)
                start, end = ops.byte_start(i, f), ops.byte_end(i, f)
                if want is None:
                    assert b is None and start == end == -1, (i, f)
                else:
                    assert b == want.encode("utf-8", "surrogateescape"), (i, f)
                    assert ops.buffer[start:end] == b and 0 <= start <= end, (i, f)


def test_raw_reads_give_the_default_modes_ops(st):
    cp = mixed_bucket(st)
    kinds = set()
    for limit in (None, 1, 5):
        for chunk_bytes in (None, 0, 100):
            raw = list(st.bucket_data_raw(cp, {"b": 0}, limit=limit, chunk_bytes=chunk_bytes))
            dflt = list(st.bucket_data(cp, {"b": 0}, limit=limit, chunk_bytes=chunk_bytes))
            check_same(raw, dflt)
            kinds |= {op.op for c in dflt for op in c.ops}
    # every op type and field shape was compared
    assert {bs.OpType.PUT, bs.OpType.REMOVE} <= kinds and \
        kinds & {bs.OpType.MOVE, bs.OpType.CLEAR}
    b = st.bucket_data_batch_raw(cp, {"b": 0, "nobucket": 0}, limit=4)
    d = st.bucket_data_batch(cp, {"b": 0, "nobucket": 0}, limit=4)
    assert isinstance(b, bs.RawBatch) and b.has_more == d.has_more is True
    check_same(b.chunks, d.chunks)


def test_raw_ops_indexes_and_arguments(st):
    with st.writer() as w:
        for i in range(3):
            w.save("t", "insert", f"r{i}", [row("b", f"r{i}")])
        cp = commit_all(w)
    (chunk,) = st.bucket_data_batch_raw(cp, {"b": 0}).chunks
    ops = chunk.ops
    assert len(ops) == 3 and ops.op_id(-1) == ops.op_id(2) == 3 and ops[-3].op_id == 1
    for bad in (3, -4, 2**63, -(2**63)):
        with pytest.raises(IndexError):
            ops.op_id(bad)
        with pytest.raises(IndexError):
            ops.bytes(bad, "data")
    with pytest.raises(IndexError):
        ops[3]
    with pytest.raises(TypeError):
        ops.data("0")
    with pytest.raises(TypeError):
        ops.data(1.0)
    with pytest.raises(ValueError, match="field"):
        ops.bytes(0, "op_id")
    with pytest.raises(ValueError, match="field"):
        ops.byte_start(0, b"data")
    with pytest.raises(TypeError):
        ops.byte_end(0)  # type: ignore[call-arg]
    assert "3 ops" in repr(ops)
    # the ops own their bytes: they outlive the storage and the database
    st.db.close()
    assert ops.data(0) == '{"id":"r0"}' and ops[1].object_id == "r1"


def test_raw_reads_of_an_empty_batch_and_a_cancel(st):
    with st.writer() as w:
        w.save("t", "insert", "r0", [row("b", "r0")])
        cp = commit_all(w)
    assert st.bucket_data_batch_raw(cp, {"nobucket": 0}) == bs.RawBatch([], False)
    assert list(st.bucket_data_raw(cp, {"b": 1})) == []
    t = bs.CancelToken()
    t.cancel(KeyError("stop"))
    with pytest.raises(KeyError):
        next(st.bucket_data_raw(cp, {"b": 0}, cancel=t))
    with pytest.raises(bs.InvalidArgumentError):
        st.bucket_data_batch_raw(cp, {"b": 0}, request_hint="fast")


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 15, 16, 17, 31, 120])
def test_fields_decoded_wherever_the_non_ascii_byte_lies(st, size):
    """A field of `size` bytes, ASCII but for one byte at each position in turn (a UTF-8 lead
    byte alone, so not UTF-8: a surrogate escape), and once all ASCII: every word and the tail of
    the ASCII check is reached."""
    values = [bytes(65 + j % 26 for j in range(size))]
    for at in range(size):
        v = bytearray(values[0])
        v[at] = 0xC3
        values.append(bytes(v))
    with st.writer() as w:
        for i, v in enumerate(values):
            w.save("t", "insert", f"r{i}", [("b", v, v, v)])
        cp = commit_all(w)
    got = [op for c in st.bucket_data(cp, {"b": 0}, limit=1000) for op in c.ops]
    raw = [c.ops for c in st.bucket_data_raw(cp, {"b": 0}, limit=1000)]
    assert len(got) == len(values)
    for op, v in zip(got, values):
        want = v.decode("utf-8", "surrogateescape")
        assert (op.object_type, op.object_id, op.data) == (want, want, want)
        assert want.isascii() == (0xC3 not in v)
    assert [r.data(i) for r in raw for i in range(len(r))] == [op.data for op in got]
