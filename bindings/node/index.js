'use strict';
// bucketstore for Node.js: the classes of index.d.ts over the Node-API addon
// (src/bucketstore_node.c). Every call that can block runs on the libuv thread pool and
// returns a Promise; a bad argument rejects it, never crashes (only setWriteCheckpointMode,
// which is synchronous, throws).
const { isUint8Array } = require('node:util').types;
const native = require('./build/Release/bucketstore.node');

// At exit (process.exit(), an uncaught exception: the process then waits for the thread pool),
// a long call whose thread waits for onProgress on this thread cancels instead.
process.once('exit', native.exiting);

const asyncDispose = Symbol.asyncDispose ?? Symbol.for('nodejs.asyncDispose');
const RESOLVED_NULL = Promise.resolve(null);

/** Runs a native call; a synchronous throw (bad argument) becomes a rejected Promise. */
function call(fn, ...args) {
  try {
    return fn(...args);
  } catch (e) {
    return Promise.reject(e);
  }
}

/**
 * Runs run(flag): flag is undefined without a signal, else an Int32Array over a
 * SharedArrayBuffer that the signal's abort sets (the addon's worker reads it between steps).
 */
async function withSignal(signal, run) {
  if (!signal) return run(undefined);
  signal.throwIfAborted();
  const flag = new Int32Array(new SharedArrayBuffer(4));
  const onAbort = () => Atomics.store(flag, 0, 1);
  signal.addEventListener('abort', onAbort, { once: true });
  try {
    return await run(flag);
  } catch (e) {
    // cancelled by the abort: rejects with its reason, as an abort before the call does
    if (signal.aborted && e?.code === 'BS_ECANCELED') throw signal.reason;
    throw e;
  } finally {
    signal.removeEventListener('abort', onAbort);
  }
}

const SAFE_DIGITS = /\d{16}/;

/**
 * JSON text as JSON.parse reads it, except that an integer beyond Number's exact range
 * (2^53) becomes a bigint, so stored big integers come back exact.
 */
function parseJson(text) {
  if (!SAFE_DIGITS.test(text)) return JSON.parse(text);
  let i = 0;
  const ws = () => {
    while (i < text.length && ' \t\n\r'.includes(text[i])) i++;
  };
  const value = () => {
    ws();
    const c = text[i];
    if (c === '{') {
      const o = {};
      i++;
      ws();
      if (text[i] === '}') return i++, o;
      for (;;) {
        ws();
        const k = string();
        ws();
        if (text[i++] !== ':') throw new SyntaxError(`JSON: ':' expected at ${i - 1}`);
        o[k] = value();
        ws();
        if (text[i] === '}') return i++, o;
        if (text[i++] !== ',') throw new SyntaxError(`JSON: ',' or '}' expected at ${i - 1}`);
      }
    }
    if (c === '[') {
      const a = [];
      i++;
      ws();
      if (text[i] === ']') return i++, a;
      for (;;) {
        a.push(value());
        ws();
        if (text[i] === ']') return i++, a;
        if (text[i++] !== ',') throw new SyntaxError(`JSON: ',' or ']' expected at ${i - 1}`);
      }
    }
    if (c === '"') return string();
    const m = /^-?(?:0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?|^true|^false|^null/.exec(text.slice(i, i + 400));
    if (!m) throw new SyntaxError(`JSON: unexpected ${c === undefined ? 'end' : `'${c}'`} at ${i}`);
    i += m[0].length;
    if (m[0] === 'true' || m[0] === 'false' || m[0] === 'null') return JSON.parse(m[0]);
    const n = Number(m[0]);
    return m[1] === undefined && m[2] === undefined && !Number.isSafeInteger(n) ? BigInt(m[0]) : n;
  };
  const string = () => {
    const m = /^"(?:[^"\\\u0000-\u001f]|\\.)*"/.exec(text.slice(i));
    if (!m) throw new SyntaxError(`JSON: string expected at ${i}`);
    i += m[0].length;
    return JSON.parse(m[0]);
  };
  const v = value();
  ws();
  if (i !== text.length) throw new SyntaxError(`JSON: unexpected '${text[i]}' at ${i}`);
  return v;
}

/** A checkpoint argument: a bigint, a number or a ReplicationCheckpoint-like {checkpoint}. */
function opId(cp) {
  return cp !== null && typeof cp === 'object' ? cp.checkpoint : cp;
}

function bucketName(b) {
  return b !== null && typeof b === 'object' && !(b instanceof Uint8Array) ? b.bucket : b;
}

function tableName(t) {
  return t !== null && typeof t === 'object' && !(t instanceof Uint8Array) ? t.name : t;
}

// ---- Saves as bytes ------------------------------------------------------------------------
// save() and saveMany() encode their records into one Buffer, in the layout the addon's
// decoder documents (src/bucketstore_node.c, "Saves as bytes"): one native call then queues
// them all, instead of a Node-API call per field. Types and lone surrogates are checked here
// (only JS sees them); the storage limits there, for the whole batch before any save is queued.
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;
const isWellFormed = String.prototype.isWellFormed
  ? (s) => s.isWellFormed()
  : (s) => !LONE_SURROGATE.test(s);
const KEEP_BYTES = 1 << 24; // a larger buffer, grown for one big batch, is not kept

function rangeError(message) {
  const e = new RangeError(message);
  e.code = 'BS_EINVAL';
  return e;
}

