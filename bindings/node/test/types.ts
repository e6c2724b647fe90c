// Compiled (not run) by test/types.test.js with `tsc --noEmit --strict`: the README's usage
// and every call shape type-check against index.d.ts.
import * as bs from '..';
import bsDefault from '..';

async function main(): Promise<void> {
  const db: bs.Database = await bs.open('app.bsdb', { nosync: true });
  const pg: bs.Database = await bs.openPostgres('postgresql://app@db/app', { nomigrate: true, maxConnections: 4 });
  await pg.close();
  const id: number = await db.createStream('sync-rules-v1', { checksum: 'sha256' });
  const st: bs.BucketStorage = await db.storage(id);
  db.onCheckpoint((e) => console.log(e.stream, e.checkpoint + 1n));
  const w: bs.Writer = await st.createWriter({ skipExistingRows: true, maxRecords: 100 });
  const flushed: bs.FlushedResult | null = await w.save({
    tag: 'insert', sourceTable: 'todos', afterReplicaId: 't1',
    evaluated: [{ bucket: 'todos["u1"]', table: 'todos', id: 't1', data: { id: 't1' } }],
    evaluatedParameters: [{ lookup: ['by_user', 1n, 2.5, null, true], bucketParameters: [{ u: 1 }] }],
  });
  if (flushed) console.log(flushed.flushed_op + 1n);
  const many: bs.FlushedResult | null = await w.saveMany([{ tag: 'insert', sourceTable: { name: 'todos' },
    afterReplicaId: new Uint8Array([116, 50]), evaluated: [{ bucket: 'todos["u1"]', table: 'todos', id: 't2', data: '{}' }] }]);
  if (many) console.log(many.flushed_op);
  await w.markSnapshotDone([], '0/10');
  const r: bs.CommitResult = await w.commit('0/10', { createEmptyCheckpoints: false });
  const cp = await st.getCheckpoint();
  for await (const c of st.getBucketDataBatch(cp, [{ bucket: 'todos["u1"]', start: 0n }], { limit: 10 })) {
    if ('hasMore' in c) console.log(c.hasMore);
    else for (const op of c.chunkData.data) console.log(op.op_id, op.op, op.data, c.targetOp);
  }
  for await (const c of st.getBucketDataBatchRaw(cp, [{ bucket: 'todos["u1"]' }], { limit: 10, reuseBuffers: true })) {
    if ('hasMore' in c) continue;
    const ops: bs.RawOplog = c.chunkData.data, f: bs.OplogField = 'data';
    for (let i = 0; i < ops.length; i++) {
      const id: bigint = ops.opId(i), data: bs.Bytes | null = ops.data(i), view: Uint8Array | null = ops.bytes(i, f);
      console.log(id, ops.op(i), ops.objectId(i), data, view, ops.buffer.subarray(ops.byteStart(i, f), ops.byteEnd(i, f)));
    }
    for (const op of ops) console.log(op.object_type, ops.entry(0).checksum);
  }
  for (const c of st.getBucketDataBatchSync(cp, [{ bucket: 'todos["u1"]' }], { limit: 10 }))
    if (!('hasMore' in c)) for (const op of c.chunkData.data) console.log(op.op_id, op.data);
  for (const c of st.getBucketDataBatchRawSync(cp, [{ bucket: 'todos["u1"]' }], { reuseBuffers: true }))
    if (!('hasMore' in c)) console.log(c.chunkData.data.opId(0), c.chunkData.next_after);
  const sums: Map<bs.Bytes, bs.BucketChecksum> = await st.getChecksums(r.checkpoint, ['todos["u1"]']);
  const rows: Record<string, unknown>[] = await cp.getParameterSets([['by_user', 1]], 10);
  const ch: bs.CheckpointChanges = await st.getCheckpointChanges({ lastCheckpoint: 0n, nextCheckpoint: cp });
  const stats: bs.CompactStats = await st.compact({ signal: new AbortController().signal, minAgeMs: 0,
    onProgress: (p) => console.log(p.opsMoved) });
  const init: { buckets: number } = await st.compactInitialReplication({ maxOpId: 10n });
  st.setWriteCheckpointMode({ mode: 'managed' });
  const m = await st.createManagedWriteCheckpoints([{ user_id: 'u1', heads: { '1': '0/10' } },
    { user_id: 'u2', heads: {}, checkpoint_request_id: 3n, checkpoint_requested_at: new Date() }]);
  const last: bigint | null = await st.lastWriteCheckpoint({ user_id: 'u1', heads: { '1': '0/10' } });
  await w.addCustomWriteCheckpoint({ user_id: 'u', checkpoint: 5n, checkpoint_requested_at: new Date() });
  const n: number = await st.deleteCheckpointRequestsBefore(new Date());
  const s: bs.StorageStatus = await st.getStatus();
  const dbStat: bs.DatabaseStat = await db.stat();
  const problems: string[] = await db.verify();
  for await (const b of st.listBuckets({ startAfter: 'a', page: 10 })) console.log(b.bucket, b.checksum, b.lastOp + 1n);
  const next: bs.Checkpoint = await st.waitCheckpoint(cp, { timeoutMs: 1000, signal: AbortSignal.timeout(5000) });
  await st.compactInitialReplication({ signal: new AbortController().signal });
  const sig = new AbortController().signal;
  await st.getChecksums(cp, ['b'], { requestHint: 'incremental' });
  for await (const c of st.getBucketDataBatch(cp, [{ bucket: 'b' }], { requestHint: 'bulk', signal: sig })) console.log(c);
  await st.clearChecksumCache();
  const inc: boolean = st.supportsIncrementalParameterCompaction();
  await st.compact({ moveBatchByteLimit: 1 << 20, moveBatchLimit: 2000, clearBatchLimit: 5000, signal: sig,
    incrementalOnly: true, opBudget: 100n, deleteCheckpointRequestsBefore: new Date() });
  const w2: bs.Writer = await st.createWriter({ zeroLSN: '0/0', storeCurrentData: true, signal: sig });
  await st.terminate({ clearStorage: true, signal: sig });
  console.log(inc, w2);
  console.log(dbStat.fileBytes, problems.length, next.checkpoint);
  console.log(sums, rows, ch.updatedDataBuckets.size, stats.opsMoved, init.buckets, m.shouldAdvance, last, n, s.state);
  await db.backup('copy.bsdb', { replace: true, onProgress: (n) => n > 10, signal: new AbortController().signal });
  for await (const rec of db.export(id)) console.log(rec.table, rec.stream, rec.key.length, rec.value[0]);
  await bs.load('new.bsdb', db.export(), { onProgress: (n: number) => console.log(n) });
  await bs.load(new Uint8Array([120]), [{ table: 'meta', key: 'format', value: new Uint8Array(4) }]);
  const row: bs.Bytes | null | undefined = await w.getSourceRow('todos', 't1');
  const sameDb: bs.Database = await bsDefault.openMemory();
  await sameDb.close();
  console.log(row, bs.checksumPut('xxh3', 'todos', 't1', '{}'), bs.version, bs.liveHandles());
  await w.close();
  await st.close();
  await db.close();
}
void main;
