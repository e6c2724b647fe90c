// bucketstore for Node.js: types of index.js. The shapes follow the sync service's storage
// interface (SyncRulesBucketStorage, BucketStorageBatch, the write-checkpoint API); where they
// differ it is said here. Every op id and checkpoint is a bigint (< 2^63; inputs also accept a
// non-negative safe-integer number). Every call that can block returns a Promise and runs on
// the libuv thread pool; a bad argument rejects it with a TypeError/RangeError, a library
// failure with an Error; both carry `code` (the library's name: 'BS_EINVAL', 'BS_ETOOBIG',
// 'BS_ESTATE', 'BS_EINVALIDATED', 'BS_ESTALE', 'BS_ELIMIT', ...) and a message naming the
// argument. Database, BucketStorage and Writer also have [Symbol.asyncDispose] (= close(), for
// `await using`); it is left out of these types so that they compile with TypeScript < 5.2.

/** Op ids and checkpoints. */
export type OpId = bigint;
/** Byte strings: a string (stored as UTF-8; one that is not valid Unicode, with a lone
 * surrogate, is refused with a TypeError) or raw bytes, stored as given. Read back as a string
 * when the bytes are UTF-8, else as a Buffer of them: bytes round-trip exactly. */
export type Bytes = string | Uint8Array;
/** A checkpoint argument: an op id, or an object with one (a ReplicationCheckpoint). */
export type CheckpointArg = OpId | number | { readonly checkpoint: OpId };
/** One value of a parameter lookup; integral numbers match integral bigints (314 = 314.0). */
export type LookupValue = null | boolean | number | bigint | string | Uint8Array;

export interface BucketStorageError extends Error {
  code: string;
}

export interface OpenOptions {
  /** No fsync at commit: a crash may lose recent commits, never corrupt the file. */
  nosync?: boolean;
  /** Read-only: every write call rejects with BS_ESTATE. */
  readonly?: boolean;
  /** Initial LMDB map size in bytes (default 4 GiB of address space; doubles on demand). */
  mapSize?: number | bigint;
  /** Checksum cache entries (default 100000). */
  checksumCacheEntries?: number | bigint;
}

/** openPostgres()'s options (storage.h bs_open_postgres). */
export interface PostgresOptions extends Omit<OpenOptions, 'mapSize'> {
  /** A read-write open neither creates nor migrates the schema: BS_ENOTFOUND when there is
   * none, BS_ECORRUPT when it is older (`bucketstore migrate URL` does it, once). */
  nomigrate?: boolean;
  /** The pool of connections for calls (default 10; at least 1), besides one session per open
   * writer and one LISTEN connection. */
  maxConnections?: number | bigint;
}

export interface StreamInfo {
  id: number;
  name: Bytes;
  state: StreamState;
  checksum: 'xxh3' | 'sha256';
}
export type StreamState = 'PROCESSING' | 'ACTIVE' | 'ERRORED' | 'STOPPED' | 'TERMINATED';

