'use strict';
// getBucketDataBatchRaw: the same reads as getBucketDataBatch, each chunk's ops as a RawOplog
// whose fields are decoded when read. Every field of every op is compared with the default
// mode's, over edge values (empty strings, non-ASCII and astral text, bytes that are not UTF-8,
// the longest object id, table and a large row, REMOVE, MOVE and CLEAR ops after a compaction)
// and over batches cut into many chunks.
const test = require('node:test');
const assert = require('node:assert/strict');
const { bs, backends } = require('./helpers.cjs');

const FIELDS = ['object_type', 'object_id', 'subkey', 'data'];
const put = (bucket, id, table, data) =>
  ({ tag: 'insert', sourceTable: 't', afterReplicaId: id, evaluated: [{ bucket, table, id, data }] });

/** Every chunk of one call in both modes: [[default chunk, raw chunk], ...] and the two ends. */
async function both(st, checkpoint, req, options) {
  const a = [], b = [];
  for await (const c of st.getBucketDataBatch(checkpoint, req, options)) a.push(c);
  for await (const c of st.getBucketDataBatchRaw(checkpoint, req, options)) b.push(c);
  assert.equal(a.length, b.length);
  assert.deepEqual(a.at(-1), b.at(-1)); // {hasMore}
  return a.slice(0, -1).map((c, i) => [c, b[i]]);
}

/** Raw chunk r against default chunk d, field by field, through every accessor. */
function same(d, r) {
  const { data: ops, ...head } = d.chunkData;
  const { data: raw, ...rawHead } = r.chunkData;
  assert.deepEqual(rawHead, head);
  assert.equal(r.targetOp, d.targetOp);
  assert.ok(raw instanceof bs.RawOplog);
  assert.equal(raw.length, ops.length);
  ops.forEach((op, i) => {
    assert.deepEqual(raw.entry(i), op, `op ${i}`);
    assert.equal(raw.opId(i), op.op_id);
    assert.equal(raw.op(i), op.op);
    assert.equal(raw.checksum(i), op.checksum);
    assert.deepEqual([raw.objectType(i), raw.objectId(i), raw.subkey(i), raw.data(i)],
      FIELDS.map((f) => op[f]));
    for (const f of FIELDS) {
      const v = op[f], bytes = raw.bytes(i, f);
      if (v === null) {
        assert.equal(bytes, null, f);
        assert.equal(raw.byteStart(i, f), -1);
        assert.equal(raw.byteEnd(i, f), -1);
        continue;
      }
      assert.ok(bytes.equals(Buffer.from(v)), `op ${i} ${f}`);
      assert.ok(raw.buffer.subarray(raw.byteStart(i, f), raw.byteEnd(i, f)).equals(bytes));
    }
  });
  // an index past the chunk is refused, also where the call's next chunk holds ops
  for (const i of [raw.length, raw.length + 1])
    assert.throws(() => raw.byteStart(i, 'data'), { name: 'RangeError', code: 'BS_EINVAL' }, String(i));
  assert.throws(() => raw.opId(raw.length), { name: 'RangeError', code: 'BS_EINVAL' });
  assert.deepEqual([...raw], ops);
  const json = (x) => JSON.stringify(x, (k, v) => (typeof v === 'bigint' ? `${v}n` : v));
  assert.equal(json(raw), json(ops));
}

