'use strict';
// The sync service's storage-interface names and options beyond the core calls: requestHint
// (accepted), signal on the reads and lifecycle calls (its reason, before or between chunks),
// clearChecksumCache, incremental parameter compaction, and the compaction options the engine
// has no use for (accepted).
const test = require('node:test');
const assert = require('node:assert/strict');
const { bs, backends } = require('./helpers.cjs');

const put = (bucket, id, params) => ({ tag: 'update', sourceTable: 't', afterReplicaId: id,
  evaluated: [{ bucket, table: 't', id, data: '{}' }],
  evaluatedParameters: params ? [{ lookup: params, bucketParameters: [{ p: params[0] }] }] : [] });

for (const [name, open] of backends) {
  test(`${name}: service-shaped options and calls`, async () => {
    const { db, cleanup } = await open();
    await db.createStream('s');
    const st = await db.storage();
    const why = new Error('stop');
    const aborted = AbortSignal.abort(why);
    await assert.rejects(st.createWriter({ signal: aborted }), (e) => e === why);
    const w = await st.createWriter({ zeroLSN: '0/0', storeCurrentData: true, signal: new AbortController().signal });
    for (let v = 0; v < 3; v++) for (const id of ['x', 'y']) await w.save(put(`b${id}`, id, [`k${v}`]));
    await w.markSnapshotDone('1');
    const { checkpoint } = await w.commit('1');
    // requestHint changes nothing
    const sums = await st.getChecksums(checkpoint, ['bx', 'by']);
    assert.deepEqual(await st.getChecksums(checkpoint, ['bx', 'by'], { requestHint: 'incremental' }), sums);
    await st.clearChecksumCache();
    assert.deepEqual(await st.getChecksums(checkpoint, ['bx', 'by'], { requestHint: 'bulk' }), sums);
    // getBucketDataBatch: aborted before the read, and between its chunks
    const req = [{ bucket: 'bx' }, { bucket: 'by' }];
    await assert.rejects(st.getBucketDataBatch(checkpoint, req, { signal: aborted }).next(), (e) => e === why);
    const ac = new AbortController();
    const seen = [];
    await assert.rejects((async () => {
      for await (const c of st.getBucketDataBatch(checkpoint, req, { requestHint: 'bulk', signal: ac.signal })) {
        seen.push(c);
        ac.abort(why);
      }
    })(), (e) => e === why);
    assert.equal(seen.length, 1);
    // the compaction options the engine has no use for are accepted; parameter compaction is
    // incremental as said
    assert.equal(st.supportsIncrementalParameterCompaction(), true);
    const stats = await st.compact({ incrementalOnly: true, compactParameterData: true, minAgeMs: 0,
      moveBatchByteLimit: 1 << 20, moveBatchLimit: 2000, clearBatchLimit: 5000 });
    assert.ok(stats.parameterEntriesRemoved > 0, JSON.stringify(stats));
    assert.deepEqual((await st.getParameterSets(checkpoint, [['k2']])).length, 2);
    assert.deepEqual(await st.getParameterSets(checkpoint, [['k0']]), []);
    await w.close();
    await assert.rejects(st.terminate({ clearStorage: true, signal: aborted }), (e) => e === why);
    assert.equal((await st.getStatus()).state, 'ACTIVE');
    await st.terminate({ clearStorage: true, signal: new AbortController().signal });
    assert.equal((await st.getStatus()).state, 'TERMINATED');
    await st.close();
    await assert.rejects(st.clearChecksumCache(), (e) => e.code === 'BS_ESTATE');
    await db.close();
    cleanup();
  });
}

const code = (C, c) => (e) => e instanceof C && e.code === c;