export declare class Database {
  /** Opens (creating if missing) the database file at path. */
  static open(path: string, options?: OpenOptions): Promise<Database>;
  /** A fresh in-memory database (the reference backend); nothing is persisted. */
  static openMemory(options?: Omit<OpenOptions, 'readonly'>): Promise<Database>;
  /** The PostgreSQL database a libpq URL or key=value string names (docs/postgresql.md): its
   * tables are created or migrated at the first read-write open (nosync: synchronous_commit
   * off). Rejects with BS_EUNSUPPORTED when the addon was built without libpq (apt-get install
   * libpq-dev, then npm rebuild bucketstore). */
  static openPostgres(url: string, options?: PostgresOptions): Promise<Database>;
  /** A new PROCESSING stream (ids 1, 2, 3, ...); resolves to its id. */
  createStream(name: string, options?: { checksum?: 'xxh3' | 'sha256' }): Promise<number>;
  listStreams(): Promise<StreamInfo[]>;
  /** fn after every checkpoint this process commits on the database (main thread, soon after
   * the commit; another process's commits are not seen); null unregisters. One per database;
   * what fn throws goes to 'uncaughtException'. Throws (synchronously) on a bad argument. */
  onCheckpoint(fn: ((event: { stream: number; checkpoint: OpId }) => void) | null): void;
  /** A handle on stream streamId; 0 (default) = the active stream, else the newest. */
  storage(streamId?: number): Promise<BucketStorage>;
  /** A consistent, compacted copy of every stream (one read snapshot; writers keep running)
   * written beside path, verified, then moved to path; on any failure (a cancel too) nothing
   * is left at path. A file at path rejects with BS_ESTATE unless replace; the memory backend
   * rejects with BS_EUNSUPPORTED. */
  backup(path: Bytes, options?: BackupOptions): Promise<void>;
  /** Every stored record of the database (stream 0, the default) or of one stream and the
   * database-wide ones (stream 0 records), table by table in key order, from one read snapshot
   * held until the iteration ends (break, return or the last record): what load() takes. A
   * thread of the addon reads them in batches (at most three in memory). While it is open the
   * database cannot be closed (BS_ESTATE). The memory backend rejects with BS_EUNSUPPORTED. */
  export(stream?: number): AsyncGenerator<StoredRecord, void, undefined>;
  /** Counts over the whole database, every stream (a full scan). */
  stat(): Promise<DatabaseStat>;
  /** Recomputes every op's checksum, every bucket's checksum and count and checks encodings
   * and source records, in one snapshot: the problems found ([] = consistent). */
  verify(): Promise<string[]>;
  /** Rejects with BS_ESTATE while storages or exports are open; resolves once calls in flight
   * are done. */
  close(): Promise<void>;
}

export interface DatabaseStat {
  streams: number;
  buckets: number;
  opsPut: number;
  opsRemove: number;
  opsMove: number;
  opsClear: number;
  parameterEntries: number;
  sourceRecords: number;
  writeCheckpoints: number;
  /** the file's size (0 for the memory backend) */
  fileBytes: number;
  /** bytes on free pages, reused by later writes; a backup leaves them out */
  reclaimableBytes: number;
}

/** One bucket as its stored figures stand (also ops flushed above the checkpoint). */
export interface BucketInfo {
  bucket: Bytes;
  /** signed 32-bit, as getChecksums */
  checksum: number;
  count: number;
  lastOp: OpId;
  /** space of its ops in the backend's own measure (for sizing and progress) */
  bytes: number;
  /** changes whenever a compaction rewrites the bucket's ops (compare for equality only) */
  generation: bigint;
  /** about how many ops arrived since its last full compaction */
  changes: number;
}

/** One stored record (the on-disk format: docs/format.md). stream 0: a record of the whole
 * database. */
export interface StoredRecord {
  table: string;
  stream: number;
  key: Uint8Array;
  value: Uint8Array;
}

/** A record for load(): a StoredRecord, or the same with strings for bytes. */
export interface LoadRecord {
  table: Bytes;
  stream?: number;
  key: Bytes;
  value: Bytes;
}

export interface LoadOptions {
  /** an abort cancels at the next batch and rejects with the signal's reason, as an abort
   * before the call does (nothing is left at path) */
  signal?: AbortSignal;
  /** called with the records written so far after each batch (a backup also with 0 once its
   * snapshot is taken), before the next one (a Promise it returns is waited for): returning
   * (or resolving to) true cancels (BS_ECANCELED), a throw (or a rejection) cancels and rejects
   * with what was thrown. If the process exits meanwhile, the call cancels at its next batch. */
  onProgress?: (records: number) => unknown;
}

export interface BackupOptions extends LoadOptions {
  /** replace a file at path (default: reject with BS_ESTATE) */
  replace?: boolean;
}

