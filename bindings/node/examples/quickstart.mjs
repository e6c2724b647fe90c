import { open } from 'bucketstore';

const B = 'todos["u1"]';
const db = await open('quickstart.bsdb'); // created if missing
const [stream] = await db.listStreams(); // a second run finds the stream of the first
const st = await db.storage(stream?.id ?? await db.createStream('rules-v1'));
if (!stream) {
  const w = await st.createWriter(); // one writer per stream; a commit makes everything visible at once
  await w.save({ tag: 'insert', sourceTable: 'todos', afterReplicaId: 't1',
    evaluated: [{ bucket: B, table: 'todos', id: 't1', data: '{"id":"t1","done":false}' }],
    evaluatedParameters: [{ lookup: ['u1'], bucketParameters: [{ list: 'u1' }] }] });
  await w.markSnapshotDone('00000010');
  await w.commit('00000010');
  await w.close();
}
const { checkpoint } = await st.getCheckpoint(); // op ids are bigints: 2n
for await (const c of st.getBucketDataBatch(checkpoint, [{ bucket: B, start: 0n }]))
  if ('chunkData' in c) for (const op of c.chunkData.data) console.log(op.op_id, op.op, op.object_id, op.data);
console.log((await st.getChecksums(checkpoint, [B])).get(B), await st.getParameterSets(checkpoint, [['u1']]));
await st.close();
await db.close();
