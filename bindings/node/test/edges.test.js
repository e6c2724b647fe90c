'use strict';
// Edge values through every string field and every number the binding takes, generated from
// tables (tests/test_edges.py has the same tables for Python): the empty value, one byte, one
// byte that is not UTF-8, a NUL byte, non-ASCII and astral text, the field's maximum length in
// bytes (storage.h's BS_MAX_*, ASCII and two-byte characters) and one over, lone surrogates;
// 1, 1.0 and 1n against 1.5 where an integer is taken; big integers in parameter rows.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { bs, backends } = require('./helpers.cjs');

// the limits as the package's own copy of storage.h has them (deps/, what it compiles)
const header = fs.readFileSync(path.join(__dirname, '..', 'deps', 'storage.h'), 'utf8');
const MAX = Object.fromEntries([...header.matchAll(/^#define (BS_MAX_\w+)\s+([\d\su*()]+?)\s*(?:\/\*.*)?$/gm)]
  .map((m) => [m[1], m[2].replace(/u/g, '').match(/\d+/g).reduce((a, b) => a * Number(b), 1)]));

const bytes = (v) => (typeof v === 'string' ? Buffer.from(v, 'utf8') : Buffer.from(v));
const LONE = ['a\uD800', 'a\uDC00'];

/** [name, value, expected code or null] for a field of at most limit bytes, at least least. */
function values(limit, least) {
  const two = 'é'.repeat(Math.floor(limit / 2)) + 'x'.repeat(limit % 2);
  const over2 = 'é'.repeat(Math.floor((limit + 1) / 2)) + 'x'.repeat((limit + 1) % 2);
  return [
    ['empty', '', least === 0 ? null : 'BS_EINVAL'],
    ['one byte', 'x', null],
    ['one non-UTF-8 byte', new Uint8Array([0xff]), null],
    ['bytes', new Uint8Array([0, 0xfe, 0x2d, 0x80]), null],
    ['non-ASCII', 'ü', null],
    ['astral', '日本語 🙂', null],
    ['maximum', 'x'.repeat(limit), null],
    ['maximum, two-byte characters', two, null],
    ['one over', 'x'.repeat(limit + 1), 'BS_ETOOBIG'],
    ['one over, two-byte characters', over2, 'BS_ETOOBIG'],
    ...LONE.map((s) => [`lone surrogate ${JSON.stringify(s)}`, s, 'TypeError']),
  ];
}

const row = (f) => ({ bucket: f.bucket ?? 'b', table: f.otype ?? 'o', id: f.oid ?? 'i', data: f.data ?? '{}' });

/** One save of a row with the given fields (else defaults), committed; its op read back, and
 * its bucket read back three ways. */
async function saveAndRead(st, f) {
  const w = await st.createWriter();
  try {
    await w.save({ tag: 'insert', sourceTable: f.table ?? 't', afterReplicaId: f.rid ?? 'r',
      currentData: 'kept', evaluated: [row(f)] });
    await w.markSnapshotDone('');
    const { checkpoint } = await w.commit('1');
    const bucket = f.bucket ?? 'b';
    const chunks = [];
    for await (const c of st.getBucketDataBatch(checkpoint, [{ bucket, start: 0n }]))
      if (!('hasMore' in c)) chunks.push(c.chunkData);
    assert.equal(chunks.length, 1);
    assert.deepEqual(bytes(chunks[0].bucket), bytes(bucket));
    const listed = [];
    for await (const b of st.listBuckets()) listed.push(bytes(b.bucket));
    assert.deepEqual(listed, [bytes(bucket)]);
    assert.equal((await st.getChecksums(checkpoint, [bucket])).get(bucket).count, 1);
    return { w, op: chunks[0].data[0] };
  } catch (e) {
    await w.close();
    throw e;
  }
}

async function readOp(st, f, field) {
  const { w, op } = await saveAndRead(st, f);
  await w.close();
  return op[field];
}

/** The value under test (v) when the source row of table and id reads back as saved. */
async function sourceRow(st, f, table, id, v) {
  const { w } = await saveAndRead(st, f);
  try {
    return (await w.getSourceRow(table, id)) === 'kept' ? bytes(v) : null;
  } finally {
    await w.close();
  }
}

/** The longest string a lookup of one value takes (BS_MAX_LOOKUP_KEY is of the encoded key). */
async function lookupLimit() {
  const db = await bs.openMemory();
  await db.createStream('s');
  const st = await db.storage();
  const w = await st.createWriter();
  let n = 1;
  const fits = (k) => w.save({ tag: 'insert', sourceTable: 't', afterReplicaId: 'r',
    evaluatedParameters: [{ lookup: ['x'.repeat(k)], bucketParameters: [] }] }).then(() => true,
    (e) => (e.code === 'BS_ETOOBIG' ? false : Promise.reject(e)));
  while (await fits(n + 1)) n++;
  await w.close();
  await st.close();
  await db.close();
  return n;
}

// field -> [limit, least, run(st, value) -> the bytes read back]
const FIELDS = {
  bucket: [MAX.BS_MAX_BUCKET_NAME, 1, async (st, v) => (await readOp(st, { bucket: v }, 'op'), bytes(v))],
  object_type: [MAX.BS_MAX_OBJECT_NAME, 0, async (st, v) => bytes(await readOp(st, { otype: v }, 'object_type'))],
  object_id: [MAX.BS_MAX_OBJECT_NAME, 0, async (st, v) => bytes(await readOp(st, { oid: v }, 'object_id'))],
  data: [MAX.BS_MAX_OP_DATA, 0, async (st, v) => bytes(await readOp(st, { data: v }, 'data'))],
  sourceTable: [MAX.BS_MAX_TABLE_NAME, 1, (st, v) => sourceRow(st, { table: v }, v, 'r', v)],
  replicaId: [MAX.BS_MAX_REPLICA_ID, 0, (st, v) => sourceRow(st, { rid: v }, 't', v, v)],
  lsn: [MAX.BS_MAX_LSN, 0, async (st, v) => {
    const w = await st.createWriter();
    try {
      await w.markSnapshotDone('');
      assert.equal((await w.commit(v)).checkpointCreated, true);
    } finally {
      await w.close();
    }
    const cp = await st.getCheckpoint();
    assert.deepEqual(bytes((await st.getStatus()).lsn), bytes(cp.lsn));
    return bytes(cp.lsn);
  }],
  'stream name': [MAX.BS_MAX_STREAM_NAME, 1, async (st, v, db) => {
    const id = await db.createStream(v);
    return bytes((await db.listStreams()).find((s) => s.id === id).name);
  }],
  user_id: [MAX.BS_MAX_USER_ID, 0, async (st, v) => {
    const r = await st.createManagedWriteCheckpoints([{ user_id: v, heads: { 1: '0' } }]);
    assert.deepEqual([...r.writeCheckpoints.values()], [1n]);
    assert.equal(await st.lastWriteCheckpoint({ user_id: v, heads: { 1: '0' } }), 1n);
    return bytes([...r.writeCheckpoints.keys()][0]);
  }],
  'lookup value': [null, 0, async (st, v) => {
    const w = await st.createWriter();
    try {
      await w.save({ tag: 'insert', sourceTable: 't', afterReplicaId: 'r',
        evaluatedParameters: [{ lookup: [v], bucketParameters: [{ found: 1 }] }] });
      await w.markSnapshotDone('');
      const { checkpoint } = await w.commit('1');
      assert.deepEqual(await st.getParameterSets(checkpoint, [[v]]), [{ found: 1 }]);
      const ch = await st.getCheckpointChanges({ lastCheckpoint: 0n, nextCheckpoint: checkpoint });
      return bytes(ch.updatedParameterLookups[0][0]);
    } finally {
      await w.close();
    }
  }],
};

test('the tables reach the limits of storage.h', async () => {
  assert.equal(MAX.BS_MAX_BUCKET_NAME, 480);
  assert.equal(MAX.BS_MAX_OBJECT_NAME, 65535);
  assert.equal(MAX.BS_MAX_OP_DATA, 15 * 1024 * 1024);
  for (const [field, [limit]] of Object.entries(FIELDS))
    assert.ok(field === 'lookup value' || limit > 0, field);
  const v = values(480, 1);
  assert.deepEqual([v[6][1], v[7][1], v[8][1], v[9][1]].map((x) => bytes(x).length), [480, 480, 481, 481]);
});

for (const [name, open] of backends) {
  test(`${name}: every string field takes its edge values, or refuses them with the right code`, async () => {
    FIELDS['lookup value'][0] = await lookupLimit();
    for (const [field, [limit, least, run]] of Object.entries(FIELDS)) {
      for (const [what, value, want] of values(limit, least)) {
        const { db, cleanup } = await open();
        const st = await db.storage(await db.createStream('s'));
        let expect = want;
        if (field === 'stream name' && !expect && bytes(value).includes(0)) expect = 'BS_EINVAL'; // a C string
        const at = `${field}: ${what}`;
        try {
          if (!expect) assert.deepEqual(await run(st, value, db), bytes(value), at);
          else if (expect === 'TypeError')
            await assert.rejects(run(st, value, db), { name: 'TypeError', code: 'BS_EINVAL', message: /not valid Unicode/ }, at);
          else
            await assert.rejects(run(st, value, db), (e) => e.code === expect &&
              (expect !== 'BS_ETOOBIG' || /over BS_MAX_/.test(e.message)), at);
        } finally {
          await st.close();
          await db.close();
          cleanup();
        }
      }
    }
  });
}

// ---- numbers: 1, 1.0 and 1n against 1.5 ------------------------------------------------------

async function filled() {
  const db = await bs.openMemory();
  const st = await db.storage(await db.createStream('s'));
  const w = await st.createWriter();
  for (let v = 0; v < 2; v++)
    await w.save({ tag: 'update', sourceTable: 't', afterReplicaId: 'r',
      evaluated: [{ bucket: 'b', table: 'o', id: 'i', data: `{"v":${v}}` }] });
  await w.markSnapshotDone('');
  await w.commit('1');
  await w.close();
  return { db, st };
}

const drain = async (it) => {
  for await (const x of it) void x;
};
async function custom(st, checkpoint, at) {
  st.setWriteCheckpointMode('custom');
  const w = await st.createWriter();
  try {
    await w.addCustomWriteCheckpoint({ user_id: 'u', checkpoint, checkpoint_requested_at: at });
    await w.flush();
  } finally {
    await w.close();
    st.setWriteCheckpointMode('managed');
  }
}

// [name, bigints taken, call(st, db, n)]: an integer argument takes 1 and 1.0 (one number in JS)
// and, where it takes a bigint, 1n; it refuses 1.5 and NaN (RangeError), -1 (but a time before
// the epoch to delete requests before), '1' and true
const INTS = [
  ['getChecksums checkpoint', true, (st, db, n) => st.getChecksums(n, ['b'])],
  ['getBucketDataBatch checkpoint', true, (st, db, n) => drain(st.getBucketDataBatch(n, [{ bucket: 'b' }]))],
  ['getBucketDataBatch start', true, (st, db, n) => drain(st.getBucketDataBatch(2n, [{ bucket: 'b', start: n }]))],
  ['getBucketDataBatch limit', true, (st, db, n) => drain(st.getBucketDataBatch(2n, [{ bucket: 'b' }], { limit: n }))],
  ['getBucketDataBatch chunkLimitBytes', true,
    (st, db, n) => drain(st.getBucketDataBatch(2n, [{ bucket: 'b' }], { chunkLimitBytes: n }))],
  ['listBuckets page', true, (st, db, n) => drain(st.listBuckets({ page: n }))],
  ['getParameterSets limit', true, (st, db, n) => st.getParameterSets(2n, [['k']], n)],
  ['getCheckpointChanges lastCheckpoint', true,
    (st, db, n) => st.getCheckpointChanges({ lastCheckpoint: n, nextCheckpoint: 2n })],
  ['compact maxOpId', true, (st, db, n) => st.compact({ maxOpId: n })],
  ['compact minBucketChanges', true, (st, db, n) => st.compact({ minBucketChanges: n })],
  ['compact opBudget', true, (st, db, n) => st.compact({ incrementalOnly: true, opBudget: n })],
  ['compact maxOpsPerTransaction', true, (st, db, n) => st.compact({ maxOpsPerTransaction: n })],
  ['compact memoryLimitMB', true, (st, db, n) => st.compact({ memoryLimitMB: n })],
  ['compact moveBatchLimit', true, (st, db, n) => st.compact({ moveBatchLimit: n })],
  ['compact minAgeMs', false, (st, db, n) => st.compact({ incrementalOnly: true, minAgeMs: n })],
  ['compact deleteCheckpointRequestsBefore', false,
    (st, db, n) => st.compact({ deleteCheckpointRequestsBefore: n })],
  ['deleteCheckpointRequestsBefore', false, (st, db, n) => st.deleteCheckpointRequestsBefore(n)],
  ['waitCheckpoint timeoutMs', false, (st, db, n) => st.waitCheckpoint(null, { timeoutMs: n })],
  ['storage streamId', true, async (st, db, n) => (await db.storage(n)).close()],
  ['export stream', true, (st, db, n) => drain(db.export(n)).catch((e) => {
    if (e.code !== 'BS_EUNSUPPORTED') throw e; // the memory backend: the argument was taken
  })],
  ['createWriter maxRecords', true, async (st, db, n) => (await st.createWriter({ maxRecords: n })).close()],
  ['addCustomWriteCheckpoint checkpoint', true, (st, db, n) => custom(st, n, undefined)],
  ['addCustomWriteCheckpoint checkpoint_requested_at', false, (st, db, n) => custom(st, 1n, n)],
  ['createManagedWriteCheckpoints checkpoint_request_id', true,
    (st, db, n) => st.createManagedWriteCheckpoints([{ user_id: 'u', heads: {}, checkpoint_request_id: n }])],
  ['createManagedWriteCheckpoints checkpoint_requested_at', false,
    (st, db, n) => st.createManagedWriteCheckpoints([{ user_id: 'u', heads: {}, checkpoint_requested_at: n }])],
];

test('integer arguments take 1, 1.0 and (where bigints are taken) 1n, and refuse 1.5', async () => {
  for (const [name, big, call] of INTS) {
    const { db, st } = await filled();
    try {
      for (const n of big ? [1, 1.0, 1n] : [1, 1.0]) await call(st, db, n);
      for (const n of [1.5, NaN]) await assert.rejects(call(st, db, n), { name: 'RangeError', code: 'BS_EINVAL' }, `${name}(${n})`);
      if (name === 'deleteCheckpointRequestsBefore') await call(st, db, -1);
      else await assert.rejects(call(st, db, -1), { code: 'BS_EINVAL' }, `${name}(-1)`);
      for (const n of ['1', true]) await assert.rejects(call(st, db, n), { code: 'BS_EINVAL' }, `${name}(${n})`);
      if (!big) await assert.rejects(call(st, db, 1n), { code: 'BS_EINVAL' }, `${name}(1n)`);
    } finally {
      await st.close();
      await db.close();
    }
  }
});

test('ratios take 1 and 1.0 alike (one number in JS) and refuse what is not a number', async () => {
  for (const name of ['minChangeRatio', 'defragmentRatio']) {
    const got = [];
    for (const x of [1, 1.0]) {
      const { db, st } = await filled();
      const s = await st.compact({ minBucketChanges: 1, [name]: x });
      got.push([s.bucketsCompacted, s.opsMoved, s.opsCleared]);
      for (const bad of ['1', true, 1n]) await assert.rejects(st.compact({ [name]: bad }), { code: 'BS_EINVAL' }, name);
      await st.close();
      await db.close();
    }
    assert.deepEqual(got[0], got[1], name);
  }
});

test('a time the C API would read as "none" or "now" (0, the epoch) is refused where it would', async () => {
  const { db, st } = await filled();
  for (const at of [0, new Date(0), -1]) {
    await assert.rejects(st.compact({ deleteCheckpointRequestsBefore: at }), { name: 'RangeError', code: 'BS_EINVAL' });
    await assert.rejects(st.createManagedWriteCheckpoints([{ user_id: 'u', heads: {}, checkpoint_requested_at: at }]),
      { name: 'RangeError', code: 'BS_EINVAL' });
  }
  await st.compact({ deleteCheckpointRequestsBefore: 1 });
  await st.close();
  await db.close();
});

test('lookup numbers: 1 and 1.0 and 1n are one key, true and "1" others', async () => {
  const cases = [[1, 1n, true], [0, 0n, true], [-5, -5n, true], [2 ** 53, 2n ** 53n, true], [1, true, false],
    [0, false, false], [1, '1', false], [1.5, 1, false], [2n ** 63n - 1n, 2n ** 63n - 2n, false]];
  for (const [one, other, same] of cases) {
    const db = await bs.openMemory();
    const st = await db.storage(await db.createStream('s'));
    const w = await st.createWriter();
    await w.save({ tag: 'insert', sourceTable: 't', afterReplicaId: 'r',
      evaluatedParameters: [{ lookup: [one], bucketParameters: [{ v: 1 }] }] });
    await w.markSnapshotDone('');
    const { checkpoint } = await w.commit('1');
    assert.deepEqual(await st.getParameterSets(checkpoint, [[other]]), same ? [{ v: 1 }] : [], `${one} ${other}`);
    await w.close();
    await st.close();
    await db.close();
  }
});

test('lookup integers at the int64 bounds', async () => {
  const db = await bs.openMemory();
  const st = await db.storage(await db.createStream('s'));
  const w = await st.createWriter();
  for (const n of [2n ** 63n, -(2n ** 63n) - 1n])
    await assert.rejects(w.save({ tag: 'insert', sourceTable: 't', afterReplicaId: 'r',
      evaluatedParameters: [{ lookup: [n], bucketParameters: [] }] }), { name: 'RangeError', code: 'BS_EINVAL' });
  const ok = [2n ** 63n - 1n, -(2n ** 63n)];
  for (const [i, n] of ok.entries())
    await w.save({ tag: 'insert', sourceTable: 't', afterReplicaId: `r${i}`,
      evaluatedParameters: [{ lookup: [n], bucketParameters: [{ i }] }] });
  await w.markSnapshotDone('');
  const { checkpoint } = await w.commit('1');
  for (const [i, n] of ok.entries()) {
    assert.deepEqual(await st.getParameterSets(checkpoint, [[n]]), [{ i }]);
    assert.deepEqual(await st.getParameterSets(checkpoint, [[n > 0n ? n - 1n : n + 1n]]), []);
  }
  await w.close();
  await st.close();
  await db.close();
});

// ---- big integers in parameter rows ----------------------------------------------------------

const BIG = [0n, -1n, 2n ** 31n, 2n ** 32n + 1n, 2n ** 53n - 1n, 2n ** 53n, 2n ** 53n + 1n, -(2n ** 53n) - 1n,
  2n ** 63n - 1n, -(2n ** 63n), 2n ** 63n, 2n ** 64n + 1n, -(10n ** 30n), 10n ** 30n + 7n];

for (const [name, open] of backends) {
  test(`${name}: big integers in parameter rows come back exact (bigint beyond 2^53)`, async () => {
    const { db, cleanup } = await open();
    const st = await db.storage(await db.createStream('s'));
    const w = await st.createWriter();
    const text = BIG.map((n) => `{"n":${n},"a":[${n},1.5],"o":{"k":${n}}}`);
    await w.save({ tag: 'insert', sourceTable: 't', afterReplicaId: 'r',
      evaluatedParameters: [{ lookup: ['k'], bucketParameters: text }] });
    await w.markSnapshotDone('');
    const { checkpoint } = await w.commit('1');
    const exact = (n) => (n >= -(2n ** 53n) + 1n && n <= 2n ** 53n - 1n ? Number(n) : n);
    const key = (r) => String(r.n);
    const got = (await st.getParameterSets(checkpoint, [['k']])).sort((a, b) => key(a).localeCompare(key(b)));
    const want = BIG.map((n) => ({ n: exact(n), a: [exact(n), 1.5], o: { k: exact(n) } }))
      .sort((a, b) => key(a).localeCompare(key(b)));
    assert.deepEqual(got, want);
    await w.close();
    await st.close();
    await db.close();
    cleanup();
  });
}
