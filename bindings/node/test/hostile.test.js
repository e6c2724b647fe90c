'use strict';
// Bad input from JavaScript gets a JS error (code BS_E*), never a crash: wrong types, bigints
// out of range, closed handles, getters and toJSON that throw, handles collected unclosed.
const test = require('node:test');
const assert = require('node:assert/strict');
const v8 = require('node:v8');
const vm = require('node:vm');
const { bs, tmpPath } = require('./helpers.cjs');

async function setup() {
  const db = await bs.openMemory();
  await db.createStream('v1');
  const st = await db.storage();
  const w = await st.createWriter();
  return { db, st, w };
}

const ok = { tag: 'insert', sourceTable: 't', afterReplicaId: 'r',
  evaluated: [{ bucket: 'b', table: 'x', id: 'o', data: '{}' }] };
const withRow = (patch) => ({ ...ok, evaluated: [{ ...ok.evaluated[0], ...patch }] });

test('wrong types and out-of-range values reject with BS_EINVAL naming the argument', async () => {
  const { db, st, w } = await setup();
  const bad = [
    [null, /record: missing/],
    [42, /record: expected an object/],
    [{ ...ok, tag: 'upsert' }, /record.tag/],
    [{ ...ok, tag: '' }, /record.tag/],
    [{ ...ok, sourceTable: 7 }, /record.sourceTable/],
    [{ ...ok, afterReplicaId: undefined }, /record.afterReplicaId: missing/],
    [{ ...ok, afterReplicaId: {} }, /record.afterReplicaId/],
    [{ ...ok, evaluated: 'rows' }, /record.evaluated: expected an array/],
    [withRow({ bucket: 1 }), /record.evaluated\[0\].bucket/],
    [withRow({ data: () => 1 }), /record.evaluated\[0\].data/],
    [withRow({ data: Symbol('s') }), /record.evaluated\[0\].data/],
    [{ ...ok, evaluatedParameters: [{ lookup: [{}], bucketParameters: [] }] },
      /evaluatedParameters\[0\].lookup\[0\]/],
    [{ ...ok, evaluatedParameters: [{ lookup: 'k', bucketParameters: [] }] }, /lookup: expected an array/],
  ];
  for (const [rec, message] of bad)
    await assert.rejects(w.save(rec), { code: 'BS_EINVAL', message }, String(message));
  await assert.rejects(w.save({ ...ok, evaluatedParameters: [{ lookup: [2n ** 63n], bucketParameters: [] }] }),
    { name: 'RangeError', code: 'BS_EINVAL' });
  for (const cp of [-1n, 2n ** 63n, 2n ** 64n, 1.5, -1, NaN, Infinity, 2 ** 53])
    await assert.rejects(st.getChecksums(cp, ['b']), { name: 'RangeError', code: 'BS_EINVAL' }, String(cp));
  for (const cp of ['1', undefined, true])
    await assert.rejects(st.getChecksums(cp, ['b']), { code: 'BS_EINVAL', message: /checkpoint/ }, String(cp));
  await assert.rejects(st.getChecksums(1n, 'b'), { code: 'BS_EINVAL' });
  await assert.rejects(st.getChecksums(1n, [1]), { code: 'BS_EINVAL', message: /buckets\[0\]/ });
  const batch = (...args) => st.getBucketDataBatch(...args)[Symbol.asyncIterator]().next();
  await assert.rejects(batch(1n, [{ bucket: 'b', start: -5n }]), { message: /dataBuckets\[0\].start/ });
  await assert.rejects(batch(1n, [{ start: 0n }]), { message: /dataBuckets\[0\].bucket: missing/ });
  await assert.rejects(batch(1n, [{ bucket: 'b' }], { limit: 0 }), { code: 'BS_EINVAL', message: /limit/ });
  await assert.rejects(batch(1n, null), { message: /dataBuckets/ }).catch(async () => {
    // null means "no buckets": an empty batch
    assert.deepEqual((await batch(1n, null)).value, { hasMore: false });
  });
  assert.deepEqual(await st.getParameterSets(1n, [['k']], 0), []); // 0 allows no row: none here
  await assert.rejects(st.createWriter({ maxRecords: 0 }), { name: 'RangeError' });
  await assert.rejects(st.createWriter({ skipExistingRows: 'yes' }), { message: /skipExistingRows/ });
  await assert.rejects(w.commit(123), { message: /lsn/ });
  await assert.rejects(w.commit('x'.repeat(256)), { code: 'BS_ETOOBIG' });
  await assert.rejects(st.compact({ minChangeRatio: 'high' }), { message: /minChangeRatio/ });
  await assert.rejects(st.compact({ compactBuckets: [null] }), { message: /compactBuckets\[0\]/ });
  await assert.rejects(st.createManagedWriteCheckpoints([{ user_id: 'u', heads: 5 }]), { message: /heads/ });
  await assert.rejects(st.createManagedWriteCheckpoints([{ user_id: 'u', heads: {}, checkpoint_request_id: -1n }]),
    { name: 'RangeError' });
  assert.throws(() => st.setWriteCheckpointMode({ mode: 'sometimes' }), { code: 'BS_EINVAL' });
  await assert.rejects(db.createStream('a\0b'), { message: /NUL/ });
  await assert.rejects(db.createStream('v', { checksum: 'md5' }), { message: /checksum/ });
  await assert.rejects(bs.open(''), { code: 'BS_EINVAL' });
  await assert.rejects(bs.open(42), { message: /path/ });
  await assert.rejects(db.storage(2 ** 40), { name: 'RangeError' });
  await assert.rejects(db.storage(99), { code: 'BS_ENOTFOUND' });
  // after all of that the writer still works and nothing was queued
  assert.equal(await w.save(ok), null);
  assert.deepEqual(await w.flush(), { flushed_op: 1n });
  await w.close();
  await st.close();
  await db.close();
});

