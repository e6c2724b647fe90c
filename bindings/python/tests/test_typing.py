"""The type hints work for a user: `mypy --strict` accepts the package and the quickstart, and
rejects a misuse (the hints are exported, py.typed is honoured). Needs mypy (Debian
python3-mypy); skipped without it."""

import importlib.util
import subprocess
import sys

import pytest

from conftest import REPO

EXAMPLES = REPO / "bindings" / "python" / "examples"
pytestmark = pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                                reason="mypy not installed (apt-get install python3-mypy)")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One fresh mypy cache for the module: the second run reuses the standard library's
    analysis (about half of make test's mypy time), and no run sees a stale cache."""
    return tmp_path_factory.mktemp("mypy-cache")


def mypy(cache, *files):
    """mypy on the files against the installed package (its py.typed)."""
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(cache),
                           *map(str, files)], cwd=str(cache), capture_output=True, text=True)


def test_examples_type_check(cache):
    r = mypy(cache, *sorted(EXAMPLES.glob("*.py")))
    assert r.returncode == 0, r.stdout


def test_misuse_is_reported(cache, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import bucketstore as bs\n"
                   "def f(st: bs.Storage) -> str:\n"
                   "    return st.checkpoint().op_id\n"
                   "def g(w: bs.Writer) -> None:\n"
                   "    w.commit(5)\n")
    r = mypy(cache, bad)
    assert r.returncode == 1
    assert "bad.py:3: error: Incompatible return value" in r.stdout
    assert "bad.py:5: error: Argument 1" in r.stdout


