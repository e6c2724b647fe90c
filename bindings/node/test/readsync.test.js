'use strict';
// getBucketDataBatchSync and getBucketDataBatchRawSync: getBucketDataBatch's and
// getBucketDataBatchRaw's reads on the calling thread. They hand out what the async forms hand
// out (every chunk, op and field, then the end), throw what those reject with, and share the
// storage's reuseBuffers memory with them: a call that takes the memory of one before (sync or
// async) ends that one's RawOplogs, and its views show the later call's bytes; a call made while
// another's iteration is open gets memory of its own.
const test = require('node:test');
const assert = require('node:assert/strict');
const { bs, backends } = require('./helpers.cjs');

const put = (bucket, id, data) =>
  ({ tag: 'insert', sourceTable: 't', afterReplicaId: id, evaluated: [{ bucket, table: 't', id, data }] });
// RawOplog's toJSON gives its entries; bigints as text
const json = (x) => JSON.stringify(x, (k, v) => (typeof v === 'bigint' ? `${v}n` : v));

async function setup(open) {
  const { db, cleanup } = await open();
  await db.createStream('s');
  const st = await db.storage();
  const w = await st.createWriter();
  // a: short rows, non-ASCII and astral text, a REMOVE; b: 300 rows, several chunks a call
  for (let i = 0; i < 40; i++) await w.save(put('a', `a${i}`, `{"a":"\u00e9${'x'.repeat(i)}\u{1F600}"}`));
  await w.save({ tag: 'delete', sourceTable: 't', beforeReplicaId: 'a3', evaluated: [] });
  for (let i = 0; i < 300; i++) await w.save(put('b', `b${i}`, `{"b":"${'v'.repeat(i % 200)}"}`));
  await w.markSnapshotDone('1');
  await w.commit('1');
  const { checkpoint } = await st.getCheckpoint();
  return { db, st, w, checkpoint, cleanup };
}

/** Each chunk of an iteration as JSON, taken while the iteration is open (reuseBuffers ends a
 * raw chunk with it). */
async function seen(iterable) {
  const out = [];
  for await (const c of iterable) out.push(json(c));
  return out;
}

