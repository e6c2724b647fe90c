'use strict';
// The binding's API against both backends: writing, reading, checksums, parameter lookups,
// write checkpoints, compaction, lifecycle; golden values from the reference service.
const test = require('node:test');
const assert = require('node:assert/strict');
const { bs, tmpPath, backends, readAll } = require('./helpers.cjs');

const row = (bucket, id, data, table = 'test') => ({ bucket, table, id, data });

async function stream(db, options) {
  await db.createStream('v1', options);
  const st = await db.storage();
  const w = await st.createWriter({});
  return { st, w };
}

for (const [name, open] of backends) {
  test(`${name}: save, commit, read back with the reference service's checksums`, async () => {
    const { db, cleanup } = await open();
    const { st, w } = await stream(db, { checksum: 'sha256' });
    assert.equal(await w.save({ tag: 'insert', sourceTable: 'todos', afterReplicaId: 't1',
      evaluated: [row('b', 't1', '{"id":"t1"}')] }), null);
    await w.save({ tag: 'insert', sourceTable: { name: 'todos' }, afterReplicaId: 't2',
      evaluated: [row('b', 't2', { id: 't2' })] }); // an object is stored as its JSON text
    const blocked = await w.commit('0/1');
    assert.equal(blocked.checkpointBlocked, true); // no snapshot_done yet
    assert.equal(blocked.blockedReason, 'snapshot_not_done');
    await w.markSnapshotDone([], '0/1');
    const r = await w.commit('0/1');
    assert.deepEqual(r, { checkpointBlocked: false, checkpointCreated: true, checkpoint: 2n,
      blockedReason: null });
    assert.equal(w.lastCheckpointLsn, '0/1');
    const cp = await st.getCheckpoint();
    assert.equal(cp.checkpoint, 2n);
    assert.equal(cp.lsn, '0/1');
    const ops = (await readAll(st, cp, ['b'])).get('b');
    assert.deepEqual(ops.map((o) => [o.op_id, o.op, o.object_id, o.data, o.checksum]), [
      [1n, 'PUT', 't1', '{"id":"t1"}', 2634521662],
      [2n, 'PUT', 't2', '{"id":"t2"}', 4243212114],
    ]);
    assert.equal(bs.checksumPut('sha256', 'test', 't2', '{"id":"t2"}'), 4243212114);
    assert.match(ops[0].subkey, /^00000001\/[0-9a-f]{32}$/);
    const cs = await st.getChecksums(cp, ['b', { bucket: 'nope' }]);
    assert.deepEqual(cs.get('b'), { bucket: 'b', checksum: (2634521662 + 4243212114) | 0, count: 2 });
    assert.deepEqual(cs.get('nope'), { bucket: 'nope', checksum: 0, count: 0 });
    const status = await st.getStatus();
    assert.equal(status.state, 'ACTIVE');
    assert.equal(status.snapshotDone, true);
    assert.equal(status.lastPersistedOp, 2n);
    assert.deepEqual(await db.listStreams(), [{ id: 1, name: 'v1', state: 'ACTIVE', checksum: 'sha256' }]);
    await w.close();
    await st.close();
    await db.close();
    cleanup();
  });

  test(`${name}: multi-byte strings of every length cross whole`, async () => {
    // a string copied in one pass into the rest of an arena block was cut short when the cut
    // fell inside a character of 2 to 4 bytes (get_bytes)
    const { db, cleanup } = await open();
    const { st, w } = await stream(db);
    const want = [];
    for (const ch of ['é', '€', '😀'])
      for (let n = 1; n <= 300; n++) {
        const data = 'a'.repeat(n % 5) + ch.repeat(n);
        want.push(data);
        await w.save({ tag: 'insert', sourceTable: 't', afterReplicaId: `${ch}${n}`,
          evaluated: [row('b', `${ch}${n}`, data)] });
      }
    await w.markSnapshotDone('1');
    const { checkpoint } = await w.commit('1');
    assert.deepEqual((await readAll(st, checkpoint, ['b'])).get('b').map((o) => o.data), want);
    await w.close();
    await st.close();
    await db.close();
    cleanup();
  });

  test(`${name}: edge values cross unchanged (empty, non-ASCII, bytes, maximum lengths)`, async () => {
    const { db, cleanup } = await open();
    const { st, w } = await stream(db);
    const long = 'x'.repeat(480);
    const cases = [['', 'empty-data'], ['ü€😀', '{"n":"ü€😀"}'], ['a', '{}'], ['', '""']];
    let i = 0;
    for (const [id, data] of cases)
      await w.save({ tag: 'insert', sourceTable: 't', afterReplicaId: `r${i++}`,
        evaluated: [row('bücket😀', id, data, 'tÿpe')] });
    await w.save({ tag: 'insert', sourceTable: 't', afterReplicaId: Buffer.from([0, 255, 1]),
      evaluated: [row(long, 'one', '{}')] });
    await w.save({ tag: 'insert', sourceTable: 't', afterReplicaId: 'r-empty',
      evaluated: [row('b2', 'e', '')] });
    await assert.rejects(w.save({ tag: 'insert', sourceTable: 't', afterReplicaId: 'r9',
      evaluated: [row(long + 'x', 'one', '{}')] }), { code: 'BS_ETOOBIG' });
    await w.markSnapshotDone('1');
    const { checkpoint } = await w.commit('1');
    const all = await readAll(st, checkpoint, ['bücket😀', long, 'b2']);
    assert.deepEqual(all.get('bücket😀').map((o) => [o.object_type, o.object_id, o.data]),
      cases.map(([id, data]) => ['tÿpe', id, data]));
    assert.equal(all.get(long).length, 1);
    assert.equal(all.get('b2')[0].data, ''); // "" is a value, not null
    assert.equal(all.get('b2')[0].checksum, bs.checksumPut('xxh3', 'test', 'e', ''));
    assert.equal((await w.getSourceRow('t', Buffer.from([0, 255, 1]))), null); // known, no data
    assert.equal((await w.getSourceRow('t', 'unknown')), undefined);
    await w.save({ tag: 'update', sourceTable: 't', afterReplicaId: 'r1', currentData: { a: 'ü' },
      evaluated: [row('bücket😀', 'ü€😀', '{"n":"ü€😀"}', 'tÿpe')] });
    assert.equal(await w.getSourceRow({ name: 't' }, 'r1'), '{"a":"ü"}'); // sees the queued save
    await w.save({ tag: 'update', sourceTable: 't', afterReplicaId: 'r2', currentData: '' });
    assert.equal(await w.getSourceRow('t', 'r2'), '');
    // keepalive: a checkpoint at a newer LSN; drop: REMOVEs for every row of the table
    const k = await w.keepalive('2');
    assert.equal(k.checkpointCreated, true);
    assert.equal(w.lastCheckpointLsn, '2');
    await w.drop([{ name: 't' }]);
    const c3 = (await w.commit('3')).checkpoint;
    const after = await readAll(st, c3, ['b2']);
    assert.deepEqual(after.get('b2').map((o) => o.op), ['PUT', 'REMOVE']);
    assert.equal((await st.getChecksums(c3, ['b2'])).get('b2').count, 2);
    await w.close();
    await st.close();
    await db.close();
    cleanup();
  });

  test(`${name}: bucket data in batches equals one unlimited read`, async () => {
    const { db, cleanup } = await open();
    const { st, w } = await stream(db);
    for (let i = 0; i < 40; i++)
      await w.save({ tag: 'insert', sourceTable: 't', afterReplicaId: `r${i}`,
        evaluated: [row(`b${i % 3}`, `o${i}`, JSON.stringify({ i, pad: 'p'.repeat(i) }))] });
    await w.markSnapshotDone('1');
    const { checkpoint } = await w.commit('1');
    const names = ['b0', 'b1', 'b2'];
    const whole = await readAll(st, checkpoint, names, { limit: 100000, chunkLimitBytes: 1 << 24 });
    for (const options of [{ limit: 1 }, { limit: 7, chunkLimitBytes: 100 }, { chunkLimitBytes: 1 }])
      assert.deepEqual(await readAll(st, checkpoint, names, options), whole);
    // chunkLimitBytes cuts chunks (the service's option, not only accepted): at 1 byte every
    // chunk is one op; without it, one chunk per bucket
    const sizes = async (options) => {
      const n = [];
      for await (const c of st.getBucketDataBatch(checkpoint, names.map((bucket) => ({ bucket })), options))
        if (!('hasMore' in c)) n.push(c.chunkData.data.length);
      return n;
    };
    assert.deepEqual(await sizes({ chunkLimitBytes: 1 }), Array(40).fill(1));
    assert.deepEqual(await sizes({}), [14, 13, 13]);
    // one batch: chunks of one bucket each, then the end marker
    const batch = [];
    for await (const c of st.getBucketDataBatch(checkpoint, [{ bucket: 'b1', start: 0n }], { limit: 5 }))
      batch.push(c);
    assert.deepEqual(batch.at(-1), { hasMore: true });
    assert.equal(batch.length, 2);
    assert.equal(batch[0].chunkData.data.length, 5);
    assert.equal(batch[0].chunkData.has_more, true);
    assert.equal(batch[0].targetOp, null);
    await w.close();
    await st.close();
    await db.close();
    cleanup();
  });

  test(`${name}: flush results, the writer's flush bound, pipelined saves keep their order`, async () => {
    const { db, cleanup } = await open();
    await db.createStream('v1');
    const st = await db.storage();
    const w = await st.createWriter({ maxRecords: 2 });
    assert.equal(await w.flush(), null); // nothing queued
    const save = (i) => w.save({ tag: 'insert', sourceTable: 't', afterReplicaId: `r${i}`,
      evaluated: [row('b', `o${i}`, `{"i":${i}}`)] });
    assert.equal(await save(1), null);
    assert.equal(await save(2), null);
    assert.deepEqual(await save(3), { flushed_op: 2n }); // the bound flushed before queueing
    assert.deepEqual(await w.flush(), { flushed_op: 3n });
    const results = await Promise.all([4, 5, 6, 7, 8].map(save)); // not awaited one by one
    assert.deepEqual(results, [null, null, { flushed_op: 5n }, null, { flushed_op: 7n }]);
    await w.markSnapshotDone('1');
    const { checkpoint } = await w.commit('1');
    const ops = (await readAll(st, checkpoint, ['b'])).get('b');
    assert.deepEqual(ops.map((o) => o.object_id), [1, 2, 3, 4, 5, 6, 7, 8].map((i) => `o${i}`));
    await w.close();
    await st.close();
    await db.close();
    cleanup();
  });

  test(`${name}: updates, deletes, parameter lookups and checkpoint changes`, async () => {
    const { db, cleanup } = await open();
    const { st, w } = await stream(db);
    const lookupRows = (user) => [{ lookup: ['by_user', 314], bucketParameters: [{ user }] }];
    await w.save({ tag: 'insert', sourceTable: 'lists', afterReplicaId: 'l1',
      evaluated: [row('b', 'l1', '{}')], evaluatedParameters: lookupRows('u1') });
    await w.save({ tag: 'insert', sourceTable: 'lists', afterReplicaId: 'l2',
      evaluatedParameters: [{ lookup: ['big', 2n ** 62n, null, true], bucketParameters: ['{"raw":1}'] }] });
    await w.markSnapshotDone('1');
    const c1 = (await w.commit('1')).checkpoint;
    assert.deepEqual(await st.getParameterSets(c1, [['by_user', 314.0]]), [{ user: 'u1' }]);
    assert.deepEqual(await st.getParameterSets(c1, [['by_user', 3.14]]), []);
    assert.deepEqual(await st.getParameterSets(c1, [['big', 2n ** 62n, null, true]]), [{ raw: 1 }]);
    await assert.rejects(st.getParameterSets(c1, [['by_user', 314], ['big', 2n ** 62n, null, true]], 1),
      { code: 'BS_ELIMIT', message: /limit was 1/ });
    await assert.rejects(st.getParameterSets(c1, [['by_user', 314]], 0), { code: 'BS_ELIMIT' });
    await w.save({ tag: 'update', sourceTable: 'lists', afterReplicaId: 'l1',
      evaluated: [row('b2', 'l1', '{"v":2}')], evaluatedParameters: lookupRows('u2') });
    await w.save({ tag: 'delete', sourceTable: 'lists', beforeReplicaId: 'l2' });
    const c2 = (await w.commit('2')).checkpoint;
    const cp = await st.getCheckpoint();
    assert.deepEqual(await cp.getParameterSets([['by_user', 314]]), [{ user: 'u2' }]);
    const ch = await st.getCheckpointChanges({ lastCheckpoint: c1, nextCheckpoint: cp });
    assert.deepEqual(ch.updatedDataBuckets, new Set(['b', 'b2']));
    assert.equal(ch.invalidateDataBuckets, false);
    assert.deepEqual(new Set(ch.updatedParameterLookups.map((l) => JSON.stringify(l, (k, v) =>
      typeof v === 'bigint' ? `${v}n` : v))), new Set(['["by_user",314]', `["big","${2n ** 62n}n",null,true]`]));
    const b = (await readAll(st, c2, ['b'])).get('b');
    assert.deepEqual(b.map((o) => o.op), ['PUT', 'REMOVE']);
    assert.equal(b[1].data, null);
    assert.equal(b[1].subkey, b[0].subkey);
    await w.close();
    await st.close();
    await db.close();
    cleanup();
  });

  test(`${name}: compaction keeps checksums; initial-replication compaction; cancel`, async () => {
    const { db, cleanup } = await open();
    const { st, w } = await stream(db);
    for (let v = 0; v < 5; v++)
      for (let i = 0; i < 10; i++)
        await w.save({ tag: v ? 'update' : 'insert', sourceTable: 't', afterReplicaId: `r${i}`,
          evaluated: [row('b', `o${i}`, `{"v":${v}}`)] });
    await w.flush();
    assert.deepEqual(await st.compactInitialReplication({}), { buckets: 1 });
    await w.markSnapshotDone('1');
    const { checkpoint } = await w.commit('1');
    assert.equal((await readAll(st, checkpoint, ['b'])).get('b').length, 10); // superseded deleted
    await assert.rejects(st.compactInitialReplication(), { code: 'BS_ESTATE' });
    for (let v = 0; v < 3; v++)
      for (let i = 0; i < 10; i++)
        await w.save({ tag: 'update', sourceTable: 't', afterReplicaId: `r${i}`,
          evaluated: [row('b', `o${i}`, `{"v":${v}}`), row(`c${i % 5}`, `o${i}`, '{}')] });
    const c2 = (await w.commit('2')).checkpoint;
    const names = ['b', 'c0', 'c1', 'c2', 'c3', 'c4'];
    const before = await st.getChecksums(c2, names);
    // A signal whose abort fires as compaction starts: cancelled after its first transaction.
    const firing = { throwIfAborted() {}, addEventListener(t, fn) { fn(); }, removeEventListener() {} };
    await assert.rejects(st.compact({ maxOpsPerTransaction: 2, minBucketChanges: 1, signal: firing }),
      { code: 'BS_ECANCELED' });
    const aborted = AbortSignal.abort();
    await assert.rejects(st.compact({ signal: aborted }), { name: 'AbortError' });
    // true (returned, or resolved by a Promise) and a throw (or a rejection) cancel
    const boom = new Error('boom');
    for (const onProgress of [() => true, async () => true])
      await assert.rejects(st.compact({ compactBuckets: ['c0'], maxOpsPerTransaction: 1, onProgress }),
        { code: 'BS_ECANCELED' });
    for (const onProgress of [() => { throw boom; }, async () => { throw boom; }])
      await assert.rejects(st.compact({ compactBuckets: ['c1'], maxOpsPerTransaction: 1, onProgress }),
        (e) => e === boom);
    const steps = [];
    const stats = await st.compact({ compactBuckets: names, maxOpsPerTransaction: 2, // the rest
      onProgress: (so) => steps.push(so.opsMoved) });
    // onProgress ran after every transaction, in order, before the call resolved
    assert.ok(steps.length > 1);
    assert.deepEqual(steps, [...steps].sort((a, b) => a - b));
    assert.equal(steps.at(-1), stats.opsMoved);
    assert.ok(stats.bucketsCompacted > 0 && stats.opsMoved > 0);
    const after = await st.getChecksums(c2, names);
    for (const b of names) {
      assert.equal(after.get(b).checksum, before.get(b).checksum);
      assert.ok(after.get(b).count < before.get(b).count);
    }
    const ops = (await readAll(st, c2, ['b'])).get('b');
    assert.equal(ops[0].op, 'CLEAR');
    assert.equal(ops.filter((o) => o.op === 'PUT').length, 10);
    await w.close();
    await st.close();
    await db.close();
    cleanup();
  });

  test(`${name}: write checkpoints, managed and custom`, async () => {
    const { db, cleanup } = await open();
    const { st, w } = await stream(db);
    await w.markSnapshotDone('0/1');
    await w.commit('0/1');
    const r = await st.createManagedWriteCheckpoints([
      { user_id: 'u1', heads: { 1: '0/5' } },
      { user_id: 'u2', heads: { 1: '0/5' }, checkpoint_request_id: 7n },
    ]);
    assert.deepEqual(r.writeCheckpoints, new Map([['u1', 1n], ['u2', 7n]]));
    assert.equal(r.shouldAdvance, true);
    assert.equal(await st.lastWriteCheckpoint({ user_id: 'u1', heads: { 1: '0/4' } }), null);
    assert.equal(await st.lastWriteCheckpoint({ user_id: 'u1', heads: { 1: '0/5' } }), 1n);
    await w.commit('0/6');
    const again = await st.createManagedWriteCheckpoints([{ user_id: 'u2', heads: { 1: '0/5' }, checkpoint_request_id: 3n }]);
    assert.deepEqual(again, { writeCheckpoints: new Map([['u2', 7n]]), shouldAdvance: false });
    st.setWriteCheckpointMode({ mode: 'custom' });
    assert.equal(st.writeCheckpointMode, 'custom');
    await assert.rejects(st.createManagedWriteCheckpoints([{ user_id: 'u1', heads: {} }]), { code: 'BS_ESTATE' });
    await w.addCustomWriteCheckpoint({ user_id: 'c1', checkpoint: 42n });
    await w.flush();
    assert.equal(await st.lastWriteCheckpoint({ user_id: 'c1' }), 42n);
    assert.equal(await st.deleteCheckpointRequestsBefore(new Date(0)), 0);
    await w.close();
    await st.close();
    await db.close();
    cleanup();
  });
}