def test_backup_export_load_hints(cache, tmp_path):
    use = tmp_path / "use.py"
    use.write_text("import bucketstore as bs\n"
                   "def f(db: bs.Database) -> int:\n"
                   "    db.backup('copy.bsdb', replace=True, progress=lambda n: n > 10)\n"
                   "    bs.load(b'new.bsdb', db.export(1), progress=print)\n"
                   "    bs.load('one.bsdb', [('meta', 0, b'format', b'1'),\n"
                   "                         bs.Record('ops', 1, b'k', b'')])\n"
                   "    return sum(len(r.key) + len(r.value) + r.stream for r in db.export())\n"
                   "def g(db: bs.Database) -> str:\n"
                   "    return next(db.export()).key\n")
    r = mypy(cache, use)
    assert r.returncode == 1
    errors = [line for line in r.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and "use.py:9: error: Incompatible return value" in errors[0], r.stdout


def test_with_blocks_are_typed(cache, tmp_path):
    use = tmp_path / "with.py"
    use.write_text("import bucketstore as bs\n"
                   "with bs.open('x.bsdb') as db, db.storage() as st, st.writer() as w:\n"
                   "    reveal_type(db)\n    reveal_type(st)\n    reveal_type(w)\n")
    r = mypy(cache, use)
    for i, t in ((3, "Database"), (4, "Storage"), (5, "Writer")):
        assert f'with.py:{i}: note: Revealed type is "bucketstore._core.{t}"' in r.stdout, r.stdout


def test_service_calls_hints(cache, tmp_path):
    use = tmp_path / "svc.py"
    use.write_text("import datetime as dt\n"
                   "import bucketstore as bs\n"
                   "def f(st: bs.Storage, at: bs.When) -> int:\n"
                   "    st.set_write_checkpoint_mode('custom', event_name='e')\n"
                   "    with st.writer(zero_lsn='0/0', store_current_data=False) as w:\n"
                   "        w.custom_write_checkpoint('u', 1, event_id='e', checkpoint_requested_at=at)\n"
                   "        w.flush()\n"
                   "    st.create_managed_write_checkpoints([bs.ManagedRequest(\n"
                   "        'u', {'1': '0/1'}, checkpoint_request_id=2,\n"
                   "        checkpoint_requested_at=dt.datetime.now(dt.timezone.utc))])\n"
                   "    st.compact(incremental_only=True, compact_parameter_data=True,\n"
                   "               delete_checkpoint_requests_before=dt.datetime.now(),\n"
                   "               move_batch_byte_limit=1 << 20)\n"
                   "    st.clear_checksum_cache()\n"
                   "    ok: bool = st.supports_incremental_parameter_compaction()\n"
                   "    s = st.status()\n"
                   "    lsn: str | None = s.resume_lsn\n"
                   "    st.checksums(1, ['b'], request_hint='bulk')\n"
                   "    st.terminate(clear_storage=ok and s.snapshot_done)\n"
                   "    return st.delete_checkpoint_requests_before(at) + \\\n"
                   "        st.compact_initial_replication(max_op_id=1, min_bucket_changes=2)\n"
                   "def g(st: bs.Storage) -> None:\n"
                   "    st.delete_checkpoint_requests_before('2026-09-01')\n")
    r = mypy(cache, use)
    errors = [line for line in r.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and "svc.py:23: error: Argument 1" in errors[0], r.stdout


def test_cancel_hints(cache, tmp_path):
    use = tmp_path / "cancel.py"
    use.write_text("import threading\n"
                   "import bucketstore as bs\n"
                   "def f(db: bs.Database, st: bs.Storage, t: bs.CancelToken,\n"
                   "      e: threading.Event) -> None:\n"
                   "    t.cancel(KeyError('stop'))\n"
                   "    st.compact(cancel=t, progress=lambda s: s.ops_moved > 10)\n"
                   "    db.backup('copy.bsdb', cancel=e)\n"
                   "    bs.load('new.bsdb', db.export(), cancel=t)\n"
                   "    n = sum(len(c.ops) for c in st.bucket_data(1, {'b': 0}, cancel=e))\n"
                   "    st.bucket_data_batch(n, {'b': 0}, cancel=t)\n"
                   "    st.wait_checkpoint(None, 100, cancel=t)\n"
                   "    st.compact_initial_replication(cancel=e)\n"
                   "    st.writer(cancel=t).close()\n"
                   "    st.terminate(cancel=t)\n"
                   "    ok: bool = t.cancelled\n"
                   "def g(st: bs.Storage) -> None:\n"
                   "    st.compact(cancel=True)\n")
    r = mypy(cache, use)
    errors = [line for line in r.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and "cancel.py:17: error: Argument" in errors[0], r.stdout


def test_raw_read_hints(cache, tmp_path):
    use = tmp_path / "raw.py"
    use.write_text("from typing import Optional\n"
                   "import bucketstore as bs\n"
                   "def f(st: bs.Storage) -> int:\n"
                   "    n = 0\n"
                   "    for c in st.bucket_data_raw(1, {'b': 0}, limit=10):\n"
                   "        ops: bs.RawOps = c.ops\n"
                   "        for i in range(len(ops)):\n"
                   "            n += ops.op_id(i) + ops.byte_end(i, 'data') - ops.byte_start(i, 'data')\n"
                   "            d: Optional[str] = ops.data(i)\n"
                   "            raw: Optional[bytes] = ops.bytes(i, 'subkey')\n"
                   "        n += sum(op.checksum for op in ops) + ops[0].op_id\n"
                   "    b: bs.RawBatch = st.bucket_data_batch_raw(1, [('b', 0)])\n"
                   "    return n + len(b.chunks[0].ops.buffer) + int(b.has_more)\n"
                   "def g(ops: bs.RawOps) -> str:\n"
                   "    return ops.data(0)\n"
                   "def h(ops: bs.RawOps) -> None:\n"
                   "    ops.bytes(0, 'op_id')\n")
    r = mypy(cache, use)
    errors = [line for line in r.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 2, r.stdout
    assert "raw.py:15: error: Incompatible return value" in errors[0], r.stdout
    assert "raw.py:17: error: Argument 2" in errors[1], r.stdout
