"""ctypes mirror of storage.h: library loading, struct layouts, prototypes, constants.

Every struct here mirrors one in storage.h field by field, under the C field names;
tests/test_layout.py compiles a C program that prints the real sizes and offsets and compares
them (and the constants below) with this module, so a change to storage.h that is not mirrored
here fails `make test` instead of corrupting memory. Structs the library writes into (outputs)
hold bytes as c_void_p addresses; structs Python fills in (inputs) hold them as c_char_p, so
ctypes keeps the Python bytes alive for as long as the struct lives.
"""

from __future__ import annotations

import ctypes
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_char,
    c_char_p,
    c_double,
    c_int,
    c_int64,
    c_size_t,
    c_ubyte,
    c_uint,
    c_uint32,
    c_uint64,
    c_void_p,
)

# ---- Loading ------------------------------------------------------------------------------
# The library is compiled into the extension module bucketstore._native (setup.py); ctypes
# opens that same shared object, so both see one copy of the library.

from . import _native  # noqa: E402

lib = ctypes.CDLL(_native.__file__)

# ---- Constants (checked against storage.h by tests/test_layout.py) -------------------------

BS_OK = 0
BS_EINVAL = -1
BS_ENOTFOUND = -2
BS_ETOOBIG = -3
BS_ELIMIT = -4
BS_ESTATE = -5
BS_EINVALIDATED = -6
BS_ESTALE = -7
BS_ECORRUPT = -8
BS_ENOMEM = -9
BS_EIO = -10
BS_EBUSY = -11
BS_EUNSUPPORTED = -12
BS_ECANCELED = -13
BS_EUSER = -14
BS_MAX_BUCKET_NAME = 480
BS_MAX_LOOKUP_KEY = 480
BS_MAX_REPLICA_ID = 256
BS_MAX_TABLE_NAME = 256
BS_MAX_OP_DATA = 15 * 1024 * 1024
BS_MAX_LSN = 255
BS_MAX_STREAM_NAME = 255
BS_MAX_USER_ID = 480
BS_MAX_OBJECT_NAME = 65535
BS_OPEN_NOSYNC = 1
BS_OPEN_RDONLY = 2
BS_OPEN_NOMIGRATE = 4
BS_OPEN_OPTIONS_VERSION = 2
BS_STREAM_OPTIONS_VERSION = 1
BS_SAVE_VERSION = 1
BS_WRITER_OPTIONS_VERSION = 1
BS_COMMIT_OPTIONS_VERSION = 1
BS_BATCH_OPTIONS_VERSION = 1
BS_BATCH_LIMIT_DEFAULT = 1000
BS_CHUNK_BYTES_DEFAULT = 1024 * 1024
BS_PARAM_LIMIT_DEFAULT = 1000
BS_COMPACT_OPTIONS_VERSION = 1
BS_SUBKEY_SIZE = 41
BS_STREAM_PROCESSING = 1
BS_STREAM_ACTIVE = 2
BS_STREAM_ERRORED = 3
BS_STREAM_STOPPED = 4
BS_STREAM_TERMINATED = 5
BS_HASH_XXH3 = 0
BS_HASH_SHA256 = 1
BS_INSERT = 1
BS_UPDATE = 2
BS_DELETE = 3
BS_OP_PUT = 1
BS_OP_REMOVE = 2
BS_OP_MOVE = 3
BS_OP_CLEAR = 4
BS_SCALAR_NULL = 0
BS_SCALAR_FALSE = 1
BS_SCALAR_TRUE = 2
BS_SCALAR_INT = 3
BS_SCALAR_DOUBLE = 4
BS_SCALAR_STRING = 5
BS_WCP_MANAGED = 0
BS_WCP_CUSTOM = 1
BS_BLOCKED_NONE = 0
BS_BLOCKED_SNAPSHOT = 1
BS_BLOCKED_NO_CHECKPOINT_BEFORE = 2
BS_BLOCKED_CHECKPOINT_LSN = 3
BS_BACKUP_REPLACE = 1
BS_BACKUP_OPTIONS_VERSION = 1
BS_VERSION_MAJOR = 0
CONSTANTS = {k: v for k, v in globals().items() if k.startswith("BS_")}
MAX_LSN = BS_MAX_LSN