test('lmdb: data survives reopening; a second stream is isolated', async () => {
  const t = tmpPath();
  let db = await bs.open(t.file);
  const { st, w } = await stream(db);
  await w.save({ tag: 'insert', sourceTable: 't', afterReplicaId: 'r', evaluated: [row('b', 'o', '{}')] });
  await w.markSnapshotDone('1');
  await w.commit('1');
  await w.close();
  await st.close();
  await db.close();
  db = await bs.open(t.file, { readonly: true });
  const st2 = await db.storage();
  const cp = await st2.getCheckpoint();
  assert.equal(cp.checkpoint, 1n);
  assert.equal((await st2.getChecksums(cp, ['b'])).get('b').count, 1);
  await assert.rejects(st2.createWriter(), { code: 'BS_ESTATE' });
  await st2.close();
  await db.close();
  db = await bs.open(t.file);
  const id2 = await db.createStream('v2');
  const st3 = await db.storage(id2);
  assert.equal(st3.replicationStreamId, id2);
  assert.equal((await st3.getChecksums(1n, ['b'])).get('b').count, 0);
  await st3.close();
  await db.close();
  t.cleanup();
});

test('works in worker threads: each env has its own handles and instance data', async () => {
  const { Worker } = require('node:worker_threads');
  const code = `
    const bs = require(${JSON.stringify(require.resolve('..'))});
    const { parentPort, workerData } = require('node:worker_threads');
    (async () => {
      const db = await bs.openMemory();
      await db.createStream('v');
      const st = await db.storage();
      const w = await st.createWriter();
      for (let i = 0; i <= workerData; i++)
        await w.save({ tag: 'insert', sourceTable: 't', afterReplicaId: 'r' + i,
          evaluated: [{ bucket: 'b', table: 'x', id: 'o' + i, data: '{}' }] });
      await w.markSnapshotDone('1');
      const r = await w.commit('1');
      await w.close(); await st.close(); await db.close();
      parentPort.postMessage(r.checkpoint);
    })();`;
  const results = await Promise.all([0, 1, 2].map((i) => new Promise((resolve, reject) => {
    const wk = new Worker(code, { eval: true, workerData: i });
    wk.once('message', resolve);
    wk.once('error', reject);
  })));
  assert.deepEqual(results, [1n, 2n, 3n]);
});

