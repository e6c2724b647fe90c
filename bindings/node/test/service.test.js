'use strict';
// The sync service's storage-interface names and options beyond the core calls: requestHint
// (accepted), signal on the reads and lifecycle calls (its reason, before or between chunks),
// clearChecksumCache, incremental parameter compaction, and the compaction options the engine
// has no use for (accepted).
const test = require('node:test');
const assert = require('node:assert/strict');
const { backends } = require('./helpers.cjs');

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
    await db.close();
    cleanup();
  });
}