// A value of the right type that is out of range, or one the library refuses (its BS_EINVAL),
// is a RangeError, as Python raises InvalidArgumentError (a ValueError) for each of these
// (tests/test_hostile.py's test_out_of_range_raises_bucketstore_error); a wrong type is a
// TypeError in both.
test('values out of range are RangeErrors, the library\'s BS_EINVAL too; wrong types TypeErrors', async () => {
  const { db, st, w } = await setup();
  const batch = (...args) => st.getBucketDataBatch(...args).next();
  const outOfRange = [
    () => st.getChecksums(-1, ['b']),
    () => st.getChecksums(2n ** 63n, ['b']),
    () => batch(1n, [{ bucket: 'b', start: 2n ** 64n }]),
    () => batch(1n, [{ bucket: 'b' }], { limit: 0 }), // refused by the library
    () => st.getBucketDataBatchRaw(1n, [{ bucket: 'b' }], { limit: 0 }).next(),
    () => batch(1n, [{ bucket: 'b' }], { limit: -1 }),
    () => batch(1n, [{ bucket: 'b' }], { limit: 2n ** 64n }),
    () => st.getParameterSets(1n, [[2n ** 63n]]),
    () => st.getParameterSets(1n, [[-(2n ** 63n) - 1n]]),
    () => st.waitCheckpoint(null, { timeoutMs: -1 }),
    () => st.compact({ maxOpId: -5 }),
    () => db.storage(2 ** 32),
    () => st.createWriter({ maxRecords: 0 }),
    async () => st.setWriteCheckpointMode('other'),
    () => db.createStream('a\0b'),
    () => db.createStream('v', { checksum: 'md5' }),
  ];
  for (const call of outOfRange)
    await assert.rejects(call(), { name: 'RangeError', code: 'BS_EINVAL' }, String(call));
  const wrongType = [() => st.getChecksums('1', ['b']), () => batch(1n, [{ bucket: 'b' }], { limit: '1' }),
    () => db.createStream(42), () => st.getParameterSets(1n, [[{}]])];
  for (const call of wrongType)
    await assert.rejects(call(), { name: 'TypeError', code: 'BS_EINVAL' }, String(call));
  await w.close();
  await st.close();
  await db.close();
});