class SaveEncoder {
  buf = Buffer.allocUnsafe(1 << 16);
  off = 0;
  /** where an error is, named only when one is thrown: saves[index] (record when -1), then
   * field, or list[j].field[k] (j, k when >= 0) */
  index = -1;
  list = '';
  j = -1;
  field = '';
  k = -1;

  start(index) {
    this.off = 0;
    this.index = index;
  }
  at(list, j, field, k = -1) {
    this.list = list, this.j = j, this.field = field, this.k = k;
  }
  /** the encoded bytes, valid until the next call */
  end() {
    const b = this.buf;
    if (b.length > KEEP_BYTES) this.buf = Buffer.allocUnsafe(1 << 16);
    return b.subarray(0, this.off);
  }
  where() {
    const rec = this.index < 0 ? 'record' : `saves[${this.index}]`;
    const list = this.list ? `${this.list}[${this.j}]` : '';
    const field = this.field ? `${list ? '.' : ''}${this.field}` : '';
    return `${rec}${list || field ? '.' : ''}${list}${field}${this.k >= 0 ? `[${this.k}]` : ''}`;
  }
  fail(what, Err = typeError) {
    return Err(`${this.where()}: ${what}`);
  }
  room(n) {
    if (this.off + n <= this.buf.length) return;
    const b = Buffer.allocUnsafe(Math.max(2 * this.buf.length, this.off + n));
    this.buf.copy(b, 0, 0, this.off);
    this.buf = b;
  }
  u8(v) {
    this.room(1);
    this.buf[this.off++] = v;
  }
  u32(v) {
    this.room(4);
    this.buf.writeUInt32LE(v, this.off);
    this.off += 4;
  }
  /** a string as UTF-8 (refused with a lone surrogate, which UTF-8 cannot carry), or a Uint8Array */
  bytes(v) {
    if (typeof v === 'string') {
      if (!isWellFormed(v)) {
        const at = v.search(LONE_SURROGATE);
        throw this.fail(`not valid Unicode (a lone surrogate at index ${at}; pass bytes as a Uint8Array)`);
      }
      this.room(4 + 3 * v.length);
      const n = this.buf.write(v, this.off + 4);
      this.buf.writeUInt32LE(n, this.off);
      this.off += 4 + n;
    } else if (isUint8Array(v)) {
      this.room(4 + v.length);
      this.buf.writeUInt32LE(v.length, this.off);
      this.buf.set(v, this.off + 4);
      this.off += 4 + v.length;
    } else {
      throw this.fail(v == null ? 'missing (expected a string)' : 'expected a string or Uint8Array');
    }
  }
  /** JSON text: a string or bytes as given, an object through JSON.stringify */
  json(v) {
    if (typeof v === 'string' || ArrayBuffer.isView(v)) return this.bytes(v);
    if (v == null) throw this.fail('missing');
    if (typeof v !== 'object') throw this.fail('expected JSON text or an object');
    this.bytes(JSON.stringify(v));
  }
  array(v) {
    if (v == null) return [];
    if (!Array.isArray(v)) throw this.fail('expected an array');
    return v;
  }
  lookup(v, j) {
    this.at('evaluatedParameters', j, 'lookup');
    if (v == null) throw this.fail('missing (expected an array)');
    const vals = this.array(v);
    this.u32(vals.length);
    for (let k = 0; k < vals.length; k++) {
      const e = vals[k];
      this.at('evaluatedParameters', j, 'lookup', k);
      if (e == null) this.u8(0);
      else if (typeof e === 'boolean') this.u8(e ? 2 : 1);
      else if (typeof e === 'number') {
        this.u8(3), this.room(8);
        this.off = this.buf.writeDoubleLE(e, this.off);
      } else if (typeof e === 'bigint') {
        if (BigInt.asIntN(64, e) !== e) throw this.fail('bigint out of the int64 range', rangeError);
        this.u8(4), this.room(8);
        this.off = this.buf.writeBigInt64LE(e, this.off);
      } else if (typeof e === 'string' || isUint8Array(e)) this.u8(5), this.bytes(e);
      else throw this.fail('expected null, a boolean, number, bigint, string or Uint8Array');
    }
  }
  /** one record of index.d.ts's SaveOptions */
  save(r) {
    this.at('', -1, '');
    if (r == null) throw this.fail('missing');
    if (typeof r !== 'object') throw this.fail('expected an object');
    const t = r.tag;
    const tag = t === 'insert' ? 1 : t === 'update' ? 2 : t === 'delete' ? 3 : 0;
    this.at('', -1, 'tag');
    if (!tag) throw this.fail("expected 'insert', 'update' or 'delete'");
    const before = r.beforeReplicaId, after = r.afterReplicaId, current = r.currentData;
    // a DELETE names the deleted row; afterReplicaId is accepted as its id too
    const deleteId = tag === 3 && before == null;
    const present = (before != null || deleteId ? 1 : 0) | (tag !== 3 ? 2 : 0) | (current != null ? 4 : 0);
    this.u8(tag), this.u8(present);
    this.at('', -1, 'sourceTable');
    this.bytes(tableName(r.sourceTable));
    this.at('', -1, 'beforeReplicaId');
    if (present & 1) this.bytes(deleteId ? after : before);
    this.at('', -1, 'afterReplicaId');
    if (present & 2) this.bytes(after);
    this.at('', -1, 'currentData');
    if (present & 4) this.json(current);
    this.at('', -1, 'evaluated');
    const rows = this.array(r.evaluated);
    this.u32(rows.length);
    for (let j = 0; j < rows.length; j++) {
      const e = rows[j];
      this.at('evaluated', j, 'bucket');
      this.bytes(e?.bucket);
      this.field = 'table';
      this.bytes(e?.table);
      this.field = 'id';
      this.bytes(e?.id);
      this.field = 'data';
      this.json(e?.data);
    }
    this.at('', -1, 'evaluatedParameters');
    const lookups = this.array(r.evaluatedParameters);
    this.u32(lookups.length);
    for (let j = 0; j < lookups.length; j++) {
      const e = lookups[j];
      this.lookup(e?.lookup, j);
      this.at('evaluatedParameters', j, 'bucketParameters');
      const params = this.array(e?.bucketParameters);
      this.u32(params.length);
      for (let k = 0; k < params.length; k++) {
        this.k = k;
        this.json(params[k]);
      }
    }
  }
}
/** Encodes save()'s record (single) or saveMany()'s records and queues them in one native call.
 * One encoder is kept for reuse; a save made while one encodes (by a getter or a toJSON of a
 * record) gets its own. */
