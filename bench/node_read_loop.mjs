#!/usr/bin/env node
// node_read_loop.mjs: bench_node.mjs's reads through the Node binding alone, for counting
// instructions, which the machine's load does not move (bench/README.md). On a file that
// build/bench/node_capi ingest wrote (200k rows, 100 buckets):
//   valgrind --tool=callgrind node --predictable bench/node_read_loop.mjs HOW FILE [PASSES]
// per op: (5 passes - 3 passes) / 400k. The first pass less is not enough: the difference of 3
// and 1 passes still holds TurboFan compiling this loop again (190-240 instructions an op).
// HOW: read (every bucket downloaded whole from 0 in calls of 10k ops, PASSES times, each op
// touched as a client would: its op_id, op, object_id and data read), made (the same, no field
// read), raw (getBucketDataBatchRaw: op id, op, object id's and data's byte offsets), rawstr (raw
// mode, object id and data as strings), count (raw mode, no op read: the read, the worker's copy
// and the call alone), none (the same run without the reads: startup, opening, the checkpoint);
// reuse, reusestr and reusecount are raw, rawstr and count with the option reuseBuffers; a HOW
// prefixed by sync (syncread, syncreuse, ...) reads through the *Sync forms.
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const bs = createRequire(import.meta.url)(path.join(root, 'bindings/node'));
const [arg, file] = process.argv.slice(2), passes = Number(process.argv[4] ?? 1);
const buckets = 100, readLimit = 10000;
const sync = arg.startsWith('sync'), how = sync ? arg.slice(4) : arg;
const reuse = how.startsWith('reuse'), mode = reuse ? `raw${how.slice(5)}`.replace('rawcount', 'count') : how;
if (!['read', 'made', 'none', 'raw', 'rawstr', 'count'].includes(mode) || !file || !(passes > 0)) {
  console.error('usage: node bench/node_read_loop.mjs [sync]read|made|raw|rawstr|count|reuse|reusestr|reusecount|none FILE [PASSES]');
  process.exit(2);
}
const raw = mode.startsWith('raw') || mode === 'count';
const bucket = (b) => `by_list["l${String(b).padStart(5, '0')}"]`;

const db = await bs.open(file, { readonly: true });
const st = await db.storage();
const cp = (await st.getCheckpoint()).checkpoint;
let count = 0, sink = 0;
const c0 = process.cpuUsage();
for (let p = 0; how !== 'none' && p < passes; p++) {
  for (let b = 0; b < buckets; b++) {
    let start = 0n;
    for (let more = true; more;) {
      more = false;
      const req = [{ bucket: bucket(b), start }];
      const o = { limit: readLimit, reuseBuffers: reuse && raw };
      const rows = sync ? (raw ? st.getBucketDataBatchRawSync(cp, req, o) : st.getBucketDataBatchSync(cp, req, o))
        : raw ? st.getBucketDataBatchRaw(cp, req, o) : st.getBucketDataBatch(cp, req, o);
      for await (const c of rows) {
        if ('hasMore' in c) {
          more = c.hasMore;
          continue;
        }
        const d = c.chunkData.data;
        if (mode === 'read') // bench_node.mjs's sum, as capi.c's on_chunk reads each op
          for (const op of d)
            sink += ((op.op_id & 1n) === 1n ? 1 : 0) + (op.op === 'PUT' ? 1 : 0) + op.object_id.length +
              op.data.length;
        else if (mode === 'raw')
          for (let i = 0; i < d.length; i++)
            sink += ((d.opId(i) & 1n) === 1n ? 1 : 0) + (d.op(i) === 'PUT' ? 1 : 0) +
              d.byteEnd(i, 'object_id') - d.byteStart(i, 'object_id') + d.byteEnd(i, 'data') -
              d.byteStart(i, 'data');
        else if (mode === 'rawstr')
          for (let i = 0; i < d.length; i++)
            sink += ((d.opId(i) & 1n) === 1n ? 1 : 0) + (d.op(i) === 'PUT' ? 1 : 0) + d.objectId(i).length +
              d.data(i).length;
        count += c.chunkData.data.length, start = c.chunkData.next_after;
      }
    }
  }
}
const c = process.cpuUsage(c0);
console.log(`${arg}: ${count} ops (${sink}), CPU ${count ? ((c.user + c.system) * 1e3 / count).toFixed(0) : 0} ns/op`);
await st.close();
await db.close();
