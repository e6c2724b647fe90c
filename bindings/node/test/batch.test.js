'use strict';
// Writer.saveMany(): records cross in one Buffer (index.js's SaveEncoder, the addon's decoder),
// as save()'s one record does. The same records give the same database through either; a bad
// record anywhere in a batch rejects naming saves[i] with the library's message
// (bs_writer_check_save, the check of bs_writer_save) and queues none of the batch.
const test = require('node:test');
const assert = require('node:assert/strict');
const { bs, backends, readAll } = require('./helpers.cjs');

const MAX = { bucket: 480, replicaId: 256, table: 256, lookupKey: 480, objectName: 65535 };
const put = (id, bucket, data = '{}', extra = {}) => ({ tag: 'insert', sourceTable: 't', afterReplicaId: id,
  evaluated: [{ bucket, table: 'items', id, data }], ...extra });

/** Records with edge values everywhere a save takes bytes. */
function edgeRecords() {
  const recs = [
    put('', 'b', ''), // empty replica id, object id and data
    put('1', 'x', '1'), // one byte
    put('r'.repeat(MAX.replicaId), 'b'.repeat(MAX.bucket), '{}'),
    put('é'.repeat(MAX.replicaId / 2), 'é'.repeat(MAX.bucket / 2), '{"s":"ü😀"}'), // limits in bytes
    put('n', '日本', { v: 1.0, w: 1.5, s: 'ü' }), // an object: JSON.stringify, so 1.0 is stored as 1
    put('t', 'b', '{"v":1.0}'), // text as given: 1.0 stays
    put('u', 'b', '{"v":1}'),
    put(Buffer.from([0xff, 0, 0xfe]), Buffer.from([0xc3, 0x28]), Buffer.from('{"raw":true}')), // not UTF-8
    put('m', 'b', '{}', { currentData: { a: 1 }, beforeReplicaId: 'm0' }),
    { ...put('k', 'b'), sourceTable: { name: 'x'.repeat(MAX.table) } },
    put('p', 'b', '{}', { evaluatedParameters: [
      { lookup: ['by_user', 1], bucketParameters: [{ user: 'one' }] },
      { lookup: ['by_user', 1.0, 2n ** 62n, null, true, false, 'é', ''], bucketParameters: ['{"raw":1.0}', {}] },
      { lookup: [], bucketParameters: [] }] }),
    { tag: 'insert', sourceTable: 't', afterReplicaId: 'none' }, // no rows, no lookups
  ];
  for (let i = 0; i < 40; i++) recs.push(put(`r${i}`, `b${i % 7}`, JSON.stringify({ i, d: 'x'.repeat(i * 13) })));
  return recs;
}

/** Every op of one bucket (named by a string, or a Buffer when its bytes are not UTF-8). */
async function bucketOps(st, checkpoint, bucket) {
  const ops = [];
  for (let start = 0n, more = true; more;) {
    more = false;
    for await (const c of st.getBucketDataBatch(checkpoint, [{ bucket, start }])) {
      if ('hasMore' in c) continue;
      ops.push(...c.chunkData.data);
      start = c.chunkData.next_after, more = c.chunkData.has_more;
    }
  }
  return ops;
}

/** Everything a database holds, for comparing two of them (export: the LMDB backend's). */
async function contents(db, name) {
  const records = [];
  // the stream's meta and change records hold times (of the writes): their keys are compared
  if (name === 'lmdb') {
    for await (const r of db.export())
      records.push(r.table === 'meta' || r.table === 'changes' ? { table: r.table, key: r.key } : r);
  }
  const st = await db.storage();
  const cp = await st.getCheckpoint();
  const buckets = [];
  for await (const b of st.listBuckets()) buckets.push(b);
  const ops = [];
  for (const b of buckets) ops.push([b.bucket, await bucketOps(st, cp.checkpoint, b.bucket)]);
  const params = await st.getParameterSets(cp.checkpoint, [['by_user', 1], ['by_user', 1, 2n ** 62n, null, true,
    false, 'é', ''], []]);
  await st.close();
  assert.deepEqual(await db.verify(), []);
  return { records, buckets, ops, params };
}

async function ingest(db, recs, batched) {
  await db.createStream('s');
  const st = await db.storage();
  const w = await st.createWriter({ maxRecords: 5 }); // batches cross the flush bound
  if (batched) {
    await w.saveMany(recs.slice(0, 3));
    await w.saveMany([]);
    await w.saveMany(recs.slice(3));
  } else {
    for (const r of recs) await w.save(r);
  }
  await w.markSnapshotDone('1');
  assert.equal((await w.commit('1')).checkpointCreated, true);
  await w.close();
  await st.close();
}