for (const [name, open] of backends) {
  test(`${name}: the options the engine has no use for are checked`, async () => {
    const { db, cleanup } = await open();
    await db.createStream('s');
    const st = await db.storage();
    const w = await st.createWriter();
    await w.save(put('b', 'x'));
    await w.markSnapshotDone('1');
    const { checkpoint } = await w.commit('1');
    await w.close();
    const sums = await st.getChecksums(checkpoint, ['b']);
    for (const bad of ['', 'b', 'Bulk', 'bülk']) {
      await assert.rejects(st.getChecksums(checkpoint, ['b'], { requestHint: bad }), code(RangeError, 'BS_EINVAL'));
      await assert.rejects(st.getBucketDataBatch(checkpoint, [{ bucket: 'b' }], { requestHint: bad }).next(),
        code(RangeError, 'BS_EINVAL'));
    }
    for (const bad of [1, new Uint8Array([98])]) {
      await assert.rejects(st.getChecksums(checkpoint, ['b'], { requestHint: bad }), code(TypeError, 'BS_EINVAL'));
    }
    assert.deepEqual(await st.getChecksums(checkpoint, ['b'], { requestHint: undefined }), sums);
    for (const bad of [{ zeroLSN: 0 }, { zeroLSN: 'a\uD800' }, { storeCurrentData: 'yes' }])
      await assert.rejects(st.createWriter(bad), code(TypeError, 'BS_EINVAL'), JSON.stringify(bad));
    for (const zeroLSN of ['', '0', 'ü', new Uint8Array([0xff])]) {
      for (const storeCurrentData of [true, false]) {
        const w2 = await st.createWriter({ zeroLSN, storeCurrentData });
        await w2.save({ ...put('b', 'y'), currentData: 'kept' });
        assert.equal(await w2.getSourceRow('t', 'y'), 'kept'); // as currentData says, whatever the option
        await w2.close();
      }
    }
    // where the library reads 0 (or a negative value) as its default, an explicit one is refused
    for (const name of ['minBucketChanges', 'memoryLimitMB', 'maxOpsPerTransaction', 'opBudget'])
      for (const zero of [0, 0n, -0]) await assert.rejects(st.compact({ [name]: zero }), code(RangeError, 'BS_EINVAL'));
    await assert.rejects(st.compactInitialReplication({ minBucketChanges: 0 }), code(RangeError, 'BS_EINVAL'));
    for (const name of ['minAgeMs', 'minChangeRatio']) {
      await assert.rejects(st.compact({ [name]: -1 }), code(RangeError, 'BS_EINVAL'));
      await st.compact({ [name]: 0 });
    }
    await st.compact({ minBucketChanges: 1, memoryLimitMB: 1, maxOpsPerTransaction: 2, opBudget: 1n });
    for (const name of ['moveBatchByteLimit', 'moveBatchLimit', 'clearBatchLimit']) {
      for (const ok of [0, 1, 1.0, 2 ** 53 - 1, 2n ** 63n]) await st.compact({ [name]: ok });
      for (const bad of ['1', true]) await assert.rejects(st.compact({ [name]: bad }), code(TypeError, 'BS_EINVAL'));
      for (const bad of [-1, 1.5, NaN, -1n]) await assert.rejects(st.compact({ [name]: bad }), code(RangeError, 'BS_EINVAL'));
    }
    await st.close();
    await db.close();
    cleanup();
  });

  test(`${name}: opBudget, compactInitialReplication, managed request times`, async () => {
    const { db, cleanup } = await open();
    await db.createStream('s');
    const st = await db.storage();
    const w = await st.createWriter();
    for (let v = 0; v < 3; v++) for (const b of ['b1', 'b2', 'b3']) await w.save(put(b, b));
    await w.save(put('b4', 'one'));
    await w.flush();
    // 1 and 1.0 are one number in JS
    assert.deepEqual(await st.compactInitialReplication({ minBucketChanges: 2.0 }), { buckets: 3 });
    await w.markSnapshotDone('1');
    await w.commit('1');
    for (let v = 0; v < 3; v++) for (const b of ['b1', 'b2', 'b3']) await w.save(put(b, b));
    await w.commit('2');
    await assert.rejects(st.compact({ opBudget: -1 }), code(RangeError, 'BS_EINVAL'));
    await assert.rejects(st.compact({ opBudget: 'x' }), code(TypeError, 'BS_EINVAL'));
    const budget = await st.compact({ incrementalOnly: true, minAgeMs: 0, opBudget: 1 });
    const all = await st.compact({ incrementalOnly: true, minAgeMs: 0 });
    assert.ok(budget.opsMoved + budget.opsCleared + budget.opsRemoved > 0, JSON.stringify(budget));
    assert.ok(all.opsMoved + all.opsCleared + all.opsRemoved > 0, JSON.stringify(all)); // what the budget left
    await w.close();

    const t0 = Date.UTC(2026, 8, 1);
    const { writeCheckpoints: ids, shouldAdvance } = await st.createManagedWriteCheckpoints([
      { user_id: '', heads: { 1: '3' }, checkpoint_request_id: 7n, checkpoint_requested_at: new Date(t0) },
      { user_id: 'ü', heads: { 1: '3' }, checkpoint_request_id: 1n, checkpoint_requested_at: t0 + 3600e3 },
      { user_id: 'x', heads: { 1: '3' }, checkpoint_requested_at: null }, // a generated id: kept
    ]);
    assert.deepEqual([...ids], [['', 7n], ['ü', 1n], ['x', 1n]]);
    assert.equal(shouldAdvance, true);
    const w2 = await st.createWriter();
    await w2.commit('3'); // processed: a commit at the heads
    await w2.close();
    const stats = await st.compact({ deleteCheckpointRequestsBefore: new Date(t0 + 60e3) });
    assert.equal(stats.checkpointRequestsDeleted, 1);
    assert.equal(await st.lastWriteCheckpoint({ user_id: '', heads: { 1: '3' } }), null);
    assert.equal(await st.deleteCheckpointRequestsBefore(Date.now() + 3600e3), 1);
    assert.equal(await st.lastWriteCheckpoint({ user_id: 'ü', heads: { 1: '3' } }), null);
    assert.equal(await st.lastWriteCheckpoint({ user_id: 'x', heads: { 1: '3' } }), 1n);
    for (const bad of [0, new Date(0), -1])
      await assert.rejects(st.createManagedWriteCheckpoints([{ user_id: 'u', heads: {}, checkpoint_requested_at: bad }]),
        code(RangeError, 'BS_EINVAL'));
    await assert.rejects(st.createManagedWriteCheckpoints([{ user_id: 'u', heads: {}, checkpoint_requested_at: new Date(NaN) }]),
      code(RangeError, 'BS_EINVAL'));
    await st.close();
    await db.close();
    cleanup();
  });
}

