'use strict';
// One behaviour for every call: checksums' signedness, parameter sets as objects with exact big
// integers, cancellation by AbortSignal (its reason, before or during a call), and stat, verify,
// listBuckets and waitCheckpoint.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { bs, tmpPath, backends, readAll } = require('./helpers.cjs');

async function collect(it) {
  const out = [];
  for await (const x of it) out.push(x);
  return out;
}

const put = (bucket, id, data = '{}') =>
  ({ tag: 'insert', sourceTable: 't', afterReplicaId: id, evaluated: [{ bucket, table: 't', id, data }] });

async function stream(db) {
  await db.createStream('s');
  const st = await db.storage();
  return { st, w: await st.createWriter() };
}

for (const [name, open] of backends) {
  test(`${name}: op checksums unsigned, bucket checksums signed 32-bit (their sum | 0)`, async () => {
    const { db, cleanup } = await open();
    const { st, w } = await stream(db);
    let sum = 0;
    let i = 0;
    for (; i < 3 || (sum | 0) >= 0; i++) { // until the bucket's checksum is negative
      await w.save(put('b', `o${i}`));
      sum += bs.checksumPut('xxh3', 't', `o${i}`, '{}');
    }
    await w.markSnapshotDone('1');
    const { checkpoint } = await w.commit('1');
    const ops = (await readAll(st, checkpoint, ['b'])).get('b');
    assert.equal(ops.length, i);
    for (const op of ops) assert.ok(Number.isInteger(op.checksum) && op.checksum >= 0 && op.checksum < 2 ** 32);
    assert.ok(ops.some((op) => op.checksum >= 2 ** 31), 'an op checksum above 2^31 - 1 stays unsigned');
    const c = (await st.getChecksums(checkpoint, ['b'])).get('b');
    assert.equal(c.checksum, ops.reduce((a, op) => a + op.checksum, 0) | 0);
    assert.ok(c.checksum < 0);
    const [listed] = await collect(st.listBuckets());
    assert.deepEqual([listed.bucket, listed.checksum, listed.count], ['b', c.checksum, c.count]);
    await w.close();
    await st.close();
    await db.close();
    cleanup();
  });

  test(`${name}: parameter sets are objects; big integers exact (bigint beyond 2^53)`, async () => {
    const { db, cleanup } = await open();
    const { st, w } = await stream(db);
    const text = '{"big":9007199254740993,"neg":-12345678901234567890,"safe":9007199254740991,' +
      '"f":1.5e300,"s":"12345678901234567890","nested":[{"x":18446744073709551615}],"t":true,"n":null,' +
      '"esc":"a\\"b\\u00e9"}';
    await w.save({ ...put('b', 'r'), evaluatedParameters: [{ lookup: ['k'], bucketParameters: [text, { small: 1 }] }] });
    await w.markSnapshotDone('1');
    const { checkpoint } = await w.commit('1');
    const rows = await st.getParameterSets(checkpoint, [['k']]);
    const big = rows.find((r) => 'big' in r);
    assert.deepEqual(big, { big: 9007199254740993n, neg: -12345678901234567890n, safe: 9007199254740991,
      f: 1.5e300, s: '12345678901234567890', nested: [{ x: 18446744073709551615n }], t: true, n: null,
      esc: 'a"bé' });
    assert.ok(rows.some((r) => r.small === 1));
    await w.close();
    await st.close();
    await db.close();
    cleanup();
  });

  test(`${name}: stat, verify, listBuckets (pages, startAfter, bytes), waitCheckpoint`, async () => {
    const { db, cleanup } = await open();
    const { st, w } = await stream(db);
    const names = ['a', 'b', 'c', 'd', 'e'];
    for (const b of names) await w.save(put(b, b));
    await w.save(put(Buffer.from([0xff]), 'x'));
    await w.markSnapshotDone('1');
    const known = await st.getCheckpoint();
    assert.equal(known.checkpoint, 0n);
    const waiting = st.waitCheckpoint(known);
    const { checkpoint } = await w.commit('1');
    const now = await waiting; // woken by the commit, whenever the wait began
    assert.deepEqual([now.checkpoint, now.lsn], [checkpoint, '1']);
    const same = await st.waitCheckpoint(now, { timeoutMs: 0 }); // nothing new: the current one
    assert.deepEqual([same.checkpoint, same.lsn], [checkpoint, '1']);
    const s = await db.stat();
    assert.equal(s.streams, 1);
    assert.equal(s.buckets, 6);
    assert.equal(s.opsPut, 6);
    assert.equal(s.sourceRecords, 6);
    assert.deepEqual(await db.verify(), []);
    const all = await collect(st.listBuckets({ page: 2 }));
    assert.deepEqual(all.map((b) => Buffer.from(b.bucket).toString('latin1')), [...names, '\xff']);
    assert.ok(Buffer.isBuffer(all[5].bucket));
    for (const b of all) {
      assert.equal(b.count, 1);
      assert.equal(b.lastOp > 0n && b.lastOp <= checkpoint, true);
      assert.equal(typeof b.generation, 'bigint');
    }
    const after = await collect(st.listBuckets({ startAfter: 'b', page: 3 }));
    assert.deepEqual(after.map((b) => b.bucket).slice(0, 3), ['c', 'd', 'e']);
    await assert.rejects(collect(st.listBuckets({ page: 0 })), RangeError);
    await w.close();
    await st.close();
    await assert.rejects(st.waitCheckpoint(null), { code: 'BS_ESTATE' });
    await db.close();
    await assert.rejects(db.stat(), { code: 'BS_ESTATE' });
    await assert.rejects(db.verify(), { code: 'BS_ESTATE' });
    cleanup();
  });
}

