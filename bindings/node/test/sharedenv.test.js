'use strict';
// One file opened in several worker threads of one process (storage.h bs_open: every open of a
// file shares one environment). The main thread's export keeps its read snapshot while workers
// open the file, read its checkpoint and close it, and every row is then rewritten and compacted:
// the export still delivers every record of its snapshot.
const test = require('node:test');
const assert = require('node:assert/strict');
const { Worker } = require('node:worker_threads');
const { bs, tmpPath } = require('./helpers.cjs');

const ROWS = 2000;

async function commitRound(w, r) {
  for (let i = 0; i < ROWS; i++)
    await w.save({ tag: r ? 'update' : 'insert', sourceTable: 't', afterReplicaId: `r${i}`,
      evaluated: [{ bucket: `b${i % 10}`, table: 'x', id: `o${i}`,
        data: JSON.stringify({ r, pad: 'x'.repeat(80) }) }] });
  return (await w.commit(String(r + 1).padStart(8, '0'))).checkpoint;
}

const text = (rec) => `${rec.table}/${rec.stream}/${Buffer.from(rec.key).toString('hex')}/` +
  Buffer.from(rec.value).toString('hex');

async function collect(it, into) {
  for (;;) {
    const { value, done } = await it.next();
    if (done) return into;
    into.push(text(value));
  }
}

test('worker threads open the file while an export of the main thread reads it', async () => {
  const t = tmpPath();
  const db = await bs.open(t.file, { nosync: true });
  await db.createStream('v1');
  const st = await db.storage();
  const w = await st.createWriter();
  await w.markSnapshotDone('00000000');
  const c1 = await commitRound(w, 0);
  const before = await collect(db.export(), []);
  const it = db.export();
  const first = await it.next(); // the export's snapshot is open from here on
  const code = `
    const bs = require(${JSON.stringify(require.resolve('..'))});
    const { parentPort, workerData } = require('node:worker_threads');
    (async () => {
      const db = await bs.open(workerData, { nosync: true });
      const st = await db.storage();
      const cp = await st.getCheckpoint();
      await st.close(); await db.close();
      parentPort.postMessage(cp.checkpoint);
    })();`;
  const seen = await Promise.all([0, 1, 2].map(() => new Promise((resolve, reject) => {
    const wk = new Worker(code, { eval: true, workerData: t.file });
    wk.once('message', resolve);
    wk.once('error', reject);
  })));
  assert.deepEqual(seen, [c1, c1, c1]);
  for (let r = 1; r <= 4; r++) {
    await commitRound(w, r);
    await st.compact({ minBucketChanges: 1 });
  }
  const after = await collect(it, [text(first.value)]);
  assert.equal(after.length, before.length);
  assert.deepEqual(after, before);
  await w.close();
  await st.close();
  await db.close();
  t.cleanup();
});
