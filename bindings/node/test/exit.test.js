'use strict';
// A process ends whatever the binding is doing: each child below leaves while a compaction, a
// backup or a load is certainly under way (its worker waits for the onProgress callback that
// is running, or for the Promise that callback returned, which never settles), by
// process.exit(), an uncaught exception or an unhandled rejection. The time limit only detects
// a hang; nothing here depends on timing.
const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const { spawnSync } = require('node:child_process');

const pkg = path.join(__dirname, '..');

/** Runs body in a child with db (a file database with a compactable bucket) and st in scope. */
function child(body) {
  const script = `
    const bs = require(${JSON.stringify(pkg)});
    const fs = require('node:fs'), os = require('node:os'), path = require('node:path');
    const never = () => new Promise(() => {});
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'bs-exit-'));
    process.on('exit', () => fs.rmSync(dir, { recursive: true, force: true }));
    (async () => {
      const db = await bs.open(path.join(dir, 'a.bsdb'), { nosync: true });
      const st = await db.storage(await db.createStream('s'));
      const w = await st.createWriter();
      for (let v = 0; v < 4; v++)
        for (let i = 0; i < 50; i++)
          await w.save({ tag: v ? 'update' : 'insert', sourceTable: 't', afterReplicaId: 'r' + i,
            evaluated: [{ bucket: 'b', table: 't', id: 'o' + i, data: '{"v":' + v + '}' }] });
      await w.markSnapshotDone('1');
      await w.commit('1');
      await w.close();
      const compact = (onProgress) => st.compact({ maxOpsPerTransaction: 2, minAgeMs: 0, onProgress });
      ${body}
    })();`;
  const r = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 15000 });
  assert.equal(r.signal, null, `the child did not end (killed by ${r.signal}): ${r.stderr}`);
  return r;
}

test('process.exit() in onProgress ends the process', () => {
  assert.equal(child('await compact(() => process.exit(7));').status, 7);
  assert.equal(child(`await db.backup(path.join(dir, 'c.bsdb'), { onProgress: () => process.exit(7) });`).status, 7);
  assert.equal(child(`await bs.load(path.join(dir, 'c.bsdb'), db.export(),
    { onProgress: () => process.exit(7) });`).status, 7);
});

test('process.exit() while onProgress awaits ends the process', () => {
  const exitSoon = '() => { setImmediate(() => process.exit(7)); return never(); }';
  assert.equal(child(`await compact(${exitSoon});`).status, 7);
  assert.equal(child(`await db.backup(path.join(dir, 'c.bsdb'), { onProgress: ${exitSoon} });`).status, 7);
});

test('an uncaught exception while onProgress awaits ends the process', () => {
  const r = child(`let thrown = false;
    await compact(() => {
      if (!thrown) setImmediate(() => { throw new Error('boom'); });
      thrown = true;
      return never();
    });`);
  assert.equal(r.status, 1);
  assert.match(r.stderr, /Error: boom/);
});

test('an async onProgress that throws rejects the call; unhandled, it ends the process', () => {
  const caught = child(`await compact(async () => { throw new Error('late'); }).catch((e) => {
      console.log(e.message);
    });
    await st.close();
    await db.close();`);
  assert.equal(caught.status, 0, caught.stderr);
  assert.equal(caught.stdout, 'late\n');
  const r = child(`compact(async () => { throw new Error('late'); });`);
  assert.equal(r.status, 1);
  assert.match(r.stderr, /Error: late/);
});

// Everything else that can be under way at once: a waitCheckpoint waiting (on the thread pool),
// an export paused between its batches (its thread waits for the slot), a load waiting for its
// next record (an input that never yields it), a getBucketDataBatch iteration left half-read
// (in the default mode and in raw mode reusing its buffers) and a writer with a save queued;
// then the process leaves, each way.
const everything = `
  const wait = st.waitCheckpoint(await st.getCheckpoint());
  const exp = db.export()[Symbol.asyncIterator]();
  await exp.next();
  let fed;
  const fedOne = new Promise((r) => (fed = r));
  const loading = bs.load(path.join(dir, 'l.bsdb'), (async function* () {
    for await (const r of db.export()) { yield r; fed(); await never(); }
  })());
  await fedOne;
  const chunks = st.getBucketDataBatch((await st.getCheckpoint()).checkpoint, [{ bucket: 'b' }], { limit: 10 });
  await chunks.next();
  const raw = st.getBucketDataBatchRaw((await st.getCheckpoint()).checkpoint, [{ bucket: 'b' }],
    { limit: 10, reuseBuffers: true });
  await raw.next();
  const w2 = await st.createWriter();
  await w2.save({ tag: 'update', sourceTable: 't', afterReplicaId: 'r1',
    evaluated: [{ bucket: 'b', table: 't', id: 'o1', data: '{}' }] });
  void wait, void loading, void raw;
  console.log('under way');`;

test('process.exit() while a wait, an export, a load, a read and a writer are under way ends the process', () => {
  const r = child(`${everything}\n process.exit(7);`);
  assert.equal(r.status, 7, r.stderr);
  assert.equal(r.stdout, 'under way\n');
});

test('an uncaught exception while a wait, an export, a load, a read and a writer are under way ends the process', () => {
  const r = child(`${everything}\n setImmediate(() => { throw new Error('boom'); });`);
  assert.equal(r.status, 1);
  assert.equal(r.stdout, 'under way\n');
  assert.match(r.stderr, /Error: boom/);
});