export interface CreateWriterOptions {
  /** Snapshot mode: INSERT only; inserts of rows that already have a record are skipped. */
  skipExistingRows?: boolean;
  /** Commits with nothing new still create a checkpoint (default true). */
  createEmptyCheckpoints?: boolean;
  /** Flush bound: saves queued before the writer flushes (default 2000). */
  maxRecords?: number;
  /** Flush bound: bytes of queued saves before the writer flushes (default 5 MB). */
  maxBytes?: number;
  /** The service's; checked (a TypeError otherwise) and unused: LSNs are opaque here, and a
   * save keeps row data when it passes currentData. */
  zeroLSN?: Bytes;
  storeCurrentData?: boolean;
  /** an abort before the call rejects with its reason */
  signal?: AbortSignal;
}

export interface EvaluatedRow {
  /** 1..480 bytes */
  bucket: Bytes;
  /** the output table (object_type) */
  table: Bytes;
  /** the output row id (object_id) */
  id: Bytes;
  /** the row as JSON text; an object is stored as JSON.stringify(data) */
  data: Bytes | object;
}

export interface EvaluatedParameters {
  lookup: LookupValue[];
  /** bucket-parameter rows: objects, or JSON text */
  bucketParameters: (object | string)[];
}

export interface SaveOptions {
  tag: 'insert' | 'update' | 'delete';
  /** the source table's name (or an object with one) */
  sourceTable: Bytes | { name: Bytes };
  /** the replica id before the change; for update, only when the key changed */
  beforeReplicaId?: Bytes;
  /** the replica id after the change (required unless delete) */
  afterReplicaId?: Bytes;
  /** the evaluated output rows (PUT into their buckets; the engine diffs against the last save) */
  evaluated?: EvaluatedRow[];
  /** the evaluated parameter lookups */
  evaluatedParameters?: EvaluatedParameters[];
  /** row data kept with the source record (read back with getSourceRow) */
  currentData?: Bytes | object;
}

export interface FlushedResult {
  /** the stream's highest persisted op id */
  flushed_op: OpId;
}

/** The service returns a boolean from commit/keepalive: here it is checkpointCreated. */
export interface CommitResult {
  checkpointBlocked: boolean;
  checkpointCreated: boolean;
  /** the stream's checkpoint after the call (0n = none) */
  checkpoint: OpId;
  blockedReason: null | 'snapshot_not_done' | 'below_no_checkpoint_before' | 'below_checkpoint_lsn';
}

export interface CustomWriteCheckpointOptions {
  user_id: Bytes;
  checkpoint: OpId;
  event_id?: Bytes;
  /** set for a checkpoint created from a client's request: cleanup may then delete it */
  checkpoint_requested_at?: Date | number | null;
}

/**
 * A replication writer (BucketStorageBatch). Calls run in call order, one at a time; a save on
 * an idle writer below its flush bound is queued without a thread hop. Nothing is visible to
 * readers before a commit. close() discards what was not flushed.
 */
export declare class Writer {
  /** The LSN of the last checkpoint this writer created. */
  lastCheckpointLsn: string | null;
  /** null, or the flush result when this save flushed the queue (its bound was reached). */
  save(record: SaveOptions): Promise<FlushedResult | null>;
  /**
   * Queues every record in order, as save() one by one would, in one call: the cheap way to
   * ingest. The whole batch is checked first, so a bad record (rejected naming saves[i]) queues
   * none of it. null, or the result of the last flush its records reached the bound for.
   */
  saveMany(records: SaveOptions[]): Promise<FlushedResult | null>;
  truncate(sourceTables: Bytes | { name: Bytes } | (Bytes | { name: Bytes })[]): Promise<null>;
  drop(sourceTables: Bytes | { name: Bytes } | (Bytes | { name: Bytes })[]): Promise<null>;
  /** null when nothing was queued since the last flush. */
  flush(): Promise<FlushedResult | null>;
  commit(lsn: string, options?: { createEmptyCheckpoints?: boolean }): Promise<CommitResult>;
  keepalive(lsn: string): Promise<CommitResult>;
  /** The snapshot is done; no checkpoint may precede lsn. markSnapshotDone(lsn) also works. */
  markSnapshotDone<T>(tables: T[], noCheckpointBeforeLsn: string): Promise<T[]>;
  markSnapshotDone(noCheckpointBeforeLsn: string): Promise<never[]>;
  setResumeLsn(lsn: string): Promise<void>;
  /** The data stored with a source record: null when none was stored, undefined for no row. */
  getSourceRow(table: Bytes | { name: Bytes }, replicaId: Bytes): Promise<Bytes | null | undefined>;
  /** Custom write-checkpoint mode: queued, persisted with the next flush. */
  addCustomWriteCheckpoint(checkpoint: CustomWriteCheckpointOptions): Promise<void>;
  close(): Promise<void>;
}

