'use strict';
// openPostgres() against the suite's PostgreSQL server (BS_TEST_PG_URL: make node-test starts
// one, tests/pg_server.sh run). The API tests run on it as a third backend (helpers.cjs); these
// are its options. Without a server each test skips, saying so (a failure under STRICT=1).
const test = require('node:test');
const assert = require('node:assert/strict');
const { bs, PG_URL, psql, pgSchema } = require('./helpers.cjs');

const NO_SERVER = 'no PostgreSQL server: BS_TEST_PG_URL is not set (make node-test starts one)';
const pgTest = (name, fn) => test(name, PG_URL ? fn : (t) => t.skip(NO_SERVER));

const tables = (schema) => Number(psql(`SELECT count(*) FROM pg_tables WHERE schemaname = '${schema}'`));
const schemaOf = (url) => /search_path%3D(\w+)/.exec(url)[1];

async function writeOne(db, id, data) {
  const st = await db.storage();
  const w = await st.createWriter();
  await w.save({ tag: 'insert', sourceTable: 't', afterReplicaId: id, evaluated: [{ bucket: 'b', table: 't', id, data }] });
  await w.markSnapshotDone([], '0/1');
  const r = await w.commit('0/1');
  await w.close();
  await st.close();
  return r.checkpoint;
}

pgTest('openPostgres: nomigrate opens only a schema that exists', async () => {
  const s = pgSchema();
  try {
    await assert.rejects(bs.openPostgres(s.url, { nomigrate: true }),
      (e) => e.code === 'BS_ENOTFOUND' && /bucketstore migrate/.test(e.message));
    assert.equal(tables(schemaOf(s.url)), 0); // refused: nothing created
    let db = await bs.openPostgres(s.url); // without the flag the open creates the schema
    await db.createStream('s');
    const cp = await writeOne(db, 'a', '{"x":1}');
    await db.close();
    const n = tables(schemaOf(s.url));
    assert.ok(n > 0);
    db = await bs.openPostgres(s.url, { nomigrate: true }); // a current schema: opens, and writes
    const st = await db.storage();
    assert.equal((await st.getChecksums(cp, ['b'])).get('b').count, 1);
    await st.close();
    assert.ok(await writeOne(db, 'b', '{"x":2}') > cp);
    await db.close();
    assert.equal(tables(schemaOf(s.url)), n);
  } finally {
    s.cleanup();
  }
});

pgTest('openPostgres: readonly reads and refuses writes; open() routes a URL there too', async () => {
  const s = pgSchema();
  try {
    const db = await bs.open(s.url); // bs_open: a postgresql:// path is this backend
    await db.createStream('s');
    const cp = await writeOne(db, 'a', '{}');
    const ro = await bs.openPostgres(s.url, { readonly: true });
    const st = await ro.storage();
    assert.equal((await st.getCheckpoint()).checkpoint, cp);
    await assert.rejects(ro.createStream('t'), { code: 'BS_ESTATE' });
    await st.close();
    await ro.close();
    await db.close();
  } finally {
    s.cleanup();
  }
});

pgTest('openPostgres: maxConnections bounds the pool; bad options are refused', async () => {
  const s = pgSchema();
  const app = `${schemaOf(s.url)}_pool`;
  const sessions = () => Number(psql(`SELECT count(*) FROM pg_stat_activity WHERE application_name = '${app}'`));
  try {
    const db = await bs.openPostgres(`${s.url}&application_name=${app}`, { maxConnections: 1 });
    await db.createStream('s');
    const cp = await writeOne(db, 'a', '{}');
    const st = await db.storage();
    // more calls at once than the pool has connections: they wait for the one
    const sums = await Promise.all(Array.from({ length: 8 }, () => st.getChecksums(cp, ['b'])));
    assert.deepEqual(sums.map((m) => m.get('b').count), Array(8).fill(1));
    assert.equal(sessions(), 1);
    await st.close();
    await db.close();
    assert.equal(sessions(), 0);
  } finally {
    s.cleanup();
  }
  await assert.rejects(bs.openPostgres(PG_URL, { maxConnections: 0 }), RangeError);
  await assert.rejects(bs.openPostgres(PG_URL, { nomigrate: 'yes' }), { code: 'BS_EINVAL' });
  await assert.rejects(bs.openPostgres(PG_URL + '\0'), { code: 'BS_EINVAL', message: /url: contains a NUL/ });
});
