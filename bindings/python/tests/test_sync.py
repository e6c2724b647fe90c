"""The sync contract through the binding, like tests/test_sync.c: a writer runs a random
workload (inserts, updates that move rows between buckets, deletes, truncates, commits,
compactions, reopening the file), and clients download their buckets, resume from wherever
they stopped (also in the middle of a batch), reduce what they got with the client's
algorithm, and at every checkpoint they complete check:
  - the client's checksum of every bucket = get_checksums = the model's sum of the whole
    history (contract.md section 9, property 1), and the count served is plausible;
  - the client's live rows = the model's live rows (property 2/3: reduce equality);
  - every PUT's checksum is checksum_put of its fields, every REMOVE's checksum_remove;
  - ops arrive in ascending op id, above the position asked for, at or below the checkpoint;
  - a client that downloads only the buckets get_checkpoint_changes names since its last
    checkpoint ends up equal too (changes never miss a bucket).
The model only predicts what contract.md 4.1 says a save emits. BS_SEED picks the seed (printed
on failure); BS_TEST_QUICK=1 runs fewer steps."""

import os
import random

import pytest

import bucketstore as bs

M32 = 2**32
BUCKETS = ["b0", "b1", "b2", 'by_user["ü"]', "global[]"]
TABLES = ["t0", "t1"]
RIDS = [f"r{i}" for i in range(12)]


class Model:
    """What the engine must serve: per bucket the sum of every op's checksum and the live rows
    {(object_type, object_id, subkey): data}; per source row its memberships."""

    def __init__(self, hash_):
        self.hash = hash_
        self.records = {}  # (table, rid) -> {(bucket, otype, oid): data}
        self.sums = {b: 0 for b in BUCKETS}
        self.live = {b: {} for b in BUCKETS}
        self.ops = 0
        self.at_cp = (0, dict(self.sums), {})  # (checkpoint, sums, live) at the last commit

    def checkpointed(self, cp):
        assert cp == self.ops, f"checkpoint {cp} is not the last op id {self.ops}"
        self.at_cp = (cp, dict(self.sums), {b: dict(r) for b, r in self.live.items()})

    def sub(self, table, rid):
        return bs.subkey(TABLES.index(table) + 1, rid)

    def put(self, table, rid, b, ot, oi, data):
        self.sums[b] += bs.checksum_put(ot, oi, data, self.hash)
        self.live[b][(ot, oi, self.sub(table, rid))] = data
        self.ops += 1

    def remove(self, table, rid, b, ot, oi):
        sk = self.sub(table, rid)
        self.sums[b] += bs.checksum_remove(sk, self.hash)
        del self.live[b][(ot, oi, sk)]
        self.ops += 1

    def save(self, table, tag, rid, rows):
        old = self.records.get((table, rid), {})
        if tag == "delete":
            for (b, ot, oi) in old:
                self.remove(table, rid, b, ot, oi)
            self.records.pop((table, rid), None)
            return
        new = {}
        for b, ot, oi, data in rows:
            self.put(table, rid, b, ot, oi, data)
            new[(b, ot, oi)] = data
        for (b, ot, oi) in old:
            if (b, ot, oi) not in new:
                self.remove(table, rid, b, ot, oi)
        self.records[(table, rid)] = new

    def truncate(self, table):
        for (t, rid) in [k for k in self.records if k[0] == table]:
            self.save(t, "delete", rid, [])


class Client:
    """The client's oplog per bucket (util_client.c): rows by identity, add/op checksums."""

    def __init__(self):
        self.b = {}  # name -> [last_op, add, op_sum, {key: (checksum, data)}]
        self.cp = None  # the checkpoint of the last complete sync

    def pos(self):
        return {n: s[0] for n, s in self.b.items()}

    def apply(self, bucket, op):
        s = self.b.setdefault(bucket, [0, 0, 0, {}])
        assert op.op_id > s[0], f"op {op.op_id} not above {s[0]} in {bucket}"
        s[0] = op.op_id
        if op.op == bs.OpType.MOVE:
            s[1] += op.checksum
        elif op.op == bs.OpType.CLEAR:
            s[1], s[2], s[3] = op.checksum, 0, {}
        else:
            key = (op.object_type, op.object_id, op.subkey)
            if key in s[3]:  # superseded
                ck = s[3].pop(key)[0]
                s[1] += ck
                s[2] -= ck
            if op.op == bs.OpType.REMOVE:
                s[1] += op.checksum
            else:
                s[3][key] = (op.checksum, op.data)
                s[2] += op.checksum

    def checksum(self, bucket):
        s = self.b.get(bucket)
        return (s[1] + s[2]) % M32 if s else 0

    def rows(self, bucket):
        s = self.b.get(bucket)
        return {k: v[1] for k, v in s[3].items()} if s else {}


def check_op(op, cp, hash_):
    assert op.op_id <= cp
    if op.op == bs.OpType.PUT:
        assert op.checksum == bs.checksum_put(op.object_type, op.object_id, op.data, hash_)
    elif op.op == bs.OpType.REMOVE:
        assert op.checksum == bs.checksum_remove(op.subkey, hash_) and op.data is None