export declare class Checkpoint {
  readonly checkpoint: OpId;
  readonly lsn: string | null;
  getParameterSets(lookups: LookupValue[][], limit?: number): Promise<Record<string, unknown>[]>;
}

export interface BucketDataRequest {
  bucket: Bytes;
  /** serve ops after this op id (default 0n) */
  start?: OpId | number;
}

export interface BucketDataBatchOptions {
  /** ops per batch, all buckets together (default 1000) */
  limit?: number;
  /** a new chunk starts when the next op would pass this size (default 1 MiB) */
  chunkLimitBytes?: number;
  /** the service's; checked (another value is a RangeError) and unused: one read path */
  requestHint?: 'bulk' | 'incremental';
  /** an abort before the read, or between the chunks it hands out, rejects with its reason */
  signal?: AbortSignal;
}

export interface BucketDataBatchRawOptions extends BucketDataBatchOptions {
  /** The call's memory is lent to the next reuseBuffers call of this storage once the
   * iteration ends (the loop finishes or leaves it), instead of new memory for every call: its
   * RawOplogs then have length 0 and their accessors throw a TypeError (code BS_ESTATE), and
   * the views they gave (buffer, bytes()) show what a later call writes there. Copy what you
   * keep (entry(), Buffer.from()). Default false: a call's chunks stay as they are. */
  reuseBuffers?: boolean;
}

/** An op as the protocol sends it (OplogEntry), with op_id a bigint. */
export interface OplogEntry {
  op_id: OpId;
  op: 'PUT' | 'REMOVE' | 'MOVE' | 'CLEAR';
  /** null for the fields an op type does not carry; "" is a value */
  object_type: Bytes | null;
  object_id: Bytes | null;
  subkey: Bytes | null;
  /** the row as JSON text (PUT) */
  data: Bytes | null;
  /** unsigned 32-bit */
  checksum: number;
}

export interface SyncBucketDataChunk {
  chunkData: {
    bucket: Bytes;
    after: OpId;
    next_after: OpId;
    has_more: boolean;
    data: OplogEntry[];
  };
  targetOp: OpId | null;
}

/** An OplogEntry field that RawOplog.bytes, byteStart and byteEnd take. */
export type OplogField = 'object_type' | 'object_id' | 'subkey' | 'data';

/**
 * The ops of one chunk in raw mode (getBucketDataBatchRaw): every field stays in one Buffer and
 * is decoded when read, so an op costs no object and no string until asked for. i is the op's
 * index in the chunk, 0 <= i < length (another is a RangeError). Each accessor gives what the
 * default mode's OplogEntry holds: a string when the bytes are UTF-8, else a Buffer; null for a
 * field the op does not carry. The first field read as a string decodes the whole chunk at once
 * when its fields are all ASCII, and the strings are slices of it (one of 13 characters or more
 * keeps the chunk's text alive, as the default mode's keep their call's); otherwise each field
 * is decoded on its own.
 */
