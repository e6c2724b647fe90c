// bucketstore for Node.js, the ES module entry: the CommonJS module (index.js) as the default
// export and each of its names as a named export (test/entry.test.js checks them against
// index.d.ts).
import bs from './index.js';

export const {
  Database, BucketStorage, Writer, Checkpoint, RawOplog, open, openMemory, openPostgres, checksumPut, load,
  liveHandles, version,
} = bs;
export default bs;