test('verify() names what it finds: an op payload changed on disk behind the library\'s back', async () => {
  const t = tmpPath();
  let db = await bs.open(t.file, { nosync: true });
  const { st, w } = await stream(db);
  await w.save(put('b', 'r', '{"marker":"QQQQQQQQQQQQ"}'));
  await w.markSnapshotDone('1');
  await w.commit('1');
  assert.deepEqual(await db.verify(), []);
  await w.close();
  await st.close();
  await db.close();
  // LMDB has no page checksums: only verify sees the change
  const bytes = fs.readFileSync(t.file);
  const at = bytes.indexOf('QQQQQQQQQQQQ');
  assert.ok(at >= 0 && bytes.indexOf('QQQQQQQQQQQQ', at + 1) < 0, 'the payload is stored once');
  bytes.write('R', at + 11);
  fs.writeFileSync(t.file, bytes);
  db = await bs.open(t.file);
  const problems = await db.verify();
  assert.equal(problems.length, 1, problems.join('\n'));
  assert.match(problems[0], /^bucket "b" op 1: PUT checksum \d+ stored, its payload hashes to \d+$/);
  await db.close();
  t.cleanup();
});

test('an abort rejects every long call with the signal\'s reason, before or during it', async () => {
  const t = tmpPath();
  const db = await bs.open(t.file, { nosync: true });
  const { st, w } = await stream(db);
  for (let v = 0; v < 3; v++)
    for (let i = 0; i < 20; i++)
      await w.save({ ...put('b', `r${i}`, `{"v":${v}}`), tag: v ? 'update' : 'insert' });
  await w.markSnapshotDone('1');
  await w.commit('1');
  const dir = path.dirname(t.file);
  // each call: run(signal, abortDuring) where abortDuring is an onProgress that aborts
  const calls = {
    compact: (signal, onProgress) => st.compact({ maxOpsPerTransaction: 1, minAgeMs: 0, signal, onProgress }),
    backup: (signal, onProgress) => db.backup(path.join(dir, 'copy.bsdb'), { signal, onProgress }),
    load: (signal, onProgress) => bs.load(path.join(dir, 'new.bsdb'), db.export(), { signal, onProgress }),
  };
  for (const [what, run] of Object.entries(calls)) {
    for (const reason of [new Error(`stop ${what}`), undefined]) {
      const before = new AbortController();
      before.abort(reason);
      const e1 = await run(before.signal).then(() => null, (e) => e);
      assert.equal(e1, before.signal.reason, `${what}: pre-aborted`);
      const during = new AbortController();
      const e2 = await run(during.signal, () => { during.abort(reason); }).then(() => null, (e) => e);
      assert.equal(e2, during.signal.reason, `${what}: aborted during`);
      if (reason === undefined) assert.equal(e2.name, 'AbortError');
    }
  }
  assert.deepEqual(fs.readdirSync(dir).filter((f) => !f.startsWith('test.bsdb')), []);
  // waitCheckpoint (waits until aborted here: nothing is committed) and compactInitialReplication
  const ac = new AbortController();
  const cp = await st.getCheckpoint();
  const waiting = st.waitCheckpoint(cp, { signal: ac.signal });
  const why = new Error('no more waiting');
  setImmediate(() => ac.abort(why));
  await assert.rejects(waiting, (e) => e === why);
  await assert.rejects(st.waitCheckpoint(cp, { signal: ac.signal }), (e) => e === why);
  await assert.rejects(st.compactInitialReplication({ signal: ac.signal }), (e) => e === why);
  // raw reads as getBucketDataBatch (service.test.js): before the read, and between its chunks
  await w.save(put('c', 'c1'));
  const cp2 = (await w.commit('2')).checkpoint;
  const two = [{ bucket: 'b' }, { bucket: 'c' }];
  for (const reuseBuffers of [false, true]) {
    await assert.rejects(st.getBucketDataBatchRaw(cp2, two, { signal: ac.signal, reuseBuffers }).next(),
      (e) => e === why);
    const between = new AbortController();
    const seen = [];
    await assert.rejects((async () => {
      for await (const c of st.getBucketDataBatchRaw(cp2, two, { signal: between.signal, reuseBuffers })) {
        seen.push(c);
        between.abort(why);
      }
    })(), (e) => e === why);
    assert.equal(seen.length, 1, 'the abort stopped the batch after its first chunk');
  }
  // compactInitialReplication aborted while it runs (the abort comes after the call started,
  // before its Promise can settle): it finishes, the work stays, and it rejects with the reason
  const s2 = await db.storage(await db.createStream('initial'));
  const w2 = await s2.createWriter();
  for (let v = 0; v < 3; v++) await w2.save({ ...put('b', 'r', `{"v":${v}}`), tag: v ? 'update' : 'insert' });
  await w2.flush();
  const during = new AbortController();
  const running = s2.compactInitialReplication({ signal: during.signal });
  during.abort(why);
  await assert.rejects(running, (e) => e === why);
  assert.deepEqual(await s2.compactInitialReplication(), { buckets: 0 }, 'its work was done');
  await w2.markSnapshotDone('1');
  const c2 = (await w2.commit('1')).checkpoint;
  assert.deepEqual((await readAll(s2, c2, ['b'])).get('b').map((o) => o.data), ['{"v":2}']);
  await w2.close();
  await s2.close();
  await w.close();
  await st.close();
  await db.close();
  t.cleanup();
});

