'use strict';
// A sync loop through the binding (after tests/test_sync.c): a writer runs a random workload
// (inserts, updates that move rows between buckets, deletes, truncates, pipelined saves, flushes,
// commits), compactions run at random (full, incremental, on named buckets), and clients
// download their buckets with getBucketDataBatch in small batches, resuming from their
// positions (some from a stale copy of an earlier state), applying ops as the protocol's client
// does. Checked at every sync: the client's checksum equals getChecksums at the checkpoint, its
// live rows equal the model's at that checkpoint, every PUT's checksum is the PUT checksum of
// its fields, and getCheckpointChanges named every bucket the client saw change.
// Seeds: BS_SEED (first, default 1), BS_SEEDS (default 3), BS_STEPS (default 400).
const test = require('node:test');
const assert = require('node:assert/strict');
const { bs, backends, rng } = require('./helpers.cjs');

const TABLES = ['todos', 'lists'];
const BUCKETS = ['b0', 'b1', 'by_user["u1"]', 'global[]', 'ünï😀'];
const N_RIDS = 10;
const SEED = Number(process.env.BS_SEED ?? 1);
const SEEDS = Number(process.env.BS_SEEDS ?? 3);
const STEPS = Number(process.env.BS_STEPS ?? 400);
const stats = { PUT: 0, REMOVE: 0, MOVE: 0, CLEAR: 0, syncs: 0, resumes: 0, compactions: 0 };

/** The protocol client's state of one bucket: live rows and the running checksum. */
class ClientBucket {
  constructor() {
    this.after = 0n;
    this.sum = 0;
    this.rows = new Map();
  }
  apply(op) {
    const key = `${op.object_type}/${op.object_id}/${op.subkey}`;
    if (op.op === 'CLEAR') {
      this.rows.clear();
      this.sum = op.checksum;
      return;
    }
    this.sum = (this.sum + op.checksum) >>> 0;
    if (op.op === 'PUT') this.rows.set(key, `${op.object_type}/${op.object_id}/${op.data}`);
    else if (op.op === 'REMOVE') this.rows.delete(key);
  }
  clone() {
    const c = new ClientBucket();
    c.after = this.after, c.sum = this.sum, c.rows = new Map(this.rows);
    return c;
  }
}

function liveRows(model) {
  // model: source key -> outputs; the live rows of each bucket, as sorted strings
  const out = new Map(BUCKETS.map((b) => [b, []]));
  for (const outputs of model.values()) {
    // one source row's outputs with the same (bucket, table, id) are one row: the last wins
    const rows = new Map(outputs.map((r) => [`${r.bucket}\0${r.table}/${r.id}`, r]));
    for (const r of rows.values()) out.get(r.bucket).push(`${r.table}/${r.id}/${r.data}`);
  }
  for (const rows of out.values()) rows.sort();
  return out;
}