def sync(st, c, cp, model, rng, stats):
    """Downloads everything up to cp, or (sometimes) only one small batch and stops there."""
    req = {b: c.b.get(b, [0])[0] for b in BUCKETS}
    if rng.random() < 0.3:  # a client that disconnects after one batch
        batch = st.bucket_data_batch(cp, req, limit=rng.randint(1, 5))
        for ch in batch.chunks:
            for op in ch.ops:
                check_op(op, cp, model.hash)
                c.apply(ch.bucket, op)
        stats["partial"] += 1
        return False
    if c.cp is not None and rng.random() < 0.5:  # only what changed since the last sync
        changes = st.checkpoint_changes(c.cp, cp)
        if not changes.invalidate_data_buckets:
            req = {b: after for b, after in req.items() if b in changes.updated_buckets}
            stats["incremental"] += 1
    for ch in st.bucket_data(cp, req, limit=rng.choice([1, 3, 1000]),
                             chunk_bytes=rng.choice([None, 40])):
        assert ch.after >= req[ch.bucket] and ch.next_after == ch.ops[-1].op_id
        for op in ch.ops:
            check_op(op, cp, model.hash)
            c.apply(ch.bucket, op)
    served = st.checksums(cp, BUCKETS)
    mcp, sums, live = model.at_cp
    assert mcp == cp
    for b in BUCKETS:
        want = sums[b] % M32
        signed = want - (1 << 32) if want >= 1 << 31 else want  # as the protocol carries it
        assert served[b].checksum == signed, f"served checksum of {b} at {cp}"
        assert c.checksum(b) == want, f"client checksum of {b} at {cp}"
        assert c.rows(b) == live[b], f"client rows of {b} at {cp}"
        assert served[b].count >= len(live[b])
    c.cp = cp
    stats["complete"] += 1
    return True


def run(seed, backend, hash_, path, steps):
    rng = random.Random(seed)
    model = Model(hash_)
    stats = {"partial": 0, "complete": 0, "incremental": 0, "compactions": 0, "reopens": 0}
    open_db = (lambda: bs.open(path, nosync=True)) if backend == "lmdb" else bs.open_memory
    db = open_db()
    sid = db.create_stream("rules", hash=hash_)
    st = db.storage(sid)
    w = st.writer()
    lsn = 0
    cp = 0
    clients = [Client() for _ in range(3)]
    # tables get ids 1, 2 in order of first use
    for t in TABLES:
        rows = [(BUCKETS[0], "items", "x", "{}")]
        w.save(t, "insert", RIDS[0], rows)
        model.save(t, "insert", RIDS[0], rows)
    w.snapshot_done("%08d" % 0)
    version = 0
    for step in range(steps):
        r = rng.random()
        if r < 0.55:
            t, rid = rng.choice(TABLES), rng.choice(RIDS)
            known = (t, rid) in model.records
            tag = rng.choice(["update", "update", "delete"]) if known else rng.choice(
                ["insert", "insert", "delete"])
            rows = []
            for b in rng.sample(BUCKETS, rng.randint(0, 3)):
                version += 1
                oid = rng.choice([rid, rid, "shared", ""])  # "" object ids too
                data = rng.choice(['{"v":%d}' % version, "", "ü" * (version % 4)])
                rows.append((b, rng.choice(["items", "lists"]), oid or rid, data))
            w.save(t, tag, rid, rows)
            model.save(t, tag, rid, [] if tag == "delete" else rows)
        elif r < 0.58:
            t = rng.choice(TABLES)
            w.truncate(t)
            model.truncate(t)
        elif r < 0.75:
            lsn += 1
            res = w.commit("%08d" % lsn)
            assert res.checkpoint_created
            cp = res.checkpoint
            model.checkpointed(cp)
        elif r < 0.8 and cp:
            kind = rng.choice(["full", "incremental", "named"])
            if kind == "full":
                st.compact(min_bucket_changes=1, min_change_ratio=0)
            elif kind == "incremental":
                st.compact(incremental_only=True, min_age_ms=0, op_budget=rng.randint(1, 50))
            else:
                st.compact(buckets=rng.sample(BUCKETS, 2))
            stats["compactions"] += 1
        elif r < 0.82 and backend == "lmdb" and cp:
            lsn += 1
            cp = w.commit("%08d" % lsn).checkpoint  # reopening discards unflushed saves
            model.checkpointed(cp)
            db.close()
            db = open_db()
            st = db.storage(sid)
            w = st.writer()
            stats["reopens"] += 1
        elif cp:
            i = rng.randrange(len(clients))
            if rng.random() < 0.1:
                clients[i] = Client()  # a new client, from scratch
            sync(st, clients[i], st.checkpoint().op_id, model, rng, stats)
    lsn += 1
    cp = w.commit("%08d" % lsn).checkpoint
    model.checkpointed(cp)
    st.compact(min_bucket_changes=1, min_change_ratio=0)
    for c in clients + [Client()]:  # everyone converges, incrementally and from scratch
        while not sync(st, c, cp, model, random.Random(0), stats):
            pass
    assert db.verify() == []
    db.close()
    return stats


@pytest.mark.parametrize("backend,hash_", [("lmdb", "xxh3"), ("memory", "sha256"),
                                           ("lmdb", "sha256")])
def test_sync_loop(backend, hash_, tmp_path):
    first = int(os.environ.get("BS_SEED", "1"))
    steps = 600 if os.environ.get("BS_TEST_QUICK") else 3000
    for seed in range(first, first + 2):
        try:
            stats = run(seed, backend, hash_, tmp_path / f"s{seed}.bsdb", steps)
        except AssertionError as e:
            raise AssertionError(f"[{backend}/{hash_} seed {seed}; reproduce with "
                                 f"BS_SEED={seed}] {e}") from e
        assert stats["complete"] > 5 and stats["incremental"] > 0 and stats["compactions"] > 0
