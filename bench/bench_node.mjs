#!/usr/bin/env node
// bench_node.mjs: one workload through three paths - the C API (bindings/node/bench/capi.c,
// compiled here against build/libbucketstore.a), the Node.js binding (bindings/node) and the
// JSON-lines driver (build/bucketstore drive, pipelined) - each on a fresh file of its own:
//   ingest: a snapshot of ROWS rows (120-byte JSON) into BUCKETS buckets, a snapshot writer,
//           one commit per COMMIT_ROWS rows (nosync unless --durable); the rows (the driver's
//           JSON lines) are built before the clock starts, as in bench_py.py;
//   reads:  every bucket of that file downloaded from 0 at the checkpoint, READ_LIMIT ops per
//           call, one bucket per call (a client resuming at next_after), twice: the second
//           (warm) pass is timed; each op's op id, type, object id and data read (a sum that
//           every binding row must give as the C API's does).
// The binding runs five times: `await w.save(r)` per row, pipelined (a commit's saves not
// awaited one by one: Promise.all before the commit), and `await w.saveMany(rows)` per commit,
// the last three times: read through getBucketDataBatch, getBucketDataBatchRaw, and
// getBucketDataBatchRaw with reuseBuffers.
// Usage: node bench/bench_node.mjs [--rows N] [--buckets N] [--commit-rows N] [--data-size N]
//        [--read-limit N] [--durable] [--runs N] [--quick] [--json PATH]
// Needs `make` (library, CLI) and `make node` (the addon). Prints the best of --runs runs:
// rates (wall clock) and CPU time per row/op (every thread of the process(es) doing the work:
// the driver's too; less sensitive to a loaded machine than the rates).
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const cfg = { rows: 200000, buckets: 100, commitRows: 10000, dataSize: 120, readLimit: 10000,
  nosync: true, runs: 1, json: null };
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  const a = argv[i], num = () => Number(argv[++i]);
  if (a === '--rows') cfg.rows = num();
  else if (a === '--buckets') cfg.buckets = num();
  else if (a === '--commit-rows') cfg.commitRows = num();
  else if (a === '--data-size') cfg.dataSize = num();
  else if (a === '--read-limit') cfg.readLimit = num();
  else if (a === '--runs') cfg.runs = num();
  else if (a === '--durable') cfg.nosync = false;
  else if (a === '--quick') Object.assign(cfg, { rows: 20000, commitRows: 5000 });
  else if (a === '--json') cfg.json = argv[++i];
  else {
    console.error(`bench_node: unknown argument ${a} (see the usage at the top of this file)`);
    process.exit(2);
  }
}
if (!(cfg.dataSize >= 64)) throw new Error('--data-size: at least 64');

// ---- the workload (capi.c generates the same rows) ------------------------------------------
const FILL = 'abcdefghijklmnopqrstuvwxyz'.repeat(2);
const pad = (n, w) => String(n).padStart(w, '0');
const rid = (i) => `r${pad(i, 8)}`;
const bucket = (b) => ['by_list["l', pad(b, 5), '"]'].join(''); // flat: see data()
function data(i) {
  const head = `{"id":"${rid(i)}","v":0,"done":false,"d":"`;
  const off = i % 26, parts = [head];
  for (let p = head.length; p < cfg.dataSize - 2; p++) parts.push(FILL[off + ((p - head.length) % 26)]);
  parts.push('"}');
  // joined, so the string is flat, as a decoder's or JSON.stringify's output is: one built with
  // += is a rope, which V8 copies flat when a binding first reads it (not a binding's cost)
  return parts.join('');
}
const lsnOf = (i) => pad(i, 8);

/** CPU seconds of this process (every thread: main and the libuv pool) since c0. */
const cpuSince = (c0) => {
  const c = process.cpuUsage(c0);
  return (c.user + c.system) / 1e6;
};