test('a getter or toJSON that throws rejects the call with its error', async () => {
  const { db, st, w } = await setup();
  const boom = new Error('boom');
  const rec = { ...ok, get evaluated() { throw boom; } };
  await assert.rejects(w.save(rec), (e) => e === boom);
  await assert.rejects(w.save(withRow({ data: { toJSON() { throw boom; } } })), (e) => e === boom);
  const lookup = ['k'];
  Object.defineProperty(lookup, 0, { get() { throw boom; } });
  const lookups = [lookup];
  await assert.rejects(st.getParameterSets(1n, lookups), (e) => e === boom);
  const heads = new Proxy({}, { ownKeys() { throw boom; } });
  await assert.rejects(st.lastWriteCheckpoint({ user_id: 'u', heads }), (e) => e === boom);
  // a throwing onProgress cancels the compaction after that transaction and rejects with its error
  await w.markSnapshotDone('1');
  for (const thrown of [boom, 'a string', undefined]) {
    for (let i = 0; i < 6; i++) // superseded rows in two buckets: more than one transaction
      await w.save({ ...withRow({ bucket: `b${i % 2}` }), tag: 'update', afterReplicaId: `r${i % 2}` });
    await w.commit('1');
    let calls = 0;
    await assert.rejects(st.compact({ maxOpsPerTransaction: 2, minBucketChanges: 1, onProgress() {
      calls++;
      throw thrown;
    } }), (e) => e === thrown);
    assert.equal(calls, 1);
  }
  await assert.rejects(st.compact({ onProgress: 'no' }), { code: 'BS_EINVAL', message: /onProgress/ });
  // the same throw while the writer is busy (the save is queued as a job)
  const pending = w.flush();
  await assert.rejects(w.save(rec), (e) => e === boom);
  await pending;
  // a consumer that throws inside for-await leaves nothing behind
  await assert.rejects((async () => {
    for await (const c of st.getBucketDataBatch(1n, [{ bucket: 'b', start: 0n }])) throw boom;
  })(), (e) => e === boom);
  assert.equal(await w.save(ok), null);
  await w.close();
  await st.close();
  await db.close();
});

test('closed handles: calls reject with BS_ESTATE; close order is checked; close twice is fine', async () => {
  const { db, st, w } = await setup();
  await assert.rejects(st.close(), { code: 'BS_ESTATE', message: /writer/ });
  await assert.rejects(db.close(), { code: 'BS_ESTATE', message: /storage/ });
  const queued = w.save(ok); // runs before the close below: calls keep their order
  const saving = [w.flush(), w.close()];
  await assert.rejects(w.save(ok), { code: 'BS_ESTATE', message: /writer: closed/ });
  await assert.rejects(w.commit('1'), { code: 'BS_ESTATE' });
  assert.equal(await queued, null);
  assert.deepEqual(await saving[0], { flushed_op: 1n });
  await saving[1];
  await w.close();
  await st.close();
  await assert.rejects(st.getCheckpoint(), { code: 'BS_ESTATE', message: /storage: closed/ });
  await db.close();
  await assert.rejects(db.storage(), { code: 'BS_ESTATE' });
  await assert.rejects(db.createStream('x'), { code: 'BS_ESTATE' });
  // a method called on a foreign object
  await assert.rejects(bs.Writer.prototype.save.call({}, ok), TypeError);
});

test('handles collected without close release the database (it can be opened again)', async () => {
  v8.setFlagsFromString('--expose-gc');
  const gc = vm.runInNewContext('gc');
  const t = tmpPath();
  const leak = async () => {
    const db = await bs.open(t.file);
    await db.createStream('v1');
    const st = await db.storage();
    const w = await st.createWriter();
    await w.save(ok);
    await w.markSnapshotDone('1');
    await w.commit('1');
    await st.getChecksums(1n, ['b']);
  };
  const live = bs.liveHandles();
  await leak();
  assert.equal(bs.liveHandles(), live + 3);
  for (let i = 0; i < 5 && bs.liveHandles() > live; i++) {
    gc();
    await new Promise((r) => setImmediate(r));
  }
  assert.equal(bs.liveHandles(), live);
  // every handle above was released: the file opens again and a writer can be opened on it
  const db = await bs.open(t.file);
  const st = await db.storage();
  assert.equal((await st.getChecksums(1n, ['b'])).get('b').count, 1);
  const w = await st.createWriter();
  await w.close();
  await st.close();
  await db.close();
  assert.equal(bs.liveHandles(), live);
  t.cleanup();
});