# ---- Structs ------------------------------------------------------------------------------

enum = c_int  # C enums here are int-sized


class bs_val(Structure):  # output: an address the library owns (borrowed)
    _fields_ = [("data", c_void_p), ("size", c_size_t)]


class val_in(Structure):  # bs_val filled in by Python
    _fields_ = [("data", c_char_p), ("size", c_size_t)]


class bs_error(Structure):
    _fields_ = [("code", c_int), ("msg", c_char * 256)]


class bs_open_options(Structure):
    _fields_ = [
        ("version", c_uint),
        ("flags", c_uint),
        ("map_size", c_size_t),
        ("checksum_cache_entries", c_size_t),
        ("allocator", c_void_p),
        ("pg_max_connections", c_size_t),
    ]


class bs_stream_options(Structure):
    _fields_ = [("version", c_uint), ("hash", enum)]


class bs_stream_info(Structure):
    _fields_ = [("id", c_uint32), ("name", bs_val), ("state", enum), ("hash", enum)]


class bs_row(Structure):
    _fields_ = [
        ("bucket", val_in),
        ("object_type", val_in),
        ("object_id", val_in),
        ("data", val_in),
    ]


class bs_lookup(Structure):
    _fields_ = [("key", val_in), ("params", POINTER(val_in)), ("n_params", c_size_t)]


class bs_save(Structure):
    _fields_ = [
        ("version", c_uint),
        ("table", val_in),
        ("tag", enum),
        ("before_id", val_in),
        ("after_id", val_in),
        ("rows", POINTER(bs_row)),
        ("n_rows", c_size_t),
        ("lookups", POINTER(bs_lookup)),
        ("n_lookups", c_size_t),
        ("stored_data", val_in),
    ]


class bs_writer_options(Structure):
    _fields_ = [
        ("version", c_uint),
        ("snapshot", c_int),
        ("create_empty", c_int),
        ("max_records", c_size_t),
        ("max_bytes", c_size_t),
    ]


class bs_commit_options(Structure):
    _fields_ = [("version", c_uint), ("create_empty", c_int)]


class bs_commit_result(Structure):
    _fields_ = [
        ("checkpoint_blocked", c_int),
        ("checkpoint_created", c_int),
        ("checkpoint", c_uint64),
        ("blocked_reason", enum),
    ]


class bs_checkpoint(Structure):
    _fields_ = [
        ("op_id", c_uint64),
        ("has_lsn", c_int),
        ("lsn_size", c_size_t),
        ("lsn", c_ubyte * MAX_LSN),
    ]


class bs_op(Structure):
    _fields_ = [
        ("op_id", c_uint64),
        ("type", enum),
        ("checksum", c_uint32),
        ("target_op", c_uint64),
        ("object_type", bs_val),
        ("object_id", bs_val),
        ("subkey", bs_val),
        ("data", bs_val),
    ]


class bs_chunk(Structure):
    _fields_ = [
        ("bucket", bs_val),
        ("after", c_uint64),
        ("next_after", c_uint64),
        ("has_more", c_int),
        ("target_op", c_uint64),
        ("ops", POINTER(bs_op)),
        ("n_ops", c_size_t),
    ]


class bs_bucket_request(Structure):
    _fields_ = [("bucket", val_in), ("after", c_uint64)]


class bs_batch_options(Structure):
    _fields_ = [
        ("version", c_uint),
        ("limit", c_size_t),
        ("chunk_bytes", c_size_t),
        ("max_bytes", c_size_t),
    ]


class bs_checksum(Structure):
    _fields_ = [("checksum", c_uint32), ("count", c_uint64)]


class bs_bucket_info(Structure):
    _fields_ = [
        ("name", bs_val),
        ("checksum", c_uint32),
        ("count", c_uint64),
        ("last_op", c_uint64),
        ("bytes", c_uint64),
        ("generation", c_uint64),
        ("changes", c_uint64),
    ]


