'use strict';
// Strings cross as UTF-8, so a string that is not valid Unicode (a lone surrogate, which Node
// would write as U+FFFD, merging 'a\uD800' and 'a\uDC00' into one bucket) is refused with a
// TypeError; bytes (Buffer, Uint8Array) are stored as given and come back the same: a string
// when they are UTF-8, else a Buffer of them.
const test = require('node:test');
const assert = require('node:assert/strict');
const { bs, backends, readAll } = require('./helpers.cjs');

const lone = ['a\uD800', 'a\uDC00', '\uDBFFz', 'x\uDC00\uD800y', '\uD800'];
const put = (bucket, id = 'o', table = 't', data = '{}') =>
  ({ tag: 'insert', sourceTable: 't', afterReplicaId: id, evaluated: [{ bucket, table, id, data }] });

for (const [name, open] of backends) {
  test(`${name}: strings with a lone surrogate are refused with a TypeError`, async () => {
    const { db, cleanup } = await open();
    await assert.rejects(db.createStream('s\uD800'), TypeError);
    await db.createStream('s');
    const st = await db.storage();
    const w = await st.createWriter();
    for (const s of lone) {
      const refused = { name: 'TypeError', code: 'BS_EINVAL', message: /not valid Unicode/ };
      await assert.rejects(w.save(put(s)), refused);
      await assert.rejects(w.save(put('b', s)), refused);
      await assert.rejects(w.save(put('b', 'o', s)), refused);
      await assert.rejects(w.save(put('b', 'o', 't', s)), refused);
      await assert.rejects(w.save({ ...put('b'), sourceTable: s }), refused);
      await assert.rejects(w.save({ ...put('b'), evaluatedParameters: [{ lookup: [s], bucketParameters: [] }] }),
        refused);
      await assert.rejects(st.getChecksums(0n, [s]), refused);
      await assert.rejects(st.getParameterSets(0n, [[s]]), refused);
      await assert.rejects(w.getSourceRow('t', s), refused);
    }
    // what is valid Unicode passes: pairs, and U+FFFD itself
    const ok = ['a\uFFFD', 'a\uD83D\uDE00', '\uDBFF\uDFFF', 'é'];
    for (const s of ok) await w.save(put(s, s));
    await w.markSnapshotDone('1');
    const { checkpoint } = await w.commit('1');
    const ops = await readAll(st, checkpoint, ok);
    for (const s of ok) assert.deepEqual(ops.get(s).map((o) => o.object_id), [s]);
    assert.equal(bs.liveHandles() > 0, true);
    await w.close();
    await st.close();
    await db.close();
    cleanup();
  });

  test(`${name}: byte names round-trip exactly; two byte names stay two buckets`, async () => {
    const { db, cleanup } = await open();
    await db.createStream('s');
    const st = await db.storage();
    const w = await st.createWriter();
    const a = Buffer.from([0x61, 0xed, 0xa0, 0x80]); // 'a' + the CESU-8 bytes of U+D800
    const b = new Uint8Array([0x61, 0xed, 0xb0, 0x80]); // 'a' + those of U+DC00
    const c = Buffer.from([0xff, 0x00, 0xfe]);
    const text = Buffer.from('bytes that are UTF-8: é');
    await w.save(put(a, 'r1', 't', '{"v":1}'));
    await w.save(put(b, 'r2', 't', '{"v":2}'));
    await w.save({ tag: 'insert', sourceTable: 't', afterReplicaId: 'r3',
      evaluated: [{ bucket: c, table: c, id: c, data: c }] });
    await w.save(put(text, 'r4'));
    await w.markSnapshotDone('1');
    const { checkpoint } = await w.commit('1');
    const sums = await st.getChecksums(checkpoint, [a, b, c]);
    assert.equal(sums.get(a).count, 1);
    assert.equal(sums.get(b).count, 1);
    assert.notEqual(sums.get(a).checksum, sums.get(b).checksum);
    const seen = new Map();
    for await (const ch of st.getBucketDataBatch(checkpoint, [a, b, c, text].map((bucket) => ({ bucket }))))
      if (!('hasMore' in ch)) seen.set(Buffer.from(ch.chunkData.bucket).toString('hex'), ch.chunkData);
    assert.equal(seen.size, 4);
    const got = (x) => seen.get(Buffer.from(x).toString('hex'));
    assert.ok(Buffer.isBuffer(got(a).bucket) && got(a).bucket.equals(a));
    assert.ok(Buffer.isBuffer(got(b).bucket) && got(b).bucket.equals(Buffer.from(b)));
    assert.equal(got(a).data[0].data, '{"v":1}');
    const op = got(c).data[0];
    for (const f of ['object_type', 'object_id', 'data']) assert.ok(op[f].equals(c), f);
    assert.equal(op.checksum, bs.checksumPut('xxh3', c, c, c));
    assert.equal(got(text).bucket, 'bytes that are UTF-8: é'); // UTF-8 bytes read back as a string
    const changes = await st.getCheckpointChanges({ lastCheckpoint: 0n, nextCheckpoint: checkpoint });
    const hex = [...changes.updatedDataBuckets].map((x) => Buffer.from(x).toString('hex')).sort();
    assert.deepEqual(hex, [a, b, c, text].map((x) => Buffer.from(x).toString('hex')).sort());
    await w.close();
    await st.close();
    await db.close();
    cleanup();
  });

  // A batch's strings reach JS as one text sliced at UTF-16 offsets, bytes that are not UTF-8
  // apart: a field after astral characters, non-ASCII or such bytes must still be cut right. A
  // field equal to the op before's is that op's string: repeats of text, non-ASCII, "" and
  // bytes (which stay bytes).
  test(`${name}: every field of a batch mixing ASCII, astral characters and bytes`, async () => {
    const { db, cleanup } = await open();
    await db.createStream('s');
    const st = await db.storage();
    const w = await st.createWriter();
    const raw = Buffer.from([0xff, 0x61, 0xfe]);
    const rows = [['t', 'a1', '{"a":1}'], ['t\u00e9', 'b\uD83D\uDE00\uD83D\uDE00', '{"b":"\uDBFF\uDFFF\u00e9"}'],
      [raw, raw, raw], ['t', 'c3', '{"c":"\u20ac"}'], ['t', 'd4', ''], ['\u00e9', raw, 'x\uD83D\uDE00'],
      ['\u00e9', 'e5', 'x\uD83D\uDE00'], ['\u00e9', 'e6', ''], [raw, raw, raw], [raw, raw, raw],
      ['\u00e9', 'e6', ''], ['t', 't', 't']];
    for (const [table, id, data] of rows) await w.save(put('mix', id, table, data));
    await w.markSnapshotDone('1');
    const { checkpoint } = await w.commit('1');
    const ops = (await readAll(st, checkpoint, ['mix'])).get('mix');
    assert.equal(ops.length, rows.length);
    ops.forEach((op, i) => assert.deepEqual([op.object_type, op.object_id, op.data], rows[i], `op ${i}`));
    await w.close();
    await st.close();
    await db.close();
    cleanup();
  });

  // The columns of a batch grow as its chunks come: several chunks whose ops outgrow the first
  // block (512 op ids) must each land after the one before.
  test(`${name}: a batch of several chunks, every op in place`, async () => {
    const { db, cleanup } = await open();
    await db.createStream('s');
    const st = await db.storage();
    const w = await st.createWriter();
    const buckets = ['c0', 'c1', 'c2'], per = 400;
    const rows = [];
    for (const b of buckets) for (let i = 0; i < per; i++) rows.push(put(b, `${b}-${i}`, 't', `{"i":${i}}`));
    await w.saveMany(rows);
    await w.markSnapshotDone('1');
    const { checkpoint } = await w.commit('1');
    const got = [];
    for await (const ch of st.getBucketDataBatch(checkpoint, buckets.map((bucket) => ({ bucket })),
      { limit: 10000 }))
      if (!('hasMore' in ch)) for (const op of ch.chunkData.data) got.push([ch.chunkData.bucket, op.object_id, op.data]);
    assert.deepEqual(got, rows.map((r) => [r.evaluated[0].bucket, r.afterReplicaId, r.evaluated[0].data]));
    await w.close();
    await st.close();
    await db.close();
    cleanup();
  });
}

