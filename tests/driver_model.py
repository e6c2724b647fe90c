"""A naive reference model of the driver's commands (docs/driver.md), written from
docs/contract.md alone, for tests/driver_diff.py.

driver_diff.py compares the backends with each other; since the rules they share live in one
engine (issue 26), a wrong rule there makes every backend agree. This model states those rules
again, independently (it imports nothing of the library; checksums and subkeys come from the
system's libxxhash and hashlib), and checks every backend's replies against them:

- op ids (contract.md 2, 4.1-4.3): every save, truncate and drop, in flush order, with source
  records, lookups (their tombstones take ids too), soft deletes and the snapshot rule;
- commits (4.4): blocked and why, created, the checkpoint's id; flush's last op id;
- stream states (1, 4.4, 8) and the default stream (the served one, else the newest);
- clear (8): the checkpoint state of a new stream, ids that keep growing;
- checksums and counts at any C (3), bucket data reduced as a client does (9, property 2), and
  every PUT's and REMOVE's checksum from its own fields;
- parameter sets (5.4) until a parameter compaction: the latest entry per key and source row, keys
  canonical (1 and 1.0 one key), rows as given (1 and 1.0 two rows), BS_ELIMIT past the limit.

What it takes from the replies: whether a command succeeded (the backends' agreement on that is
driver_diff.py's job) and a compaction's counts (a compaction lowers counts, and may make a read
torn: reads of a compacted stream are checked for what compaction keeps, not for counts).

Python 3 stdlib plus libxxhash through ctypes (Debian's libxxhash-dev, a build dependency).
"""
import ctypes
import ctypes.util
import hashlib
import json

# ---- Hashes (contract.md 1, 3) ------------------------------------------------------------------


class _H128(ctypes.Structure):
    _fields_ = [("low64", ctypes.c_uint64), ("high64", ctypes.c_uint64)]


_XXH = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
_XXH.XXH3_64bits.restype = ctypes.c_uint64
_XXH.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
_XXH.XXH3_128bits.restype = _H128
_XXH.XXH3_128bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def b(s):
    """A driver string as the bytes the library gets (NUL bytes kept)."""
    return s.encode("utf-8")


def op_hash(kind, data):
    if kind == "sha256":
        return int.from_bytes(hashlib.sha256(data).digest()[:4], "little")
    return _XXH.XXH3_64bits(data, len(data)) & 0xFFFFFFFF


def subkey(table_id, rid):
    h = _XXH.XXH3_128bits(rid, len(rid))
    return "%08x/%016x%016x" % (table_id, h.high64, h.low64)


def put_checksum(kind, otype, oid, data):
    return op_hash(kind, b"put." + b(otype) + b"." + b(oid) + b"." + b(data))


def remove_checksum(kind, sk):
    return op_hash(kind, b"delete." + sk.encode())


def signed32(x):
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x >= 1 << 31 else x


def lsn_lt(a, b_):
    """LSN order (contract.md 1): byte-wise, a proper prefix first (Python's bytes order)."""
    return b(a) < b(b_)


# ---- Lookup keys (contract.md 5.4): integral numbers are one key however spelled ----------------

def lookup_key(values):
    out = []
    for v in values:
        if isinstance(v, bool):
            out.append(("bool", v))
        elif v is None:
            out.append(("null",))
        elif isinstance(v, int):
            out.append(("int", v))
        elif isinstance(v, float):
            if v == int(v) and -(2**63) <= int(v) < 2**63:
                out.append(("int", int(v)))
            else:
                out.append(("real", v))
        else:
            out.append(("text", b(v)))
    return tuple(out)


def canon(v):
    """A JSON value as comparable text, numbers with their kind: 1 and 1.0 differ (a row is kept
    as given, docs/driver.md), 1.0 and 1e0 do not (the same double, which the driver writes
    back as jansson does)."""
    def typed(x):
        if isinstance(x, float):
            return {"\u0000float": repr(x)}
        if isinstance(x, dict):
            return {k: typed(y) for k, y in x.items()}
        if isinstance(x, list):
            return [typed(y) for y in x]
        return x
    return json.dumps(typed(v), sort_keys=True)


# ---- One stream ---------------------------------------------------------------------------------