class bs_checkpoint_changes(Structure):
    _fields_ = [
        ("invalidate_data_buckets", c_int),
        ("invalidate_parameter_buckets", c_int),
        ("updated_buckets", POINTER(bs_val)),
        ("n_updated_buckets", c_size_t),
        ("updated_lookups", POINTER(bs_val)),
        ("n_updated_lookups", c_size_t),
        ("updated_write_checkpoint_users", POINTER(bs_val)),
        ("n_updated_write_checkpoint_users", c_size_t),
    ]


class bs_scalar(Structure):  # output of bs_lookup_decode
    _fields_ = [("type", enum), ("i", c_int64), ("d", c_double), ("s", bs_val)]


class scalar_in(Structure):  # bs_scalar filled in by Python
    _fields_ = [("type", enum), ("i", c_int64), ("d", c_double), ("s", val_in)]


class bs_head(Structure):
    _fields_ = [("connection", val_in), ("lsn", val_in)]


class bs_managed_request(Structure):
    _fields_ = [
        ("user_id", val_in),
        ("heads", POINTER(bs_head)),
        ("n_heads", c_size_t),
        ("has_request_id", c_int),
        ("request_id", c_uint64),
        ("requested_at_ms", c_int64),
    ]


class bs_compact_stats(Structure):
    _fields_ = [
        (n, c_uint64)
        for n in (
            "buckets_compacted",
            "ops_moved",
            "ops_cleared",
            "ops_removed",
            "bytes_before",
            "bytes_after",
            "parameter_entries_removed",
            "checkpoint_requests_deleted",
            "ops_reemitted",
        )
    ]


PROGRESS_FN = CFUNCTYPE(c_int, POINTER(bs_compact_stats), c_void_p)


class bs_compact_options(Structure):
    _fields_ = [
        ("version", c_uint),
        ("max_op_id", c_uint64),
        ("buckets", POINTER(val_in)),
        ("n_buckets", c_size_t),
        ("min_bucket_changes", c_uint64),
        ("min_change_ratio", c_double),
        ("memory_limit_mb", c_size_t),
        ("incremental_only", c_int),
        ("min_age_ms", c_int64),
        ("max_ops_per_txn", c_size_t),
        ("op_budget", c_uint64),
        ("compact_parameters", c_int),
        ("delete_checkpoint_requests_before_ms", c_int64),
        ("defragment_ratio", c_double),
        ("progress", PROGRESS_FN),
        ("progress_payload", c_void_p),
    ]


class bs_status(Structure):
    _fields_ = [
        ("state", enum),
        ("snapshot_done", c_int),
        ("checkpoint", c_uint64),
        ("last_persisted_op", c_uint64),
        ("has_lsn", c_int),
        ("lsn_size", c_size_t),
        ("lsn", c_ubyte * MAX_LSN),
        ("has_resume_lsn", c_int),
        ("resume_lsn_size", c_size_t),
        ("resume_lsn", c_ubyte * MAX_LSN),
        ("last_error", c_char * 256),
    ]


class bs_stat(Structure):
    _fields_ = [
        (n, c_uint64)
        for n in (
            "streams",
            "buckets",
            "ops_put",
            "ops_remove",
            "ops_move",
            "ops_clear",
            "parameter_entries",
            "source_records",
            "write_checkpoints",
            "file_bytes",
            "reclaimable_bytes",
        )
    ]


class bs_record(Structure):  # output of bs_db_export (borrowed)
    _fields_ = [("table", c_char_p), ("stream", c_uint32), ("key", bs_val), ("value", bs_val)]


class record_in(Structure):  # bs_record filled in by Python for bs_load
    _fields_ = [("table", c_char_p), ("stream", c_uint32), ("key", val_in), ("value", val_in)]


BACKUP_PROGRESS_FN = CFUNCTYPE(c_int, c_uint64, c_void_p)


class bs_backup_options(Structure):
    _fields_ = [
        ("version", c_uint),
        ("flags", c_uint),
        ("progress", BACKUP_PROGRESS_FN),
        ("progress_payload", c_void_p),
        ("allocator", c_void_p),
    ]


