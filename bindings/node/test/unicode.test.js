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
