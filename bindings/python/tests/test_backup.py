"""Backup, export and load (storage.h's bs_backup, bs_db_export, bs_load): a backup reads as
its source; export -> load gives the same records; a cancelled or failed call leaves nothing
at the path; an existing target is refused; the memory backend answers UnsupportedError; the
export iterator holds a bounded number of records and stops with its database; edge values
(empty values, one-record and empty inputs, maximum-length names, non-ASCII paths)."""

import os
import threading

import pytest

import bucketstore as bs
import bucketstore._core as core
from conftest import commit_all, read_all, row

NAMES = ["b", "ü", "日本語 🙂", "x" * 480]  # bucket names: one byte, non-ASCII, the maximum
USER, HEADS = "user ü", {"1": "00000001"}


def lookups(i):
    return [(["u", i, 1.0], ['{"b":%d}' % i, "{}"])]


@pytest.fixture
def src(tmp_path):
    """An LMDB file with two streams: ops of every type (with empty data and empty stored
    rows), parameter entries, a managed write checkpoint, a compacted bucket."""
    db = bs.open(tmp_path / "src.bsdb", nosync=True)
    with db.storage(db.create_stream("v1")) as st:
        with st.writer() as w:
            for i, b in enumerate(NAMES):
                w.save("todos", "insert", f"r{i}", [row(b, f"o{i}", data=""), row(b, "ü", "{}")],
                       lookups(i), store="")
            w.save("todos", "update", "r0", [row("b", "o0", '{"v":2}')], lookups(0))
            w.save("todos", "delete", "r1")
            commit_all(w, "00000001")
            w.save("todos", "update", "r0", [row("b", "o0", '{"v":3}')], lookups(0))
            w.commit("00000002")
        st.compact()
        st.create_managed_write_checkpoints([bs.ManagedRequest(USER, HEADS)])
    with db.storage(db.create_stream("v2", hash="sha256")) as st, st.writer() as w:
        w.save("t2", "insert", "a", [row("b", "a")])
        w.flush()
    yield db
    db.close()


def reads(db):
    """What clients and the replicator read from every stream."""
    out = []
    for s in db.streams():
        with db.storage(s.id) as st:
            cp = st.checkpoint()
            buckets = list(st.list_buckets())
            out.append((s, cp, st.status(), buckets,
                        read_all(st, cp.op_id, {b.name: 0 for b in buckets}),
                        st.parameter_sets(cp.op_id, [v for i in range(len(NAMES))
                                                     for v, _ in lookups(i)]),
                        st.last_write_checkpoint(USER, HEADS)))
    return out


def leftovers(d):
    """Files of the directory apart from the source database."""
    return sorted(f for f in os.listdir(d) if not f.startswith("src.bsdb"))


def test_backup_reads_as_its_source(src, tmp_path):
    calls = []
    src.backup(tmp_path / "copy.bsdb", progress=calls.append)
    records = list(src.export())
    assert calls[0] == 0 and calls[-1] == len(records) and calls == sorted(calls)
    with bs.open(tmp_path / "copy.bsdb", readonly=True) as copy:
        assert copy.verify() == []
        assert reads(copy) == reads(src)
        assert list(copy.export()) == records
    assert leftovers(tmp_path) == ["copy.bsdb", "copy.bsdb-lock"]


def test_export_load_gives_identical_records(src, tmp_path):
    records = list(src.export())
    tables = {r.table for r in records}
    assert {"meta", "ops", "bstate", "params", "source", "wcp"} <= tables
    assert any(r.value == b"" for r in records)  # empty values are values
    assert any(r.stream == 0 for r in records) and {r.stream for r in records} == {0, 1, 2}
    seen = []
    bs.load(tmp_path / "new.bsdb", src.export(), progress=seen.append)  # streamed: no list
    assert seen[-1] == len(records)
    with bs.open(tmp_path / "new.bsdb") as new:
        assert list(new.export()) == records
        assert reads(new) == reads(src)
    # plain tuples, str or bytes-like fields
    bs.load(str(tmp_path / "tuples.bsdb"),
            [(r.table.encode(), r.stream, bytearray(r.key), memoryview(r.value)) for r in records])
    with bs.open(tmp_path / "tuples.bsdb") as new:
        assert list(new.export()) == records