for (const [name, open] of backends) {
  test(`${name}: saveMany and save give the same database, edge values exact`, async () => {
    const recs = edgeRecords();
    const a = await open(), b = await open();
    await ingest(a.db, recs, false);
    await ingest(b.db, recs, true);
    const ca = await contents(a.db, name), cb = await contents(b.db, name);
    assert.deepEqual(cb, ca);
    if (name === 'lmdb') assert.ok(ca.records.length > recs.length);
    // and the values are the ones given
    const ops = new Map(ca.ops);
    const data = (bucket, id) => ops.get(bucket).find((o) => o.object_id === id)?.data;
    assert.equal(data('b', ''), '');
    assert.equal(data('x', '1'), '1');
    assert.equal(data('b'.repeat(MAX.bucket), 'r'.repeat(MAX.replicaId)), '{}');
    assert.equal(data('é'.repeat(MAX.bucket / 2), 'é'.repeat(MAX.replicaId / 2)), '{"s":"ü😀"}');
    assert.equal(data('日本', 'n'), '{"v":1,"w":1.5,"s":"ü"}');
    assert.equal(data('b', 't'), '{"v":1.0}');
    assert.equal(data('b', 'u'), '{"v":1}');
    const raw = ca.ops.find(([k]) => Buffer.isBuffer(k) && k.equals(Buffer.from([0xc3, 0x28])))[1];
    assert.deepEqual(Buffer.from(raw[0].object_id), Buffer.from([0xff, 0, 0xfe]));
    assert.deepEqual(ca.params[0], { user: 'one' });
    assert.equal(ca.params.length, 3);
    a.cleanup(), b.cleanup();
  });

  test(`${name}: a bad record anywhere in a batch rejects naming saves[i] and queues nothing`, async () => {
    const { db, cleanup } = await open();
    await db.createStream('s');
    const st = await db.storage();
    const w = await st.createWriter({ maxRecords: 2 });
    const good = (i) => put(`g${i}`, 'good');
    const bad = [
      [put('x', 'a\uD800'), TypeError, /^saves\[2\]\.evaluated\[0\]\.bucket: not valid Unicode/],
      [put('\uDC00', 'b'), TypeError, /^saves\[2\]\.afterReplicaId: not valid Unicode/],
      // the library's checks, its messages exactly (tests/test_front.c t_check_save has the same)
      [{ ...put('x', 'b'), sourceTable: 'x'.repeat(MAX.table + 1) }, { code: 'BS_ETOOBIG' },
        'saves[2]: change->table is 257 bytes, over BS_MAX_TABLE_NAME (256)'],
      [put('x', 'é'.repeat(MAX.bucket / 2) + 'a'), { code: 'BS_ETOOBIG' },
        'saves[2]: rows[0].bucket is 481 bytes, over BS_MAX_BUCKET_NAME (480)'],
      [put('x', ''), { code: 'BS_EINVAL' }, 'saves[2]: rows[0].bucket is empty'],
      [{ ...put('x', 'b'), evaluated: [{ bucket: 'b', table: 't', id: 'x', data: '{}' },
        { bucket: 'b', table: 't', id: 'i'.repeat(MAX.objectName + 1), data: '{}' }] }, { code: 'BS_ETOOBIG' },
        'saves[2]: rows[1].object_id is 65536 bytes, over BS_MAX_OBJECT_NAME (65535)'],
      [put('x', 'b', '{}', { evaluated: [{ bucket: 'b', table: 't'.repeat(MAX.objectName + 1), id: 'x', data: '{}' }] }),
        { code: 'BS_ETOOBIG' }, 'saves[2]: rows[0].object_type is 65536 bytes, over BS_MAX_OBJECT_NAME (65535)'],
      [put('r'.repeat(MAX.replicaId + 1), 'b'), { code: 'BS_ETOOBIG' },
        'saves[2]: change->after_id is 257 bytes, over BS_MAX_REPLICA_ID (256)'],
      [{ ...put('x', 'b'), tag: 'update', beforeReplicaId: 'r'.repeat(MAX.replicaId + 1) }, { code: 'BS_ETOOBIG' },
        'saves[2]: change->before_id is 257 bytes, over BS_MAX_REPLICA_ID (256)'],
      [put('x', 'b', '{}', { evaluatedParameters: [{ lookup: ['k'.repeat(MAX.lookupKey)], bucketParameters: [] }] }),
        { code: 'BS_ETOOBIG' }, /^saves\[2\]: evaluatedParameters\[0\]\.lookup: .* over BS_MAX_LOOKUP_KEY/],
      [put('x', 'b', '{}', { evaluatedParameters: [{ lookup: [2n ** 63n], bucketParameters: [] }] }), RangeError,
        /^saves\[2\]\.evaluatedParameters\[0\]\.lookup\[0\]: bigint out of the int64 range/],
      [put('x', 'b', 7), TypeError, /^saves\[2\]\.evaluated\[0\]\.data: expected JSON text or an object/],
      [{ ...put('x', 'b'), tag: 'upsert' }, TypeError, /^saves\[2\]\.tag/],
      [null, TypeError, /^saves\[2\]: missing/],
    ];
    for (const [rec, kind, message] of bad) {
      const batch = [good(0), good(1), rec, good(3), good(4)];
      await assert.rejects(w.saveMany(batch), kind, String(message));
      await assert.rejects(w.saveMany(batch), { message }, String(message));
      assert.equal(await w.flush(), null, `${message}: nothing of the batch was queued`);
      if (typeof message === 'string') // save() of the record alone: the same message
        await assert.rejects(w.save(rec), { message: message.replace('saves[2]', 'record') });
    }
    await assert.rejects(w.saveMany('no'), { name: 'TypeError', message: /saves: expected an array/ });
    // the same refusals on a writer busy with a commit: the batch is refused before it waits
    const busy = w.commit('0');
    await assert.rejects(w.saveMany([good(0), put('x', 'a\uD800')]), TypeError);
    await assert.rejects(w.saveMany([good(0), put('x', 'b'.repeat(MAX.bucket + 1))]), { code: 'BS_ETOOBIG' });
    await busy;
    // nothing of those batches was queued: a flush has nothing to write
    assert.equal(await w.flush(), null);
    await w.markSnapshotDone('1');
    await w.commit('1');
    const cs = await st.getChecksums((await st.getCheckpoint()).checkpoint, ['good']);
    assert.equal(cs.get('good').count, 0);
    await w.close();
    // a snapshot writer takes INSERTs only: an UPDATE mid-batch refuses the batch
    const sw = await st.createWriter({ skipExistingRows: true });
    await assert.rejects(sw.saveMany([good(0), { ...put('x', 'b'), tag: 'update' }]),
      { code: 'BS_ESTATE', message: 'saves[1]: change->tag: a snapshot writer accepts INSERT only (contract.md 4.3)' });
    assert.equal(await sw.flush(), null);
    await sw.close();
    await st.close();
    cleanup();
  });

  test(`${name}: saveMany keeps call order with the writer's other calls and reports its flush`, async () => {
    const { db, cleanup } = await open();
    await db.createStream('s');
    const st = await db.storage();
    const w = await st.createWriter({ maxRecords: 4 });
    const upd = (data) => ({ ...put('o', 'b', data), tag: 'update', beforeReplicaId: 'o' });
    await w.markSnapshotDone('0');
    const calls = [w.saveMany([put('o', 'b', '{"v":0}')]), w.commit('1'),
      w.saveMany([upd('{"v":1}'), upd('{"v":2}')]), w.save(upd('{"v":3}')), w.saveMany([upd('{"v":4}')])];
    await Promise.all(calls);
    // a save made by a record's toJSON while that record is encoded: both arrive whole
    let inner;
    const outer = put('outer', 'b', { toJSON: () => ((inner = w.save(put('inner', 'b', '{"in":1}'))), { out: 1 }) });
    await w.saveMany([outer]);
    await inner;
    // five records from one batch: the bound (4) is reached once inside it
    const r = await w.saveMany([1, 2, 3, 4, 5].map((i) => put(`n${i}`, 'n')));
    assert.equal(typeof r?.flushed_op, 'bigint');
    const { checkpoint } = await w.commit('2');
    const ops = await readAll(st, checkpoint, ['b', 'n']);
    const last = (id) => ops.get('b').findLast((o) => o.object_id === id).data;
    assert.deepEqual([last('o'), last('outer'), last('inner')], ['{"v":4}', '{"out":1}', '{"in":1}']);
    assert.equal(ops.get('n').length, 5);
    await w.close();
    await st.close();
    cleanup();
  });
}
