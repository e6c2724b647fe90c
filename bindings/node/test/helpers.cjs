'use strict';
// Shared by the binding's tests: temporary databases and a seeded PRNG.
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const bs = require('..');

/** A fresh LMDB file in a temporary directory (removed by the returned cleanup). */
function tmpPath() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'bs-node-'));
  return { file: path.join(dir, 'test.bsdb'), cleanup: () => fs.rmSync(dir, { recursive: true }) };
}

/** The PostgreSQL server the suite runs against (make node-test starts one: tests/pg_server.sh
 * run), or undefined. */
const PG_URL = process.env.BS_TEST_PG_URL;
let schemas = 0;

/** SQL run by psql on the suite's server; its output. */
function psql(query) {
  const r = spawnSync('psql', ['-X', '-q', '-t', '-A', '-v', 'ON_ERROR_STOP=1', '-d', PG_URL, '-c', query],
    { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`psql: ${r.error ?? r.stderr}`);
  return r.stdout.trim();
}

/** A new empty schema on the suite's server: {url (its search_path), cleanup}. */
function pgSchema() {
  const name = `bs_node_${process.pid}_${schemas++}`;
  psql(`CREATE SCHEMA ${name}`);
  return { url: `${PG_URL}${PG_URL.includes('?') ? '&' : '?'}options=-csearch_path%3D${name}`,
    cleanup: () => psql(`DROP SCHEMA ${name} CASCADE`) };
}

/** Every backend: [name, open()] where open returns {db, cleanup}; PostgreSQL when the suite
 * has a server (else pgTest skips, saying why). */
const backends = [
  ['memory', async () => ({ db: await bs.openMemory(), cleanup() {} })],
  ['lmdb', async () => {
    const t = tmpPath();
    return { db: await bs.open(t.file, { nosync: true }), cleanup: t.cleanup };
  }],
  ...(PG_URL ? [['postgres', async () => {
    const s = pgSchema();
    return { db: await bs.openPostgres(s.url, { nosync: true }), cleanup: s.cleanup };
  }]] : []),
];

/** mulberry32: a small seeded PRNG (never seeded from the clock). */
function rng(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  next.int = (n) => Math.floor(next() * n);
  next.pick = (arr) => arr[next.int(arr.length)];
  return next;
}

/** Every op of the given buckets at checkpoint, read in batches of the given sizes. */
async function readAll(st, checkpoint, buckets, options) {
  const pos = new Map(buckets.map((b) => [b, 0n]));
  const ops = new Map(buckets.map((b) => [b, []]));
  for (;;) {
    let more = false;
    const req = [...pos].map(([bucket, start]) => ({ bucket, start }));
    for await (const c of st.getBucketDataBatch(checkpoint, req, options)) {
      if ('hasMore' in c) {
        more = more || c.hasMore;
        continue;
      }
      const d = c.chunkData;
      if (d.after !== pos.get(d.bucket)) throw new Error(`chunk after ${d.after}, expected ${pos.get(d.bucket)}`);
      ops.get(d.bucket).push(...d.data);
      pos.set(d.bucket, d.next_after);
      more = more || d.has_more;
    }
    if (!more) return ops;
  }
}

module.exports = { bs, tmpPath, backends, rng, readAll, PG_URL, psql, pgSchema };