for (const [name, open] of backends) {
  test(`${name}: leaving a writer's scope discards what was not flushed, as the README says`, async () => {
    const { db, cleanup } = await open();
    const { st, w } = await stream(db);
    await w.markSnapshotDone('1');
    await w.save(put('b', 'kept'));
    await w.flush(); // flushed: persisted, visible with the next checkpoint
    await w.save(put('b', 'closed')); // queued, then the writer closes
    await w.close();
    const dispose = Symbol.asyncDispose ?? Symbol.for('nodejs.asyncDispose');
    const w2 = await st.createWriter(); // `await using w2` leaves its scope through this
    await w2.save(put('b', 'disposed'));
    await w2[dispose]();
    await assert.rejects(w2.save(put('b', 'x')), { code: 'BS_ESTATE' });
    // startBatch: the callback's saves flushed, then closed; a throw closes without the flush
    assert.deepEqual(await st.startBatch({}, async (b) => {
      await b.save(put('b', 'batched'));
    }), { flushed_op: 2n });
    const boom = new Error('boom');
    let inside;
    await assert.rejects(st.startBatch({}, async (b) => {
      inside = b;
      await b.save(put('b', 'thrown'));
      throw boom;
    }), (e) => e === boom);
    await assert.rejects(inside.flush(), { code: 'BS_ESTATE' }); // it was closed
    const w3 = await st.createWriter();
    assert.equal(await w3.flush(), null); // nothing queued survived a scope
    const { checkpoint } = await w3.commit('1');
    assert.deepEqual((await readAll(st, checkpoint, ['b'])).get('b').map((o) => o.object_id), ['kept', 'batched']);
    await w3.close();
    await st.close();
    await db.close();
    cleanup();
  });
}