def test_export_of_one_stream(src, tmp_path):
    records = list(src.export(1))
    assert {r.stream for r in records} == {0, 1}
    assert records == [r for r in src.export() if r.stream in (0, 1)]
    bs.load(tmp_path / "one.bsdb", records)
    with bs.open(tmp_path / "one.bsdb") as one:
        assert [s.id for s in one.streams()] == [1]
        assert reads(one) == reads(src)[:1]
    assert list(src.export(99)) == [r for r in records if r.stream == 0]  # no such stream


def test_cancel_and_failure_leave_nothing(src, tmp_path):
    target = tmp_path / "t.bsdb"
    for cancel in (lambda n: True, lambda n: n > 0):  # at the snapshot, after the last batch
        with pytest.raises(bs.CanceledError) as e:
            src.backup(target, progress=cancel)
        assert e.value.code == bs.ECANCELED
        assert leftovers(tmp_path) == []
    with pytest.raises(bs.CanceledError):
        bs.load(target, src.export(), progress=lambda n: "stop")
    assert leftovers(tmp_path) == []

    def boom(n):
        raise KeyError("from progress")

    with pytest.raises(KeyError, match="from progress"):
        src.backup(target, progress=boom)
    with pytest.raises(KeyError, match="from progress"):
        bs.load(target, src.export(), progress=boom)
    with pytest.raises(bs.StateError, match="callback"):  # progress may read, not write
        src.backup(target, progress=lambda n: src.create_stream("x"))
    src.backup(target, progress=lambda n: src.stat() and None)  # reading is allowed
    assert leftovers(tmp_path) == ["t.bsdb"]  # a backup leaves no lock file beside its copy
    os.unlink(target)

    def failing():
        it = src.export()
        yield from (next(it) for _ in range(3))
        raise RuntimeError("source gone")

    with pytest.raises(RuntimeError, match="source gone"):
        bs.load(target, failing())
    assert leftovers(tmp_path) == []
    assert src.verify() == []


def test_existing_target_is_refused(src, tmp_path):
    target = tmp_path / "t.bsdb"
    target.write_bytes(b"mine")
    with pytest.raises(bs.StateError, match="exists"):
        src.backup(target)
    with pytest.raises(bs.StateError, match="exists"):
        bs.load(target, src.export())
    assert target.read_bytes() == b"mine"
    src.backup(target, replace=True)
    with bs.open(target) as copy:
        assert reads(copy) == reads(src)
    with pytest.raises(bs.InvalidArgumentError, match="own file"):
        src.backup(tmp_path / "src.bsdb", replace=True)
    assert leftovers(tmp_path) == ["t.bsdb", "t.bsdb-lock"]


def test_memory_backend_is_unsupported(tmp_path):
    with bs.open_memory() as m:
        m.create_stream("v1")
        with pytest.raises(bs.UnsupportedError) as e:
            m.backup(tmp_path / "m.bsdb")
        assert e.value.code == bs.EUNSUPPORTED
        with pytest.raises(bs.UnsupportedError):
            list(m.export())
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("name", ["ü.bsdb", "日本語 🙂 copy", "a b'c\"d", "x"])
def test_non_ascii_and_odd_paths(src, tmp_path, name):
    d = tmp_path / "dïr 日本"
    d.mkdir()
    src.backup(d / name)
    bs.load(os.fsencode(d / (name + ".loaded")), src.export())
    for p in (d / name, d / (name + ".loaded")):
        with bs.open(p) as copy:
            assert reads(copy) == reads(src)
    assert sorted(os.listdir(d)) == sorted([name, name + "-lock", name + ".loaded",
                                            name + ".loaded-lock"])


def test_bad_arguments(src, tmp_path):
    target = tmp_path / "t.bsdb"
    with pytest.raises(bs.InvalidArgumentError, match="path"):
        src.backup("")
    with pytest.raises(bs.InvalidArgumentError, match="NUL"):
        src.backup("a\0b")
    with pytest.raises(bs.StorageIOError):  # no such directory
        src.backup(tmp_path / "missing" / "t.bsdb")
    with pytest.raises(TypeError, match="progress"):
        src.backup(target, progress=1)
    with pytest.raises(TypeError, match="replace"):
        src.backup(target, replace="yes")
    with pytest.raises(TypeError, match="stream"):
        src.export("1")
    with pytest.raises(bs.InvalidArgumentError, match="stream"):
        src.export(-1)
    with pytest.raises(bs.InvalidArgumentError, match="stream"):
        src.export(1 << 32)
    with pytest.raises(TypeError, match="records"):
        bs.load(target, 5)
    with pytest.raises(TypeError, match="records"):
        bs.load(target, b"meta")
    assert leftovers(tmp_path) == []