let spareEncoder = new SaveEncoder();
function saveEncoded(h, records, single) {
  const e = spareEncoder ?? new SaveEncoder();
  spareEncoder = null;
  try {
    e.start(single ? -1 : 0);
    if (single) e.save(records);
    else {
      for (let i = 0; i < records.length; i++) {
        e.index = i;
        e.save(records[i]);
      }
    }
    return native.save(h, e.end(), single ? 1 : records.length, single) ?? RESOLVED_NULL;
  } catch (err) {
    return Promise.reject(err);
  } finally {
    spareEncoder = e;
  }
}

// ---- Options of the sync service that the engine has no use for ---------------------------
// Accepted and checked as the service would take them, then unused (README, "Accepted, unused").

/** options.requestHint: undefined, 'bulk' or 'incremental'. */
function checkHint(options) {
  const h = options?.requestHint;
  if (h === undefined || h === 'bulk' || h === 'incremental') return;
  if (typeof h !== 'string') throw typeError('options.requestHint: expected a string');
  throw rangeError(`options.requestHint: '${h}' is not 'bulk' or 'incremental'`);
}

/** createWriter's zeroLSN (a string or bytes) and storeCurrentData (a boolean). */
function checkWriterOptions(options) {
  const { zeroLSN: z, storeCurrentData: c } = options ?? {};
  if (z != null) {
    if (typeof z === 'string' && !isWellFormed(z))
      throw typeError('options.zeroLSN: not valid Unicode (a lone surrogate)');
    if (typeof z !== 'string' && !isUint8Array(z))
      throw typeError('options.zeroLSN: expected a string or Uint8Array');
  }
  if (c != null && typeof c !== 'boolean') throw typeError('options.storeCurrentData: expected a boolean');
}

const UNUSED_COMPACT = ['moveBatchByteLimit', 'moveBatchLimit', 'clearBatchLimit'];
// Counts the library reads as "its default" when 0, and a time or ratio it reads so when
// negative: an explicit such value is refused, as Python refuses it, instead of meaning the
// default silently (leave the option out for that).
const COMPACT_COUNTS = ['minBucketChanges', 'memoryLimitMB', 'maxOpsPerTransaction', 'opBudget'];
const COMPACT_NOT_NEGATIVE = ['minAgeMs', 'minChangeRatio'];

function checkExplicit(options, counts, notNegative) {
  for (const name of counts) {
    const v = options?.[name];
    if (v === 0 || v === 0n) throw rangeError(`options.${name}: 0 (at least 1; leave it out for the default)`);
  }
  for (const name of notNegative) {
    const v = options?.[name];
    if (typeof v === 'number' && v < 0) throw rangeError(`options.${name}: negative (leave it out for the default)`);
  }
}

/** compact's batch limits: non-negative integers (a number or bigint); the explicit options. */
function checkCompactOptions(options) {
  checkExplicit(options, COMPACT_COUNTS, COMPACT_NOT_NEGATIVE);
  for (const name of UNUSED_COMPACT) {
    const v = options?.[name];
    if (v == null) continue;
    if (typeof v !== 'number' && typeof v !== 'bigint')
      throw typeError(`options.${name}: expected a number`);
    if (typeof v === 'number' ? !(Number.isSafeInteger(v) && v >= 0) : v < 0n)
      throw rangeError(`options.${name}: not a non-negative integer`);
  }
}

const OP_NAMES = [null, 'PUT', 'REMOVE', 'MOVE', 'CLEAR'];

/** Field f of a batch in columns that is not text (see done_bucket_data in the addon): null, a
 * value made on its own (bytes that are not UTF-8) or same, the same field of the op before. */
function otherField(r, kind, f, same) {
  return kind === 1 ? null : kind === 2 ? r.raw[f] : same;
}

/**
 * Ops k to k + n - 1 of a batch in columns as the protocol's OplogEntry objects. A field of kind
 * 0 is a slice of text, the piece of the batch's text that holds the op (from UTF-16 unit base
 * on); s carries from chunk to chunk the piece (q, text, base, and next, the op the next piece
 * starts at) and p, the op before. The columns are read from locals: a property of r read in
 * the loop is read again after every call (a slice), as V8 cannot tell that none changes it.
 */