test('milliseconds are whole numbers wherever a call takes them (a fraction is refused, as Python refuses a float)', async () => {
  const db = await bs.openMemory();
  await db.createStream('s');
  const st = await db.storage();
  const w = await st.createWriter();
  await w.markSnapshotDone('1');
  await w.commit('1');
  const calls = {
    addCustomWriteCheckpoint: async (ms) => {
      st.setWriteCheckpointMode('custom');
      try {
        await w.addCustomWriteCheckpoint({ user_id: 'u', checkpoint: 1n, checkpoint_requested_at: ms });
        await w.flush();
      } finally {
        st.setWriteCheckpointMode('managed');
      }
    },
    createManagedWriteCheckpoints: (ms) =>
      st.createManagedWriteCheckpoints([{ user_id: 'u', heads: { 1: '1' }, checkpoint_requested_at: ms }]),
    deleteCheckpointRequestsBefore: (ms) => st.deleteCheckpointRequestsBefore(ms),
    'compact deleteCheckpointRequestsBefore': (ms) => st.compact({ deleteCheckpointRequestsBefore: ms }),
    'compact minAgeMs': (ms) => st.compact({ incrementalOnly: true, minAgeMs: ms }),
    'waitCheckpoint timeoutMs': (ms) => st.waitCheckpoint(null, { timeoutMs: ms }),
  };
  for (const [what, call] of Object.entries(calls)) {
    for (const ms of [1000, 1000.0, 1e3, 2 ** 40, new Date(1000.7)]) { // a Date holds whole ms
      if (ms instanceof Date && what.includes('Ms')) continue; // durations are numbers
      await call(ms);
    }
    for (const ms of [1000.5, 1000 + 2 ** -20, 1.5, 2 ** 40 + 0.5])
      await assert.rejects(call(ms), code(RangeError, 'BS_EINVAL'), `${what}(${ms})`);
    await assert.rejects(call(1.5), { message: /whole number/ }, what);
  }
  await w.close();
  await st.close();
  await db.close();
});