// ---- the three paths ----------------------------------------------------------------------
/** capi.c compiled with the library the addon compiles: its amalgamation (`make node-sources`). */
function capiBinary() {
  const src = path.join(root, 'bindings/node/bench/capi.c');
  const lib = path.join(root, 'bindings/node/deps/bucketstore.c');
  const bin = path.join(root, 'build/bench/node_capi');
  const mtime = (f) => fs.statSync(f).mtimeMs;
  if (!fs.existsSync(lib)) throw new Error('bindings/node/deps/bucketstore.c missing: run make node');
  if (!fs.existsSync(bin) || mtime(bin) < Math.max(mtime(src), mtime(lib))) {
    fs.mkdirSync(path.dirname(bin), { recursive: true });
    const r = spawnSync('cc', ['-std=c11', '-O2', '-Wall', '-Wextra', '-Werror',
      `-I${path.dirname(lib)}`, src, lib, '-llmdb', '-lnettle', '-lpthread', '-o', bin], { stdio: 'inherit' });
    if (r.status !== 0) throw new Error('compiling capi.c failed');
  }
  return bin;
}

function runCapi(...args) {
  const r = spawnSync(capiBinary(), args.map(String), { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`capi ${args[0]}: ${r.stderr}`);
  return JSON.parse(r.stdout);
}

const capi = {
  ingest: (file) => runCapi('ingest', file, cfg.rows, cfg.buckets, cfg.commitRows, cfg.dataSize,
    cfg.nosync ? 1 : 0),
  read: (file) => runCapi('read', file, cfg.buckets, cfg.readLimit),
};

function loadBinding() {
  try {
    return createRequire(import.meta.url)(path.join(root, 'bindings/node'));
  } catch (e) {
    throw new Error(`the Node binding is not built (run make node): ${e.message}`);
  }
}

const binding = {
  /** how: 'await' each save, 'pipelined' (the saves of a commit not awaited one by one:
   * Promise.all before it), or 'many' (one saveMany of a commit's rows) */
  async ingest(file, how = 'await') {
    const bs = loadBinding();
    const db = await bs.open(file, { nosync: cfg.nosync });
    await db.createStream('bench');
    const st = await db.storage();
    const w = await st.createWriter({ skipExistingRows: true });
    const recs = [];
    for (let i = 0; i < cfg.rows; i++) {
      const id = rid(i);
      recs.push({ tag: 'insert', sourceTable: 'todos', afterReplicaId: id,
        evaluated: [{ bucket: bucket(i % cfg.buckets), table: 'todos', id, data: data(i) }] });
    }
    const t0 = performance.now(), c0 = process.cpuUsage();
    let pending = [], from = 0;
    for (let i = 0; i < cfg.rows; i++) {
      if (how === 'pipelined') pending.push(w.save(recs[i]));
      else if (how === 'await') await w.save(recs[i]);
      if ((i + 1) % cfg.commitRows === 0 || i + 1 === cfg.rows) {
        if (how === 'many') await w.saveMany(recs.slice(from, i + 1));
        await Promise.all(pending);
        pending = [], from = i + 1;
        if (i + 1 === cfg.rows) await w.markSnapshotDone(lsnOf(i + 1));
        await w.commit(lsnOf(i + 1));
      }
    }
    const secs = (performance.now() - t0) / 1e3, cpu = cpuSince(c0);
    await w.close();
    await st.close();
    await db.close();
    return { secs, cpu, count: cfg.rows };
  },
  /** Each op read as capi.c's on_chunk reads it (sink: the same sum): as an OplogEntry, or
   * raw (getBucketDataBatchRaw: the object id and data as byte offsets, capi.c's bs_val);
   * raw 'reuse': with reuseBuffers (each call writes into the memory of the one before). */
  async read(file, raw = false) {
    const bs = loadBinding();
    const db = await bs.open(file);
    const st = await db.storage();
    const cp = await st.getCheckpoint();
    let count = 0, sink = 0;
    const t0 = performance.now(), c0 = process.cpuUsage();
    for (let b = 0; b < cfg.buckets; b++) {
      let start = 0n;
      for (let more = true; more;) {
        more = false;
        const req = [{ bucket: bucket(b), start }], o = { limit: cfg.readLimit, reuseBuffers: raw === 'reuse' };
        for await (const c of raw ? st.getBucketDataBatchRaw(cp, req, o) : st.getBucketDataBatch(cp, req, o)) {
          if ('hasMore' in c) {
            more = c.hasMore;
            continue;
          }
          const d = c.chunkData.data;
          if (raw)
            for (let i = 0; i < d.length; i++)
              sink += ((d.opId(i) & 1n) === 1n ? 1 : 0) + (d.op(i) === 'PUT' ? 1 : 0) +
                d.byteEnd(i, 'object_id') - d.byteStart(i, 'object_id') + d.byteEnd(i, 'data') -
                d.byteStart(i, 'data');
          else // the benchmark's ids and rows are ASCII: a string's length is its byte count
            for (const op of d)
              sink += ((op.op_id & 1n) === 1n ? 1 : 0) + (op.op === 'PUT' ? 1 : 0) + op.object_id.length +
                op.data.length;
          count += d.length, start = c.chunkData.next_after;
        }
      }
    }
    const secs = (performance.now() - t0) / 1e3, cpu = cpuSince(c0);
    await st.close();
    await db.close();
    return { secs, cpu, count, sink };
  },
};

/** The driver as a client sees it: lines written ahead (pipelined), replies read in order. */
function openDriver(file, nosync) {
  const bin = path.join(root, 'build/bucketstore');
  if (!fs.existsSync(bin)) throw new Error('build/bucketstore missing: run make');
  const p = spawn(bin, ['drive', '--db', file, ...(nosync ? ['--nosync'] : [])],
    { stdio: ['pipe', 'pipe', 'inherit'] });
  let received = 0, wanted = Infinity, wake = null, lastLine = null, failed = null;
  createInterface({ input: p.stdout }).on('line', (l) => {
    received++, lastLine = l;
    if (!failed && !l.startsWith('{"ok":true')) failed = new Error(`driver: ${l}`);
    if (received >= wanted) wake();
  });
  let sent = 0;
  /** Writes n command lines; resolves once every reply so far has arrived: the last one. */
  const sendText = async (text, n, wait = true) => {
    sent += n;
    if (!p.stdin.write(text)) await new Promise((r) => p.stdin.once('drain', r));
    if (!wait) return null;
    if (received < sent) await new Promise((r) => (wanted = sent, wake = r));
    if (failed) throw failed;
    return JSON.parse(lastLine);
  };
  const send = (cmds, wait) => sendText(cmds.map((c) => JSON.stringify(c)).join('\n') + '\n',
    cmds.length, wait);
  const close = () => new Promise((r) => {
    p.on('exit', r);
    p.stdin.end();
  });
  /** CPU seconds of the driver process so far (/proc: clock ticks, 10 ms). */
  const cpu = () => {
    const f = fs.readFileSync(`/proc/${p.pid}/stat`, 'utf8').split(') ')[1].split(' ');
    return (Number(f[11]) + Number(f[12])) / 100;
  };
  return { send, sendText, close, cpu };
}

const driver = {
  async ingest(file) {
    const d = openDriver(file, cfg.nosync);
    await d.send([{ cmd: 'stream.create', name: 'bench' }, { cmd: 'writer.open', snapshot: true }]);
    const batches = [];
    for (let i = 0; i < cfg.rows; i += cfg.commitRows) {
      const cmds = [];
      const end = Math.min(cfg.rows, i + cfg.commitRows);
      for (let k = i; k < end; k++)
        cmds.push({ cmd: 'save', table: 'todos', tag: 'insert', id: rid(k),
          rows: [{ bucket: bucket(k % cfg.buckets), type: 'todos', id: rid(k), data: data(k) }] });
      if (end === cfg.rows) cmds.push({ cmd: 'snapshot_done', lsn: lsnOf(end) });
      cmds.push({ cmd: 'commit', lsn: lsnOf(end) });
      batches.push([cmds.map((c) => JSON.stringify(c)).join('\n') + '\n', cmds.length]);
    }
    const t0 = performance.now(), c0 = process.cpuUsage(), d0 = d.cpu();
    for (let b = 0; b < batches.length; b++) // pipelined: only the last commit's reply is awaited
      await d.sendText(...batches[b], b === batches.length - 1);
    const secs = (performance.now() - t0) / 1e3, cpu = cpuSince(c0) + d.cpu() - d0;
    await d.close();
    return { secs, cpu, count: cfg.rows };
  },
  async read(file) {
    const d = openDriver(file, false);
    const cp = (await d.send([{ cmd: 'checkpoint' }])).checkpoint;
    let count = 0;
    const t0 = performance.now(), c0 = process.cpuUsage(), d0 = d.cpu();
    for (let b = 0; b < cfg.buckets; b++) {
      let after = '0';
      for (let more = true; more;) {
        const r = await d.send([{ cmd: 'bucket_data', checkpoint: cp,
          buckets: { [bucket(b)]: after }, limit: cfg.readLimit }]);
        for (const c of r.chunks) count += c.data.length, after = c.next_after;
        more = r.has_more;
      }
    }
    const secs = (performance.now() - t0) / 1e3, cpu = cpuSince(c0) + d.cpu() - d0;
    await d.close();
    return { secs, cpu, count };
  },
};

// ---- run ----------------------------------------------------------------------------------
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'bench-node-'));
const paths = { 'C API': capi, 'Node binding': binding,
  'Node, pipelined': { ingest: (f) => binding.ingest(f, 'pipelined'), read: binding.read },
  'Node, saveMany': { ingest: (f) => binding.ingest(f, 'many'), read: binding.read },
  'Node, raw reads': { ingest: (f) => binding.ingest(f, 'many'), read: (f) => binding.read(f, true) },
  'Node, raw, reuse': { ingest: (f) => binding.ingest(f, 'many'), read: (f) => binding.read(f, 'reuse') },
  'JSON driver': driver };
