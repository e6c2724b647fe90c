#!/usr/bin/env node
// bench_node.mjs: one workload through three paths - the C API (bindings/node/bench/capi.c,
// compiled here against build/libbucketstore.a), the Node.js binding (bindings/node) and the
// JSON-lines driver (build/bucketstore drive, pipelined) - each on a fresh file of its own:
//   ingest: a snapshot of ROWS rows (120-byte JSON) into BUCKETS buckets, a snapshot writer,
//           one commit per COMMIT_ROWS rows (nosync unless --durable); the rows (the driver's
//           JSON lines) are built before the clock starts, as in bench_py.py;
//   reads:  every bucket of that file downloaded from 0 at the checkpoint, READ_LIMIT ops per
//           call, one bucket per call (a client resuming at next_after), 1 + READ_PASSES times
//           in one process (the C API's) or one read of the binding: the first pass (cold:
//           page cache, JIT, heap) untimed, the next READ_PASSES timed (one pass of 200k ops is
//           about 13 ms of the C API's, too short to be steady on a loaded machine); each op's
//           op id, type, object id and data read (a sum that every binding row must give as the
//           C API's does). The JSON driver reads one timed pass (its reads take about 1 s).
// The binding runs five times: `await w.save(r)` per row, pipelined (a commit's saves not
// awaited one by one: Promise.all before the commit), and `await w.saveMany(rows)` per commit,
// the last three times: read through getBucketDataBatch, getBucketDataBatchRaw, and
// getBucketDataBatchRaw with reuseBuffers; then twice more, read on the calling thread:
// getBucketDataBatchSync, and getBucketDataBatchRawSync with reuseBuffers.
// Usage: node bench/bench_node.mjs [--rows N] [--buckets N] [--commit-rows N] [--data-size N]
//        [--read-limit N] [--read-passes N] [--durable] [--runs N] [--quick] [--json PATH]
//        [--only ID,...]   (IDs: capi node pipelined many raw reuse sync syncreuse driver; capi
//        always runs)
// Needs `make` (library, CLI) and `make node` (the addon). A run measures every path one after
// the other (so a run's ratios are taken within seconds of each other); prints the best of
// --runs runs: rates (wall clock) and CPU time per row/op (every thread of the process(es) doing
// the work: the driver's too; less sensitive to a loaded machine than the rates), and each
// run's read ratio to the C API of the same run (the spread between runs).
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const cfg = { rows: 200000, buckets: 100, commitRows: 10000, dataSize: 120, readLimit: 10000,
  readPasses: 10, nosync: true, runs: 1, json: null, only: null };
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  const a = argv[i], num = () => Number(argv[++i]);
  if (a === '--rows') cfg.rows = num();
  else if (a === '--buckets') cfg.buckets = num();
  else if (a === '--commit-rows') cfg.commitRows = num();
  else if (a === '--data-size') cfg.dataSize = num();
  else if (a === '--read-limit') cfg.readLimit = num();
  else if (a === '--read-passes') cfg.readPasses = num();
  else if (a === '--runs') cfg.runs = num();
  else if (a === '--only') cfg.only = argv[++i].split(',');
  else if (a === '--durable') cfg.nosync = false;
  else if (a === '--quick') Object.assign(cfg, { rows: 20000, commitRows: 5000 });
  else if (a === '--json') cfg.json = argv[++i];
  else {
    console.error(`bench_node: unknown argument ${a} (see the usage at the top of this file)`);
    process.exit(2);
  }
}
if (!(cfg.dataSize >= 64)) throw new Error('--data-size: at least 64');
if (!(Number.isInteger(cfg.readPasses) && cfg.readPasses >= 1 && cfg.readPasses < 64))
  throw new Error('--read-passes: 1..63');

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
  /** 1 + passes in one process, the first untimed (see the top of this file) */
  read(file, passes) {
    const r = runCapi('read', file, cfg.buckets, cfg.readLimit, passes + 1);
    const secs = r.pass.slice(1).reduce((a, b) => a + b, 0), per = r.count / (passes + 1);
    // the CPU of the untimed pass taken out in proportion to its time
    return { secs, cpu: r.cpu * (secs / (secs + r.pass[0])), count: per * passes,
      sink: (r.sink / (passes + 1)) * passes };
  },
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
   * raw 'reuse': with reuseBuffers (each call writes into the memory of the one before); sync:
   * through the *Sync forms (read on this thread). 1 + passes passes, the first untimed. */
  async read(file, passes, raw = false, sync = false) {
    const bs = loadBinding();
    const db = await bs.open(file);
    const st = await db.storage();
    const cp = await st.getCheckpoint();
    let count = 0, sink = 0, t0, c0;
    for (let p = 0; p <= passes; p++) {
      if (p === 1) count = 0, sink = 0, t0 = performance.now(), c0 = process.cpuUsage();
      for (let b = 0; b < cfg.buckets; b++) {
        let start = 0n;
        for (let more = true; more;) {
          more = false;
          const req = [{ bucket: bucket(b), start }], o = { limit: cfg.readLimit, reuseBuffers: raw === 'reuse' };
          const batch = sync ? (raw ? st.getBucketDataBatchRawSync(cp, req, o) : st.getBucketDataBatchSync(cp, req, o))
            : raw ? st.getBucketDataBatchRaw(cp, req, o) : st.getBucketDataBatch(cp, req, o);
          for await (const c of batch) {
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
  /** Two passes, the first untimed: the driver reads about 1 s a pass, long enough. */
  async read(file) {
    const d = openDriver(file, false);
    const cp = (await d.send([{ cmd: 'checkpoint' }])).checkpoint;
    let count = 0, t0, c0, d0;
    for (let p = 0; p < 2; p++) {
      if (p === 1) count = 0, t0 = performance.now(), c0 = process.cpuUsage(), d0 = d.cpu();
      for (let b = 0; b < cfg.buckets; b++) {
        let after = '0';
        for (let more = true; more;) {
          const r = await d.send([{ cmd: 'bucket_data', checkpoint: cp,
            buckets: { [bucket(b)]: after }, limit: cfg.readLimit }]);
          for (const c of r.chunks) count += c.data.length, after = c.next_after;
          more = r.has_more;
        }
      }
    }
    const secs = (performance.now() - t0) / 1e3, cpu = cpuSince(c0) + d.cpu() - d0;
    await d.close();
    return { secs, cpu, count, passes: 1 };
  },
};

// ---- run ----------------------------------------------------------------------------------
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'bench-node-'));
const allPaths = { 'C API': ['capi', capi], 'Node binding': ['node', binding],
  'Node, pipelined': ['pipelined', { ingest: (f) => binding.ingest(f, 'pipelined'), read: binding.read }],
  'Node, saveMany': ['many', { ingest: (f) => binding.ingest(f, 'many'), read: binding.read }],
  'Node, raw reads': ['raw', { ingest: (f) => binding.ingest(f, 'many'), read: (f, n) => binding.read(f, n, true) }],
  'Node, raw, reuse': ['reuse', { ingest: (f) => binding.ingest(f, 'many'), read: (f, n) => binding.read(f, n, 'reuse') }],
  'Node, Sync': ['sync', { ingest: (f) => binding.ingest(f, 'many'), read: (f, n) => binding.read(f, n, false, true) }],
  'Node, raw, Sync': ['syncreuse', { ingest: (f) => binding.ingest(f, 'many'),
    read: (f, n) => binding.read(f, n, 'reuse', true) }],
  'JSON driver': ['driver', driver] };
for (const id of cfg.only ?? [])
  if (!Object.values(allPaths).some(([i]) => i === id)) throw new Error(`--only: no path ${id}`);
const paths = Object.fromEntries(Object.entries(allPaths)
  .filter(([, [id]]) => id === 'capi' || !cfg.only || cfg.only.includes(id)).map(([n, [, impl]]) => [n, impl]));
const results = {}, readRatios = {};
let sink; // the C API's sum over the ops it read a pass; each binding read must give the same
try {
  // run by run, every path in each, so that the ratios of a run are taken close together
  for (let run = 0; run < cfg.runs; run++) {
    let cOp; // the C API's seconds and CPU seconds an op in this run
    for (const [name, impl] of Object.entries(paths)) {
      const file = path.join(dir, `${name.replace(/\W/g, '')}-${run}.bsdb`);
      const ingest = await impl.ingest(file);
      const read = await impl.read(file, cfg.readPasses);
      const passes = read.passes ?? cfg.readPasses;
      if (read.count !== cfg.rows * passes)
        throw new Error(`${name}: read ${read.count} ops, expected ${cfg.rows * passes}`);
      if (read.sink !== undefined && read.sink / passes !== (sink ??= read.sink / passes))
        throw new Error(`${name}: read sum ${read.sink / passes} a pass, the C API's ${sink}: not the same work`);
      const r = { ingest: ingest.count / ingest.secs, reads: read.count / read.secs,
        ingestCpuUs: (ingest.cpu / ingest.count) * 1e6, readCpuUs: (read.cpu / read.count) * 1e6 };
      cOp ??= { secs: read.secs / read.count, cpu: read.cpu / read.count };
      (readRatios[name] ??= []).push([read.secs / read.count / cOp.secs, read.cpu / read.count / cOp.cpu]);
      const best = results[name];
      results[name] = best ? { ingest: Math.max(best.ingest, r.ingest), reads: Math.max(best.reads, r.reads),
        ingestCpuUs: Math.min(best.ingestCpuUs, r.ingestCpuUs),
        readCpuUs: Math.min(best.readCpuUs, r.readCpuUs) } : r;
      fs.rmSync(file, { force: true });
      fs.rmSync(`${file}-lock`, { force: true });
    }
  }
} finally {
  fs.rmSync(dir, { recursive: true, force: true });
}

const fmt = (v) => (v >= 1e6 ? `${(v / 1e6).toFixed(2)}M` : `${(v / 1e3).toFixed(0)}k`);
const c = results['C API'];
console.log(`bench_node: ${cfg.rows} rows (${cfg.dataSize} B) -> ${cfg.buckets} buckets, commit every ` +
  `${cfg.commitRows} rows, ${cfg.nosync ? 'nosync' : 'durable'}; reads ${cfg.readLimit} ops/call, ` +
  `${cfg.readPasses} timed passes; best of ${cfg.runs}; node ${process.version}, load ` +
  `${os.loadavg().map((l) => l.toFixed(1)).join(' ')}`);
console.log(`${'path'.padEnd(16)}${'ingest rows/s'.padStart(14)}${'vs C'.padStart(7)}` +
  `${'CPU us/row'.padStart(11)}${'reads ops/s'.padStart(13)}${'vs C'.padStart(8)}${'CPU ns/op'.padStart(10)}` +
  `${'vs C'.padStart(7)}  reads vs C each run: time/CPU`);
for (const [name, r] of Object.entries(results))
  console.log(`${name.padEnd(16)}${fmt(r.ingest).padStart(14)}${(c.ingest / r.ingest).toFixed(1).padStart(6)}x` +
    `${r.ingestCpuUs.toFixed(2).padStart(11)}${fmt(r.reads).padStart(13)}` +
    `${(c.reads / r.reads).toFixed(2).padStart(7)}x${(r.readCpuUs * 1e3).toFixed(0).padStart(10)}` +
    `${(r.readCpuUs / c.readCpuUs).toFixed(2).padStart(6)}x  ` +
    readRatios[name].map(([t, u]) => `${t.toFixed(2)}/${u.toFixed(2)}`).join(' '));
if (cfg.json)
  fs.writeFileSync(cfg.json, JSON.stringify({ config: cfg, node: process.version, results, readRatios }, null, 2));