# (C type name, mirror): what tests/test_layout.py compares with the compiled header.
STRUCTS = [
    ("bs_val", bs_val),
    ("bs_val", val_in),
    ("bs_error", bs_error),
    ("bs_open_options", bs_open_options),
    ("bs_stream_options", bs_stream_options),
    ("bs_stream_info", bs_stream_info),
    ("bs_row", bs_row),
    ("bs_lookup", bs_lookup),
    ("bs_save", bs_save),
    ("bs_writer_options", bs_writer_options),
    ("bs_commit_options", bs_commit_options),
    ("bs_commit_result", bs_commit_result),
    ("bs_checkpoint", bs_checkpoint),
    ("bs_op", bs_op),
    ("bs_chunk", bs_chunk),
    ("bs_bucket_request", bs_bucket_request),
    ("bs_batch_options", bs_batch_options),
    ("bs_checksum", bs_checksum),
    ("bs_bucket_info", bs_bucket_info),
    ("bs_checkpoint_changes", bs_checkpoint_changes),
    ("bs_scalar", bs_scalar),
    ("bs_scalar", scalar_in),
    ("bs_head", bs_head),
    ("bs_managed_request", bs_managed_request),
    ("bs_compact_stats", bs_compact_stats),
    ("bs_compact_options", bs_compact_options),
    ("bs_status", bs_status),
    ("bs_stat", bs_stat),
    ("bs_record", bs_record),
    ("bs_record", record_in),
    ("bs_backup_options", bs_backup_options),
]

# ---- Callbacks and prototypes -------------------------------------------------------------

STREAM_FN = CFUNCTYPE(c_int, POINTER(bs_stream_info), c_void_p)
SOURCE_FN = CFUNCTYPE(c_int, POINTER(bs_val), c_void_p)
LISTENER_FN = CFUNCTYPE(None, c_uint32, c_uint64, c_void_p)
CHUNK_FN = CFUNCTYPE(c_int, POINTER(bs_chunk), c_void_p)
BUCKET_FN = CFUNCTYPE(c_int, POINTER(bs_bucket_info), c_void_p)
CHANGES_FN = CFUNCTYPE(c_int, POINTER(bs_checkpoint_changes), c_void_p)
PARAMS_FN = CFUNCTYPE(c_int, POINTER(bs_val), c_void_p)
VERIFY_FN = CFUNCTYPE(None, c_char_p, c_void_p)
EXPORT_FN = CFUNCTYPE(c_int, POINTER(bs_record), c_void_p)
LOAD_FN = CFUNCTYPE(c_int, POINTER(record_in), c_void_p)

H = c_void_p  # an opaque handle
E = POINTER(bs_error)
P = POINTER
u64 = c_uint64

