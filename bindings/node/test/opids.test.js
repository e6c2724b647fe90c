'use strict';
// Op ids above 2^53 from a real store, read exactly as BigInt. A stream's op head cannot be
// moved through the API (writing 2^53 ops is out of reach), so the LMDB store is prepared by the
// C helper tests/op_head_set.c (make node-test builds it and names it in BS_TEST_OP_HEAD_SET),
// the PostgreSQL one by an UPDATE of its stream row. Its ops then take the last ids below 2^63
// (the contract's bound): 2^63 - 3, 2^63 - 2, 2^63 - 1, none of which a double holds (each
// would round to 2^63); the next one is refused with BS_ELIMIT.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const { bs, tmpPath, readAll, PG_URL, psql, pgSchema } = require('./helpers.cjs');

const HEAD = 2n ** 63n - 4n;
const IDS = [HEAD + 1n, HEAD + 2n, HEAD + 3n];

/** The helper: BS_TEST_OP_HEAD_SET, else the one a `make` in this tree built. */
function helper() {
  const p = process.env.BS_TEST_OP_HEAD_SET ||
    path.join(__dirname, '..', '..', '..', 'build', 'tests', 'op_head_set');
  if (!fs.existsSync(p))
    throw new Error(`no ${p}: run make node-test, or make build/tests/op_head_set and set BS_TEST_OP_HEAD_SET`);
  return p;
}

/** Stream 1 created, written nothing; its op head set to HEAD by set(); {db} reopened. */
async function prepared(open, set) {
  let db = await open();
  assert.equal(await db.createStream('high'), 1);
  await db.close();
  set();
  db = await open();
  return db;
}

async function checkIds(db) {
  const st = await db.storage();
  const w = await st.createWriter({});
  try {
    await writeAndRead(st, w);
  } finally {
    await w.close();
    await st.close();
  }
}

async function writeAndRead(st, w) {
  const row = (i) => ({ bucket: 'b', table: 't', id: `r${i}`, data: `{"i":${i}}` });
  for (let i = 0; i < 2; i++)
    await w.save({ tag: 'insert', sourceTable: 't', afterReplicaId: `r${i}`, evaluated: [row(i)] });
  assert.deepEqual(await w.flush(), { flushed_op: IDS[1] });
  await w.save({ tag: 'insert', sourceTable: 't', afterReplicaId: 'r2', evaluated: [row(2)] });
  await w.markSnapshotDone('1');
  const r = await w.commit('1');
  assert.deepEqual(r, { checkpointBlocked: false, checkpointCreated: true, checkpoint: IDS[2],
    blockedReason: null });
  const cp = await st.getCheckpoint();
  assert.equal(cp.checkpoint, IDS[2]);
  assert.equal((await st.getStatus()).lastPersistedOp, IDS[2]);
  const ops = (await readAll(st, cp, ['b'])).get('b');
  assert.deepEqual(ops.map((o) => o.op_id), IDS);
  assert.ok(ops.every((o) => typeof o.op_id === 'bigint'));
  // reads from an op id above 2^53, and at one: exact, not rounded to 2^63
  assert.deepEqual((await readAll(st, IDS[1], ['b'])).get('b').map((o) => o.op_id), IDS.slice(0, 2));
  const after = [];
  for await (const c of st.getBucketDataBatch(cp, [{ bucket: 'b', start: IDS[0] }]))
    if (!('hasMore' in c)) after.push(...c.chunkData.data.map((o) => o.op_id), c.chunkData.after, c.chunkData.next_after);
  assert.deepEqual(after, [IDS[1], IDS[2], IDS[0], IDS[2]]);
  assert.equal((await st.getChecksums(IDS[1], ['b'])).get('b').count, 2);
  const ch = await st.getCheckpointChanges({ lastCheckpoint: IDS[1], nextCheckpoint: cp });
  assert.deepEqual(ch.updatedDataBuckets, new Set(['b']));
  // the id after 2^63 - 1 does not exist: the next flush is refused and the head stays
  await w.save({ tag: 'insert', sourceTable: 't', afterReplicaId: 'r3', evaluated: [row(3)] });
  await assert.rejects(w.flush(), { code: 'BS_ELIMIT' });
  assert.equal((await st.getStatus()).lastPersistedOp, IDS[2]);
}

test('lmdb: op ids up to 2^63 - 1 read back exactly as BigInt', async () => {
  const t = tmpPath();
  const db = await prepared(() => bs.open(t.file, { nosync: true }), () => {
    const r = spawnSync(helper(), [t.file, '1', String(HEAD)], { encoding: 'utf8' });
    assert.equal(r.status, 0, `op_head_set: ${r.error ?? r.stderr}`);
  });
  try {
    await checkIds(db);
  } finally {
    await db.close();
    t.cleanup();
  }
});

test('postgres: op ids up to 2^63 - 1 read back exactly as BigInt',
  { skip: PG_URL ? false : 'no PostgreSQL server (BS_TEST_PG_URL; make node-test starts one)' }, async () => {
    const s = pgSchema();
    const schema = new URL(s.url).searchParams.get('options').replace('-csearch_path=', '');
    const db = await prepared(() => bs.openPostgres(s.url, { nosync: true }),
      () => psql(`UPDATE ${schema}.bs_streams SET op_head = ${HEAD} WHERE id = 1`));
    try {
      await checkIds(db);
    } finally {
      await db.close();
      s.cleanup();
    }
  });