class Stream:
    def __init__(self, sid, hash_kind):
        self.id = sid
        self.hash = hash_kind
        self.state = "PROCESSING"
        self.head = 0
        self.next_table = 1
        self.reset()
        self.compacted = False   # a compaction changed ops: counts may be lower, reads torn
        self.initial = False     # initial-replication compaction deleted ops: sums change too
        self.params_compacted = False  # parameter compaction dropped entries (compact.c: only
        # bs_compact with compact_parameters; bucket compaction leaves the index alone)

    def reset(self):
        """What bs_clear leaves (contract.md 8): the checkpoint state of a new stream; op ids
        and table ids keep growing."""
        self.tables = {}       # name -> id
        self.records = {}      # (table id, rid bytes) -> Record
        self.buckets = {}      # name -> [Op]
        self.params = []       # (op id, lookup key, table id, rid, rows or None), ascending id
        # [lo, hi]: ids whose order among themselves the contract leaves open (the REMOVEs of
        # one step of a save, all ops of a truncate: util_model.h's groups); a read at C with
        # lo <= C < hi may see any subset of them
        self.groups = []
        self.snapshot_done = False
        self.nocb = None
        self.cp = 0
        self.cp_lsn = None
        self.has_cp = False
        # what a clear leaves: changes from below the op head at the clear are no longer known,
        # so checkpoint_changes from there invalidates (contract.md 5.1, 8)
        self.fence = getattr(self, "head", 0)

    def table_id(self, name):
        if name not in self.tables:
            self.tables[name] = self.next_table
            self.next_table += 1
        return self.tables[name]

    def emit(self, bucket, kind, otype, oid, sk, data=None):
        self.head += 1
        ck = put_checksum(self.hash, otype, oid, data) if kind == "PUT" else \
            remove_checksum(self.hash, sk)
        self.buckets.setdefault(bucket, []).append(
            {"op_id": self.head, "op": kind, "object_type": otype, "object_id": oid,
             "subkey": sk, "data": data, "checksum": ck})

    def param(self, key, table, rid, rows):
        """A parameter entry (rows: the lookup's parameter rows as given) or a tombstone (rows
        None) of source row (table, rid) under lookup key: it takes an id (contract.md 2)."""
        self.head += 1
        self.params.append((self.head, key, table, rid, rows))

    def parameter_sets(self, c, keys):
        """contract.md 5.4: for every key and source row, the latest entry at or below c; a
        tombstone drops the row. The rows, as canon() texts."""
        latest = {}
        for op_id, key, table, rid, rows in self.params:
            if op_id <= c and key in keys:
                latest[(key, table, rid)] = rows
        return [canon(r) for rows in latest.values() if rows for r in rows]

    def remove_record(self, rec, tombstones):
        for bucket, otype, oid in rec.members:
            self.emit(bucket, "REMOVE", otype, oid, rec.subkey)
        if tombstones:
            for key in rec.lookups:
                self.param(key, rec.table, rec.rid, None)

    def save(self, cmd, snapshot):
        """contract.md 4.1 and 4.3, applied at flush."""
        t = self.table_id(b(cmd["table"]))
        tag = cmd["tag"]
        after = b(cmd["id"])
        before = b(cmd["old_id"]) if cmd.get("old_id") is not None else after
        has_after = tag != "delete"
        soft = not has_after and (snapshot or not self.snapshot_done)
        rec = self.records.get((t, before))
        old = rec if rec and not rec.soft else None
        if snapshot and tag == "insert" and (t, after) in self.records:
            return
        if old and (not has_after or before != after):
            self.group_from(self.head + 1)
            self.remove_record(old, False)
            self.group_to()
            for key in old.lookups:
                self.param(key, t, before, None)
            del self.records[(t, before)]
            if soft:
                self.records[(t, before)] = Record(t, before, soft=True, mark=self.head)
        elif soft and (t, before) not in self.records:
            self.records[(t, before)] = Record(t, before, soft=True, mark=self.head)
        if not has_after:
            return
        prev = None
        if tag == "update":
            r = self.records.get((t, after))
            prev = r if r and not r.soft else None
        nr = Record(t, after)
        nr.stored = cmd.get("store")
        for row in cmd.get("rows") or []:
            self.emit(row["bucket"], "PUT", row["type"], row["id"], nr.subkey, row["data"])
            if (row["bucket"], row["type"], row["id"]) not in nr.members:  # a set, as the keys
                nr.members.append((row["bucket"], row["type"], row["id"]))
        if prev:
            self.group_from(self.head + 1)
            for m in prev.members:
                if m not in nr.members:
                    self.emit(m[0], "REMOVE", m[1], m[2], nr.subkey)
            self.group_to()
        for lk in cmd.get("lookups") or []:
            self.param(lookup_key(lk["lookup"]), t, after, lk.get("params") or [])
            if lookup_key(lk["lookup"]) not in nr.lookups:  # the record keeps each key once
                nr.lookups.append(lookup_key(lk["lookup"]))
        if prev:
            for k in prev.lookups:
                if k not in nr.lookups:
                    self.param(k, t, after, None)
        self.records[(t, after)] = nr

    def truncate(self, table, drop):
        # a table never saved to has no rows: a truncate does not register it (no id taken)
        t = self.tables.get(b(table))
        if t is None:
            return
        self.group_from(self.head + 1)
        for key in [k for k in self.records if k[0] == t]:
            self.remove_record(self.records.pop(key), True)
        self.group_to()
        if drop:
            del self.tables[b(table)]

    def group_from(self, lo):
        self.lo = lo

    def group_to(self):
        if self.head > self.lo:
            self.groups.append((self.lo, self.head))

    def open_order(self, c):
        """Whether C cuts a group: which of its ops a read at C sees is the engine's choice."""
        return any(lo <= c < hi for lo, hi in self.groups)

    def commit(self, lsn, create_empty):
        """contract.md 4.4: (blocked reason or None, created)."""
        if not self.snapshot_done:
            return "snapshot_not_done", False
        if self.nocb is not None and lsn_lt(lsn, self.nocb):
            return "below_no_checkpoint_before", False
        if self.has_cp and lsn_lt(lsn, self.cp_lsn):
            return "below_checkpoint_lsn", False
        if not create_empty and self.has_cp and self.head == self.cp:
            return None, False
        self.has_cp, self.cp, self.cp_lsn = True, self.head, lsn
        for key in [k for k, r in self.records.items() if r.soft and r.mark <= self.cp]:
            del self.records[key]
        return None, True

    def history(self, bucket, c):
        return [op for op in self.buckets.get(bucket, []) if op["op_id"] <= c]