export declare class RawOplog implements Iterable<OplogEntry> {
  private constructor();
  readonly length: number;
  /** The bytes of every field of the call's ops, a Buffer (its chunks share it); see byteStart. */
  readonly buffer: Uint8Array;
  opId(i: number): OpId;
  op(i: number): OplogEntry['op'];
  /** unsigned 32-bit */
  checksum(i: number): number;
  objectType(i: number): Bytes | null;
  objectId(i: number): Bytes | null;
  subkey(i: number): Bytes | null;
  data(i: number): Bytes | null;
  /** The field's bytes as a view of buffer (a Buffer, no copy), or null. */
  bytes(i: number, field: OplogField): Uint8Array | null;
  /** Where the field starts in buffer (a byte offset), -1 when it is null: no object made. */
  byteStart(i: number, field: OplogField): number;
  /** Where it ends (exclusive), -1 when it is null. */
  byteEnd(i: number, field: OplogField): number;
  /** Op i as the default mode's OplogEntry. */
  entry(i: number): OplogEntry;
  [Symbol.iterator](): Iterator<OplogEntry>;
  /** The entries, so that JSON.stringify gives what it gives for the default mode's array. */
  toJSON(): OplogEntry[];
}

export interface SyncBucketDataRawChunk {
  chunkData: Omit<SyncBucketDataChunk['chunkData'], 'data'> & { data: RawOplog };
  targetOp: OpId | null;
}

export interface SyncBucketDataBatchEnd {
  /** true when the batch stopped at its limit: call again with start = next_after per bucket */
  hasMore: boolean;
}

export interface BucketChecksum {
  bucket: Bytes;
  /** signed 32-bit, as the service emits bucket checksums */
  checksum: number;
  count: number;
}

export interface CheckpointChanges {
  updatedDataBuckets: Set<Bytes>;
  invalidateDataBuckets: boolean;
  /** decoded lookups (the service has them JSON-serialised in a Set) */
  updatedParameterLookups: LookupValue[][];
  invalidateParameterBuckets: boolean;
  updatedWriteCheckpointUsers: Set<Bytes>;
}

export interface CompactOptions {
  /** horizon: ops above it are untouched (default: the current checkpoint) */
  maxOpId?: OpId | number;
  compactBuckets?: Bytes[];
  minBucketChanges?: number;
  minChangeRatio?: number;
  memoryLimitMB?: number;
  incrementalOnly?: boolean;
  /** incremental horizon age (default: the library's, BS_COMPACT_MIN_AGE_MS) */
  minAgeMs?: number;
  compactParameterData?: boolean;
  deleteCheckpointRequestsBefore?: Date | number;
  /** ops per write transaction (default: the library's, BS_COMPACT_MAX_OPS_PER_TXN): how long a
   * writer waits at most */
  maxOpsPerTransaction?: number;
  /** incremental: stop after this many ops (default: no limit) */
  opBudget?: OpId | number;
  /** opt-in defragmentation ratio (0 = off) */
  defragmentRatio?: number;
  /** The service's; checked (non-negative integers) and unused: the engine bounds a
   * compaction's memory by memoryLimitMB and its write transactions by maxOpsPerTransaction. */
  moveBatchByteLimit?: number;
  moveBatchLimit?: number;
  clearBatchLimit?: number;
  /** an abort cancels between transactions and rejects with the signal's reason, as an abort
   * before the call does (done work stays) */
  signal?: AbortSignal;
  /** called after each transaction with the totals so far, before the next one starts (a
   * Promise it returns is waited for): returning (or resolving to) true cancels (BS_ECANCELED;
   * done work stays), a throw (or a rejection) cancels and rejects with what was thrown. If the
   * process exits meanwhile, the compaction cancels after its transaction. */
  onProgress?: (soFar: CompactStats) => unknown;
}

export interface CompactStats {
  bucketsCompacted: number;
  opsMoved: number;
  opsCleared: number;
  opsRemoved: number;
  bytesBefore: number;
  bytesAfter: number;
  parameterEntriesRemoved: number;
  checkpointRequestsDeleted: number;
  opsReemitted: number;
}