// Every argument that takes a string, of every call (index.d.ts), refuses one that is not valid
// Unicode before anything is done with it, naming the argument: the calls above and
// edges.test.js's tables cover the fields of saves and reads; this table is the rest (paths,
// LSNs, tables, write-checkpoint users, events and heads, filters, records, URLs, messages).
test('every string argument of every call refuses a lone surrogate, naming the argument', async () => {
  const { tmpPath } = require('./helpers.cjs');
  const path = require('node:path');
  const fs = require('node:fs');
  const t = tmpPath();
  const dir = path.dirname(t.file);
  const db = await bs.open(t.file, { nosync: true });
  const st = await db.storage(await db.createStream('s'));
  const w = await st.createWriter();
  const L = 'a\uD800';
  const row = { tag: 'insert', sourceTable: 't', afterReplicaId: 'r',
    evaluated: [{ bucket: 'b', table: 't', id: 'r', data: '{}' }] };
  const calls = {
    'open path': [/^path/, () => bs.open(path.join(dir, L))],
    'open postgresql URL': [/^path/, () => bs.open(`postgresql://127.0.0.1:1/${L}`)],
    'openPostgres url': [/^url/, () => bs.openPostgres(`postgresql://127.0.0.1:1/${L}`)],
    'createStream name': [/^name/, () => db.createStream(L)],
    'backup path': [/^path/, () => db.backup(path.join(dir, L))],
    'load path': [/^path/, () => bs.load(path.join(dir, L), db.export())],
    'load record table': [/^records\[0\]\.table/, () => bs.load(path.join(dir, 'l1'), [{ table: L, stream: 0, key: 'k', value: 'v' }])],
    'load record key': [/^records\[0\]\.key/, () => bs.load(path.join(dir, 'l2'), [{ table: 'meta', stream: 0, key: L, value: 'v' }])],
    'checksumPut objectType': [/^objectType/, async () => bs.checksumPut('xxh3', L, 'i', '{}')],
    'checksumPut objectId': [/^objectId/, async () => bs.checksumPut('xxh3', 't', L, '{}')],
    'checksumPut data': [/^data/, async () => bs.checksumPut('xxh3', 't', 'i', L)],
    'save currentData': [/currentData/, () => w.save({ ...row, currentData: L })],
    'save beforeReplicaId': [/beforeReplicaId/, () => w.save({ ...row, tag: 'update', beforeReplicaId: L })],
    'save bucketParameters text': [/bucketParameters\[0\]/, () => w.save({ ...row,
      evaluatedParameters: [{ lookup: ['k'], bucketParameters: [`{"a":"${L}"}`] }] })],
    'saveMany bucket': [/^saves\[0\]\.evaluated\[0\]\.bucket/, () => w.saveMany([{ ...row,
      evaluated: [{ bucket: L, table: 't', id: 'r', data: '{}' }] }])],
    'truncate table': [/^table/, () => w.truncate(L)],
    'truncate {name}': [/^table/, () => w.truncate({ name: L })],
    'drop tables': [/^table/, () => w.drop([L])],
    'commit lsn': [/^lsn/, () => w.commit(L)],
    'keepalive lsn': [/^lsn/, () => w.keepalive(L)],
    'markSnapshotDone lsn': [/^lsn/, () => w.markSnapshotDone(L)],
    'setResumeLsn lsn': [/^lsn/, () => w.setResumeLsn(L)],
    'getSourceRow table': [/^table/, () => w.getSourceRow(L, 'r')],
    'addCustomWriteCheckpoint user_id': [/user_id/, () => w.addCustomWriteCheckpoint({ user_id: L, checkpoint: 1n })],
    'addCustomWriteCheckpoint event_id': [/event_id/, () => w.addCustomWriteCheckpoint({ user_id: 'u', checkpoint: 1n, event_id: L })],
    'setWriteCheckpointMode eventName': [/eventName/, async () => st.setWriteCheckpointMode({ mode: 'custom', eventName: L })],
    'createWriter zeroLSN': [/zeroLSN/, () => st.createWriter({ zeroLSN: L })],
    'createManagedWriteCheckpoints user_id': [/user_id/, () => st.createManagedWriteCheckpoints([{ user_id: L, heads: { 1: '0' } }])],
    'createManagedWriteCheckpoints head': [/heads\[0\]/, () => st.createManagedWriteCheckpoints([{ user_id: 'u', heads: { 1: L } }])],
    'createManagedWriteCheckpoints connection': [/heads key/, () => st.createManagedWriteCheckpoints([{ user_id: 'u', heads: { [L]: '0' } }])],
    'lastWriteCheckpoint user_id': [/user_id/, () => st.lastWriteCheckpoint({ user_id: L, heads: { 1: '0' } })],
    'lastWriteCheckpoint head': [/heads\[0\]/, () => st.lastWriteCheckpoint({ user_id: 'u', heads: { 1: L } })],
    'getBucketDataBatchRaw bucket': [/bucket/, () => st.getBucketDataBatchRaw(0n, [{ bucket: L }]).next()],
    'getChecksums {bucket}': [/^buckets\[0\]/, () => st.getChecksums(0n, [{ bucket: L }])],
    'listBuckets startAfter': [/startAfter/, () => st.listBuckets({ startAfter: L }).next()],
    'waitCheckpoint known.lsn': [/lsn/, () => st.waitCheckpoint({ checkpoint: 0n, lsn: L }, { timeoutMs: 0 })],
    'reportError message': [/^message/, () => st.reportError(L)],
    'reportError Error': [/^message/, () => st.reportError(new Error(L))],
  };
  for (const [what, [arg, call]] of Object.entries(calls)) {
    await assert.rejects(call(), (e) => {
      assert.equal(e.name, 'TypeError', `${what}: ${e.stack}`);
      assert.equal(e.code, 'BS_EINVAL', what);
      assert.match(e.message, /not valid Unicode/, what);
      assert.match(e.message, arg, what);
      return true;
    }, what);
  }
  // nothing was done: no file, no stream, no record, no error, no queued work
  assert.deepEqual(fs.readdirSync(dir).sort(), ['test.bsdb', 'test.bsdb-lock']);
  assert.deepEqual((await db.listStreams()).map((s) => s.name), ['s']);
  assert.equal((await st.getStatus()).lastError, null);
  assert.equal(await w.flush(), null);
  await w.close();
  await st.close();
  await db.close();
  t.cleanup();
});