for (const [name, open] of backends) {
  test(`${name}: the Sync forms hand out what the async forms do`, async () => {
    const { db, st, w, checkpoint, cleanup } = await setup(open);
    const req = [{ bucket: 'b', start: 5n }, { bucket: 'a' }, { bucket: 'none' }];
    for (const options of [undefined, { limit: 100, chunkLimitBytes: 0 }, { limit: 1000, chunkLimitBytes: 700 }]) {
      const want = [];
      for await (const c of st.getBucketDataBatch(checkpoint, req, options)) want.push(c);
      assert.ok(want.length > 2);
      assert.deepEqual([...st.getBucketDataBatchSync(checkpoint, req, options)], want);
      for (const reuseBuffers of [false, true]) {
        const o = { ...options, reuseBuffers }, raw = await seen(st.getBucketDataBatchRaw(checkpoint, req, o));
        assert.equal(raw.length, want.length);
        assert.deepEqual(raw, want.map(json));
        assert.deepEqual(await seen(st.getBucketDataBatchRawSync(checkpoint, req, o)), raw);
      }
    }
    await w.close();
    await st.close();
    await db.close();
    cleanup();
  });

  test(`${name}: the Sync forms throw what the async forms reject with, at the first next()`, async () => {
    const { db, st, w, checkpoint, cleanup } = await setup(open);
    const cases = [
      [[checkpoint, [{ bucket: 'a\uD800' }]], { name: 'TypeError', code: 'BS_EINVAL', message: /not valid Unicode/ }],
      [[checkpoint, [{ bucket: 'a' }], { limit: 0 }], { name: 'RangeError', code: 'BS_EINVAL' }], // the library's
      [[checkpoint, [{ bucket: 'a' }], { requestHint: 'x' }], RangeError],
      [[checkpoint, [{ bucket: 'a' }], { signal: AbortSignal.abort(new Error('why')) }], /why/],
      [[-1n, [{ bucket: 'a' }]], RangeError],
    ];
    for (const [args, error] of cases) {
      await assert.rejects(st.getBucketDataBatch(...args).next(), error);
      const it = st.getBucketDataBatchSync(...args); // a generator: nothing read until next()
      assert.throws(() => it.next(), error);
      assert.throws(() => st.getBucketDataBatchRawSync(...args).next(), error);
    }
    assert.throws(() => st.getBucketDataBatchRawSync(checkpoint, [{ bucket: 'a' }], { reuseBuffers: 1 }).next(),
      { name: 'TypeError', code: 'BS_EINVAL' });
    // an abort between chunks: the chunks before it were handed out
    const ac = new AbortController(), got = [];
    assert.throws(() => {
      for (const c of st.getBucketDataBatchRawSync(checkpoint, [{ bucket: 'b' }], { chunkLimitBytes: 0, signal: ac.signal })) {
        got.push(c);
        ac.abort(new Error('stop'));
      }
    }, () => got.length === 1);
    await w.close();
    await st.close();
    assert.throws(() => st.getBucketDataBatchSync(checkpoint, [{ bucket: 'a' }]).next(), { code: 'BS_ESTATE' });
    await db.close();
    cleanup();
  });

  test(`${name}: reuseBuffers: Sync and async calls lend the storage's memory to each other`, async () => {
    const { db, st, w, checkpoint, cleanup } = await setup(open);
    const reuse = { reuseBuffers: true };
    const want = async (bucket) => seen(st.getBucketDataBatchRaw(checkpoint, [{ bucket }]));
    const [wantA, wantB] = [await want('a'), await want('b')];
    const ended = (raw) => {
      assert.equal(raw.length, 0);
      assert.throws(() => raw.opId(0), { name: 'TypeError', code: 'BS_ESTATE' });
    };
    // an async call's iteration held open: a Sync call meanwhile gets memory of its own
    const a = st.getBucketDataBatchRaw(checkpoint, [{ bucket: 'b' }], reuse);
    const first = (await a.next()).value.chunkData.data;
    const view = first.bytes(0, 'data'), copy = Buffer.from(view);
    assert.deepEqual([...(function* () {
      for (const c of st.getBucketDataBatchRawSync(checkpoint, [{ bucket: 'a' }], reuse)) yield json(c);
    })()], wantA);
    assert.equal(json(first), json(JSON.parse(wantB[0]).chunkData.data));
    assert.ok(view.equals(copy));
    await a.return(); // ends the async call's chunks; its memory goes to the next call
    ended(first);
    // the next call, Sync, writes into that memory: the view the async call gave shows its bytes
    let held;
    for (const c of st.getBucketDataBatchRawSync(checkpoint, [{ bucket: 'a' }], reuse)) {
      if ('hasMore' in c) continue;
      held = c.chunkData.data;
      assert.equal(held.buffer.buffer, view.buffer);
      assert.ok(!view.equals(copy));
      assert.equal(json(c), wantA[0]);
    }
    ended(held); // the Sync iteration ended with its loop
    // and an async call takes the Sync call's memory in turn
    for await (const c of st.getBucketDataBatchRaw(checkpoint, [{ bucket: 'b' }], reuse))
      if (!('hasMore' in c)) assert.equal(c.chunkData.data.buffer.buffer, view.buffer);
    // a Sync read while an async read of the storage is queued or running on the thread pool
    const pending = seen(st.getBucketDataBatchRaw(checkpoint, [{ bucket: 'b' }]));
    assert.deepEqual(await seen(st.getBucketDataBatchRawSync(checkpoint, [{ bucket: 'a' }])), wantA);
    assert.deepEqual(await pending, wantB);
    await w.close();
    await st.close();
    await db.close();
    cleanup();
  });
}