export interface ManagedWriteCheckpointOptions {
  user_id: Bytes;
  heads: Record<string, string>;
  /** the client's request id (absent: the stored id + 1, generated) */
  checkpoint_request_id?: bigint;
  /** when the client asked (absent: now; after the epoch), what deleteCheckpointRequestsBefore
   * compares for a request with an id (a generated id has no request time and stays) */
  checkpoint_requested_at?: Date | number | null;
}

export interface StorageStatus {
  state: StreamState;
  resumeLsn: string | null;
  snapshotDone: boolean;
  checkpoint: OpId;
  lsn: string | null;
  lastPersistedOp: OpId;
  /** The message of the last reportError (cut at 255 bytes; a character cut there is U+FFFD),
   * null when there is none (docs/bindings.md: Python's last_error is "" then). */
  lastError: string | null;
}

/** One replication stream (SyncRulesBucketStorage). Safe to use from many async callers. */
export declare class BucketStorage {
  readonly replicationStreamId: number;
  createWriter(options?: CreateWriterOptions): Promise<Writer>;
  /** createWriter, callback, flush, close: the flush result. */
  startBatch(options: CreateWriterOptions | undefined,
    callback: (batch: Writer) => Promise<void>): Promise<FlushedResult | null>;
  getCheckpoint(): Promise<Checkpoint>;
  /** One batch: its chunks (one bucket each, buckets in byte order of name), then the end. */
  getBucketDataBatch(checkpoint: CheckpointArg, dataBuckets: BucketDataRequest[],
    options?: BucketDataBatchOptions): AsyncIterable<SyncBucketDataChunk | SyncBucketDataBatchEnd>;
  /** getBucketDataBatch in raw mode: each chunk's ops as one RawOplog, decoded when read. */
  getBucketDataBatchRaw(checkpoint: CheckpointArg, dataBuckets: BucketDataRequest[],
    options?: BucketDataBatchRawOptions): AsyncIterable<SyncBucketDataRawChunk | SyncBucketDataBatchEnd>;
  /** getBucketDataBatch read on the calling thread: the first next() reads the batch (blocking
   * the event loop meanwhile: a local read on LMDB and memory, network round trips on
   * PostgreSQL) or throws what the async form rejects with; the same chunks and end. */
  getBucketDataBatchSync(checkpoint: CheckpointArg, dataBuckets: BucketDataRequest[],
    options?: BucketDataBatchOptions): IterableIterator<SyncBucketDataChunk | SyncBucketDataBatchEnd>;
  /** getBucketDataBatchRaw read on the calling thread, as getBucketDataBatchSync; reuseBuffers
   * lends the same memory as the async form's (a call of either form takes it from the other). */
  getBucketDataBatchRawSync(checkpoint: CheckpointArg, dataBuckets: BucketDataRequest[],
    options?: BucketDataBatchRawOptions): IterableIterator<SyncBucketDataRawChunk | SyncBucketDataBatchEnd>;
  /** One entry per requested bucket; unknown buckets have checksum 0, count 0. */
  getChecksums(checkpoint: CheckpointArg, buckets: (Bytes | { bucket: Bytes })[],
    options?: { /** checked and unused */ requestHint?: 'bulk' | 'incremental' }):
    Promise<Map<Bytes, BucketChecksum>>;
  /** Nothing to drop: the library updates its checksum cache at every commit, compaction and
   * clear of this process (another process's clear needs a reopen: storage.h bs_clear). */
  clearChecksumCache(): Promise<void>;
  /** true: parameter compaction keeps a cursor, so an incremental run continues where the last
   * stopped. */
  supportsIncrementalParameterCompaction(): boolean;
  /** The bucket-parameter rows, parsed (JSON.parse, except that an integer beyond 2^53 comes
   * back as an exact bigint). Rejects with code BS_ELIMIT ("too many parameter results (limit
   * was N)"). */
  getParameterSets(checkpoint: CheckpointArg, lookups: LookupValue[][], limit?: number):
    Promise<Record<string, unknown>[]>;
  getCheckpointChanges(options: { lastCheckpoint: CheckpointArg; nextCheckpoint: CheckpointArg }):
    Promise<CheckpointChanges>;
  /** The service resolves to void: here to the statistics. */
  compact(options?: CompactOptions): Promise<CompactStats>;
  /** Before the first checkpoint only (else BS_ESTATE). It has no steps to stop at: an abort,
   * before or during the call, rejects with the signal's reason (the work done stays). */
  compactInitialReplication(options?: { maxOpId?: OpId | number; minBucketChanges?: number;
    signal?: AbortSignal }): Promise<{ buckets: number }>;
  /** Every bucket with a stored op, in ascending byte order of name, after startAfter; read in
   * pages of `page` buckets (default 1000), one snapshot each. */
  listBuckets(options?: { startAfter?: Bytes; page?: number }): AsyncGenerator<BucketInfo, void, undefined>;
  /** The stream's checkpoint once it differs from known (null: no checkpoint yet), or the
   * current one after timeoutMs (default: no limit). Commits of this process wake it at once,
   * other processes' within 50 ms. An abort rejects with the signal's reason. */
  waitCheckpoint(known: { checkpoint: OpId; lsn: string | null } | null,
    options?: { timeoutMs?: number; signal?: AbortSignal }): Promise<Checkpoint>;
  readonly writeCheckpointMode: 'managed' | 'custom';
  setWriteCheckpointMode(config: 'managed' | 'custom' |
    { mode: 'managed' | 'custom'; eventName?: string }): void;
  createManagedWriteCheckpoints(checkpoints: ManagedWriteCheckpointOptions[]):
    Promise<{ writeCheckpoints: Map<Bytes, bigint>; shouldAdvance: boolean }>;
  /** managed: heads required; custom: user_id only. null when there is none. */
  lastWriteCheckpoint(filters: { user_id: Bytes; heads?: Record<string, string> }):
    Promise<bigint | null>;
  /** Resolves to the number of records deleted. */
  deleteCheckpointRequestsBefore(before: Date | number): Promise<number>;
  getStatus(): Promise<StorageStatus>;
  clear(): Promise<void>;
  /** An abort of signal before the call rejects with its reason. */
  terminate(options?: { clearStorage?: boolean; signal?: AbortSignal }): Promise<void>;
  reportError(e: unknown): Promise<void>;
  /** Rejects with BS_ESTATE while a writer is open. */
  close(): Promise<void>;
}