function oplogEntries(r, k, n, s) {
  const { ids, types, sums, kinds, offs, texts, cuts } = r;
  let { q, text, base, next, p } = s;
  const data = new Array(n);
  for (let i = 0; i < n; i++, k++) {
    if (k === next) q++, text = texts[q], base = cuts[2 * q + 1], next = cuts[2 * q + 2];
    const f = 4 * k, k0 = kinds[f], k1 = kinds[f + 1], k2 = kinds[f + 2], k3 = kinds[f + 3];
    data[i] = p = { op_id: ids[k], op: OP_NAMES[types[k]],
      object_type: k0 === 0 ? text.slice(offs[f] - base, offs[f + 1] - base) : otherField(r, k0, f, p?.object_type),
      object_id: k1 === 0 ? text.slice(offs[f + 1] - base, offs[f + 2] - base) : otherField(r, k1, f + 1, p?.object_id),
      subkey: k2 === 0 ? text.slice(offs[f + 2] - base, offs[f + 3] - base) : otherField(r, k2, f + 2, p?.subkey),
      data: k3 === 0 ? text.slice(offs[f + 3] - base, offs[f + 4] - base) : otherField(r, k3, f + 3, p?.data),
      checksum: sums[k] };
  }
  s.q = q, s.text = text, s.base = base, s.next = next, s.p = p;
  return data;
}

const utf8Fatal = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });
// isAscii: Node 18.15 and later (older ones decode each field on its own)
const { isAscii, constants: { MAX_STRING_LENGTH } } = require('node:buffer');

/** The index of an OplogEntry field name (RawOplog.bytes, byteStart, byteEnd), or a RangeError. */
function fieldIndex(name) {
  // compared, not looked up in an object: a lookup by a varying key is V8's slow path
  const f = name === 'data' ? 3 : name === 'object_id' ? 1 : name === 'object_type' ? 0
    : name === 'subkey' ? 2 : -1;
  if (f < 0) throw badField(name);
  return f;
}

// The errors of RawOplog's accessors, made out of line: V8 inlines an accessor into a reader's
// loop only while the inlined functions stay small.
function badField(name) {
  return rangeError(`field: ${String(name)} is not object_type, object_id, subkey or data`);
}

function reused() {
  const e = new TypeError('RawOplog: read after its iteration ended (reuseBuffers: copy what you keep)');
  e.code = 'BS_ESTATE';
  return e;
}

/** The RawOplogs that revoke ended, looked up only when an index is outside a chunk: a private
 * field and method for it made every accessor slower, though only the error path uses them
 * (callgrind, bench/README.md: raw mode's string reads about 100 instructions an op). */
const revoked = new WeakSet();

/** The error of RawOplog ops read at index i outside it: a TypeError once revoked. */
function outside(ops, i) {
  return revoked.has(ops) ? reused() : badIndex(i, ops.length);
}

/** Ends a RawOplog of a reuseBuffers call, whose memory is then the next call's (set in
 * RawOplog's static block: it replaces the chunk's views by empty ones, so that every accessor
 * throws, a TypeError since the RawOplog is in revoked). */
let revoke;

function badIndex(i, n) {
  return rangeError(`op index ${String(i)}: not in 0..${n - 1}`);
}

const NO_IDS = new BigUint64Array(0), NO_BYTES = new Uint8Array(0), NO_U32 = new Uint32Array(0);

/**
 * The ops of one chunk in raw mode (getBucketDataBatchRaw): the fields of every op of the call
 * stay in one Buffer, and a field is decoded when it is read, so an op costs no object and no
 * string until asked for. Op i of the chunk (0 <= i < length) is op k + i of the batch r, laid
 * out as done_bucket_data in the addon says (raw mode: byte offsets into r.text, a Buffer; a
 * type's bits from the fifth up say which fields are null). The columns are held as views of
 * the chunk's ops alone, made once per chunk, so that an accessor is a load from a typed array
 * indexed by i, whose own bounds check (an element outside reads undefined) is the index check:
 * with a check of its own (i >>> 0, the length) and an offset k added, the accessors took twice
 * the time (bench/README.md). A number index is required: a typed array reads '0' as 0.
 */