const results = {};
let sink; // the C API's sum over the ops it read; each binding read must give the same
try {
  for (const [name, impl] of Object.entries(paths)) {
    let best = null;
    for (let run = 0; run < cfg.runs; run++) {
      const file = path.join(dir, `${name.replace(/\W/g, '')}-${run}.bsdb`);
      const ingest = await impl.ingest(file);
      await impl.read(file); // the cold pass
      const read = await impl.read(file);
      if (read.count !== cfg.rows) throw new Error(`${name}: read ${read.count} ops, expected ${cfg.rows}`);
      if (read.sink !== undefined && read.sink !== (sink ??= read.sink))
        throw new Error(`${name}: read sum ${read.sink}, the C API's ${sink}: not the same work`);
      const r = { ingest: ingest.count / ingest.secs, reads: read.count / read.secs,
        ingestCpuUs: (ingest.cpu / ingest.count) * 1e6, readCpuUs: (read.cpu / read.count) * 1e6 };
      best = best ? { ingest: Math.max(best.ingest, r.ingest), reads: Math.max(best.reads, r.reads),
        ingestCpuUs: Math.min(best.ingestCpuUs, r.ingestCpuUs),
        readCpuUs: Math.min(best.readCpuUs, r.readCpuUs) } : r;
      fs.rmSync(file, { force: true });
      fs.rmSync(`${file}-lock`, { force: true });
    }
    results[name] = best;
  }
} finally {
  fs.rmSync(dir, { recursive: true, force: true });
}