test('onCheckpoint: the listener sees each commit; a throwing one reaches uncaughtException', async () => {
  const db = await bs.openMemory();
  await db.createStream('v1');
  const st = await db.storage();
  const w = await st.createWriter();
  const events = [];
  let wake;
  db.onCheckpoint((e) => {
    events.push(e);
    wake();
  });
  const next = () => new Promise((r) => (wake = r));
  await w.markSnapshotDone('1');
  for (let i = 1; i <= 3; i++) {
    const seen = next();
    await w.save({ tag: 'insert', sourceTable: 't', afterReplicaId: `r${i}`,
      evaluated: [{ bucket: 'b', table: 'x', id: `o${i}`, data: '{}' }] });
    const { checkpoint } = await w.commit(String(i));
    await seen;
    assert.deepEqual(events.at(-1), { stream: 1, checkpoint });
  }
  assert.throws(() => db.onCheckpoint('no'), { code: 'BS_EINVAL' });
  db.onCheckpoint(null);
  await w.commit('4');
  assert.equal(events.length, 3);
  await w.close();
  await st.close();
  await db.close();
  // in a process of its own: the test runner treats an uncaught exception as a failure. The
  // commit whose listener throws resolves with the result it has without a listener (the
  // checkpoint it made, which a reader then sees), not with the listener's error.
  const script = `
    const bs = require(${JSON.stringify(require.resolve('..'))});
    const json = (x) => JSON.stringify(x, (k, v) => (typeof v === 'bigint' ? v + 'n' : v));
    async function run(listen) {
      const db = await bs.openMemory();
      await db.createStream('v');
      const st = await db.storage();
      const w = await st.createWriter();
      const caught = listen && new Promise((r) => process.once('uncaughtException', r));
      if (listen) db.onCheckpoint(() => { throw new Error('listener threw'); });
      await w.markSnapshotDone('1');
      await w.save({ tag: 'insert', sourceTable: 't', afterReplicaId: 'r',
        evaluated: [{ bucket: 'b', table: 'x', id: 'o', data: '{}' }] });
      const r = await w.commit('1');
      if (listen) console.log((await caught).message);
      const seen = (await st.getCheckpoint()).checkpoint;
      console.log(json({ r, seen, same: r.checkpointCreated && r.checkpoint === seen }));
      await w.close(); await st.close(); await db.close();
    }
    run(false).then(() => run(true));`;
  const r = require('node:child_process').spawnSync(process.execPath, ['-e', script], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  const [quiet, message, loud] = r.stdout.trim().split('\n');
  assert.equal(message, 'listener threw');
  assert.equal(loud, quiet);
  assert.equal(JSON.parse(loud).same, true, loud);
});

test('a PostgreSQL password is never in an error', async () => {
  // a closed port, and URLs libpq refuses by quoting them
  const pw = 'Zq7secretPW';
  for (const url of [`postgresql://u:${pw}@127.0.0.1:1/db`, `postgresql://u:${pw}%zz@127.0.0.1:1/db`,
    `postgresql://u:${pw}@[::1:1/db`, `postgres://u@127.0.0.1:1/db?password=${pw}&x=1`])
    await assert.rejects(bs.Database.open(url), (e) =>
      e.code !== undefined && !String(e.message).includes(pw) && !String(e.stack).includes(pw));
});