class RawOplog {
  #ids;
  #types;
  #sums;
  #offs;
  #text;
  /** the chunk's fields as one string when they are all ASCII (#base: its first byte's offset in
   * the batch), null when not, undefined until a field is first decoded */
  #ascii;
  #base = 0;
  constructor(r, k, n) {
    this.#ids = r.ids.subarray(k, k + n);
    this.#types = r.types.subarray(k, k + n);
    this.#sums = r.sums.subarray(k, k + n);
    this.#offs = r.offs.subarray(4 * k, 4 * (k + n) + 1);
    this.#text = r.text;
    this.length = n;
  }
  static {
    revoke = (ops) => {
      ops.#ids = NO_IDS, ops.#types = NO_BYTES, ops.#sums = NO_U32, ops.#offs = NO_U32;
      ops.length = 0;
      revoked.add(ops);
    };
  }
  /** The bytes of every field of the call's ops (shared by its chunks; byteStart/byteEnd). */
  get buffer() {
    return this.#text;
  }
  /** Where field f of op i starts (e 0) or ends (e 1) in buffer, -1 when null; a RangeError
   * for an i outside the chunk (a TypeError once revoked). */
  #offset(i, f, e) {
    const t = this.#types[i];
    if (t === undefined || typeof i !== 'number') throw outside(this, i);
    return t & (16 << f) ? -1 : this.#offs[4 * i + f + e];
  }
  /** Where field name of op i starts in buffer (a byte offset), -1 when the field is null. */
  byteStart(i, name) {
    return this.#offset(i, fieldIndex(name), 0);
  }
  /** Where it ends (exclusive), -1 when it is null. */
  byteEnd(i, name) {
    return this.#offset(i, fieldIndex(name), 1);
  }
  /** Field name of op i as a view of buffer (no copy), or null. */
  bytes(i, name) {
    const f = fieldIndex(name), start = this.#offset(i, f, 0);
    return start < 0 ? null : this.#text.subarray(start, this.#offs[4 * i + f + 1]);
  }
  /** The chunk's fields as one string if they are all ASCII (a byte a character), else null. */
  #decodeAscii() {
    const start = this.#offs[0], end = this.#offs[4 * this.length];
    const bytes = this.#text.subarray(start, end);
    this.#base = start;
    return (this.#ascii = isAscii && end - start <= MAX_STRING_LENGTH && isAscii(bytes)
      ? bytes.latin1Slice() : null);
  }
  /** Field f of op i as the default mode gives it: a string when UTF-8, else a Buffer. An ASCII
   * chunk is decoded once and its fields sliced (a slice of 13 characters or more keeps the
   * chunk's string alive, as the default mode's keep their batch's); another decodes each field
   * on its own. */
  #field(i, f) {
    const start = this.#offset(i, f, 0), end = this.#offs[4 * i + f + 1];
    if (start < 0) return null;
    const ascii = this.#ascii === undefined ? this.#decodeAscii() : this.#ascii;
    if (ascii !== null) return ascii.slice(start - this.#base, end - this.#base);
    const s = this.#text.toString('utf8', start, end);
    if (!s.includes('\uFFFD')) return s; // no replacement: the bytes were UTF-8
    const b = Buffer.from(this.#text.subarray(start, end));
    try {
      return utf8Fatal.decode(b);
    } catch {
      return b;
    }
  }
  opId(i) {
    const v = this.#ids[i];
    if (v === undefined || typeof i !== 'number') throw outside(this, i);
    return v;
  }
  op(i) {
    const t = this.#types[i];
    if (t === undefined || typeof i !== 'number') throw outside(this, i);
    return OP_NAMES[t & 15];
  }
  checksum(i) {
    const v = this.#sums[i];
    if (v === undefined || typeof i !== 'number') throw outside(this, i);
    return v;
  }
  objectType(i) {
    return this.#field(i, 0);
  }
  objectId(i) {
    return this.#field(i, 1);
  }
  subkey(i) {
    return this.#field(i, 2);
  }
  data(i) {
    return this.#field(i, 3);
  }
  /** Op i as the default mode's OplogEntry. */
  entry(i) {
    return { op_id: this.opId(i), op: this.op(i), object_type: this.objectType(i),
      object_id: this.objectId(i), subkey: this.subkey(i), data: this.data(i),
      checksum: this.checksum(i) };
  }
  *[Symbol.iterator]() {
    for (let i = 0; i < this.length; i++) yield this.entry(i);
  }
  /** JSON.stringify sees the entries, as of the default mode's array. */
  toJSON() {
    return [...this];
  }
}

