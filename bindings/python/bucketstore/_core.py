"""The Python API over libbucketstore (see the package README for the shape of it).

Rules this module keeps, so that bad input from Python never reaches C as undefined behaviour:
  - every argument is type- and range-checked here before the call (ctypes would silently
    truncate an int to the C width), with TypeError / InvalidArgumentError naming it;
  - handles are Python objects with a closed state; a call on a closed handle raises
    StateError, closing a parent closes its children first, and a close waits for the calls
    in flight on that handle (the C library forbids a close that races with a call);
  - a writer is used by one thread at a time (calls from several threads are serialised);
  - an exception raised by a Python callback stops the C call and is re-raised by the call
    that ran the callback; inside a callback only read calls are allowed.
Bytes fields take str (valid Unicode: a lone surrogate is refused with InvalidArgumentError, a
ValueError) or bytes (any bytes, exactly), and come back as str, decoded with
"surrogateescape" (a byte that is not UTF-8 becomes U+DC80..U+DCFF, so
s.encode("utf-8", "surrogateescape") gives the stored bytes back). A field a C struct marks absent (data NULL) is None; an empty
string is "" (contract.md: an empty string is a value).
"""

from __future__ import annotations

import ctypes
import json
import operator
import os
import threading
from ctypes import byref, c_int, c_size_t, c_uint32, c_uint64, c_void_p, string_at
from datetime import datetime, timedelta, timezone
from enum import IntEnum
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    TypeVar,
    Union,
)

from . import _ffi as F
from . import _native as N
from ._ffi import lib

Bytes = Union[str, bytes]
Scalar = Union[None, bool, int, float, str, bytes]
# {bucket: after} or (bucket, after) pairs (Mapping keys are invariant: one alias per key type)
Positions = Union[Mapping[str, int], Mapping[bytes, int], Iterable[Tuple[Bytes, int]]]
Heads = Union[Mapping[str, Bytes], Mapping[bytes, Bytes]]  # connection -> LSN
# a point in time: a datetime, or milliseconds since the Unix epoch (storage.h's *_ms times)
When = Union[datetime, int]
_NO_HEADS: Mapping[str, Bytes] = {}

U32 = (1 << 32) - 1
U64 = (1 << 64) - 1
I64 = 1 << 63
OP_MAX = (1 << 63) - 1  # op ids and checkpoints are < 2^63 (contract.md section 2)
INT_MAX = (1 << 31) - 1
SIZE_MAX = (1 << (8 * ctypes.sizeof(c_size_t))) - 1

# ---- Errors -------------------------------------------------------------------------------


class BucketstoreError(Exception):
    """A failed call. code: the BS_E* status (negative int); name: its symbol; message: the
    library's message naming the argument or key (or the code's description)."""

    code: int = 0

    def __init__(self, code: int, message: str = "") -> None:
        self.code = code
        self.name = _CODE_NAMES.get(code, "BS_EUNKNOWN")
        self.message = message or strerror(code).partition(": ")[2]
        super().__init__(f"{self.name}: {self.message}")

    def __reduce__(self) -> Any:
        return (type(self), (self.code, self.message))


class InvalidArgumentError(BucketstoreError, ValueError):
    """BS_EINVAL, also raised by the binding for out-of-range ints and bad values."""


class NotFoundError(BucketstoreError, LookupError):
    """BS_ENOTFOUND."""


class TooBigError(BucketstoreError, ValueError):
    """BS_ETOOBIG: a key or value over a limit."""


class LimitError(BucketstoreError):
    """BS_ELIMIT: a result limit was exceeded."""


class StateError(BucketstoreError):
    """BS_ESTATE: not valid in this state (closed handle, read-only db, wrong mode)."""


class InvalidatedError(BucketstoreError):
    """BS_EINVALIDATED: the checkpoint was torn by compaction; read a newer one."""


class StaleError(BucketstoreError):
    """BS_ESTALE: parameter read below the parameter-compaction horizon."""


class CorruptError(BucketstoreError):
    """BS_ECORRUPT."""


class NoMemoryError(BucketstoreError, MemoryError):
    """BS_ENOMEM."""


class StorageIOError(BucketstoreError, OSError):
    """BS_EIO: an LMDB or OS error."""


class BusyError(BucketstoreError):
    """BS_EBUSY."""


class UnsupportedError(BucketstoreError):
    """BS_EUNSUPPORTED."""


class CanceledError(BucketstoreError):
    """BS_ECANCELED."""


class CallbackError(BucketstoreError):
    """BS_EUSER: a callback returned a non-zero value, which stopped the call (the message
    names the callback and quotes the value)."""


_CODE_CLASSES = {
    F.BS_EINVAL: InvalidArgumentError,
    F.BS_ENOTFOUND: NotFoundError,
    F.BS_ETOOBIG: TooBigError,
    F.BS_ELIMIT: LimitError,
    F.BS_ESTATE: StateError,
    F.BS_EINVALIDATED: InvalidatedError,
    F.BS_ESTALE: StaleError,
    F.BS_ECORRUPT: CorruptError,
    F.BS_ENOMEM: NoMemoryError,
    F.BS_EIO: StorageIOError,
    F.BS_EBUSY: BusyError,
    F.BS_EUNSUPPORTED: UnsupportedError,
    F.BS_ECANCELED: CanceledError,
    F.BS_EUSER: CallbackError,
}
_CODE_NAMES = {
    v: k for k, v in F.CONSTANTS.items() if k.startswith("BS_E") and v in _CODE_CLASSES
}


def library_version() -> str:
    """The version string of the loaded shared library (bs_version)."""
    return str(lib.bs_version(None, None, None).decode())


def strerror(code: int) -> str:
    """The library's static description of a status code ("BS_EINVAL: invalid argument")."""
    return str(lib.bs_strerror(_int(code, "code", -INT_MAX - 1, INT_MAX)).decode())


def _error(rc: int, err: Optional[F.bs_error] = None) -> BucketstoreError:
    msg = err.msg.decode("utf-8", "replace") if err is not None else ""
    return _CODE_CLASSES.get(rc, BucketstoreError)(rc, msg)


def _check(rc: int, err: F.bs_error) -> None:
    if rc != 0:
        raise _error(rc, err)


def _check_msg(rc: int, msg: bytes) -> None:
    """_check for the C functions of _native, which return the bs_error message."""
    if rc != 0:
        raise _error_msg(rc, msg.decode("utf-8", "replace"))


def _error_msg(rc: int, msg: str) -> BucketstoreError:
    """The exception of status rc (what _native raises too)."""
    return _CODE_CLASSES.get(rc, BucketstoreError)(rc, msg)


def _inval(msg: str) -> InvalidArgumentError:
    return InvalidArgumentError(F.BS_EINVAL, msg)


# ---- Argument conversion ------------------------------------------------------------------


def _bytes(v: Any, name: str) -> bytes:
    t = type(v)
    if t is bytes:
        same: bytes = v
        return same
    if isinstance(v, str):
        try:
            return str(v).encode("utf-8")
        except UnicodeEncodeError:
            raise _inval(f"{name}: {NOT_UNICODE}") from None
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    raise TypeError(f"{name}: expected str or bytes, got {t.__name__}")


# (_native.c says the same for the saves)
NOT_UNICODE = "not valid Unicode (a lone surrogate); pass bytes for bytes that are not UTF-8"


def _signed32(v: int) -> int:
    """A bucket checksum as the sync protocol carries it: the 32-bit sum, signed."""
    return v - (1 << 32) if v >= 1 << 31 else v


def _val(v: Any, name: str) -> F.val_in:
    b = _bytes(v, name)
    return F.val_in(b, len(b))


def _opt_val(v: Any, name: str) -> F.val_in:
    return F.val_in() if v is None else _val(v, name)


def _cstr(v: Any, name: str) -> bytes:
    b = _bytes(v, name)
    if b"\0" in b:
        raise _inval(f"{name}: contains a NUL byte")
    return b


def _int(v: Any, name: str, lo: int, hi: int) -> int:
    if type(v) is not int:
        if isinstance(v, (bool, float)) or not hasattr(v, "__index__"):
            raise TypeError(f"{name}: expected int, got {type(v).__name__}")
        v = operator.index(v)
    if not lo <= v <= hi:
        raise _inval(f"{name}: {v} is out of range ({lo}..{hi})")
    return int(v)


def _op_id(v: Any, name: str) -> int:
    return _int(v, name, 0, OP_MAX)


def _size(v: Optional[int], name: str, positive: bool = True) -> int:
    """An optional size: None = the library's default (0); an explicit value is honoured, so
    0 is refused where C would read it as "default"."""
    if v is None:
        return 0
    return _int(v, name, 1 if positive else 0, SIZE_MAX)


def _bool(v: Any, name: str) -> int:
    if not isinstance(v, (bool, int)):
        raise TypeError(f"{name}: expected bool, got {type(v).__name__}")
    return 1 if v else 0