for (const [name, open] of backends) {
  test(`${name}: raw mode gives every field of the default mode, edge values included`, async () => {
    const { db, cleanup } = await open();
    await db.createStream('s');
    const st = await db.storage();
    const w = await st.createWriter();
    const notUtf8 = Buffer.from([0x61, 0xed, 0xa0, 0x80, 0xff]); // 'a', CESU-8 U+D800, 0xff
    const fffd = Buffer.from('a\uFFFDb'); // UTF-8 of U+FFFD itself: a string, not bytes
    const rows = [['t', 'a1', '{"a":1}'], ['t', '', ''], ['t\u00e9', 'b\uD83D\uDE00', '{"b":"\uDBFF\uDFFF\u00e9"}'],
      [notUtf8, notUtf8, notUtf8], ['t', fffd, fffd], ['\u00e9', 'x'.repeat(256), 'y'.repeat(1 << 20)],
      ['T'.repeat(256), 'c3', '{"c":"\u20ac"}'], [Buffer.alloc(0), Buffer.from([0]), Buffer.from([0xc3])]];
    for (const [table, id, data] of rows) await w.save(put('edge', id, table, data));
    for (let i = 0; i < 30; i++) await w.save(put(`many${i % 3}`, `m${i}`, 't', `{"i":${i}}`));
    await w.markSnapshotDone('1');
    await w.commit('1');
    // superseded rows, a REMOVE, then a compaction: MOVE and CLEAR ops
    for (let i = 0; i < 10; i++) await w.save(put('many0', `m${3 * i}`, 't', `{"i":${i},"v":2}`));
    await w.save({ tag: 'update', sourceTable: 't', afterReplicaId: 'm1', evaluated: [] });
    await w.commit('2');
    await st.compact({ minBucketChanges: 1 });
    const { checkpoint } = await st.getCheckpoint();
    const buckets = ['edge', 'many0', 'many1', 'many2'];
    const ops = new Set();
    for (const options of [undefined, { limit: 7 }, { chunkLimitBytes: 0 }, { limit: 3, chunkLimitBytes: 40 }]) {
      const pos = new Map(buckets.map((b) => [b, 0n]));
      for (let more = true; more;) {
        const pairs = await both(st, checkpoint, [...pos].map(([bucket, start]) => ({ bucket, start })), options);
        more = false;
        for (const [d, r] of pairs) {
          same(d, r);
          for (const op of d.chunkData.data) ops.add(op.op);
          pos.set(d.chunkData.bucket, d.chunkData.next_after);
          more = more || d.chunkData.has_more;
        }
      }
    }
    assert.ok(ops.has('PUT') && ops.has('REMOVE') && (ops.has('MOVE') || ops.has('CLEAR')), [...ops].join());
    // the fields as given: bytes that are not UTF-8 are a Buffer, U+FFFD's bytes a string
    const [[, edge]] = await both(st, checkpoint, [{ bucket: 'edge' }], { chunkLimitBytes: 1 << 24 });
    const e = edge.chunkData.data;
    assert.ok(Buffer.isBuffer(e.objectId(3)) && e.objectId(3).equals(notUtf8));
    assert.equal(e.data(4), 'a\uFFFDb');
    assert.equal(e.objectId(1), '');
    assert.equal(e.data(1), '');
    assert.equal(e.objectId(5).length, 256);
    assert.equal(e.data(5).length, 1 << 20);
    assert.equal(e.objectType(6).length, 256);
    assert.deepEqual([e.objectType(7), e.objectId(7)], ['', '\0']);
    assert.ok(Buffer.isBuffer(e.data(7)) && e.data(7).equals(Buffer.from([0xc3])));
    // indexes outside the chunk and unknown field names are refused
    for (const i of [-1, e.length, 0.5, '0', NaN])
      assert.throws(() => e.opId(i), { name: 'RangeError', code: 'BS_EINVAL' }, String(i));
    assert.throws(() => e.bytes(0, 'op_id'), { name: 'RangeError', code: 'BS_EINVAL' });
    await w.close();
    await st.close();
    await db.close();
    cleanup();
  });

  test(`${name}: raw mode's chunks decoded once when ASCII, each field on its own when not`, async () => {
    const { db, cleanup } = await open();
    await db.createStream('s');
    const st = await db.storage();
    const w = await st.createWriter();
    // one call's chunks: ASCII, non-ASCII at a chunk's first and last byte, ASCII again, one
    // with bytes that are not UTF-8; empty fields and a REMOVE's nulls among the ASCII ones
    const rows = { a: [['t', 'a1', '{"a":1}'], ['t', '', '']], b: [['\u00e9', 'b1', '1'], ['t', 'b2', '\u00e9']],
      c: [['t', 'c1', 'x'.repeat(40)], ['t', 'c2', '{}']], d: [['t', 'd1', Buffer.from([0x80])]] };
    for (const [bucket, list] of Object.entries(rows))
      for (const [table, id, data] of list) await w.save(put(bucket, id, table, data));
    await w.markSnapshotDone('1');
    await w.commit('1');
    await w.save({ tag: 'delete', sourceTable: 't', beforeReplicaId: 'c2' });
    await w.commit('2');
    const { checkpoint } = await st.getCheckpoint();
    const req = ['a', 'b', 'c', 'd'].map((bucket) => ({ bucket }));
    for (const options of [undefined, { chunkLimitBytes: 0 }]) {
      const pairs = await both(st, checkpoint, req, options);
      assert.ok(pairs.length >= 4);
      assert.ok(pairs.some(([d]) => d.chunkData.data.some((op) => op.op === 'REMOVE')));
      for (const [d, r] of pairs) same(d, r);
      // a field read first, then the others (the chunk's string made by the first read)
      for (const [d, r] of pairs) {
        const raw = r.chunkData.data;
        for (let i = raw.length - 1; i >= 0; i--) assert.deepEqual(raw.data(i), d.chunkData.data[i].data);
      }
    }
    await w.close();
    await st.close();
    await db.close();
    cleanup();
  });

  test(`${name}: the default mode's text in pieces: every field of a batch of many pieces`, async () => {
    // the addon hands the default mode's text over in pieces of about 32k UTF-16 units cut
    // between ops (js_text_pieces); index.js slices each op's fields out of its piece. One call
    // over ASCII and non-ASCII chunks, fields that are not UTF-8, REMOVEs (null data), an op
    // larger than a piece and ops that share their object type across the cuts.
    const { db, cleanup } = await open();
    await db.createStream('s');
    const st = await db.storage();
    const w = await st.createWriter();
    const rows = {
      a: (i) => ['t', `a${i}`, `{"i":${i},"s":"${'abcdefgh'.repeat(1 + (i % 40))}"}`],
      b: (i) => [i % 7 ? 't' : 'u', `b${i}`, `{"i":${i},"s":"${'\u00e9\u20ac'.repeat(1 + (i % 60))}\uD83D\uDE00"}`],
      c: (i) => ['t', i % 50 ? `c${i}` : Buffer.from([0xff, i & 0x7f]), i === 7 ? 'z'.repeat(70000) : `{"c":${i}}`],
    };
    for (let i = 0; i < 600; i++)
      for (const [bucket, row] of Object.entries(rows)) {
        const [table, id, data] = row(i);
        await w.save(put(bucket, id, table, data));
      }
    await w.markSnapshotDone('1');
    await w.commit('1');
    for (let i = 0; i < 600; i += 9) await w.save({ tag: 'delete', sourceTable: 't', beforeReplicaId: `a${i}` });
    await w.commit('2');
    const { checkpoint } = await st.getCheckpoint();
    const req = ['a', 'b', 'c'].map((bucket) => ({ bucket }));
    for (const options of [{ limit: 5000 }, { limit: 5000, chunkLimitBytes: 3000 }]) {
      const pairs = await both(st, checkpoint, req, options);
      let units = 0, n = 0;
      for (const [d, r] of pairs) {
        same(d, r);
        for (const op of d.chunkData.data) {
          n++;
          for (const f of FIELDS) units += typeof op[f] === 'string' ? op[f].length : 0;
        }
      }
      assert.equal(n, 3 * 600 + 67);
      assert.ok(units > 4 * 32768, `${units} units: several pieces`);
      const [[a]] = pairs, ops = a.chunkData.data;
      assert.deepEqual([ops[1].object_id, ops[1].data], ['a1', `{"i":1,"s":"${'abcdefgh'.repeat(2)}"}`]);
    }
    await w.close();
    await st.close();
    await db.close();
    cleanup();
  });

  test(`${name}: reuseBuffers: a call writes into the memory of the one before; its chunks end with the iteration`, async () => {
    const { db, cleanup } = await open();
    await db.createStream('s');
    const st = await db.storage();
    const w = await st.createWriter();
    // batches of several sizes, so that a call's batch fits in the memory lent to it, or does
    // not (the worker moves what it wrote to memory of its own), or leaves most of it unused
    const sizes = { small: 3, mid: 40, big: 300 };
    for (const [bucket, n] of Object.entries(sizes))
      for (let i = 0; i < n; i++) await w.save(put(bucket, `${bucket}${i}`, 't', `{"${bucket}":"${'v'.repeat(i % 90)}\u00e9${i}"}`));
    await w.markSnapshotDone('1');
    await w.commit('1');
    const { checkpoint } = await st.getCheckpoint();
    const ended = (raw) => {
      assert.equal(raw.length, 0);
      assert.throws(() => raw.opId(0), { name: 'TypeError', code: 'BS_ESTATE' });
      assert.throws(() => raw.data(0), { name: 'TypeError', code: 'BS_ESTATE' });
      assert.throws(() => raw.byteStart(0, 'data'), { name: 'TypeError', code: 'BS_ESTATE' });
      assert.throws(() => raw.entry(0), { name: 'TypeError', code: 'BS_ESTATE' });
      assert.deepEqual([...raw], []);
    };
    const held = [];
    const plan = [['small'], ['big'], ['mid', 'small'], ['big'], ['small'], ['big', 'mid', 'small']];
    for (const [j, buckets] of plan.entries()) {
      const req = buckets.map((bucket) => ({ bucket }));
      const options = { limit: 1000, chunkLimitBytes: j % 2 ? 0 : 1 << 20 };
      const want = [];
      for await (const c of st.getBucketDataBatch(checkpoint, req, options)) want.push(c);
      let i = 0;
      const mine = [];
      for await (const c of st.getBucketDataBatchRaw(checkpoint, req, { ...options, reuseBuffers: true })) {
        if ('hasMore' in c) {
          assert.deepEqual(c, want[i]);
          continue;
        }
        same(want[i++], c);
        mine.push(c.chunkData.data);
        held.forEach(ended); // the calls before's
      }
      assert.equal(i, want.length - 1);
      mine.forEach(ended); // once the iteration ended, this call's chunks end too
      held.push(...mine);
    }
    // a view of the buffer is the storage's memory: the next call writes into it (copy what
    // you keep); leaving the loop early ends the iteration as well
    let view, copy;
    for await (const c of st.getBucketDataBatchRaw(checkpoint, [{ bucket: 'big' }], { reuseBuffers: true })) {
      held.push(c.chunkData.data);
      view = c.chunkData.data.bytes(0, 'data');
      copy = Buffer.from(view);
      break;
    }
    ended(held.at(-1));
    assert.equal(copy.toString(), '{"big":"\u00e90"}');
    for await (const c of st.getBucketDataBatchRaw(checkpoint, [{ bucket: 'mid' }], { reuseBuffers: true })) {
      if ('hasMore' in c) continue;
      const buf = c.chunkData.data.buffer;
      assert.equal(view.buffer, buf.buffer); // the same memory, lent again
      assert.ok(view.equals(buf.subarray(view.byteOffset, view.byteOffset + view.length)));
      assert.ok(!view.equals(copy));
    }
    // two iterations at once: the second gets memory of its own; without the option, a call's
    // chunks stay as they are whatever runs after it
    const a = st.getBucketDataBatchRaw(checkpoint, [{ bucket: 'mid' }], { reuseBuffers: true });
    const b = st.getBucketDataBatchRaw(checkpoint, [{ bucket: 'big' }], { reuseBuffers: true });
    const kept = st.getBucketDataBatchRaw(checkpoint, [{ bucket: 'mid' }]);
    const [ra, rb, rk] = [(await a.next()).value, (await b.next()).value, (await kept.next()).value];
    const [[[dMid]], [[dBig]]] = [await both(st, checkpoint, [{ bucket: 'mid' }]), await both(st, checkpoint, [{ bucket: 'big' }])];
    same(dMid, ra);
    same(dBig, rb);
    await a.return();
    same(dBig, rb);
    await b.return();
    await kept.return();
    const keptView = rk.chunkData.data.bytes(0, 'data'), keptCopy = Buffer.from(keptView);
    for (const bucket of ['big', 'mid', 'small'])
      for await (const c of st.getBucketDataBatchRaw(checkpoint, [{ bucket }], { reuseBuffers: true })) void c;
    same(dMid, rk);
    assert.ok(keptView.equals(keptCopy));
    ended(ra.chunkData.data);
    ended(rb.chunkData.data);
    await assert.rejects(st.getBucketDataBatchRaw(checkpoint, [{ bucket: 'big' }], { reuseBuffers: 1 }).next(),
      { name: 'TypeError', code: 'BS_EINVAL' });
    await w.close();
    await st.close();
    await db.close();
    cleanup();
  });

  test(`${name}: raw mode refuses what the default mode refuses`, async () => {
    const { db, cleanup } = await open();
    await db.createStream('s');
    const st = await db.storage();
    for (const bucket of ['a\uD800', 'a\uDC00'])
      await assert.rejects(st.getBucketDataBatchRaw(0n, [{ bucket }]).next(),
        { name: 'TypeError', code: 'BS_EINVAL', message: /not valid Unicode/ });
    await assert.rejects(st.getBucketDataBatchRaw(0n, [{ bucket: 'b' }], { requestHint: 'x' }).next(), RangeError);
    const aborted = AbortSignal.abort(new Error('why'));
    await assert.rejects(st.getBucketDataBatchRaw(0n, [{ bucket: 'b' }], { signal: aborted }).next(), /why/);
    await st.close();
    await db.close();
    cleanup();
  });
}