_PROTOS = {
    "bs_strerror": (c_char_p, [c_int]),
    "bs_version": (c_char_p, [P(c_int), P(c_int), P(c_int)]),
    "bs_open": (c_int, [P(H), c_char_p, P(bs_open_options), E]),
    "bs_open_memory": (c_int, [P(H), P(bs_open_options), E]),
    "bs_close": (None, [H]),
    "bs_stream_create": (c_int, [P(c_uint32), H, c_char_p, P(bs_stream_options), E]),
    "bs_stream_list": (c_int, [H, STREAM_FN, c_void_p, E]),
    "bs_storage_open": (c_int, [P(H), H, c_uint32, E]),
    "bs_storage_close": (None, [H]),
    "bs_storage_stream_id": (c_uint32, [H]),
    "bs_writer_open": (c_int, [P(H), H, P(bs_writer_options), E]),
    "bs_writer_close": (None, [H]),
    "bs_writer_save": (c_int, [H, P(bs_save), E]),
    "bs_writer_truncate": (c_int, [H, val_in, E]),
    "bs_writer_drop": (c_int, [H, val_in, E]),
    "bs_writer_flush": (c_int, [P(u64), H, E]),
    "bs_writer_commit": (c_int, [P(bs_commit_result), H, val_in, P(bs_commit_options), E]),
    "bs_writer_keepalive": (c_int, [P(bs_commit_result), H, val_in, E]),
    "bs_writer_snapshot_done": (c_int, [H, val_in, E]),
    "bs_writer_resume_lsn": (c_int, [H, val_in, E]),
    "bs_writer_source_row": (c_int, [H, val_in, val_in, SOURCE_FN, c_void_p, E]),
    "bs_writer_custom_write_checkpoint": (c_int, [H, val_in, u64, val_in, E]),
    "bs_writer_custom_write_checkpoint_requested": (c_int, [H, val_in, u64, val_in, c_int64, E]),
    "bs_get_checkpoint": (c_int, [P(bs_checkpoint), H, E]),
    "bs_wait_checkpoint": (c_int, [P(bs_checkpoint), H, P(bs_checkpoint), c_int, E]),
    "bs_set_checkpoint_listener": (c_int, [H, LISTENER_FN, c_void_p]),
    "bs_get_bucket_data": (
        c_int,
        [P(c_int), H, u64, P(bs_bucket_request), c_size_t, P(bs_batch_options), CHUNK_FN,
         c_void_p, E],
    ),
    "bs_get_checksums": (c_int, [P(bs_checksum), H, u64, P(val_in), c_size_t, E]),
    "bs_list_buckets": (c_int, [H, val_in, BUCKET_FN, c_void_p, E]),
    "bs_get_checkpoint_changes": (c_int, [H, u64, u64, CHANGES_FN, c_void_p, E]),
    "bs_get_parameter_sets": (
        c_int, [H, u64, P(val_in), c_size_t, c_size_t, PARAMS_FN, c_void_p, E]
    ),
    "bs_lookup_encode": (c_int, [c_void_p, c_size_t, P(c_size_t), P(scalar_in), c_size_t, E]),
    "bs_lookup_decode": (c_int, [P(bs_scalar), c_size_t, P(c_size_t), val_in, E]),
    "bs_checksum_put": (c_uint32, [enum, val_in, val_in, val_in]),
    "bs_checksum_remove": (c_uint32, [enum, val_in]),
    "bs_subkey": (None, [c_void_p, c_uint32, val_in]),
    "bs_set_write_checkpoint_mode": (c_int, [H, enum, val_in, E]),
    "bs_create_managed_write_checkpoints": (
        c_int, [P(u64), P(c_int), H, P(bs_managed_request), c_size_t, E]
    ),
    "bs_last_write_checkpoint": (c_int, [P(u64), P(c_int), H, val_in, P(bs_head), c_size_t, E]),
    "bs_delete_checkpoint_requests_before": (c_int, [P(u64), H, c_int64, E]),
    "bs_compact": (c_int, [P(bs_compact_stats), H, P(bs_compact_options), E]),
    "bs_compact_initial_replication": (c_int, [P(u64), H, u64, u64, E]),
    "bs_get_status": (c_int, [P(bs_status), H, E]),
    "bs_report_error": (c_int, [H, c_char_p, E]),
    "bs_clear": (c_int, [H, E]),
    "bs_terminate": (c_int, [H, c_int, E]),
    "bs_db_stat": (c_int, [P(bs_stat), H, E]),
    "bs_db_verify": (c_int, [P(u64), H, VERIFY_FN, c_void_p, E]),
    "bs_backup": (c_int, [H, c_char_p, P(bs_backup_options), E]),
    "bs_db_export": (c_int, [H, c_uint32, EXPORT_FN, c_void_p, E]),
    "bs_load": (c_int, [c_char_p, P(bs_backup_options), LOAD_FN, c_void_p, E]),
}

for _name, (_res, _args) in _PROTOS.items():
    try:
        _f = getattr(lib, _name)
    except AttributeError:
        raise ImportError(f"bucketstore: {lib._name} has no {_name} (an older library?)") from None
    _f.restype = _res
    _f.argtypes = _args

_major = c_int(-1)
lib.bs_version(ctypes.byref(_major), None, None)
if _major.value != CONSTANTS["BS_VERSION_MAJOR"]:
    raise ImportError(f"bucketstore: {lib._name} is ABI {_major.value}, this binding mirrors "
                      f"storage.h of ABI {CONSTANTS['BS_VERSION_MAJOR']}")
