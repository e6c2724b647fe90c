'use strict';
// worker_threads open the database file the main thread has open (the library shares one LMDB
// environment per file in a process): workers write and commit, the main thread reads what they
// committed through its own handle; and a read snapshot of the main thread (an export paused
// between its batches) stays whole while a worker rewrites and compacts every row.
const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const { Worker } = require('node:worker_threads');
const { bs, tmpPath } = require('./helpers.cjs');

const pkg = path.join(__dirname, '..');

/** Runs body (an async function's text, with bs, file and stream in scope) in a worker. */
function inWorker(file, stream, body) {
  const w = new Worker(`
    const { parentPort, workerData: { pkg, file, stream } } = require('node:worker_threads');
    const bs = require(pkg);
    (async () => { ${body} })().then((r) => parentPort.postMessage({ r }), (e) => parentPort.postMessage({ e: String(e.stack) }));
  `, { eval: true, workerData: { pkg, file, stream } });
  return new Promise((resolve, reject) => {
    w.once('message', (m) => (m.e ? reject(new Error(m.e)) : resolve(m.r)));
    w.once('error', reject);
  });
}

const writeRows = `
  const db = await bs.open(file, { nosync: true });
  const st = await db.storage(stream);
  const w = await st.createWriter();
  for (let i = 0; i < 50; i++)
    await w.save({ tag: 'insert', sourceTable: 't', afterReplicaId: 'r' + i,
      evaluated: [{ bucket: 'b' + stream, table: 't', id: 'o' + i, data: '{"i":' + i + '}' }] });
  await w.markSnapshotDone('1');
  const { checkpoint } = await w.commit('1');
  await w.close();
  const sums = await st.getChecksums(checkpoint, ['b' + stream]);
  await st.close();
  await db.close();
  return { checkpoint: String(checkpoint), ...sums.get('b' + stream) };`;

test('worker threads and the main thread share one database file', async () => {
  const t = tmpPath();
  const db = await bs.open(t.file, { nosync: true });
  const s1 = await db.createStream('one');
  const s2 = await db.createStream('two');
  // two workers write a stream each, at the same time, while the main thread holds the file open
  const [r1, r2] = await Promise.all([inWorker(t.file, s1, writeRows), inWorker(t.file, s2, writeRows)]);
  for (const [s, r] of [[s1, r1], [s2, r2]]) {
    assert.equal(r.count, 50);
    const st = await db.storage(s);
    const cp = await st.getCheckpoint();
    assert.equal(String(cp.checkpoint), r.checkpoint); // the main thread sees the worker's commit
    const mine = (await st.getChecksums(cp, [`b${s}`])).get(`b${s}`);
    assert.deepEqual([mine.checksum, mine.count], [r.checksum, r.count]);
    await st.close();
  }
  // a worker reads what the other wrote
  const read = await inWorker(t.file, s1, `
    const db = await bs.open(file, { nosync: true });
    const st = await db.storage(stream);
    const cp = await st.getCheckpoint();
    const c = (await st.getChecksums(cp, ['b' + stream])).get('b' + stream);
    await st.close();
    await db.close();
    return c;`);
  assert.deepEqual([read.checksum, read.count], [r1.checksum, 50]);
  assert.deepEqual(await db.verify(), []);
  await db.close();
  t.cleanup();
});

test("a worker's rewrites and compactions leave the main thread's paused export whole", async () => {
  const t = tmpPath();
  const db = await bs.open(t.file, { nosync: true });
  const stream = await db.createStream('s');
  const st = await db.storage(stream);
  const w = await st.createWriter();
  const row = (i, v) => ({ tag: v ? 'update' : 'insert', sourceTable: 't', afterReplicaId: `r${i}`,
    evaluated: [{ bucket: `b${i % 10}`, table: 't', id: `o${i}`, data: `{"i":${i},"v":${v},"pad":"${'x'.repeat(100)}"}` }] });
  for (let i = 0; i < 4000; i++) await w.save(row(i, 0));
  await w.markSnapshotDone('1');
  await w.commit('1');
  await w.close();
  await st.close();
  const digest = (r) => `${r.table}/${r.stream}/${Buffer.from(r.key).toString('hex')}=${Buffer.from(r.value).toString('hex')}`;
  const want = [];
  for await (const r of db.export()) want.push(digest(r));
  assert.ok(want.length > 4000);
  const paused = db.export()[Symbol.asyncIterator]();
  const got = [digest((await paused.next()).value)]; // its snapshot is taken and held from here
  await inWorker(t.file, stream, `
    const db = await bs.open(file, { nosync: true });
    const st = await db.storage(stream);
    const w = await st.createWriter();
    for (let v = 1; v <= 6; v++) {
      for (let i = 0; i < 4000; i++)
        await w.save({ tag: 'update', sourceTable: 't', afterReplicaId: 'r' + i, evaluated: [{ bucket: 'b' + (i % 10),
          table: 't', id: 'o' + i, data: '{"i":' + i + ',"v":' + v + ',"pad":"' + 'y'.repeat(100) + '"}' }] });
      await w.commit(String(v + 1));
      await st.compact({ minBucketChanges: 1, minChangeRatio: 0 });
    }
    await w.close();
    await st.close();
    await db.close();`);
  for (let r; !(r = await paused.next()).done;) got.push(digest(r.value));
  assert.equal(got.length, want.length);
  assert.deepEqual(got, want);
  assert.deepEqual(await db.verify(), []);
  await db.close();
  t.cleanup();
});
