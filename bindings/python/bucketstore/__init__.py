"""bucketstore: the bucketstore storage engine for Python (the C library compiled in).

    import bucketstore as bs
    with bs.open("app.db") as db, db.storage(db.create_stream("v1")) as st:
        with st.writer() as w:
            w.save("todos", "insert", "t1", [("b", "todos", "t1", '{"id":"t1"}')])
            ...

See README.md next to this package for the whole API.
"""

from ._core import (
    Batch,
    BlockedReason,
    BucketInfo,
    BucketstoreError,
    BusyError,
    CallbackError,
    CanceledError,
    Cancellable,
    CancelToken,
    Checkpoint,
    CheckpointChanges,
    Checksum,
    Chunk,
    CommitResult,
    CompactStats,
    CorruptError,
    Database,
    InvalidArgumentError,
    InvalidatedError,
    LimitError,
    Lookup,
    ManagedRequest,
    NoMemoryError,
    NotFoundError,
    Op,
    OpType,
    RawBatch,
    RawChunk,
    RawOps,
    Record,
    Row,
    Save,
    Stat,
    StaleError,
    StateError,
    Status,
    Storage,
    StorageIOError,
    StreamInfo,
    StreamState,
    Tag,
    TooBigError,
    UnsupportedError,
    When,
    Writer,
    checksum_put,
    checksum_remove,
    decode_lookup,
    encode_lookup,
    library_version,
    load,
    open,
    open_memory,
    strerror,
    subkey,
)
from ._ffi import CONSTANTS as _C

__version__ = "0.4.0"

# the status codes, as in storage.h (BucketstoreError.code is one of these)
OK = _C["BS_OK"]
EINVAL = _C["BS_EINVAL"]
ENOTFOUND = _C["BS_ENOTFOUND"]
ETOOBIG = _C["BS_ETOOBIG"]
ELIMIT = _C["BS_ELIMIT"]
ESTATE = _C["BS_ESTATE"]
EINVALIDATED = _C["BS_EINVALIDATED"]
ESTALE = _C["BS_ESTALE"]
ECORRUPT = _C["BS_ECORRUPT"]
ENOMEM = _C["BS_ENOMEM"]
EIO = _C["BS_EIO"]
EBUSY = _C["BS_EBUSY"]
EUNSUPPORTED = _C["BS_EUNSUPPORTED"]
ECANCELED = _C["BS_ECANCELED"]
EUSER = _C["BS_EUSER"]

__all__ = [
    "Batch",
    "BlockedReason",
    "BucketInfo",
    "BucketstoreError",
    "BusyError",
    "CallbackError",
    "CanceledError",
    "Cancellable",
    "CancelToken",
    "Checkpoint",
    "CheckpointChanges",
    "Checksum",
    "Chunk",
    "CommitResult",
    "CompactStats",
    "CorruptError",
    "Database",
    "InvalidArgumentError",
    "InvalidatedError",
    "LimitError",
    "Lookup",
    "ManagedRequest",
    "NoMemoryError",
    "NotFoundError",
    "Op",
    "OpType",
    "RawBatch",
    "RawChunk",
    "RawOps",
    "Record",
    "Row",
    "Save",
    "Stat",
    "StaleError",
    "StateError",
    "Status",
    "Storage",
    "StorageIOError",
    "StreamInfo",
    "StreamState",
    "Tag",
    "TooBigError",
    "UnsupportedError",
    "When",
    "Writer",
    "checksum_put",
    "checksum_remove",
    "decode_lookup",
    "encode_lookup",
    "library_version",
    "load",
    "open",
    "open_memory",
    "strerror",
    "subkey",
    "OK",
    "EINVAL",
    "ENOTFOUND",
    "ETOOBIG",
    "ELIMIT",
    "ESTATE",
    "EINVALIDATED",
    "ESTALE",
    "ECORRUPT",
    "ENOMEM",
    "EIO",
    "EBUSY",
    "EUNSUPPORTED",
    "ECANCELED",
    "EUSER",
    "__version__",
]