class Record:
    def __init__(self, table, rid, soft=False, mark=0):
        self.table, self.rid, self.soft, self.mark = table, rid, soft, mark
        self.subkey = subkey(table, rid)
        self.members, self.lookups, self.stored = [], [], None


def reduce_ops(ops):
    """The client's reduce (contract.md 9, property 2): the live rows (latest PUT per row
    identity) and the total checksum."""
    rows, total = {}, 0
    for op in ops:
        total += op["checksum"]
        key = (op["object_type"], op["object_id"], op["subkey"])
        if op["op"] == "PUT":
            rows[key] = op["data"]
        elif op["op"] == "REMOVE":
            rows.pop(key, None)
        elif op["op"] == "CLEAR":
            rows.clear()
    return rows, total & 0xFFFFFFFF


def _id(x):
    """An op id argument as the driver takes it (a decimal string below 2^63), else None."""
    if isinstance(x, str) and x.isdigit() and x.isascii() and int(x) < 2**63:
        return int(x)
    return None


# ---- The database -------------------------------------------------------------------------------

class Model:
    def __init__(self):
        self.streams = []        # Stream, by id - 1
        self.writers = {}        # (stream id, name) -> Writer

    def default_stream(self):
        for s in self.streams:
            if s.state in ("ACTIVE", "ERRORED"):
                return s
        return self.streams[-1] if self.streams else None

    def stream_of(self, cmd):
        sid = cmd.get("stream")
        if sid is None:
            return self.default_stream()
        if isinstance(sid, int) and not isinstance(sid, bool) and 1 <= sid <= len(self.streams):
            return self.streams[sid - 1]
        return None

    def flush(self, w):
        s = self.streams[w.stream - 1]
        for kind, arg in w.queue:
            if kind == "save":
                s.save(arg, w.snapshot)
        w.queue = []

    def step(self, cmd, reply):
        """Applies cmd given its reply (a dict) and returns what in the reply is wrong, or None."""
        if not isinstance(cmd, dict) or not isinstance(reply, dict):
            return None
        name = cmd.get("cmd")
        ok = reply.get("ok") is True
        fn = getattr(self, "c_" + str(name).replace(".", "_"), None)
        if fn is None:
            return None
        return fn(cmd, reply, ok)

    # ---- streams --------------------------------------------------------------------------
    def c_stream_create(self, cmd, reply, ok):
        if not ok:
            return None
        for s in self.streams:
            if s.state == "PROCESSING":
                s.state = "STOPPED"
        self.streams.append(Stream(len(self.streams) + 1, cmd.get("checksum") or "xxh3"))
        if reply.get("stream") != len(self.streams):
            return "stream %r, the model's %d" % (reply.get("stream"), len(self.streams))
        return None

    def c_stream_list(self, cmd, reply, ok):
        if not ok:
            return None
        got = [(x.get("stream"), x.get("state")) for x in reply.get("streams", [])]
        want = [(s.id, s.state) for s in self.streams]
        return None if got == want else "streams %r, the model's %r" % (got, want)

    def c_stream_status(self, cmd, reply, ok):
        s = self.stream_of(cmd)
        if not ok or s is None:
            return None
        # storage.h bs_status: snapshot_done is reported once a checkpoint exists
        want = {"stream": s.id, "state": s.state, "snapshot_done": s.snapshot_done and s.has_cp,
                "checkpoint": str(s.cp), "lsn": s.cp_lsn if s.has_cp else None,
                "last_persisted_op": str(s.head)}
        got = {k: reply.get(k) for k in want}
        return None if got == want else "status %r, the model's %r" % (got, want)

    def c_checkpoint(self, cmd, reply, ok):
        s = self.stream_of(cmd)
        if not ok:
            return None
        want = {"checkpoint": str(s.cp) if s else "0",
                "lsn": s.cp_lsn if s and s.has_cp else None}
        got = {k: reply.get(k) for k in want}
        return None if got == want else "%r, the model's %r" % (got, want)

    def c_clear(self, cmd, reply, ok):
        s = self.stream_of(cmd)
        if ok and s:
            s.reset()
        return None

    def c_terminate(self, cmd, reply, ok):
        s = self.stream_of(cmd)
        if ok and s:
            if cmd.get("clear"):
                s.reset()
            s.state = "TERMINATED"
        return None

    def c_reopen(self, cmd, reply, ok):
        self.writers = {}  # closed without flushing: the queues are lost
        return None

    # ---- writers --------------------------------------------------------------------------
    def writer(self, cmd, reply, ok):
        """The command's writer, opened on first use; None when it could not be opened (the
        command then failed with the open's error: BS_EBUSY beside another of its kind,
        BS_ESTATE on a terminated stream)."""
        s = self.stream_of(cmd)
        if s is None:
            return None
        key = (s.id, cmd.get("writer", "main"))
        if key not in self.writers:
            code = (reply.get("error") or {}).get("code")
            if not ok and (code == "BS_EBUSY" or s.state == "TERMINATED"):
                return None
            self.writers[key] = Writer(s.id)
        return self.writers[key]

    def c_writer_open(self, cmd, reply, ok):
        s = self.stream_of(cmd)
        if s is None:
            return None
        key = (s.id, cmd.get("writer", "main"))
        old = self.writers.pop(key, None)
        if old is not None and s.state != "TERMINATED":
            self.flush(old)
        if ok:
            w = Writer(s.id)
            w.snapshot = cmd.get("snapshot") is True
            w.create_empty = cmd.get("create_empty") is not False
            self.writers[key] = w
        return None

    def c_save(self, cmd, reply, ok):
        w = self.writer(cmd, reply, ok)
        if ok and w:
            w.queue.append(("save", cmd))
        return None

    def _truncate(self, cmd, reply, ok, drop):
        w = self.writer(cmd, reply, ok)
        if ok and w:
            self.flush(w)
            self.streams[w.stream - 1].truncate(cmd["table"], drop)
        return None

    def c_truncate(self, cmd, reply, ok):
        return self._truncate(cmd, reply, ok, False)

    def c_drop(self, cmd, reply, ok):
        return self._truncate(cmd, reply, ok, True)

    def c_flush(self, cmd, reply, ok):
        w = self.writer(cmd, reply, ok)
        if not ok or not w:
            return None
        self.flush(w)
        head = self.streams[w.stream - 1].head
        return None if reply.get("last_op") == str(head) else \
            "last_op %r, the model's %d" % (reply.get("last_op"), head)

    def _commit(self, cmd, reply, ok, keepalive):
        w = self.writer(cmd, reply, ok)
        if not ok or not w:
            return None
        s = self.streams[w.stream - 1]
        self.flush(w)
        create_empty = True if keepalive else (
            cmd["create_empty"] if isinstance(cmd.get("create_empty"), bool) else w.create_empty)
        why, created = s.commit(cmd["lsn"], create_empty)
        if created and s.state == "PROCESSING":
            for o in self.streams:
                if o.state in ("ACTIVE", "ERRORED"):
                    o.state = "STOPPED"
            s.state = "ACTIVE"
        want = {"checkpoint_blocked": why is not None, "checkpoint_created": created,
                "checkpoint": str(s.cp), "blocked_reason": why}
        got = {k: reply.get(k) for k in want}
        return None if got == want else "%r, the model's %r" % (got, want)

    def c_commit(self, cmd, reply, ok):
        return self._commit(cmd, reply, ok, False)

    def c_keepalive(self, cmd, reply, ok):
        return self._commit(cmd, reply, ok, True)

    def c_snapshot_done(self, cmd, reply, ok):
        w = self.writer(cmd, reply, ok)
        if ok and w:
            s = self.streams[w.stream - 1]
            s.snapshot_done = True
            if s.nocb is None or lsn_lt(s.nocb, cmd["lsn"]):
                s.nocb = cmd["lsn"]
        return None

    def c_resume_lsn(self, cmd, reply, ok):
        self.writer(cmd, reply, ok)
        return None

    def c_source_row(self, cmd, reply, ok):
        w = self.writer(cmd, reply, ok)
        if not ok or not w or any(x.queue for x in self.writers.values()
                                  if x.stream == w.stream):
            return None  # what a queued save would change is the writer's view, not the store's
        s = self.streams[w.stream - 1]
        t = s.tables.get(b(cmd["table"]))
        r = s.records.get((t, b(cmd["id"]))) if t else None
        want = r.stored if r and not r.soft else None
        return None if reply.get("data") == want else "data %r, the model's %r" % (
            reply.get("data"), want)

    def c_write_checkpoint_custom(self, cmd, reply, ok):
        self.writer(cmd, reply, ok)
        return None

    # ---- reads ----------------------------------------------------------------------------
    def read_at(self, cmd, reply, ok):
        """What a read at C (checksums, bucket_data) opens with: (stream, C, None) for a reply the
        caller goes on to judge, else (None, None, verdict): nothing to judge (no such stream,
        no C), or a failed read, which may only be a torn read (BS_EINVALIDATED) after a
        compaction touched the stream."""
        s = self.stream_of(cmd)
        c = _id(cmd.get("checkpoint"))
        if s is None or c is None:
            return None, None, None
        if not ok:
            code = (reply.get("error") or {}).get("code")
            if code == "BS_EINVALIDATED" and not s.compacted:
                return None, None, \
                    "BS_EINVALIDATED on a stream no compaction touched (contract.md 5.5)"
            return None, None, None
        return s, c, None

    def c_checksums(self, cmd, reply, ok):
        s, c, verdict = self.read_at(cmd, reply, ok)
        if s is None:
            return verdict
        if s.initial or s.open_order(c):
            return None
        got = reply.get("checksums", {})
        for name in cmd.get("buckets") or []:
            h = s.history(name, c)
            want = {"checksum": signed32(sum(op["checksum"] for op in h)), "count": len(h)}
            g = dict(got.get(name) or {})
            if s.compacted:
                g.pop("count", None)
                want.pop("count")
            if g != want:
                return "bucket %r at %d: %r, the model's %r" % (name, c, g, want)
        return None

    def c_bucket_data(self, cmd, reply, ok):
        s, c, verdict = self.read_at(cmd, reply, ok)
        if s is None:
            return verdict
        for ch in reply.get("chunks", []):
            for op in ch.get("data", []):
                if op.get("op") == "PUT":
                    want = put_checksum(s.hash, op["object_type"], op["object_id"], op["data"])
                elif op.get("op") == "REMOVE":
                    want = remove_checksum(s.hash, op["subkey"])
                else:
                    continue
                if op.get("checksum") != want:
                    return "op %s's checksum %r, its fields hash to %d" % (
                        op.get("op_id"), op.get("checksum"), want)
        afters = cmd.get("buckets") or {}
        if reply.get("has_more") or s.initial or s.open_order(c) or \
                any(_id(ch.get("target_op")) and int(ch["target_op"]) > c
                    for ch in reply.get("chunks", [])):
            return None
        for name, after in afters.items():
            if after != "0":
                continue
            got = reduce_ops(op for ch in reply.get("chunks", []) if ch.get("bucket") == name
                             for op in ch.get("data", []))
            want = reduce_ops(s.history(name, c))
            if got != want:
                return "bucket %r from 0 at %d reduces to %r, the model's %r" % (
                    name, c, got, want)
        return None

    def c_checkpoint_changes(self, cmd, reply, ok):
        """contract.md 5.1: every bucket with an op in (from, to] is listed, unless the list is
        replaced by the invalidate flag (extra names are allowed)."""
        s = self.stream_of(cmd)
        lo, hi = _id(cmd.get("from")), _id(cmd.get("to"))
        if ok and s is not None and lo is not None and lo < s.fence and not (
                reply.get("invalidate_data_buckets") and
                reply.get("invalidate_parameter_buckets")):
            return "from %d is below the clear at %d: both kinds must be invalidated" % (
                lo, s.fence)
        if not ok or s is None or lo is None or hi is None or \
                reply.get("invalidate_data_buckets") or s.open_order(lo) or s.open_order(hi):
            return None
        listed = set(reply.get("updated_buckets") or [])
        for name, ops in s.buckets.items():
            if name not in listed and any(lo < op["op_id"] <= hi for op in ops):
                return "bucket %r has an op in (%d, %d] and is not listed" % (name, lo, hi)
        return None

    def c_parameter_sets(self, cmd, reply, ok):
        """contract.md 5.4 until a parameter compaction (which drops entries and makes reads below
        its horizon BS_ESTALE): the rows of the requested keys (a key
        listed twice counts once; 1 and 1.0 are one key), each row as given, with its numbers'
        kinds (1 is not 1.0); more than `limit` (default 1000) is BS_ELIMIT."""
        s = self.stream_of(cmd)
        c = _id(cmd.get("checkpoint"))
        code = (reply.get("error") or {}).get("code")
        if s is not None and code == "BS_ESTALE" and not s.params_compacted:
            return "BS_ESTALE on a stream never compacted (contract.md 5.5)"
        if s is None or c is None or s.params_compacted or s.open_order(c) or \
                not isinstance(cmd.get("lookups"), list) or (not ok and code != "BS_ELIMIT"):
            return None
        limit = cmd.get("limit")
        limit = 1000 if limit is None else limit
        want = s.parameter_sets(c, {lookup_key(k) for k in cmd["lookups"]})
        if len(want) > limit:
            return None if code == "BS_ELIMIT" else \
                "%d rows at %d, over the limit %d: BS_ELIMIT expected" % (len(want), c, limit)
        if not ok:
            return "BS_ELIMIT with %d rows at %d, limit %d" % (len(want), c, limit)
        got = sorted(canon(r) for r in reply.get("sets") or [])
        return None if got == sorted(want) else "sets at %d: %r, the model's %r" % (
            c, got, sorted(want))

    # ---- compaction -----------------------------------------------------------------------
    def c_compact(self, cmd, reply, ok):
        s = self.stream_of(cmd)
        if ok and s:
            s.compacted = True
            s.params_compacted |= cmd.get("compact_parameters") is True
        return None

    def c_compact_initial_replication(self, cmd, reply, ok):
        s = self.stream_of(cmd)
        if ok and s and reply.get("buckets"):
            s.initial = s.compacted = True
        return None


class Writer:
    def __init__(self, stream):
        self.stream = stream
        self.snapshot = False
        self.create_empty = True
        self.queue = []