async function runSeed(open, seed) {
  const r = rng(seed);
  const { db, cleanup } = await open();
  await db.createStream('sync', { checksum: r() < 0.5 ? 'xxh3' : 'sha256' });
  const st = await db.storage();
  const w = await st.createWriter({ maxRecords: 1 + r.int(20) });
  const hash = (await db.listStreams())[0].checksum;
  const model = new Map(); // `${table}/${rid}` -> outputs
  const atCheckpoint = new Map(); // checkpoint -> live rows
  const clients = [0, 1, 2].map(() => new Map(BUCKETS.map((b) => [b, new ClientBucket()])));
  const stale = [];
  let pending = [];
  let lsn = 0;
  let version = 0;
  let snapshotDone = false;

  const outputs = (rid) => {
    const n = r.int(3);
    const rows = [];
    for (let i = 0; i < n; i++)
      rows.push({ bucket: r.pick(BUCKETS), table: r.pick(['todo', 'list']), id: `o${rid % 4}`,
        data: r() < 0.1 ? '' : JSON.stringify({ rid, v: version++, s: 'ü€'.repeat(r.int(3)) }) });
    return rows;
  };
  const save = async () => {
    const table = r.pick(TABLES);
    const rid = r.int(N_RIDS);
    const key = `${table}/${rid}`;
    let rec;
    if (model.has(key) && r() < 0.3) {
      rec = { tag: 'delete', sourceTable: table, beforeReplicaId: `r${rid}` };
      model.delete(key);
    } else {
      const evaluated = outputs(rid);
      rec = { tag: model.has(key) ? 'update' : 'insert', sourceTable: table, afterReplicaId: `r${rid}`, evaluated };
      model.set(key, evaluated);
    }
    const p = w.save(rec);
    if (r() < 0.4) pending.push(p); // pipelined: the next calls queue behind it
    else await p;
  };
  const drain = async () => {
    await Promise.all(pending);
    pending = [];
  };
  const commit = async () => {
    if (!snapshotDone && r() < 0.5) {
      await w.markSnapshotDone(String(lsn).padStart(8, '0'));
      snapshotDone = true;
    }
    const res = await w.commit(String(++lsn).padStart(8, '0'));
    await drain();
    if (res.checkpointCreated) atCheckpoint.set(res.checkpoint, liveRows(model));
  };
  const sync = async (ci) => {
    const cp = await st.getCheckpoint();
    if (cp.checkpoint === 0n) return;
    const client = clients[ci];
    const names = BUCKETS.filter(() => r() < 0.8);
    const from = new Map(names.map((b) => [b, client.get(b).after]));
    const options = { limit: 1 + r.int(8), chunkLimitBytes: r() < 0.5 ? 1 + r.int(200) : undefined };
    for (let more = true; more;) {
      more = false;
      const req = names.map((b) => ({ bucket: b, start: client.get(b).after }));
      for await (const c of st.getBucketDataBatch(cp, req, options)) {
        if ('hasMore' in c) {
          more = more || c.hasMore;
          continue;
        }
        const d = c.chunkData;
        const cb = client.get(d.bucket);
        assert.equal(d.after, cb.after, `seed ${seed}: chunk after`);
        assert.ok(c.targetOp === null || c.targetOp <= cp.checkpoint, `seed ${seed}: targetOp`);
        for (const op of d.data) {
          assert.ok(op.op_id > cb.after && op.op_id <= cp.checkpoint, `seed ${seed}: op id range`);
          if (op.op === 'PUT')
            assert.equal(op.checksum, bs.checksumPut(hash, op.object_type, op.object_id, op.data));
          cb.apply(op);
          stats[op.op]++;
          cb.after = op.op_id;
        }
        assert.equal(cb.after, d.next_after);
        more = more || d.has_more;
      }
    }
    const sums = await st.getChecksums(cp, names);
    stats.syncs++;
    const expected = atCheckpoint.get(cp.checkpoint);
    for (const b of names) {
      const cb = client.get(b);
      assert.equal(cb.sum | 0, sums.get(b).checksum, `seed ${seed}: checksum of ${b} at ${cp.checkpoint}`);
      assert.deepEqual([...cb.rows.values()].sort(), expected.get(b), `seed ${seed}: rows of ${b}`);
      if (cb.after < cp.checkpoint) cb.after = cp.checkpoint; // positions advance to the checkpoint
    }
    const changes = await st.getCheckpointChanges({ lastCheckpoint: 0n, nextCheckpoint: cp });
    for (const b of names)
      if (client.get(b).rows.size && !changes.invalidateDataBuckets)
        assert.ok(changes.updatedDataBuckets.has(b), `seed ${seed}: changes name ${b}`);
    for (const [from_b, after] of from) if (after > cp.checkpoint) throw new Error(`${from_b} ahead`);
  };

  for (let step = 0; step < STEPS; step++) {
    const x = r();
    if (x < 0.55) await save();
    else if (x < 0.68) await commit();
    else if (x < 0.82) await sync(r.int(clients.length));
    else if (x < 0.85) {
      await drain();
      await w.flush();
    } else if (x < 0.87) {
      const t = r.pick(TABLES);
      await drain();
      await w.truncate([t]);
      for (const k of [...model.keys()]) if (k.startsWith(`${t}/`)) model.delete(k);
    } else if (x < 0.93) {
      const kind = r.int(3);
      stats.compactions++;
      await st.compact(kind === 0 ? {} : kind === 1 ? { incrementalOnly: true, minAgeMs: 0 }
        : { compactBuckets: [r.pick(BUCKETS)], maxOpsPerTransaction: 2 + r.int(5) });
    } else if (x < 0.96) {
      const ci = r.int(clients.length); // remember a state to resume from later
      stale.push([ci, new Map([...clients[ci]].map(([b, c]) => [b, c.clone()]))]);
    } else if (stale.length) {
      const [ci, state] = stale.splice(r.int(stale.length), 1)[0];
      clients[ci] = state; // a client resumes from an old position (property 3)
      stats.resumes++;
    }
  }
  await drain();
  await w.markSnapshotDone('00000000');
  await commit();
  for (let ci = 0; ci < clients.length; ci++) await sync(ci);
  await w.close();
  await st.close();
  await db.close();
  cleanup();
}

for (const [name, open] of backends)
  test(`${name}: sync loop, ${SEEDS} seeds from ${SEED}, ${STEPS} steps`, async () => {
    for (const k of Object.keys(stats)) stats[k] = 0;
    for (let seed = SEED; seed < SEED + SEEDS; seed++) {
      try {
        await runSeed(open, seed);
      } catch (e) {
        e.message = `seed ${seed} (BS_SEED=${seed} BS_SEEDS=1): ${e.message}`;
        throw e;
      }
    }
    if (process.env.BS_VERBOSE) console.log(name, stats);
    // the workload reached what it is meant to check
    assert.ok(stats.MOVE > 0 && stats.CLEAR > 0 && stats.REMOVE > 0 && stats.resumes > 0);
  });