for (const [name, open] of backends) {
  test(`${name}: getStatus's resumeLsn, custom checkpoints' event_id and request time, compactInitialReplication's maxOpId`, async () => {
    const { db, cleanup } = await open();
    const st = await db.storage(await db.createStream('s'));
    assert.deepEqual([(await st.getStatus()).resumeLsn, (await st.getStatus()).snapshotDone], [null, false]);
    const w = await st.createWriter();
    await w.setResumeLsn('0/ü');
    assert.equal((await st.getStatus()).resumeLsn, '0/ü');
    // compactInitialReplication up to maxOpId only: b1's ops 1..3 are before it, b2's 4..6 after
    for (const b of ['b1', 'b2'])
      for (let v = 0; v < 3; v++)
        await w.save({ tag: v ? 'update' : 'insert', sourceTable: 't', afterReplicaId: b,
          evaluated: [{ bucket: b, table: 't', id: b, data: `{"v":${v}}` }] });
    await w.flush();
    await st.compactInitialReplication({ maxOpId: 3n }); // (its count: see the report)
    await w.setResumeLsn('9');
    await w.markSnapshotDone('1');
    const { checkpoint } = await w.commit('1');
    const sums = await st.getChecksums(checkpoint, ['b1', 'b2']);
    assert.deepEqual([sums.get('b1').count, sums.get('b2').count], [1, 3]);
    const s = await st.getStatus();
    assert.deepEqual([s.snapshotDone, s.lsn, s.resumeLsn], [true, '1', '9']); // it only rises
    // custom write checkpoints with an event, and with a request time
    st.setWriteCheckpointMode({ mode: 'custom', eventName: 'ev' });
    await w.addCustomWriteCheckpoint({ user_id: 'u', checkpoint: 3n, event_id: 'ev' });
    await w.addCustomWriteCheckpoint({ user_id: 'u', checkpoint: 4n, event_id: 'other' });
    await w.addCustomWriteCheckpoint({ user_id: 'v', checkpoint: 5n, checkpoint_requested_at: new Date(1000) });
    await w.flush();
    assert.equal(await st.lastWriteCheckpoint({ user_id: 'u' }), 3n);
    st.setWriteCheckpointMode({ mode: 'custom', eventName: 'other' });
    assert.equal(await st.lastWriteCheckpoint({ user_id: 'u' }), 4n);
    st.setWriteCheckpointMode('custom'); // no event: those without one
    assert.equal(await st.lastWriteCheckpoint({ user_id: 'u' }), null);
    assert.equal(await st.lastWriteCheckpoint({ user_id: 'v' }), 5n);
    assert.equal(await st.deleteCheckpointRequestsBefore(1000), 0); // made at 1000: not before it
    assert.equal(await st.deleteCheckpointRequestsBefore(new Date(1001)), 1);
    assert.equal(await st.lastWriteCheckpoint({ user_id: 'v' }), null);
    await w.close();
    await st.close();
    await db.close();
    cleanup();
  });
}