export declare const open: typeof Database.open;
export declare const openMemory: typeof Database.openMemory;
export declare const openPostgres: typeof Database.openPostgres;
/** The PUT op checksum (the storage contract, section 3) as the storage computes it: unsigned 32-bit. */
export declare function checksumPut(hash: 'xxh3' | 'sha256', objectType: Bytes, objectId: Bytes,
  data: Bytes | object): number;
/** A new database file at path from records (those of Database.export()), taken from any
 * iterable or async iterable as the loader needs them; written beside path, verified, then
 * moved to path (the same records give the same database). A file at path rejects with
 * BS_ESTATE (load never replaces); records without the format record, of an unknown table or
 * of another format reject with BS_ECORRUPT; on any failure nothing is left at path. */
export declare function load(path: Bytes,
  records: Iterable<LoadRecord> | AsyncIterable<LoadRecord>, options?: LoadOptions): Promise<void>;
/** Database, storage and writer handles whose C objects are not yet released. */
export declare function liveHandles(): number;
export declare const version: string;
/** The module's names as one object: `import bs from 'bucketstore'` (ESM) and
 * `require('bucketstore').default`. */
declare const bucketstore: {
  Database: typeof Database;
  BucketStorage: typeof BucketStorage;
  Writer: typeof Writer;
  Checkpoint: typeof Checkpoint;
  RawOplog: typeof RawOplog;
  open: typeof open;
  openMemory: typeof openMemory;
  openPostgres: typeof openPostgres;
  checksumPut: typeof checksumPut;
  load: typeof load;
  liveHandles: typeof liveHandles;
  version: typeof version;
};
export default bucketstore;