const fmt = (v) => (v >= 1e6 ? `${(v / 1e6).toFixed(2)}M` : `${(v / 1e3).toFixed(0)}k`);
const c = results['C API'];
console.log(`bench_node: ${cfg.rows} rows (${cfg.dataSize} B) -> ${cfg.buckets} buckets, commit every ` +
  `${cfg.commitRows} rows, ${cfg.nosync ? 'nosync' : 'durable'}; reads ${cfg.readLimit} ops/call; ` +
  `best of ${cfg.runs}; node ${process.version}, load ${os.loadavg().map((l) => l.toFixed(1)).join(' ')}`);
console.log(`${'path'.padEnd(16)}${'ingest rows/s'.padStart(14)}${'vs C'.padStart(7)}` +
  `${'CPU us/row'.padStart(11)}${'reads ops/s'.padStart(13)}${'vs C'.padStart(8)}${'CPU ns/op'.padStart(10)}`);
for (const [name, r] of Object.entries(results))
  console.log(`${name.padEnd(16)}${fmt(r.ingest).padStart(14)}${(c.ingest / r.ingest).toFixed(1).padStart(6)}x` +
    `${r.ingestCpuUs.toFixed(2).padStart(11)}${fmt(r.reads).padStart(13)}` +
    `${(c.reads / r.reads).toFixed(1).padStart(7)}x${(r.readCpuUs * 1e3).toFixed(0).padStart(10)}`);
if (cfg.json) fs.writeFileSync(cfg.json, JSON.stringify({ config: cfg, node: process.version, results }, null, 2));