for (const [name, open] of backends) {
  test(`${name}: terminate({clearStorage}) clears the stream or keeps its data; no writer opens after`, async () => {
    for (const options of [undefined, {}, { clearStorage: false }, { clearStorage: true }]) {
      const { db, cleanup } = await open();
      const st = await db.storage(await db.createStream('s'));
      const w = await st.createWriter();
      await w.save(put('b', 'r'));
      await w.markSnapshotDone('1');
      const { checkpoint } = await w.commit('1');
      await w.close();
      await assert.rejects(st.terminate({ clearStorage: 'yes' }), code(TypeError, 'BS_EINVAL'));
      await st.terminate(options);
      const s = await st.getStatus();
      const cleared = options?.clearStorage === true;
      assert.deepEqual([s.state, s.checkpoint], ['TERMINATED', cleared ? 0n : checkpoint], JSON.stringify(options));
      assert.equal((await st.getChecksums(checkpoint, ['b'])).get('b').count, cleared ? 0 : 1);
      await assert.rejects(st.createWriter(), { code: 'BS_ESTATE' });
      await st.close();
      await db.close();
      cleanup();
    }
  });
}

// compact()'s thresholds reach the library, each as itself (a binding that passed one option
// in another's place, or dropped it, selects other buckets): a bucket of 12 ops, 2 of them
// changes since its last compaction (a ratio of 1/6).
for (const [name, open] of backends) {
  test(`${name}: compact's minBucketChanges, minChangeRatio, incrementalOnly and minAgeMs select as the library does`, async () => {
    const cases = [
      [{ minBucketChanges: 2 }, 1], [{ minBucketChanges: 3 }, 0],
      [{ minBucketChanges: 1, minChangeRatio: 0.15 }, 1], [{ minBucketChanges: 1, minChangeRatio: 0.2 }, 0],
      [{ minBucketChanges: 1, incrementalOnly: true, minAgeMs: 0 }, 1],
      [{ minBucketChanges: 1, incrementalOnly: true, minAgeMs: 3600e3 }, 0],
      [{ minBucketChanges: 1, incrementalOnly: false, minAgeMs: 3600e3 }, 1],
    ];
    for (const [options, selected] of cases) {
      const { db, cleanup } = await open();
      const st = await db.storage(await db.createStream('s'));
      const w = await st.createWriter();
      for (let i = 0; i < 10; i++) await w.save({ ...put('b', `r${i}`), tag: 'insert' });
      await w.markSnapshotDone('1');
      await w.commit('1');
      await st.compact({ minBucketChanges: 1 }); // the changes since this one count
      for (let v = 1; v <= 2; v++)
        await w.save({ ...put('b', 'r0'), evaluated: [{ bucket: 'b', table: 't', id: 'r0', data: `{"v":${v}}` }] });
      await w.commit('2');
      await w.close();
      assert.equal((await st.compact(options)).bucketsCompacted, selected, JSON.stringify(options));
      await st.close();
      await db.close();
      cleanup();
    }
  });
}

for (const [name, open] of backends) {
  test(`${name}: getStatus's lastError: null when none, else a string (a character cut at 255 bytes is U+FFFD)`, async () => {
    // docs/bindings.md: Node's null where Python's last_error is "" (storage.h: "" when none)
    const { db, cleanup } = await open();
    const st = await db.storage(await db.createStream('s'));
    assert.equal((await st.getStatus()).lastError, null);
    await st.reportError(new Error('source gone'));
    assert.equal((await st.getStatus()).lastError, 'source gone');
    // 200 two-byte characters, cut to 255 bytes: 127 whole and half of one, which Python's
    // decode("utf-8", "replace") also makes U+FFFD (this was a Buffer of the 255 bytes)
    await st.reportError('é'.repeat(200));
    assert.equal((await st.getStatus()).lastError, `${'é'.repeat(127)}\uFFFD`);
    await st.reportError(''); // the library's "" is "no error": null, as before any report
    assert.equal((await st.getStatus()).lastError, null);
    await st.close();
    await db.close();
    cleanup();
  });
}