def _float(v: Any, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{name}: expected a number, got {type(v).__name__}")
    return float(v)


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_ONE_MS = timedelta(milliseconds=1)


def _ms(v: Any, name: str, lo: int) -> int:
    """A When as milliseconds since the epoch, sub-milliseconds dropped (a JS Date has none).
    A datetime without tzinfo is local time, as datetime.timestamp() reads it."""
    if isinstance(v, datetime):
        if v.utcoffset() is None:
            v = v.astimezone()
        v = (v - _EPOCH) // _ONE_MS
    elif isinstance(v, (bool, float)) or not hasattr(v, "__index__"):
        raise TypeError(f"{name}: expected a datetime or int milliseconds since the epoch, "
                        f"got {type(v).__name__}")
    return _int(v, name, lo, I64 - 1)


REQUEST_HINTS = ("bulk", "incremental")


def _unused(v: Any, name: str, check: Callable[[Any, str], Any]) -> None:
    """An option the sync service has and the engine has no use for: checked, then unused."""
    if v is not None:
        check(v, name)


def _hint(v: Optional[str]) -> None:
    if v is None or v in REQUEST_HINTS:
        return
    if not isinstance(v, str):
        raise TypeError(f"request_hint: expected str, got {type(v).__name__}")
    raise _inval(f"request_hint: {v!r} is not one of 'bulk', 'incremental'")


def _ratio(v: Any, name: str) -> float:
    """A ratio the library reads as "its default" when negative: an explicit one is >= 0."""
    r = _float(v, name)
    if r < 0:
        raise _inval(f"{name}: negative (None for the default)")
    return r


def _str(v: F.bs_val) -> Optional[str]:
    """A borrowed bs_val as str (None when absent)."""
    if v.data is None:
        return None
    return string_at(v.data, v.size).decode("utf-8", "surrogateescape")


def _lsn(has: int, size: int, buf: Any) -> Optional[str]:
    return bytes(buf[:size]).decode("utf-8", "surrogateescape") if has else None


# ---- Callbacks ----------------------------------------------------------------------------

def _in_callback() -> bool:
    """Whether user code runs inside a library callback in this thread (_Trap, listeners): the
    depth is kept in C (_native), where Writer.save reads it too."""
    return N.in_callback()


class _Trap:
    """Runs a Python function as a C callback: an exception is kept and stops the C call
    (non-zero return), to be re-raised by the caller with raise_pending()."""

    __slots__ = ("exc", "user")

    def __init__(self, user: bool = False) -> None:
        self.exc: Optional[BaseException] = None
        self.user = user  # user code: only read calls allowed while it runs

    def call(self, fn: Callable[..., Any], *args: Any) -> int:
        if self.user:
            N.callback_enter()
        try:
            r = fn(*args)
            return 0 if r is None else int(r)
        except BaseException as e:  # noqa: B902 - also KeyboardInterrupt: re-raised below
            if self.exc is None:
                self.exc = e
            return F.BS_ECANCELED
        finally:
            if self.user:
                N.callback_leave()

    def raise_pending(self) -> None:
        if self.exc is not None:
            e, self.exc = self.exc, None
            raise e


def _run_listener(fn: Callable[[int, int], Any], stream: int, checkpoint: int) -> None:
    """The checkpoint listener runs in the committing thread, after the commit succeeded: an
    exception it raises leaves through ctypes, which hands it to sys.unraisablehook (printed
    to stderr by default), so the commit still returns its result."""
    N.callback_enter()
    try:
        fn(stream, checkpoint)
    finally:
        N.callback_leave()


# ---- Cancellation --------------------------------------------------------------------------


class Cancellable(Protocol):
    """What a long call's cancel= takes: a CancelToken, a threading.Event, or anything with
    is_set() (and, for what the call raises, a `reason`)."""

    def is_set(self) -> bool: ...


class CancelToken:
    """Cancels the long calls it is passed to (cancel=), as Node's AbortSignal does: after
    cancel(reason), a call that takes the token raises reason (by default a CanceledError)
    before it starts, or at its next step once started (the steps done stay). Thread-safe;
    a token stays cancelled."""

    def __init__(self) -> None:
        self._set = threading.Event()
        self.reason: Optional[BaseException] = None

    def cancel(self, reason: Optional[BaseException] = None) -> None:
        """Cancels, once: later calls keep the first reason."""
        if reason is not None and not isinstance(reason, BaseException):
            raise TypeError(f"reason: expected an exception, got {type(reason).__name__}")
        with _CANCEL_LOCK:
            if self.reason is None:
                self.reason = reason if reason is not None else CanceledError(
                    F.BS_ECANCELED, "cancelled by its CancelToken")
                self._set.set()

    def is_set(self) -> bool:
        return self._set.is_set()

    @property
    def cancelled(self) -> bool:
        return self._set.is_set()


_CANCEL_LOCK = threading.Lock()


def _cancel_arg(cancel: Any) -> Optional[Cancellable]:
    if cancel is not None and not callable(getattr(cancel, "is_set", None)):
        raise TypeError(f"cancel: expected a CancelToken (or an object with is_set()), "
                        f"got {type(cancel).__name__}")
    c: Optional[Cancellable] = cancel
    return c


def _raise_if_cancelled(cancel: Optional[Cancellable]) -> None:
    """Raises the token's reason (a CanceledError when it has none) once it is set."""
    if cancel is not None and cancel.is_set():
        reason = getattr(cancel, "reason", None)
        if isinstance(reason, BaseException):
            raise reason
        raise CanceledError(F.BS_ECANCELED, "cancelled")


def _steps(trap: _Trap, progress: Any, cancel: Optional[Cancellable],
           arg: Callable[..., Any]) -> Optional[Callable[..., int]]:
    """A long call's C progress callback, or None when it needs none: it stops the call
    (non-zero) once cancel is set, before or after progress(arg(*args)) runs, and when
    progress returns a truthy value; progress runs through trap (an exception stops it)."""
    if progress is not None and not callable(progress):
        raise TypeError("progress: expected a callable")
    if progress is None and cancel is None:
        return None

    def one(*args: Any) -> int:
        if cancel is not None and cancel.is_set():
            return 1
        stop = progress is not None and progress(arg(*args))
        return 1 if stop or (cancel is not None and cancel.is_set()) else 0

    return lambda *args: trap.call(one, *args)


def _finish(rc: int, err: F.bs_error, trap: _Trap, cancel: Optional[Cancellable]) -> None:
    """After a long call: progress's exception, else the token's reason when it cancelled
    the call, else the call's error."""
    trap.raise_pending()
    if rc == F.BS_ECANCELED:
        _raise_if_cancelled(cancel)
    _check(rc, err)


# ---- Result types -------------------------------------------------------------------------


class Tag(IntEnum):
    INSERT = F.BS_INSERT
    UPDATE = F.BS_UPDATE
    DELETE = F.BS_DELETE


class OpType(IntEnum):
    PUT = F.BS_OP_PUT
    REMOVE = F.BS_OP_REMOVE
    MOVE = F.BS_OP_MOVE
    CLEAR = F.BS_OP_CLEAR


class StreamState(IntEnum):
    PROCESSING = F.BS_STREAM_PROCESSING
    ACTIVE = F.BS_STREAM_ACTIVE
    ERRORED = F.BS_STREAM_ERRORED
    STOPPED = F.BS_STREAM_STOPPED
    TERMINATED = F.BS_STREAM_TERMINATED


_HASHES = {"xxh3": F.BS_HASH_XXH3, "sha256": F.BS_HASH_SHA256}
_HASH_NAMES = {v: k for k, v in _HASHES.items()}
_TAGS = {"insert": Tag.INSERT, "update": Tag.UPDATE, "delete": Tag.DELETE}
_OP_TYPES = (None, OpType.PUT, OpType.REMOVE, OpType.MOVE, OpType.CLEAR)  # by bs_op_type


class Row(NamedTuple):
    """One evaluated output row of a source row: a PUT into bucket."""

    bucket: Bytes
    object_type: Bytes
    object_id: Bytes
    data: Bytes


class Lookup(NamedTuple):
    """One evaluated parameter lookup: lookup values -> bucket-parameter rows (JSON text)."""

    values: Sequence[Scalar]
    params: Sequence[Bytes]


class Save(NamedTuple):
    """One source row change for Writer.save_many: Writer.save's arguments."""

    table: Bytes
    tag: Union[str, int]
    id: Bytes
    rows: Iterable[Union[Row, Tuple[Bytes, Bytes, Bytes, Bytes]]] = ()
    lookups: Iterable[Union[Lookup, Tuple[Sequence[Scalar], Sequence[Bytes]]]] = ()
    old_id: Optional[Bytes] = None
    store: Optional[Bytes] = None


SaveArgs = Union[Save, Tuple[Bytes, Union[str, int], Bytes], Tuple[Any, ...]]


class BlockedReason(IntEnum):
    """Why a commit made no checkpoint (the first that holds, in this order)."""

    SNAPSHOT = F.BS_BLOCKED_SNAPSHOT  # the snapshot is not done
    NO_CHECKPOINT_BEFORE = F.BS_BLOCKED_NO_CHECKPOINT_BEFORE  # lsn below snapshot_done's
    CHECKPOINT_LSN = F.BS_BLOCKED_CHECKPOINT_LSN  # lsn below the last checkpoint's (byte-wise)


class CommitResult(NamedTuple):
    checkpoint_blocked: bool
    checkpoint_created: bool
    checkpoint: int
    blocked_reason: Optional[BlockedReason] = None  # None unless blocked


class Checkpoint(NamedTuple):
    op_id: int  # 0 before the first checkpoint
    lsn: Optional[str]


class Op(NamedTuple):
    op_id: int
    op: OpType
    object_type: Optional[str]
    object_id: Optional[str]
    subkey: Optional[str]
    data: Optional[str]
    checksum: int  # unsigned 32-bit (0..2**32-1)
    target_op: Optional[int]  # MOVE/CLEAR only


class Chunk(NamedTuple):
    bucket: str
    after: int
    next_after: int
    has_more: bool
    target_op: Optional[int]
    ops: List[Op]


class Batch(NamedTuple):
    chunks: List[Chunk]
    has_more: bool  # the call stopped at its limit: call again from next_after


RawOps = N.RawOps  # a chunk's ops in raw mode: _native.pyi says what it offers


class RawChunk(NamedTuple):
    """A Chunk of Storage.bucket_data_raw: the same fields, its ops one RawOps."""

    bucket: str
    after: int
    next_after: int
    has_more: bool
    target_op: Optional[int]
    ops: RawOps


class RawBatch(NamedTuple):
    chunks: List[RawChunk]
    has_more: bool


class Checksum(NamedTuple):
    checksum: int  # the 32-bit wrapping sum of the op checksums, signed (as the protocol has it)
    count: int  # type: ignore[assignment]  # the field shadows tuple.count


class StreamInfo(NamedTuple):
    id: int
    name: str
    state: StreamState
    hash: str


class BucketInfo(NamedTuple):
    name: str
    checksum: int  # signed, as Checksum's
    count: int  # type: ignore[assignment]  # the field shadows tuple.count
    last_op: int
    bytes: int
    generation: int
    changes: int


class CheckpointChanges(NamedTuple):
    invalidate_data_buckets: bool
    invalidate_parameter_buckets: bool
    updated_buckets: List[str]
    updated_lookups: List[List[Scalar]]
    updated_write_checkpoint_users: List[str]


class CompactStats(NamedTuple):
    buckets_compacted: int
    ops_moved: int
    ops_cleared: int
    ops_removed: int
    bytes_before: int
    bytes_after: int
    parameter_entries_removed: int
    checkpoint_requests_deleted: int
    ops_reemitted: int


class Status(NamedTuple):
    state: StreamState
    snapshot_done: bool
    checkpoint: int
    last_persisted_op: int
    lsn: Optional[str]
    resume_lsn: Optional[str]
    last_error: str


class Stat(NamedTuple):
    streams: int
    buckets: int
    ops_put: int
    ops_remove: int
    ops_move: int
    ops_clear: int
    parameter_entries: int
    source_records: int
    write_checkpoints: int
    file_bytes: int
    reclaimable_bytes: int  # bytes on free pages; the file never shrinks (bs_backup copies)


class ManagedRequest(NamedTuple):
    """One managed write-checkpoint request; heads: connection -> LSN; checkpoint_request_id:
    the client's request id (None: the stored id + 1, generated); checkpoint_requested_at
    (a When; None: now): when the client asked, what delete_checkpoint_requests_before
    compares for a request with an id (a generated id has no request time and stays)."""

    user_id: Bytes
    heads: Heads
    checkpoint_request_id: Optional[int] = None
    checkpoint_requested_at: Optional[When] = None


class Record(NamedTuple):
    """One stored record of a database file, as bs_db_export hands it out and load takes it:
    table (the backend's table, e.g. "ops"), stream (0: a record of the whole database), and
    the key and value bytes exactly as stored (the on-disk format, docs/format.md)."""

    table: str
    stream: int
    key: bytes
    value: bytes


def _stats(s: F.bs_compact_stats) -> CompactStats:
    return CompactStats(*(getattr(s, n) for n, _ in F.bs_compact_stats._fields_))


def _hash(h: Any) -> int:
    if h not in _HASHES:
        raise _inval(f"hash: {h!r} is not one of 'xxh3', 'sha256'")
    return _HASHES[h]


# ---- Pure functions -----------------------------------------------------------------------


def checksum_put(object_type: Bytes, object_id: Bytes, data: Bytes, hash: str = "xxh3") -> int:
    """The checksum of a PUT: hash("put." + object_type + "." + object_id + "." + data)."""
    return int(lib.bs_checksum_put(
        _hash(hash), _val(object_type, "object_type"), _val(object_id, "object_id"),
        _val(data, "data"),
    ))


def checksum_remove(subkey: Bytes, hash: str = "xxh3") -> int:
    """The checksum of a REMOVE: hash("delete." + subkey)."""
    return int(lib.bs_checksum_remove(_hash(hash), _val(subkey, "subkey")))


def subkey(table_id: int, replica_id: Bytes) -> str:
    """The subkey of a source row (contract.md section 1)."""
    buf = ctypes.create_string_buffer(F.BS_SUBKEY_SIZE)
    lib.bs_subkey(buf, _int(table_id, "table_id", 0, U32), _val(replica_id, "replica_id"))
    return buf.raw[: F.BS_SUBKEY_SIZE].decode()


def _scalar(v: Any, where: str) -> F.scalar_in:
    s = F.scalar_in()
    if v is None:
        s.type = F.BS_SCALAR_NULL
    elif v is True:
        s.type = F.BS_SCALAR_TRUE
    elif v is False:
        s.type = F.BS_SCALAR_FALSE
    elif isinstance(v, int):
        s.type, s.i = F.BS_SCALAR_INT, _int(v, where, -I64, I64 - 1)
    elif isinstance(v, float):
        s.type, s.d = F.BS_SCALAR_DOUBLE, v
    elif isinstance(v, (str, bytes, bytearray, memoryview)):
        s.type, s.s = F.BS_SCALAR_STRING, _val(v, where)
    else:
        raise TypeError(f"{where}: expected None, bool, int, float, str or bytes, "
                        f"got {type(v).__name__}")
    return s


def encode_lookup(values: Sequence[Scalar], name: str = "lookup") -> bytes:
    """The canonical encoding of a list of lookup values (314 and 314.0 encode alike)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name}: expected a sequence of values, got {type(values).__name__}")
    arr = (F.scalar_in * max(len(values), 1))(
        *[_scalar(v, f"{name}[{i}]") for i, v in enumerate(values)]
    )
    err = F.bs_error()
    size = c_size_t(0)
    cap = F.BS_MAX_LOOKUP_KEY + 32
    for _ in range(2):  # an over-long key is measured, then encoded (save enforces the limit)
        buf = ctypes.create_string_buffer(cap)
        rc = lib.bs_lookup_encode(buf, cap, byref(size), arr, len(values), byref(err))
        if rc == F.BS_ETOOBIG and size.value > cap:
            cap = size.value
            continue
        _check(rc, err)
        return buf.raw[: size.value]
    raise _error(F.BS_ETOOBIG, err)


def _save_lookup(values: Sequence[Scalar], params: Sequence[Any]) -> bytes:
    """A save's lookup: the encoded key of values; each param row must be JSON text, as
    parameter_sets parses them."""
    for j, p in enumerate(params):
        if isinstance(p, (str, bytes, bytearray, memoryview)):
            try:
                json.loads(_bytes(p, f"lookups params[{j}]"))
            except InvalidArgumentError:
                raise
            except ValueError:
                raise _inval(f"lookups params[{j}]: not JSON text: {p!r:.60}") from None
    return encode_lookup(values, "lookups values")


N.setup(Op, Chunk, _OP_TYPES, _save_lookup, InvalidArgumentError, RawChunk,
        _error_msg)  # what _native builds and raises


def _decode_scalars(key: bytes) -> List[Scalar]:
    cap = len(key) + 1  # every value takes a byte or more
    arr = (F.bs_scalar * cap)()
    n = c_size_t(0)
    err = F.bs_error()
    _check(lib.bs_lookup_decode(arr, cap, byref(n), F.val_in(key, len(key)), byref(err)), err)
    out: List[Scalar] = []
    for s in arr[: n.value]:
        t = s.type
        if t == F.BS_SCALAR_NULL:
            out.append(None)
        elif t == F.BS_SCALAR_TRUE or t == F.BS_SCALAR_FALSE:
            out.append(t == F.BS_SCALAR_TRUE)
        elif t == F.BS_SCALAR_INT:
            out.append(s.i)
        elif t == F.BS_SCALAR_DOUBLE:
            out.append(s.d)
        else:
            out.append(_str(s.s))
    return out


def decode_lookup(key: bytes) -> List[Scalar]:
    """The values of an encoded lookup key (strings as str)."""
    return _decode_scalars(_bytes(key, "key"))


# ---- Handles ------------------------------------------------------------------------------


_H = TypeVar("_H", bound="_Handle")


class _Cell:
    """A C handle, the calls running on it, and the cells of the handles opened from it,
    which close before it. A handle object holds its parent object, and its cell is held by
    its parent's cell, never the object itself: the collector clears weak references before
    it runs the finalizers of a cycle, and runs them in any order, so a database collected in
    one cycle with its storage (or a storage with its writer) still finds the child's cell
    and closes it first; the child's finalizer then finds it closed. A child closed on its
    own leaves its parent's cell, so a parent never keeps a dropped child's handle open."""

    __slots__ = ("h", "free", "cv", "busy", "serial", "children", "parent")

    def __init__(self, free: Callable[[int], None], parent: Optional["_Cell"],
                 serial: Optional[N.WriterCore]) -> None:
        self.h: Optional[int] = None
        self.free = free  # the C close function, bound now: no global is needed at exit
        self.cv = threading.Condition(threading.Lock())
        self.busy = 0  # calls running (_Guard)
        self.serial = serial  # a writer's lock: held by each of its calls, and by close
        self.children: "set[_Cell]" = set()
        self.parent = parent

    def close(self) -> None:
        if self.serial is not None:
            self.serial.acquire()
        try:
            with self.cv:  # no new calls (children open only through a call), then drain
                h, self.h = self.h, None
                while self.busy:
                    self.cv.wait()
            for c in list(self.children):
                c.close()
            if self.parent is not None:
                self.parent.children.discard(self)
            if h is not None:
                self.free(h)
        finally:
            if self.serial is not None:
                self.serial.release()


class _Handle:
    """An opaque C handle with a closed state (its _Cell). Calls go through `with
    self._guard() as h`: it fails on a closed handle and counts the call, so close() can wait
    for it."""

    _kind = "handle"

    def __init__(self, free: Callable[[int], None], parent: Optional["_Handle"] = None,
                 serial: Optional[N.WriterCore] = None) -> None:
        self._c: _Cell = _Cell(free, parent._c if parent is not None else None, serial)

    def _opened(self, h: Optional[int]) -> None:
        """Called with the parent's guard held, so that the parent cannot close meanwhile."""
        c = self._c
        c.h = h
        if c.parent is not None:
            c.parent.children.add(c)

    def _guard(self) -> "_Guard":
        return _Guard(self._c, self._kind)

    @property
    def closed(self) -> bool:
        return self._c.h is None

    def close(self) -> None:
        """Closes the handle (children first); waits for calls on it in other threads.
        Closing twice is a no-op. Not allowed inside a library callback."""
        if _in_callback():
            raise StateError(F.BS_ESTATE, f"cannot close a {self._kind} inside a callback")
        self._c.close()

    def __repr__(self) -> str:
        sid = getattr(self, "stream_id", None)
        what = f" stream {sid}" if sid is not None else ""
        return f"<bucketstore.{type(self).__name__}{what} {'closed' if self.closed else 'open'}>"

    def __enter__(self: _H) -> _H:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        c: Optional[_Cell] = self.__dict__.get("_c")  # (absent when __init__ failed early)
        try:
            if c is not None and c.h is not None:
                self.close()
        except Exception:  # pragma: no cover - collected inside a callback: stays open
            pass


class _Guard:
    __slots__ = ("c", "kind")

    def __init__(self, c: _Cell, kind: str) -> None:
        self.c = c
        self.kind = kind

    def __enter__(self) -> int:
        c = self.c
        with c.cv:
            if c.h is None:
                raise StateError(F.BS_ESTATE, f"the {self.kind} is closed")
            c.busy += 1
            return c.h

    def __exit__(self, *exc: Any) -> None:
        c = self.c
        with c.cv:
            c.busy -= 1
            if not c.busy:
                c.cv.notify_all()


Path = Union[str, bytes, "os.PathLike[str]"]


def _path(path: Any, name: str) -> bytes:
    """A file path (str, bytes or os.PathLike) as the C string the library takes."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    return _cstr(path, name)


def _backup_options(trap: _Trap, progress: Optional[Callable[[int], Any]],
                    cancel: Optional[Cancellable], replace: bool = False
                    ) -> F.bs_backup_options:
    """bs_backup_options for backup and load: progress(records) and cancel as _steps says.
    The allocator stays NULL: load allocates with libc, backup with the database's."""
    o = F.bs_backup_options(F.BS_BACKUP_OPTIONS_VERSION,
                            F.BS_BACKUP_REPLACE if _bool(replace, "replace") else 0)
    step = _steps(trap, progress, cancel, lambda n: n)
    if step is not None:
        fn = step
        o.progress = F.BACKUP_PROGRESS_FN(lambda n, x: fn(n))
    return o


def _cache_entries(o: F.bs_open_options, cache_entries: Optional[int]) -> F.bs_open_options:
    if cache_entries is not None:  # 0 entries = no cache
        n = _int(cache_entries, "cache_entries", 0, SIZE_MAX - 1)
        o.checksum_cache_entries = n if n else SIZE_MAX
    return o


def open(
    path: Path,
    *,
    nosync: bool = False,
    readonly: bool = False,
    map_size: Optional[int] = None,
    cache_entries: Optional[int] = None,
    nomigrate: bool = False,
    pg_max_connections: Optional[int] = None,
) -> "Database":
    """Opens (creating if missing) the database file at path, or the PostgreSQL database a
    postgresql:// URL names (storage.h bs_open_postgres: its schema, pool and writers' sessions;
    map_size is ignored there). nosync: no fsync at commit (PostgreSQL: synchronous_commit
    off); cache_entries: checksum-cache size (None = the library's default, 0 = no cache).
    PostgreSQL only: nomigrate: a read-write open neither creates nor migrates the schema
    (NotFoundError when there is none, CorruptError when it is older: `bucketstore migrate URL`
    does it, once, deliberately); pg_max_connections: the pool of connections for calls (None
    = the library's 10), besides the writers' sessions and one LISTEN connection."""
    o = _cache_entries(F.bs_open_options(F.BS_OPEN_OPTIONS_VERSION), cache_entries)
    o.flags = (
        (F.BS_OPEN_NOSYNC if _bool(nosync, "nosync") else 0)
        | (F.BS_OPEN_RDONLY if _bool(readonly, "readonly") else 0)
        | (F.BS_OPEN_NOMIGRATE if _bool(nomigrate, "nomigrate") else 0)
    )
    o.map_size = _size(map_size, "map_size")
    if pg_max_connections is not None:  # None, not 0, asks for the default here
        o.pg_max_connections = _int(pg_max_connections, "pg_max_connections", 1, SIZE_MAX)
    return Database(_path(path, "path"), o)


def open_memory(*, cache_entries: Optional[int] = None) -> "Database":
    """Opens a fresh in-memory store (the reference backend); nothing is persisted."""
    return Database(None, _cache_entries(F.bs_open_options(F.BS_OPEN_OPTIONS_VERSION),
                                         cache_entries))


class Database(_Handle):
    """One open file (or memory store). Thread-safe; a context manager."""

    _kind = "database"

    def __init__(self, path: Optional[bytes], opts: F.bs_open_options) -> None:
        super().__init__(lib.bs_close)
        h = c_void_p()
        err = F.bs_error()
        if path is None:
            rc = lib.bs_open_memory(byref(h), byref(opts), byref(err))
        else:
            rc = lib.bs_open(byref(h), path, byref(opts), byref(err))
        _check(rc, err)
        self._opened(h.value)
        self._listener: Any = None
        self._exports: "set[_Export]" = set()

    def create_stream(self, name: Bytes, hash: str = "xxh3", *, exist_ok: bool = False) -> int:
        """Creates a PROCESSING stream; returns its id. hash: 'xxh3' or 'sha256'. exist_ok:
        the newest stream of that name that is not terminated, when there is one, instead of
        a new one (so that a program can be run again on its file)."""
        if exist_ok:
            want = _cstr(name, "name")
            for s in reversed(self.streams()):
                if s.name.encode("utf-8", "surrogateescape") == want and \
                        s.state != StreamState.TERMINATED:
                    return s.id
        if _in_callback():
            raise StateError(F.BS_ESTATE, "cannot create a stream inside a callback")
        o = F.bs_stream_options(F.BS_STREAM_OPTIONS_VERSION, _hash(hash))
        out = c_uint32()
        err = F.bs_error()
        n = _cstr(name, "name")
        with self._guard() as h:
            _check(lib.bs_stream_create(byref(out), h, n, byref(o), byref(err)), err)
        return out.value

    def streams(self) -> List[StreamInfo]:
        """Every stream, ascending id."""
        res: List[StreamInfo] = []
        trap = _Trap()

        def one(p: Any, _: Any) -> None:
            i = p[0]
            res.append(StreamInfo(i.id, _str(i.name) or "", StreamState(i.state),
                                  _HASH_NAMES.get(i.hash, str(i.hash))))

        fn = F.STREAM_FN(lambda p, x: trap.call(one, p, x))
        err = F.bs_error()
        with self._guard() as h:
            rc = lib.bs_stream_list(h, fn, None, byref(err))
        trap.raise_pending()
        _check(rc, err)
        return res

    def storage(self, stream_id: int = 0) -> "Storage":
        """A handle on a stream; 0 = the active stream, else the newest one."""
        return Storage(self, _int(stream_id, "stream_id", 0, U32))

    def stat(self) -> Stat:
        """Counts over the whole database (a full scan)."""
        s = F.bs_stat()
        err = F.bs_error()
        with self._guard() as h:
            _check(lib.bs_db_stat(byref(s), h, byref(err)), err)
        return Stat(*(getattr(s, n) for n, _ in F.bs_stat._fields_))

    def verify(self) -> List[str]:
        """Recomputes every bucket's checksum and count, checks encodings; the problems found
        (an empty list: consistent)."""
        problems: List[str] = []
        trap = _Trap()

        def one(p: bytes, _: Any) -> None:  # a void callback: returns None
            trap.call(lambda: problems.append(p.decode("utf-8", "replace")))

        fn = F.VERIFY_FN(one)
        n = c_uint64()
        err = F.bs_error()
        with self._guard() as h:
            rc = lib.bs_db_verify(byref(n), h, fn, None, byref(err))
        trap.raise_pending()
        _check(rc, err)
        return problems

    def backup(self, path: Path, *, replace: bool = False,
               progress: Optional[Callable[[int], Any]] = None,
               cancel: Optional[Cancellable] = None) -> None:
        """Writes a consistent, compacted, verified copy of every stream (one read snapshot) to
        a new file at path; writers and readers keep running. replace: replace a file at path
        (else StateError). progress(records) runs with 0 once the snapshot is taken, then after
        each batch written; a truthy return cancels (CanceledError), an exception stops the
        call and is re-raised, only read calls are allowed in it; cancel (a CancelToken) stops it
        at its next batch, raising the token's reason. On any failure nothing is left at path.
        The memory backend raises UnsupportedError."""
        if _in_callback():
            raise StateError(F.BS_ESTATE, "cannot back up inside a callback")
        c = _cancel_arg(cancel)
        trap = _Trap(user=True)
        o = _backup_options(trap, progress, c, replace)
        b = _path(path, "path")
        _raise_if_cancelled(c)
        err = F.bs_error()
        with self._guard() as h:
            rc = lib.bs_backup(h, b, byref(o), byref(err))
        _finish(rc, err, trap, c)

    def export(self, stream: int = 0) -> Iterator[Record]:
        """Every record of the database (stream 0) or of one stream and the database-wide
        ones, table by table in key order, from one read snapshot: what load() builds a file
        from. The records are read in a thread of the binding and handed over in bounded
        batches, so the database is never held in memory; the snapshot lives until the
        iterator is exhausted or closed (closing the database closes it; an abandoned one
        pins old pages until it is collected). While it is open, do not write to this
        database from the thread that consumes it: a write that must grow the map waits
        until the snapshot ends. The memory backend raises UnsupportedError."""
        return self._export(_int(stream, "stream", 0, U32))

    def _export(self, stream: int) -> Iterator[Record]:
        x = _Export()
        t = threading.Thread(target=x.run, args=(self, stream), name="bucketstore-export",
                             daemon=True)
        with self._c.cv:
            self._exports.add(x)
        t.start()
        try:
            while True:
                batch = x.take()
                if batch is None:
                    break
                yield from batch
            x.finish()
        finally:
            x.stop()
            t.join()
            with self._c.cv:
                self._exports.discard(x)

    def close(self) -> None:
        if not _in_callback():  # (else _Handle.close refuses)
            with self._c.cv:
                exports = list(self._exports)
            for x in exports:  # their threads stop at their next record (_Export.run)
                x.stop(closed=True)
        super().close()
        self._listener = None

    def set_checkpoint_listener(self, fn: Optional[Callable[[int, int], None]]) -> None:
        """fn(stream_id, checkpoint) runs after every checkpoint this process commits on the
        database, in the committing thread; None unregisters. It may call read functions only;
        an exception it raises goes to sys.unraisablehook (the commit returns its result)."""
        if fn is not None and not callable(fn):
            raise TypeError(f"fn: expected a callable or None, got {type(fn).__name__}")
        if fn is None:
            cfn = F.LISTENER_FN(0)  # NULL: unregister
        else:
            user: Callable[[int, int], Any] = fn
            cfn = F.LISTENER_FN(lambda s, c, x: _run_listener(user, s, c))
        with self._guard() as h:
            rc = lib.bs_set_checkpoint_listener(h, cfn, None)
        if rc != 0:
            raise _error(rc)
        self._listener = cfn  # kept alive while registered


class _Export:
    """One export: run() calls bs_db_export in its own thread and hands the records over in
    batches (bounded by _EXPORT_RECORDS and _EXPORT_BYTES) through one slot; take() returns
    the next batch, None at the end. At most three batches exist at a time: the consumer's,
    the slot's and the one being filled."""

    def __init__(self) -> None:
        self.cv = threading.Condition(threading.Lock())
        self.slot: Optional[List[Record]] = None
        self.done = False
        self.stopped = False  # the consumer went away (or the database is closing)
        self.closed = False  # stopped by Database.close
        self.rc = 0
        self.err = F.bs_error()
        self.trap = _Trap()

    def run(self, db: "Database", stream: int) -> None:
        batch: List[Record] = []
        size = 0

        def one(p: Any, _: Any) -> int:
            nonlocal batch, size
            if self.stopped:
                return F.BS_ECANCELED
            r = p[0]
            k, v = r.key, r.value
            rec = Record(r.table.decode("utf-8", "surrogateescape"), r.stream,
                         string_at(k.data, k.size), string_at(v.data, v.size) if v.size else b"")
            batch.append(rec)
            size += k.size + v.size
            if len(batch) >= _EXPORT_RECORDS or size >= _EXPORT_BYTES:
                if not self.hand(batch):
                    return F.BS_ECANCELED
                batch, size = [], 0
            return 0

        rc = F.BS_ECANCELED
        try:
            fn = F.EXPORT_FN(lambda p, x: self.trap.call(one, p, x))
            with db._guard() as h:
                rc = lib.bs_db_export(h, stream, fn, None, byref(self.err))
            if rc == 0 and batch:
                self.hand(batch)
        except BaseException as e:  # noqa: B902 - StateError (closed), MemoryError: the consumer's
            self.trap.exc = self.trap.exc or e
        finally:
            with self.cv:
                self.rc, self.done = rc, True
                self.cv.notify_all()

    def hand(self, batch: List[Record]) -> bool:
        with self.cv:
            while self.slot is not None and not self.stopped:
                self.cv.wait()
            if self.stopped:
                return False
            self.slot = batch
            self.cv.notify_all()
            return True

    def take(self) -> Optional[List[Record]]:
        with self.cv:
            while self.slot is None and not self.done:
                self.cv.wait()
            batch, self.slot = self.slot, None
            self.cv.notify_all()
            return batch

    def finish(self) -> None:
        """After the last batch: the producer's failure, if any, as an exception."""
        if self.closed:
            raise StateError(F.BS_ESTATE, "the database was closed during the export")
        self.trap.raise_pending()
        _check(self.rc, self.err)

    def stop(self, closed: bool = False) -> None:
        with self.cv:
            self.closed = self.closed or (closed and not self.done)
            self.stopped = True
            self.cv.notify_all()


_EXPORT_RECORDS = 1000
_WAIT_SLICE_MS = 100  # how soon a wait_checkpoint with cancel= sees the cancel
_EXPORT_BYTES = 1 << 20


def load(path: Path, records: Iterable[Union[Record, Tuple[Bytes, int, Bytes, Bytes]]], *,
         progress: Optional[Callable[[int], Any]] = None,
         cancel: Optional[Cancellable] = None) -> None:
    """Creates a new database file at path from records (those of Database.export, or
    (table, stream, key, value) tuples), read one at a time from any iterable. The file is
    written beside path, verified and only then moved into place: the same records give the
    same database, record for record. A file at path is refused (StateError: load never
    replaces); records without the format record, of an unknown table or another format
    raise CorruptError. progress(records) runs after each batch written; a truthy return
    cancels (CanceledError); an exception from it or from the iterable stops the call and is
    re-raised; cancel (a CancelToken) stops it at its next batch, raising the token's reason.
    On any failure nothing is left at path."""
    b = _path(path, "path")
    if isinstance(records, (str, bytes)) or not isinstance(records, Iterable):
        raise TypeError(f"records: expected an iterable of records, got {type(records).__name__}")
    c = _cancel_arg(cancel)
    trap = _Trap()
    o = _backup_options(trap, progress, c)
    _raise_if_cancelled(c)
    it = iter(records)
    held: List[Any] = []  # the current record's buffers: borrowed by C until the next call
    n = 0

    def one(p: Any) -> int:
        nonlocal n
        held.clear()
        try:
            r = next(it)
        except StopIteration:
            return 0
        where = f"records[{n}]"
        n += 1
        try:
            table, stream, key, value = r
        except (TypeError, ValueError):
            raise TypeError(f"{where}: expected (table, stream, key, value)") from None
        rec = F.record_in(_cstr(table, f"{where}.table"), _int(stream, f"{where}.stream", 0, U32),
                          _val(key, f"{where}.key"), _val(value, f"{where}.value"))
        held.append(rec)
        ctypes.memmove(ctypes.addressof(p.contents), ctypes.addressof(rec), ctypes.sizeof(rec))
        return 1

    fn = F.LOAD_FN(lambda p, x: trap.call(one, p))
    err = F.bs_error()
    rc = lib.bs_load(b, byref(o), fn, None, byref(err))
    held.clear()
    _finish(rc, err, trap, c)


class Storage(_Handle):
    """One stream: reads (thread-safe), compaction, write checkpoints, lifecycle; opens
    writers. A context manager."""

    _kind = "storage"

    def __init__(self, db: Database, stream_id: int) -> None:
        super().__init__(lib.bs_storage_close, db)
        if _in_callback():
            raise StateError(F.BS_ESTATE, "cannot open a storage inside a callback")
        self.db = db
        h = c_void_p()
        err = F.bs_error()
        with db._guard() as dh:
            _check(lib.bs_storage_open(byref(h), dh, stream_id, byref(err)), err)
            self._opened(h.value)
            self.stream_id: int = lib.bs_storage_stream_id(h)

    # ---- writing ----
    def writer(
        self,
        *,
        snapshot: bool = False,
        create_empty: bool = True,
        max_records: Optional[int] = None,
        max_bytes: Optional[int] = None,
        zero_lsn: Optional[Bytes] = None,
        store_current_data: Optional[bool] = None,
        cancel: Optional[Cancellable] = None,
    ) -> "Writer":
        """Opens the stream's writer (contract.md section 4). snapshot: skip_existing mode.
        zero_lsn and store_current_data are the sync service's, accepted (type-checked) and
        unused: LSNs are opaque here, and a save keeps row data when it passes store=. A
        cancel before the call raises the token's reason."""
        _unused(zero_lsn, "zero_lsn", _bytes)
        _unused(store_current_data, "store_current_data", _bool)
        _raise_if_cancelled(_cancel_arg(cancel))
        o = F.bs_writer_options(
            F.BS_WRITER_OPTIONS_VERSION, _bool(snapshot, "snapshot"),
            _bool(create_empty, "create_empty"), _size(max_records, "max_records"),
            _size(max_bytes, "max_bytes"),
        )
        return Writer(self, o)

    # ---- reading ----
    def checkpoint(self) -> Checkpoint:
        """The stream's current checkpoint ((0, None) before the first)."""
        cp = F.bs_checkpoint()
        err = F.bs_error()
        with self._guard() as h:
            _check(lib.bs_get_checkpoint(byref(cp), h, byref(err)), err)
        return Checkpoint(cp.op_id, _lsn(cp.has_lsn, cp.lsn_size, cp.lsn))

    def wait_checkpoint(self, known: Optional[Checkpoint], timeout_ms: int, *,
                        cancel: Optional[Cancellable] = None) -> Checkpoint:
        """Blocks (without the GIL) until the checkpoint differs from known, or timeout_ms
        passes (then returns the current one). cancel (a CancelToken) ends the wait, raising
        the token's reason: the wait then runs in slices of _WAIT_SLICE_MS, checking it
        between them."""
        k = None
        if known is not None:
            if not isinstance(known, Checkpoint):
                raise TypeError(f"known: expected Checkpoint or None, got {type(known).__name__}")
            k = F.bs_checkpoint(_op_id(known.op_id, "known.op_id"))
            if known.lsn is not None:
                b = _bytes(known.lsn, "known.lsn")
                if len(b) > F.MAX_LSN:
                    raise TooBigError(F.BS_ETOOBIG, f"known.lsn: longer than {F.MAX_LSN} bytes")
                k.has_lsn, k.lsn_size = 1, len(b)
                ctypes.memmove(k.lsn, b, len(b))
        left = _int(timeout_ms, "timeout_ms", 0, INT_MAX)
        c = _cancel_arg(cancel)
        out = F.bs_checkpoint()
        err = F.bs_error()
        while True:
            _raise_if_cancelled(c)
            t = left if c is None or k is None else min(left, _WAIT_SLICE_MS)
            with self._guard() as h:
                rc = lib.bs_wait_checkpoint(byref(out), h, byref(k) if k is not None else None,
                                            t, byref(err))
            _check(rc, err)
            left -= t
            if left == 0 or k is None or out.op_id != k.op_id or out.has_lsn != k.has_lsn or \
                    bytes(out.lsn[:out.lsn_size]) != bytes(k.lsn[:k.lsn_size]):
                return Checkpoint(out.op_id, _lsn(out.has_lsn, out.lsn_size, out.lsn))

    def bucket_data_batch(
        self,
        checkpoint: int,
        buckets: Positions,
        *,
        limit: Optional[int] = None,
        chunk_bytes: Optional[int] = None,
        max_bytes: Optional[int] = None,
        request_hint: Optional[str] = None,
        cancel: Optional[Cancellable] = None,
    ) -> Batch:
        """One call of get_bucket_data_batch (contract.md 5.2): ops with after < op_id <=
        checkpoint of the requested buckets {name: after}, as chunks (copied out). limit: ops
        per call (None = 1000). request_hint ('bulk' or 'incremental', the sync service's) is
        checked and unused: the engine has one read path. A cancel (a CancelToken) before or
        during the read raises the token's reason."""
        chunks, more = self._batch(False, checkpoint, buckets, limit, chunk_bytes, max_bytes,
                                   request_hint, cancel)
        return Batch(chunks, more)

    def bucket_data_batch_raw(
        self,
        checkpoint: int,
        buckets: Positions,
        *,
        limit: Optional[int] = None,
        chunk_bytes: Optional[int] = None,
        max_bytes: Optional[int] = None,
        request_hint: Optional[str] = None,
        cancel: Optional[Cancellable] = None,
    ) -> RawBatch:
        """bucket_data_batch in raw mode: the same chunks, each chunk's ops one RawOps (their
        fields in one bytes object, decoded when read)."""
        chunks, more = self._batch(True, checkpoint, buckets, limit, chunk_bytes, max_bytes,
                                   request_hint, cancel)
        return RawBatch(chunks, more)

    def _batch(self, raw: bool, checkpoint: int, buckets: Positions, limit: Optional[int],
               chunk_bytes: Optional[int], max_bytes: Optional[int],
               request_hint: Optional[str], cancel: Optional[Cancellable]
               ) -> Tuple[List[Any], bool]:
        _hint(request_hint)
        c = _cancel_arg(cancel)
        _raise_if_cancelled(c)
        cp = _op_id(checkpoint, "checkpoint")
        req = []
        for i, it in enumerate(buckets.items() if isinstance(buckets, Mapping) else buckets):
            try:
                name, after = it
            except (TypeError, ValueError):
                raise TypeError(f"buckets[{i}]: expected a (name, after) pair") from None
            req.append((_bytes(name, f"buckets[{i}] name"), _op_id(after, f"buckets[{i}] after")))
        lim = F.BS_BATCH_LIMIT_DEFAULT if limit is None else _size(limit, "limit")
        chunk = (F.BS_CHUNK_BYTES_DEFAULT if chunk_bytes is None
                 else _size(chunk_bytes, "chunk_bytes", positive=False))  # 0: one op per chunk
        with self._guard() as h:
            rc, msg, (chunks, more) = N.bucket_data(h, cp, req, lim, chunk,
                                                    _size(max_bytes, "max_bytes"), raw)
        _check_msg(rc, msg)
        _raise_if_cancelled(c)
        return chunks, more

    def bucket_data(
        self,
        checkpoint: int,
        buckets: Positions,
        *,
        limit: Optional[int] = None,
        chunk_bytes: Optional[int] = None,
        max_bytes: Optional[int] = None,
        request_hint: Optional[str] = None,
        cancel: Optional[Cancellable] = None,
    ) -> Iterator[Chunk]:
        """Every chunk up to checkpoint, calling the library again from each bucket's
        next_after while a batch says has_more (no gap, no duplicate). Each batch is one read
        snapshot; the iterator holds nothing between batches (closing it, or leaving the
        loop, ends it). request_hint: as bucket_data_batch's. A cancel (a CancelToken) before
        a read, or between the chunks handed out, raises the token's reason."""
        return self._chunks(False, checkpoint, buckets, limit, chunk_bytes, max_bytes,
                            request_hint, cancel)

    def bucket_data_raw(
        self,
        checkpoint: int,
        buckets: Positions,
        *,
        limit: Optional[int] = None,
        chunk_bytes: Optional[int] = None,
        max_bytes: Optional[int] = None,
        request_hint: Optional[str] = None,
        cancel: Optional[Cancellable] = None,
    ) -> Iterator[RawChunk]:
        """bucket_data in raw mode: the same chunks, each chunk's ops one RawOps."""
        return self._chunks(True, checkpoint, buckets, limit, chunk_bytes, max_bytes,
                            request_hint, cancel)

    def _chunks(self, raw: bool, checkpoint: int, buckets: Positions, limit: Optional[int],
                chunk_bytes: Optional[int], max_bytes: Optional[int],
                request_hint: Optional[str], cancel: Optional[Cancellable]) -> Iterator[Any]:
        _hint(request_hint)
        c = _cancel_arg(cancel)
        pos: Dict[Any, int] = {}
        for i, it in enumerate(buckets.items() if isinstance(buckets, Mapping) else buckets):
            try:
                name, after = it
            except (TypeError, ValueError):
                raise TypeError(f"buckets[{i}]: expected a (name, after) pair") from None
            pos[_bytes(name, f"buckets[{i}] name")] = after
        while True:
            chunks, more = self._batch(raw, checkpoint, pos.items(), limit, chunk_bytes,
                                       max_bytes, request_hint, c)
            for ch in chunks:
                key = ch.bucket.encode("utf-8", "surrogateescape")
                if ch.has_more:
                    pos[key] = ch.next_after
                else:  # this bucket is done
                    pos.pop(key, None)
            for ch in chunks:
                yield ch
                _raise_if_cancelled(c)
            if not more or not pos:
                return

    def checksums(self, checkpoint: int, buckets: Iterable[Bytes], *,
                  request_hint: Optional[str] = None) -> Dict[str, Checksum]:
        """{name: Checksum(checksum, count)} at checkpoint (unknown bucket: 0, 0). request_hint
        ('bulk' or 'incremental', the sync service's) is checked and unused: one cached path."""
        _hint(request_hint)
        cp = _op_id(checkpoint, "checkpoint")
        if isinstance(buckets, (str, bytes)):
            raise TypeError("buckets: expected an iterable of names, not one name")
        names = list(buckets)
        arr = (F.val_in * max(len(names), 1))(
            *[_val(n, f"buckets[{i}]") for i, n in enumerate(names)]
        )
        out = (F.bs_checksum * max(len(names), 1))()
        err = F.bs_error()
        with self._guard() as h:
            _check(lib.bs_get_checksums(out, h, cp, arr, len(names), byref(err)), err)
        return {
            (n if isinstance(n, str) else _bytes(n, "").decode("utf-8", "surrogateescape")):
            Checksum(_signed32(out[i].checksum), out[i].count)
            for i, n in enumerate(names)
        }

    def list_buckets(self, start_after: Optional[Bytes] = None, page: int = 1000
                     ) -> Iterator[BucketInfo]:
        """Every bucket with a stored op, ascending name, after start_after; read in pages of
        `page` buckets (one snapshot each)."""
        after = b"" if start_after is None else _bytes(start_after, "start_after")
        n = _int(page, "page", 1, INT_MAX)
        while True:
            got: List[BucketInfo] = []
            trap = _Trap()

            def one(p: Any, _: Any) -> int:
                i = p[0]
                got.append(BucketInfo(_str(i.name) or "", _signed32(i.checksum), i.count, i.last_op,
                                      i.bytes, i.generation, i.changes))
                return 1 if len(got) >= n else 0

            fn = F.BUCKET_FN(lambda p, x: trap.call(one, p, x))
            err = F.bs_error()
            sa = F.val_in(after, len(after)) if after else F.val_in()
            with self._guard() as h:
                rc = lib.bs_list_buckets(h, sa, fn, None, byref(err))
            trap.raise_pending()
            if rc not in (0, F.BS_EUSER):  # BS_EUSER: one() stopped the call at a full page
                raise _error(rc, err)
            yield from got
            if rc == 0 or not got:
                return
            after = got[-1].name.encode("utf-8", "surrogateescape")

    def checkpoint_changes(self, from_: int, to: int) -> CheckpointChanges:
        """What changed in (from_, to]."""
        a, b = _op_id(from_, "from_"), _op_id(to, "to")
        res: List[CheckpointChanges] = []
        trap = _Trap()

        def one(p: Any, _: Any) -> None:
            c = p[0]

            def names(arr: Any, k: int) -> List[str]:
                return [_str(arr[i]) or "" for i in range(k)]

            lookups = [
                _decode_scalars(string_at(c.updated_lookups[i].data or 0,
                                          c.updated_lookups[i].size))
                for i in range(c.n_updated_lookups)
            ]
            res.append(CheckpointChanges(
                bool(c.invalidate_data_buckets), bool(c.invalidate_parameter_buckets),
                names(c.updated_buckets, c.n_updated_buckets), lookups,
                names(c.updated_write_checkpoint_users, c.n_updated_write_checkpoint_users)))

        fn = F.CHANGES_FN(lambda p, x: trap.call(one, p, x))
        err = F.bs_error()
        with self._guard() as h:
            rc = lib.bs_get_checkpoint_changes(h, a, b, fn, None, byref(err))
        trap.raise_pending()
        _check(rc, err)
        return res[0]

    def parameter_sets(self, checkpoint: int, lookups: Iterable[Sequence[Scalar]],
                       limit: Optional[int] = None) -> List[Dict[str, Any]]:
        """The bucket-parameter rows of the lookups at checkpoint, parsed (json.loads: integers
        of any size exact). More than limit rows (None = 1000) raises LimitError; a stored row
        that is not JSON raises ValueError (json.JSONDecodeError)."""
        cp = _op_id(checkpoint, "checkpoint")
        keys = [encode_lookup(v, f"lookups[{i}]") for i, v in enumerate(lookups)]
        arr = (F.val_in * max(len(keys), 1))(*[F.val_in(k, len(k)) for k in keys])
        lim = F.BS_PARAM_LIMIT_DEFAULT if limit is None else _size(limit, "limit", False)
        rows: List[Dict[str, Any]] = []
        trap = _Trap()
        fn = F.PARAMS_FN(lambda p, x: trap.call(
            lambda: rows.append(json.loads(string_at(p[0].data, p[0].size)))))
        err = F.bs_error()
        with self._guard() as h:
            rc = lib.bs_get_parameter_sets(h, cp, arr, len(keys), lim, fn, None, byref(err))
        trap.raise_pending()
        _check(rc, err)
        return rows

    # ---- write checkpoints ----
    def set_write_checkpoint_mode(self, mode: str, event_name: Optional[Bytes] = None) -> None:
        """'managed' (default) or 'custom' for this handle; event_name: the custom
        checkpoints' event that last_write_checkpoint reads (None: those without one)."""
        modes = {"managed": F.BS_WCP_MANAGED, "custom": F.BS_WCP_CUSTOM}
        if mode not in modes:
            raise _inval(f"mode: {mode!r} is not one of 'managed', 'custom'")
        ev = _opt_val(event_name, "event_name")
        err = F.bs_error()
        with self._guard() as h:
            _check(lib.bs_set_write_checkpoint_mode(h, modes[mode], ev, byref(err)), err)

    def create_managed_write_checkpoints(
        self, requests: Sequence[ManagedRequest]
    ) -> Tuple[Dict[str, int], bool]:
        """One batch (contract.md 7): ({user_id: stored id}, should_advance)."""
        self._no_write_in_callback()
        reqs = list(requests)
        arr = (F.bs_managed_request * max(len(reqs), 1))()
        for i, r in enumerate(reqs):
            if not isinstance(r, ManagedRequest):
                raise TypeError(f"requests[{i}]: expected ManagedRequest")
            a = arr[i]
            a.user_id = _val(r.user_id, f"requests[{i}].user_id")
            heads = _heads(r.heads, f"requests[{i}].heads")
            a.heads, a.n_heads = heads, len(r.heads)
            if r.checkpoint_request_id is not None:
                a.has_request_id = 1
                a.request_id = _int(r.checkpoint_request_id,
                                    f"requests[{i}].checkpoint_request_id", 0, U64)
            if r.checkpoint_requested_at is not None:  # else 0: now
                a.requested_at_ms = _ms(r.checkpoint_requested_at,
                                        f"requests[{i}].checkpoint_requested_at", 1)
        ids = (c_uint64 * max(len(reqs), 1))()
        adv = c_int(0)
        err = F.bs_error()
        with self._guard() as h:
            _check(lib.bs_create_managed_write_checkpoints(ids, byref(adv), h, arr, len(reqs),
                                                           byref(err)), err)
        out = {}
        for i, r in enumerate(reqs):
            u = r.user_id
            out[u if isinstance(u, str) else _bytes(u, "").decode("utf-8", "surrogateescape")] \
                = ids[i]
        return out, bool(adv.value)

    def last_write_checkpoint(
        self, user_id: Bytes, heads: Optional[Heads] = None
    ) -> Optional[int]:
        """Managed: the user's id iff its heads are at or below the given ones; custom: the
        stored value. None when there is none."""
        u = _val(user_id, "user_id")
        hd: Heads = _NO_HEADS if heads is None else heads
        hs = _heads(hd, "heads")
        out = c_uint64()
        found = c_int(0)
        err = F.bs_error()
        with self._guard() as h:
            _check(lib.bs_last_write_checkpoint(byref(out), byref(found), h, u, hs,
                                                len(hd), byref(err)), err)
        return out.value if found.value else None

    def delete_checkpoint_requests_before(self, before: When) -> int:
        """Deletes the processed requests made before `before` (a datetime, or ms since the
        epoch); returns how many."""
        self._no_write_in_callback()
        t = _ms(before, "before", -I64)
        n = c_uint64()
        err = F.bs_error()
        with self._guard() as h:
            _check(lib.bs_delete_checkpoint_requests_before(byref(n), h, t, byref(err)), err)
        return n.value

    # ---- compaction ----
    def compact(
        self,
        *,
        max_op_id: int = 0,
        buckets: Optional[Iterable[Bytes]] = None,
        min_bucket_changes: Optional[int] = None,
        min_change_ratio: Optional[float] = None,
        memory_limit_mb: Optional[int] = None,
        incremental_only: bool = False,
        min_age_ms: Optional[int] = None,
        max_ops_per_txn: Optional[int] = None,
        op_budget: Optional[int] = None,
        compact_parameter_data: bool = False,
        delete_checkpoint_requests_before: Optional[When] = None,
        defragment_ratio: float = 0.0,
        move_batch_byte_limit: Optional[int] = None,
        move_batch_limit: Optional[int] = None,
        clear_batch_limit: Optional[int] = None,
        progress: Optional[Callable[[CompactStats], Any]] = None,
        cancel: Optional[Cancellable] = None,
    ) -> CompactStats:
        """Compacts the stream (contract.md section 6). None = the library's default. progress:
        called with the totals after each transaction; a truthy return cancels
        (CanceledError), an exception stops it and is re-raised; cancel (a CancelToken) stops it
        after its transaction, raising the token's reason. delete_checkpoint_requests_
        before (a datetime, or ms since the epoch) runs that cleanup with the compaction.
        move_batch_byte_limit, move_batch_limit and clear_batch_limit are the sync service's,
        accepted (type-checked) and unused: memory_limit_mb and max_ops_per_txn bound the
        engine's work."""
        self._no_write_in_callback()
        for name, v in (("move_batch_byte_limit", move_batch_byte_limit),
                        ("move_batch_limit", move_batch_limit),
                        ("clear_batch_limit", clear_batch_limit)):
            _unused(v, name, lambda x, n: _int(x, n, 0, SIZE_MAX))
        o = F.bs_compact_options(F.BS_COMPACT_OPTIONS_VERSION)
        o.max_op_id = _op_id(max_op_id, "max_op_id")
        names = None
        if buckets is not None:
            if isinstance(buckets, (str, bytes)):
                raise TypeError("buckets: expected an iterable of names, not one name")
            bl = list(buckets)
            names = (F.val_in * max(len(bl), 1))(
                *[_val(n, f"buckets[{i}]") for i, n in enumerate(bl)]
            )
            o.buckets, o.n_buckets = names, len(bl)
        o.min_bucket_changes = _size(min_bucket_changes, "min_bucket_changes")
        o.min_change_ratio = -1.0 if min_change_ratio is None else _ratio(
            min_change_ratio, "min_change_ratio")
        o.memory_limit_mb = _size(memory_limit_mb, "memory_limit_mb")
        o.incremental_only = _bool(incremental_only, "incremental_only")
        o.min_age_ms = -1 if min_age_ms is None else _int(min_age_ms, "min_age_ms", 0, I64 - 1)
        o.max_ops_per_txn = _size(max_ops_per_txn, "max_ops_per_txn")
        o.op_budget = _size(op_budget, "op_budget")
        o.compact_parameters = _bool(compact_parameter_data, "compact_parameter_data")
        if delete_checkpoint_requests_before is not None:  # 0 in C: no cleanup
            o.delete_checkpoint_requests_before_ms = _ms(
                delete_checkpoint_requests_before, "delete_checkpoint_requests_before", 1)
        o.defragment_ratio = _float(defragment_ratio, "defragment_ratio")
        c = _cancel_arg(cancel)
        trap = _Trap(user=True)
        step = _steps(trap, progress, c, lambda p: _stats(p[0]))
        if step is not None:
            fn = step
            o.progress = F.PROGRESS_FN(lambda p, x: fn(p))
        _raise_if_cancelled(c)
        stats = F.bs_compact_stats()
        err = F.bs_error()
        with self._guard() as h:
            rc = lib.bs_compact(byref(stats), h, byref(o), byref(err))
        _finish(rc, err, trap, c)
        return _stats(stats)

    def compact_initial_replication(self, *, max_op_id: int = 0,
                                    min_bucket_changes: Optional[int] = None,
                                    cancel: Optional[Cancellable] = None) -> int:
        """Before the first checkpoint only: deletes superseded ops; returns the number of
        buckets compacted (the sync service's {buckets}). max_op_id 0: the last persisted op;
        min_bucket_changes None: 1. It has no steps to stop at: a cancel before the call, or
        during it, raises the token's reason (after it, the work staying)."""
        self._no_write_in_callback()
        m = _op_id(max_op_id, "max_op_id")
        mb = _size(min_bucket_changes, "min_bucket_changes")
        c = _cancel_arg(cancel)
        _raise_if_cancelled(c)
        n = c_uint64()
        err = F.bs_error()
        with self._guard() as h:
            _check(lib.bs_compact_initial_replication(byref(n), h, m, mb, byref(err)), err)
        _raise_if_cancelled(c)
        return n.value

    def clear_checksum_cache(self) -> None:
        """The sync service's call; nothing to drop here: the library updates its checksum cache
        at every commit, compaction and clear of this process (another process's clear needs a
        reopen: storage.h bs_clear). Raises StateError on a closed storage."""
        with self._guard():
            pass

    @staticmethod
    def supports_incremental_parameter_compaction() -> bool:
        """True: parameter compaction keeps a cursor in the stream, so an incremental run
        continues where the last one stopped."""
        return True

    # ---- lifecycle ----
    def status(self) -> Status:
        """The sync service's getStatus(): state, snapshot_done, resume_lsn, the checkpoint."""
        s = F.bs_status()
        err = F.bs_error()
        with self._guard() as h:
            _check(lib.bs_get_status(byref(s), h, byref(err)), err)
        return Status(StreamState(s.state), bool(s.snapshot_done), s.checkpoint,
                      s.last_persisted_op, _lsn(s.has_lsn, s.lsn_size, s.lsn),
                      _lsn(s.has_resume_lsn, s.resume_lsn_size, s.resume_lsn),
                      s.last_error.decode("utf-8", "replace"))

    def report_error(self, message: Bytes) -> None:
        self._no_write_in_callback()
        m = _cstr(message, "message")
        err = F.bs_error()
        with self._guard() as h:
            _check(lib.bs_report_error(h, m, byref(err)), err)

    def clear(self) -> None:
        """Drops every op, bucket, lookup, source record and checkpoint of the stream."""
        self._no_write_in_callback()
        err = F.bs_error()
        with self._guard() as h:
            _check(lib.bs_clear(h, byref(err)), err)

    def terminate(self, *, clear_storage: bool = False,
                  cancel: Optional[Cancellable] = None) -> None:
        """Marks the stream TERMINATED (no writer opens on it again); clear_storage: clear() it
        first. A cancel before the call raises the token's reason."""
        self._no_write_in_callback()
        c = _bool(clear_storage, "clear_storage")
        _raise_if_cancelled(_cancel_arg(cancel))
        err = F.bs_error()
        with self._guard() as h:
            _check(lib.bs_terminate(h, c, byref(err)), err)

    @staticmethod
    def _no_write_in_callback() -> None:
        if _in_callback():
            raise StateError(F.BS_ESTATE, "only read calls are allowed inside a callback")


def _heads(heads: Heads, name: str) -> Any:
    if not isinstance(heads, Mapping):
        raise TypeError(f"{name}: expected a mapping connection -> lsn")
    arr = (F.bs_head * max(len(heads), 1))()
    for i, (c, lsn) in enumerate(heads.items()):
        arr[i].connection = _val(c, f"{name} connection")
        arr[i].lsn = _val(lsn, f"{name}[{c!r}]")
    return arr


class Writer(_Handle, N.WriterBase):
    """The replication writer of a stream (contract.md section 4); one thread at a time (calls
    from several threads are serialised). Closing discards what was not flushed. As a context
    manager: a block that ends normally with saves or write checkpoints queued since the last
    commit, keepalive or flush discards them and raises StateError (commit before the end of
    the block, or close() the writer to discard on purpose); a block left by an exception
    discards them and lets that exception through."""

    _kind = "writer"

    def __init__(self, st: Storage, opts: F.bs_writer_options) -> None:
        # N.WriterBase (C) made self._core: the lock held by each call (and by _Cell.close),
        # the bs_writer and whether work is queued since the last flush; its save and
        # save_many take the lock, convert and queue in one call (_native.c).
        core = self._lock = self._core

        def free(h: int, close: Callable[[int], None] = lib.bs_writer_close) -> None:
            core.handle = None  # (under the lock, which _Cell.close holds)
            close(h)

        super().__init__(free, st, core)
        Storage._no_write_in_callback()
        self.storage = st
        h = c_void_p()
        err = F.bs_error()
        with st._guard() as sh:
            _check(lib.bs_writer_open(byref(h), sh, byref(opts), byref(err)), err)
            self._opened(h.value)
            core.handle = h.value

    def _enter(self) -> int:
        if _in_callback():
            raise StateError(F.BS_ESTATE, "writer calls are not allowed inside a callback")
        self._lock.acquire()
        h = self._c.h
        if h is None:
            self._lock.release()
            raise StateError(F.BS_ESTATE, "the writer is closed")
        return h

    def close(self) -> None:
        super().close()
        self._core.queued = False

    def __exit__(self, *exc: Any) -> None:
        queued = self._core.queued
        self.close()
        if queued and (not exc or exc[0] is None):
            raise StateError(F.BS_ESTATE, "the writer's with block ended with changes queued "
                             "since the last commit: they were discarded (commit(lsn) before "
                             "the end of the block, or close() the writer to discard them)")

    if TYPE_CHECKING:  # save and save_many are N.WriterBase's, in C (_native.c); as typed:

        def save(
            self,
            table: Bytes,
            tag: Union[str, int],
            id: Bytes,
            rows: Iterable[Union[Row, Tuple[Bytes, Bytes, Bytes, Bytes]]] = (),
            lookups: Iterable[Union[Lookup, Tuple[Sequence[Scalar], Sequence[Bytes]]]] = (),
            *,
            old_id: Optional[Bytes] = None,
            store: Optional[Bytes] = None,
        ) -> None:
            """Queues one source row change (contract.md 4.1). tag: 'insert'/'update'/'delete'
            (or Tag); id: the replica id after the change (for delete: of the deleted row);
            old_id: the replica id before, when the key changed; rows: (bucket, object_type,
            object_id, data); lookups: (values, params); store: row data kept with the source
            record."""

        def save_many(self, saves: Iterable[SaveArgs]) -> None:
            """Queues many source row changes with one call into the library (the fast way to
            ingest): each a tuple of save()'s arguments, (table, tag, id[, rows[, lookups[,
            old_id[, store]]]]). All are checked, by the library's rules too, before any is
            queued: a refused one queues none of them, and the error says which (saves[i])."""

    def _lsn_call(self, fn: Any, table: Any, name: str, flushes: bool = False) -> None:
        v = _val(table, name)
        err = F.bs_error()
        h = self._enter()
        try:
            rc = fn(h, v, byref(err))
            if flushes and rc == 0:
                self._core.queued = False
        finally:
            self._lock.release()
        _check(rc, err)

    def truncate(self, table: Bytes) -> None:
        """Flushes the queue, then persists REMOVEs / tombstones for every row of table
        (visible with the next checkpoint)."""
        self._lsn_call(lib.bs_writer_truncate, table, "table", flushes=True)

    def drop(self, table: Bytes) -> None:
        """truncate + forget the table."""
        self._lsn_call(lib.bs_writer_drop, table, "table", flushes=True)

    def snapshot_done(self, lsn: Bytes) -> None:
        """Marks the snapshot done; no checkpoint may be made below lsn."""
        self._lsn_call(lib.bs_writer_snapshot_done, lsn, "lsn")

    def resume_lsn(self, lsn: Bytes) -> None:
        """Records where replication restarts."""
        self._lsn_call(lib.bs_writer_resume_lsn, lsn, "lsn")

    def flush(self) -> int:
        """Persists the queue; returns the stream's highest persisted op id."""
        out = c_uint64()
        err = F.bs_error()
        h = self._enter()
        try:
            rc = lib.bs_writer_flush(byref(out), h, byref(err))
            if rc == 0:
                self._core.queued = False
        finally:
            self._lock.release()
        _check(rc, err)
        return out.value

    def _commit(self, lsn: Bytes, opts: Any) -> CommitResult:
        v = _val(lsn, "lsn")
        res = F.bs_commit_result()
        err = F.bs_error()
        h = self._enter()
        try:
            if opts is None:
                rc = lib.bs_writer_keepalive(byref(res), h, v, byref(err))
            else:
                rc = lib.bs_writer_commit(byref(res), h, v, byref(opts), byref(err))
            if rc == 0:
                self._core.queued = False
        finally:
            self._lock.release()
        _check(rc, err)
        reason = None
        if res.checkpoint_blocked:
            reason = BlockedReason(res.blocked_reason) if res.blocked_reason in (
                1, 2, 3) else res.blocked_reason
        return CommitResult(bool(res.checkpoint_blocked), bool(res.checkpoint_created),
                            res.checkpoint, reason)

    def commit(self, lsn: Bytes, *, create_empty: Optional[bool] = None) -> CommitResult:
        """Flushes, then makes a checkpoint iff the LSN allows it (contract.md 4.4)."""
        o = F.bs_commit_options(F.BS_COMMIT_OPTIONS_VERSION,
                                -1 if create_empty is None else _bool(create_empty,
                                                                      "create_empty"))
        return self._commit(lsn, o)

    def keepalive(self, lsn: Bytes) -> CommitResult:
        """commit(lsn) with create_empty."""
        return self._commit(lsn, None)

    def source_row(self, table: Bytes, id: Bytes) -> Optional[str]:
        """The data stored with a source record (None: none stored); NotFoundError when the
        row is unknown."""
        t, r = _val(table, "table"), _val(id, "id")
        got: List[Optional[str]] = []
        trap = _Trap()
        fn = F.SOURCE_FN(lambda p, x: trap.call(
            lambda: got.append(_str(p[0]) if p else None)))
        err = F.bs_error()
        h = self._enter()
        try:
            rc = lib.bs_writer_source_row(h, t, r, fn, None, byref(err))
        finally:
            self._lock.release()
        trap.raise_pending()
        _check(rc, err)
        return got[0] if got else None

    def custom_write_checkpoint(self, user_id: Bytes, checkpoint: int,
                                event_id: Optional[Bytes] = None,
                                checkpoint_requested_at: Optional[When] = None) -> None:
        """Custom mode: queue (user, value[, event_id]), persisted by the next flush. Without
        checkpoint_requested_at (a datetime, or ms since the epoch) it is persistent (owned by
        the source); with it, it came from a client's request made then and
        delete_checkpoint_requests_before expires it."""
        u = _val(user_id, "user_id")
        c = _op_id(checkpoint, "checkpoint")
        ev = _opt_val(event_id, "event_id")
        at = None if checkpoint_requested_at is None else _ms(checkpoint_requested_at,
                                                              "checkpoint_requested_at", 0)
        err = F.bs_error()
        h = self._enter()
        try:
            if at is None:
                rc = lib.bs_writer_custom_write_checkpoint(h, u, c, ev, byref(err))
            else:
                rc = lib.bs_writer_custom_write_checkpoint_requested(h, u, c, ev, at, byref(err))
            self._core.queued = self._core.queued or rc == 0
        finally:
            self._lock.release()
        _check(rc, err)