def test_load_refuses_bad_records(src, tmp_path):
    target = tmp_path / "t.bsdb"
    records = list(src.export())
    fmt = [r for r in records if r.table == "meta" and r.key == b"format"]
    assert len(fmt) == 1
    cases = [
        ([], bs.CorruptError, "format record"),  # empty input
        ([r for r in records if r not in fmt], bs.CorruptError, "format record"),
        (fmt + [("nosuch", 0, b"k", b"")], bs.CorruptError, "unknown table nosuch"),
        (fmt + [("ops", 0, b"", b"v")], bs.CorruptError, "bad key"),
        (fmt + [("ops", 0, b"k" * 512, b"v")], bs.CorruptError, "bad key"),
        ([fmt[0]._replace(value=b"\xff")], bs.CorruptError, "another format"),
        (fmt + [("ops", 0, b"k")], TypeError, r"records\[1\]"),
        (fmt + [5], TypeError, r"records\[1\]"),
        (fmt + [("o\0ps", 0, b"k", b"")], bs.InvalidArgumentError, r"records\[1\].table"),
        (fmt + [("ops", -1, b"k", b"")], bs.InvalidArgumentError, r"records\[1\].stream"),
        (fmt + [("ops", 0, 7, b"")], TypeError, r"records\[1\].key"),
    ]
    for recs, exc, match in cases:
        with pytest.raises(exc, match=match):
            bs.load(target, recs)
        assert leftovers(tmp_path) == [], match
    bs.load(target, fmt)  # the format record alone: an empty database
    with bs.open(target) as one:
        assert one.streams() == [] and list(one.export()) == fmt


def test_export_holds_a_bounded_number_of_records(src, monkeypatch):
    """The producer thread gets at most the slot's and its own batch ahead of the consumer:
    once it blocks, nothing more than that has been read."""
    batch = 3
    made = [0]
    waiting = threading.Event()
    real_record, real_init = core.Record, core._Export.__init__

    class Cv(threading.Condition):
        def wait(self, timeout=None):
            if threading.current_thread().name == "bucketstore-export":
                waiting.set()
            return super().wait(timeout)

    def init(self):
        real_init(self)
        self.cv = Cv(threading.Lock())

    def counting(*a):
        made[0] += 1
        return real_record(*a)

    monkeypatch.setattr(core, "_EXPORT_RECORDS", batch)
    monkeypatch.setattr(core, "Record", counting)
    monkeypatch.setattr(core._Export, "__init__", init)
    it = src.export()
    got = [next(it)]
    for t in [t for t in threading.enumerate() if t.name == "bucketstore-export"]:
        while t.is_alive() and not waiting.wait(0.01):
            pass  # until the producer blocks on the full slot (or ends, if it never blocks)
    assert waiting.is_set() and made[0] <= 3 * batch
    for r in it:
        got.append(r)
        assert made[0] <= len(got) - 1 + 3 * batch
    monkeypatch.setattr(core, "Record", real_record)
    assert len(got) > 10 * batch and got == list(src.export())


def test_export_stops_when_abandoned_or_its_database_closes(src, monkeypatch):
    monkeypatch.setattr(core, "_EXPORT_RECORDS", 2)
    total = len(list(src.export()))
    before = threading.active_count()
    it = src.export()
    next(it)
    assert threading.active_count() == before + 1  # the producer, blocked on the slot
    it.close()  # the generator's finally stops and joins it
    assert threading.active_count() == before
    it = src.export()
    got = [next(it)]
    src.close()  # stops the producer instead of waiting for it
    with pytest.raises(bs.StateError, match="closed"):
        got.extend(it)
    assert len(got) < total
    assert threading.active_count() == before
    with pytest.raises(bs.StateError, match="closed"):
        list(src.export())
