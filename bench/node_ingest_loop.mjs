#!/usr/bin/env node
// node_ingest_loop.mjs: bench_node.mjs's ingest through the Node binding alone, for counting
// instructions, which the machine's load does not move (bench/README.md):
//   valgrind --tool=callgrind node --predictable bench/node_ingest_loop.mjs HOW [ROWS]
// HOW: save (await each), many (one saveMany per commit), none (the same run without the
// saves: startup, building the records, the commits; subtracted from the others). The rows
// are bench_node.mjs's (flat strings), 100 buckets, a snapshot writer, a commit per 10k rows.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const bs = createRequire(import.meta.url)(path.join(root, 'bindings/node'));
const how = process.argv[2], rows = Number(process.argv[3] ?? 200000), commitRows = 10000;
if (!['save', 'many', 'none'].includes(how) || !(rows > 0)) {
  console.error('usage: node bench/node_ingest_loop.mjs save|many|none [ROWS]');
  process.exit(2);
}
const FILL = 'abcdefghijklmnopqrstuvwxyz'.repeat(2);
const pad = (n, w) => String(n).padStart(w, '0');
const rid = (i) => `r${pad(i, 8)}`;
const bucket = (b) => ['by_list["l', pad(b, 5), '"]'].join('');
function data(i) {
  const head = `{"id":"${rid(i)}","v":0,"done":false,"d":"`;
  const off = i % 26, parts = [head];
  for (let p = head.length; p < 118; p++) parts.push(FILL[off + ((p - head.length) % 26)]);
  parts.push('"}');
  return parts.join('');
}

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'bench-node-loop-'));
try {
  const db = await bs.open(path.join(dir, 'loop.bsdb'), { nosync: true });
  await db.createStream('bench');
  const st = await db.storage();
  const w = await st.createWriter({ skipExistingRows: true });
  const recs = [];
  for (let i = 0; i < rows; i++) {
    const id = rid(i);
    recs.push({ tag: 'insert', sourceTable: 'todos', afterReplicaId: id,
      evaluated: [{ bucket: bucket(i % 100), table: 'todos', id, data: data(i) }] });
  }
  const c0 = process.cpuUsage();
  for (let i = 0; i < rows; i += commitRows) {
    const end = Math.min(rows, i + commitRows);
    if (how === 'many') await w.saveMany(recs.slice(i, end));
    else if (how === 'save') for (let k = i; k < end; k++) await w.save(recs[k]);
    if (end === rows) await w.markSnapshotDone(pad(end, 8));
    await w.commit(pad(end, 8));
  }
  const c = process.cpuUsage(c0);
  console.log(`${how}: ${rows} rows, CPU ${((c.user + c.system) / rows).toFixed(2)} us/row`);
  await w.close();
  await st.close();
  await db.close();
} finally {
  fs.rmSync(dir, { recursive: true, force: true });
}