class Database {
  #h;
  /** @internal use open() / openMemory() / openPostgres() */
  constructor(handle) {
    this.#h = handle;
  }
  static async open(path, options) {
    return new Database(await call(native.open, path, { ...options, memory: false }));
  }
  static async openMemory(options) {
    return new Database(await call(native.open, null, { ...options, memory: true }));
  }
  static async openPostgres(url, options) {
    return new Database(await call(native.open, url, { ...options, memory: false, postgres: true }));
  }
  createStream(name, options) {
    return call(native.streamCreate, this.#h, name, options);
  }
  listStreams() {
    return call(native.streamList, this.#h);
  }
  /**
   * fn({stream, checkpoint}) after every checkpoint this process commits on the database (on
   * the main thread, soon after the commit); null unregisters. One listener per database.
   */
  onCheckpoint(fn) {
    native.onCheckpoint(this.#h, fn);
  }
  async storage(streamId = 0) {
    return new BucketStorage(await call(native.storageOpen, this.#h, streamId));
  }
  /** A consistent, compacted, verified copy at path (bs_backup); see index.d.ts. */
  backup(path, options) {
    const { signal, ...o } = options ?? {};
    return withSignal(signal, (flag) => call(native.backup, this.#h, path, o, flag));
  }
  /**
   * Every stored record (bs_db_export), from one snapshot held until the iteration ends: a
   * thread of the addon reads them and hands them over in batches, at most three at a time.
   */
  async *export(stream = 0) {
    const x = native.exportOpen(this.#h, stream);
    try {
      for (let batch; (batch = await native.exportNext(x)) !== null;) yield* batch;
    } finally {
      await native.exportClose(x);
    }
  }
  /** Counts over the whole database (bs_db_stat: a full scan). */
  stat() {
    return call(native.stat, this.#h);
  }
  /** Every checksum, count and encoding recomputed (bs_db_verify): the problems, [] if none. */
  verify() {
    return call(native.verify, this.#h);
  }
  close() {
    return call(native.close, this.#h);
  }
  [asyncDispose]() {
    return this.close();
  }
}

class Checkpoint {
  #st;
  constructor(storage, checkpoint, lsn) {
    this.#st = storage;
    this.checkpoint = checkpoint;
    this.lsn = lsn;
  }
  getParameterSets(lookups, limit) {
    return this.#st.getParameterSets(this.checkpoint, lookups, limit);
  }
}

/** The ArrayBuffers of a bucketData call (see done_bucket_data in the addon), or null when they
 * are more than KEEP_BYTES: the next call's worker writes into them, memory already mapped,
 * instead of new memory that V8 gives back only when it collects. */
function keepable(pool) {
  let bytes = 0;
  for (const ab of pool) bytes += ab?.byteLength ?? 0;
  return bytes <= KEEP_BYTES ? pool : null;
}

/** options.reuseBuffers of the raw reads: a boolean, default false. */
function reuseOption(options) {
  const reuse = options?.reuseBuffers;
  if (reuse != null && typeof reuse !== 'boolean') throw typeError('options.reuseBuffers: expected a boolean');
  return reuse === true;
}

class BucketStorage {
  #h;
  #mode = 'managed';
  /** the last bucketData call's buffers, lent to the next (one call at a time takes them) */
  #pool = null;
  constructor(handle) {
    this.#h = handle;
  }
  get replicationStreamId() {
    return native.storageStreamId(this.#h);
  }
  /** options.signal: an abort before the call rejects with its reason (opening a writer has no
   * steps to stop at). zeroLSN and storeCurrentData are checked and unused (the service's). */
  async createWriter(options) {
    options?.signal?.throwIfAborted();
    checkWriterOptions(options);
    return new Writer(await call(native.createWriter, this.#h, options));
  }
  /** Callback form: creates a writer, runs callback, flushes, closes; the flush result. */
  async startBatch(options, callback) {
    const w = await this.createWriter(options);
    try {
      await callback(w);
      return await w.flush();
    } finally {
      await w.close();
    }
  }
  async getCheckpoint() {
    const r = await call(native.getCheckpoint, this.#h);
    return new Checkpoint(this, r.checkpoint, r.lsn);
  }
  /** The batch of a bucketData call, written into the buffers of the call before when lend
   * (the default mode, whose columns the user never sees, and raw mode with reuseBuffers); read
   * on this thread when sync (the *Sync forms), else on the thread pool (a Promise). */
  #bucketData(checkpoint, dataBuckets, options, raw, lend, sync) {
    const pool = lend ? this.#pool ?? [] : undefined;
    if (lend) this.#pool = null;
    if (sync) return native.bucketDataSync(this.#h, opId(checkpoint), dataBuckets, options, raw, pool);
    return call(native.bucketData, this.#h, opId(checkpoint), dataBuckets, options, raw, pool);
  }
  /** The chunks of batch r as getBucketDataBatch (raw false) and getBucketDataBatchRaw hand them
   * out, then {hasMore}; the signal is checked before each. A raw batch in lent memory (r.pool)
   * ends its RawOplogs when the iteration ends, and the memory goes to the next call. */
  *#chunks(r, raw, signal) {
    if (!raw) {
      signal?.throwIfAborted();
      // piece q of the text (done_bucket_data) holds ops cuts[2q] to cuts[2q + 2] - 1
      const s = { q: -1, text: '', base: 0, next: 0, p: null };
      for (let c = 0, k = 0; c < r.chunks.length; k += r.chunks[c++].n) {
        const ch = r.chunks[c], data = oplogEntries(r, k, ch.n, s);
        // the entries hold no view of the columns: the next call may write into them
        if (c === r.chunks.length - 1) this.#pool = keepable(r.pool);
        yield { chunkData: { bucket: ch.bucket, after: ch.after, next_after: ch.next_after,
          has_more: ch.has_more, data }, targetOp: ch.targetOp };
        signal?.throwIfAborted();
      }
      if (!r.chunks.length) this.#pool = keepable(r.pool);
      yield { hasMore: r.hasMore };
      return;
    }
    const lent = [];
    try {
      signal?.throwIfAborted();
      if (r.pool) r.text = Buffer.from(r.text.buffer, 0, r.text.length);
      for (let c = 0, k = 0; c < r.chunks.length; k += r.chunks[c++].n) {
        const ch = r.chunks[c], data = new RawOplog(r, k, ch.n);
        if (r.pool) lent.push(data);
        yield { chunkData: { bucket: ch.bucket, after: ch.after, next_after: ch.next_after,
          has_more: ch.has_more, data }, targetOp: ch.targetOp };
        signal?.throwIfAborted();
      }
      yield { hasMore: r.hasMore };
    } finally {
      // detaching the views instead (a transfer) would slow every typed array read of the
      // process: V8 checks for detached buffers once one has been
      lent.forEach(revoke);
      if (r.pool) this.#pool = keepable(r.pool);
    }
  }
  /** options.signal: an abort before the call, or before a chunk is handed out, rejects with
   * its reason; options.requestHint is checked and unused (one read path). */
  async *getBucketDataBatch(checkpoint, dataBuckets, options) {
    const signal = options?.signal;
    signal?.throwIfAborted();
    checkHint(options);
    yield* this.#chunks(await this.#bucketData(checkpoint, dataBuckets, options, false, true), false, signal);
  }
  /** getBucketDataBatch read on the calling thread (no thread-pool hop, no Promise): an
   * iterable whose first next() reads the batch, or throws what the async form rejects with. */
  *getBucketDataBatchSync(checkpoint, dataBuckets, options) {
    const signal = options?.signal;
    signal?.throwIfAborted();
    checkHint(options);
    yield* this.#chunks(this.#bucketData(checkpoint, dataBuckets, options, false, true, true), false, signal);
  }
  /** getBucketDataBatch with each chunk's ops as one RawOplog (fields decoded when read);
   * options.reuseBuffers: the call's memory is the next such call's once the iteration ends. */
  async *getBucketDataBatchRaw(checkpoint, dataBuckets, options) {
    const signal = options?.signal;
    signal?.throwIfAborted();
    checkHint(options);
    const lend = reuseOption(options);
    yield* this.#chunks(await this.#bucketData(checkpoint, dataBuckets, options, true, lend), true, signal);
  }
  /** getBucketDataBatchRaw read on the calling thread, as getBucketDataBatchSync. */
  *getBucketDataBatchRawSync(checkpoint, dataBuckets, options) {
    const signal = options?.signal;
    signal?.throwIfAborted();
    checkHint(options);
    const lend = reuseOption(options);
    yield* this.#chunks(this.#bucketData(checkpoint, dataBuckets, options, true, lend, true), true, signal);
  }
  /** options.requestHint is checked and unused (one checksum path, cached). */
  async getChecksums(checkpoint, buckets, options) {
    checkHint(options);
    if (!Array.isArray(buckets)) throw typeError('buckets: expected an array');
    const names = buckets.map(bucketName);
    const r = await call(native.checksums, this.#h, opId(checkpoint), names);
    const map = new Map();
    names.forEach((b, i) => map.set(b, { bucket: b, checksum: r[2 * i], count: r[2 * i + 1] }));
    return map;
  }
  async getParameterSets(checkpoint, lookups, limit) {
    const rows = await call(native.parameterSets, this.#h, opId(checkpoint), lookups, limit);
    return rows.map(parseJson);
  }
  async getCheckpointChanges(options) {
    const o = options ?? {};
    const r = await call(native.checkpointChanges, this.#h, opId(o.lastCheckpoint),
      opId(o.nextCheckpoint));
    return {
      updatedDataBuckets: new Set(r.updatedDataBuckets),
      invalidateDataBuckets: r.invalidateDataBuckets,
      updatedParameterLookups: r.updatedParameterLookups,
      invalidateParameterBuckets: r.invalidateParameterBuckets,
      updatedWriteCheckpointUsers: new Set(r.updatedWriteCheckpointUsers),
    };
  }
  compact(options) {
    const { signal, ...o } = options ?? {};
    try {
      checkCompactOptions(o);
    } catch (e) {
      return Promise.reject(e);
    }
    return withSignal(signal, (flag) => call(native.compact, this.#h, o, flag));
  }
  /** No steps to cancel at: an abort before the call or during it rejects with its reason. */
  async compactInitialReplication(options) {
    const { signal, ...o } = options ?? {};
    signal?.throwIfAborted();
    checkExplicit(o, ['minBucketChanges'], []);
    const r = await call(native.compactInitialReplication, this.#h, o);
    signal?.throwIfAborted();
    return r;
  }
  /** Every bucket with a stored op, ascending byte order of name, after startAfter; read in
   * pages of `page` buckets (one snapshot each). */
  async *listBuckets(options) {
    let after = options?.startAfter ?? null;
    const page = options?.page ?? 1000;
    for (;;) {
      const got = await call(native.listBuckets, this.#h, after, page);
      yield* got;
      if (got.length < page) return;
      after = got[got.length - 1].bucket;
    }
  }
  /** The checkpoint once it differs from known (null: none yet), or after timeoutMs. */
  async waitCheckpoint(known, options) {
    const { signal, timeoutMs } = options ?? {};
    const r = await withSignal(signal, (flag) =>
      call(native.waitCheckpoint, this.#h, known, timeoutMs === Infinity ? undefined : timeoutMs, flag));
    return new Checkpoint(this, r.checkpoint, r.lsn);
  }
  get writeCheckpointMode() {
    return this.#mode;
  }
  setWriteCheckpointMode(config) {
    const c = typeof config === 'string' ? { mode: config } : config ?? {};
    native.setWriteCheckpointMode(this.#h, c.mode, c.eventName);
    this.#mode = c.mode;
  }
  async createManagedWriteCheckpoints(checkpoints) {
    const r = await call(native.createManagedWriteCheckpoints, this.#h, checkpoints);
    const writeCheckpoints = new Map();
    checkpoints.forEach((c, i) => writeCheckpoints.set(c.user_id, r.ids[i]));
    return { writeCheckpoints, shouldAdvance: r.shouldAdvance };
  }
  lastWriteCheckpoint(filters) {
    return call(native.lastWriteCheckpoint, this.#h, filters);
  }
  deleteCheckpointRequestsBefore(before) {
    return call(native.deleteCheckpointRequestsBefore, this.#h, before);
  }
  getStatus() {
    return call(native.getStatus, this.#h);
  }
  clear() {
    return call(native.clear, this.#h);
  }
  /** options.signal: an abort before the call rejects with its reason. */
  async terminate(options) {
    options?.signal?.throwIfAborted();
    return call(native.terminate, this.#h, options?.clearStorage ?? false);
  }
  /** The library updates its checksum cache with every commit, compaction and clear of this
   * process, so there is nothing stale to drop: resolves at once (the service's shape), or
   * rejects with BS_ESTATE on a closed storage, as every call. */
  async clearChecksumCache() {
    native.storageStreamId(this.#h);
  }
  /** Parameter compaction keeps a cursor in the stream, so an incremental run continues where the
   * last one stopped. */
  supportsIncrementalParameterCompaction() {
    return true;
  }
  reportError(e) {
    return call(native.reportError, this.#h, e instanceof Error ? e.message : String(e));
  }
  close() {
    return call(native.close, this.#h);
  }
  [asyncDispose]() {
    return this.close();
  }
}

class Writer {
  #h;
  /** The LSN of the last checkpoint this writer created (commit or keepalive). */
  lastCheckpointLsn = null;
  constructor(handle) {
    this.#h = handle;
  }
  save(record) {
    try {
      return saveEncoded(this.#h, record, true);
    } catch (e) {
      return Promise.reject(e); // not a Writer
    }
  }
  /** Queues every record, in order, or none: a bad one rejects naming saves[i]. */
  saveMany(records) {
    try {
      if (!Array.isArray(records)) throw typeError('saves: expected an array');
      return saveEncoded(this.#h, records, false);
    } catch (e) {
      return Promise.reject(e);
    }
  }
  async truncate(sourceTables) {
    let r = null;
    for (const t of [sourceTables].flat()) r = (await call(native.truncate, this.#h, tableName(t))) ?? r;
    return r;
  }
  async drop(sourceTables) {
    let r = null;
    for (const t of [sourceTables].flat()) r = (await call(native.drop, this.#h, tableName(t))) ?? r;
    return r;
  }
  flush() {
    return call(native.flush, this.#h);
  }
  async commit(lsn, options) {
    const r = await call(native.commit, this.#h, lsn, options);
    if (r.checkpointCreated) this.lastCheckpointLsn = lsn;
    return r;
  }
  async keepalive(lsn) {
    const r = await call(native.keepalive, this.#h, lsn);
    if (r.checkpointCreated) this.lastCheckpointLsn = lsn;
    return r;
  }
  /** The service's form: (tables, no_checkpoint_before_lsn) -> tables; or (lsn). */
  async markSnapshotDone(tables, lsn) {
    await call(native.snapshotDone, this.#h, lsn === undefined ? tables : lsn);
    return lsn === undefined ? [] : tables;
  }
  setResumeLsn(lsn) {
    return call(native.resumeLsn, this.#h, lsn);
  }
  getSourceRow(table, replicaId) {
    return call(native.sourceRow, this.#h, tableName(table), replicaId);
  }
  addCustomWriteCheckpoint(checkpoint) {
    return call(native.addCustomWriteCheckpoint, this.#h, checkpoint);
  }
  close() {
    return call(native.close, this.#h);
  }
  [asyncDispose]() {
    return this.close();
  }
}

function typeError(message) {
  const e = new TypeError(message);
  e.code = 'BS_EINVAL';
  return e;
}

const LOAD_RECORDS = 1000;
const LOAD_BYTES = 1 << 20;

/**
 * A new database file at path from records (bs_load): any iterable or async iterable of
 * {table, stream, key, value}, read as the addon's loader thread takes them (batches of up to
 * LOAD_RECORDS records or LOAD_BYTES bytes, one waiting at a time).
 */
/* Uses v, so that a handle is not collected while an async call on it runs. */
function keepAlive(v) {
  return v;
}

function load(path, records, options) {
  const { signal, onProgress } = options ?? {};
  if (records === null || typeof records !== 'object' ||
      !(Symbol.iterator in records || Symbol.asyncIterator in records))
    return Promise.reject(typeError('records: expected an iterable or async iterable of records'));
  return withSignal(signal, async (flag) => {
    const x = native.loadOpen(path, onProgress, flag);
    let batch = [];
    let bytes = 0;
    let base = 0;
    const push = async () => {
      const taken = await native.loadPush(x, batch, base);
      base += batch.length;
      batch = [];
      bytes = 0;
      return taken;
    };
    try {
      let open = true;
      for await (const r of records) {
        batch.push(r);
        bytes += (r?.key?.length ?? 0) + (r?.value?.length ?? 0);
        if ((batch.length >= LOAD_RECORDS || bytes >= LOAD_BYTES) && !(open = await push())) break;
      }
      if (open && batch.length) await push(); // false: the loader ended early (loadEnd says why)
    } catch (e) {
      await native.loadEnd(x, true).catch(() => {});
      throw e;
    }
    // x stays reachable until the loader has ended: a collected handle stops its loader, which
    // then answers its next record with BS_ECANCELED
    try {
      return await native.loadEnd(x, false);
    } finally {
      keepAlive(x);
    }
  });
}

/** Op checksum of a PUT (the storage contract, section 3), as the storage computes it: an unsigned 32-bit number. */
function checksumPut(hash, objectType, objectId, data) {
  return native.checksumPut(hash, objectType, objectId, data);
}

module.exports = {
  Database,
  BucketStorage,
  Writer,
  Checkpoint,
  RawOplog,
  open: Database.open,
  openMemory: Database.openMemory,
  openPostgres: Database.openPostgres,
  checksumPut,
  load,
  /** Handles (database, storage, writer) whose C objects are not yet released: a leak check. */
  liveHandles: native.liveHandles,
  version: native.version,
};
// `import bs from 'bucketstore'` in TypeScript compiled to CommonJS reads .default
module.exports.default = module.exports;
