#!/usr/bin/python3
"""Driver differential test: the same seeded random command sequence through
`bucketstore drive --memory` and `bucketstore drive --nosync --db FILE`, every reply compared.

usage: tests/driver_diff.py BIN [--seed N] [--seeds N] [--steps N] [--messages] [--strict NAME|all]
                           [--print] [--postgres URL]
  --seed N    first seed (default: BS_SEED_BASE, 1 unless set, in the seed block of the run's
              pair of its own, SEED_BLOCKS, as tests/util_contract.h's ct_first_seed gives the C
              suites theirs); --seeds N: how many seeds (default 5). Each seed run is appended
              to the file BS_SEED_LOG names, when set (tests/step.sh --seeds checks the log)
  --steps N   commands per seed (default 300)
  --messages  compare error messages too (by default only error codes)
  --strict NAME  compare a known disagreement that is skipped by default (see KNOWN)
  --print     write the seed's command sequence to stdout and exit (for reproduction)
  --postgres URL  the second side is `drive --nosync --postgres URL` instead of the LMDB file,
              each seed in a schema of its own on that server (psql creates and drops it)

Each backend's replies are also checked against a naive model of the contract
(tests/driver_model.py: op ids, commits, stream states, clears, checksums, counts and bucket data
as a client reduces them), written independently of the engine whose shared rules both sides run.
On a disagreement it prints the seed, the command index (1-based), the command, both replies
and a one-line reproduction, and exits 1. Before the seeds, one fixed sequence (limit_lines)
writes op data and stored data of exactly BS_MAX_OP_DATA bytes and one byte over on both sides:
the replies must agree and hold what the contract says (refused; kept whole). Python 3 stdlib
only.
"""
import json
import os
import random
import re
import subprocess
import sys
import tempfile

import driver_model

# Reply fields that legitimately differ between the backends, with the reason. Nothing else is
# ignored. Besides these, error.message is compared only with --messages: each backend words its
# own messages (both name the argument); the code is always compared.
IGNORED = {
    "stat": {
        "file_bytes": "the memory backend has no file",
        "reclaimable_bytes": "free LMDB pages; the memory backend has none",
    },
}

MAX_BUCKET = 480  # contract.md section 10 (storage.h BS_MAX_*)
MAX_LOOKUP = 480
MAX_REPLICA = 256
MAX_TABLE = 256
MAX_USER = 480
MAX_STREAM = 255
MAX_LSN = 255
MAX_OP_DATA = 15 * 1024 * 1024  # BS_MAX_OP_DATA
MAX_OBJECT = 65535  # BS_MAX_OBJECT_NAME: an output's object type and object id

# The edge pool: strings every generator draws from ("", one byte, non-ASCII, astral: U+10000,
# U+10FFFF, an emoji; JSON's specials; NUL bytes, which a field of bytes keeps and a name the
# library takes as a C string refuses, docs/driver.md).
EDGE = ["", "a", "\u00e9", "\u65e5\u672c", "\U0001f600", "\U00010000", "\U0010ffff", '"', "\\",
        "a\"b\\c", "1", "1.0", "null", " ", "x" * 64, "a\u0000b", "\u0000", "\u00e9\u0000"]
# Strings the driver refuses wherever they stand: a lone surrogate is no Unicode text (invalid
# JSON, BS_EINVAL). Drawn now and then (edge()).
REFUSED = ["\ud800", "\udc00", "a\ud83db"]


def raw(token):
    """A JSON number written as given (1e0, 10e-1): Gen.line() unquotes it."""
    return "\x01" + token + "\x01"


RAW = re.compile(r'"\\u0001([^"\\]*)\\u0001"')
# Lookup values; integral numbers are one key however spelled (contract.md 5.4: 1, 1.0, 1e0,
# 10e-1), integers beyond 2^53 exactly (2^53 + 1 is not 2^53, but the double 2^53 + 1.0 is);
# integers beyond int64 (2^63, -2^63 - 1, 2^64 + 1) refused naming the field, the double 2^63 not.
LOOKUP_VALUES = [1, 1.0, raw("1e0"), raw("10e-1"), raw("100E-2"), -0.0, raw("-0e0"), 0, -1,
                 True, False, None, 2**53, float(2**53), 2**53 + 1, raw("9007199254740993.0"),
                 -(2**53 + 1), 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64 + 1,
                 float(2**63), 3.14, raw("314e-2"), "", "1", "u1",
                 "\u00e9", "\U0001f600", '"', "\\"]


# Op data that looks like numbers: text to the library, hashed and served as given.
NUMBER_TEXTS = ["1", "1.0", "1e0", "-0", "0", '{"v":1}', '{"v":1.0}', '{"v":1e0}', "01"]
# Values of a parameter row (a JSON object the driver stores as jansson writes it).
PARAM_NUMBERS = [1, 1.0, raw("1e0"), raw("10e-1"), 0, -0.0, 2**53 + 1, float(2**53), 3.14, True,
                 None]


# Op id arguments at their edges (docs/driver.md: a decimal string below 2^63): 2^32, 2^53 (the
# last integer a JavaScript number holds) and 2^63 - 1 taken, leading zeros are digits; 2^63,
# 2^64 - 1, "", "-1", "1.0", " 1", "1e3" and a JSON number refused naming the field.
OP_ID_EDGES = ["0", "00", "007", str(2**32 - 1), str(2**32), str(2**53), str(2**53 + 1),
               str(2**63 - 1), str(2**63), str(2**64 - 1), "", "-1", "1.0", " 1", "1e3", 7]
MAX_EVENT = 255
MAX_USER_EVENT = 504  # a custom write checkpoint's user_id and event together

# memory/lmdb's and memory/postgres's seed blocks, of CT_SEED_BLOCK seeds each, as the registry
# of every block (tests/util_contract.c seed_blocks) gives them.
SEED_BLOCK = 1000000
SEED_BLOCKS = {"lmdb": 21, "postgres": 22}


def edge(rng, extra=()):
    if rng.random() < 0.02:
        return rng.choice(REFUSED)
    pool = EDGE + list(extra)
    return rng.choice(pool)


def sized(rng, plain, limit):
    """Now and then a value of the limit's length, or one over (refused: BS_ETOOBIG), or an
    edge; else one of plain."""
    x = rng.random()
    if x < 0.02:
        return "y" * limit
    if x < 0.03:
        return "y" * (limit + 1)
    if x < 0.05:
        return edge(rng)
    return rng.choice(plain)


class Gen:
    """Random command lines. The generator does not read replies: both backends get the same
    input, so its choices only need to make interesting states likely."""

    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.streams = 0
        self.lsn = 0
        self.ops = 0  # an upper bound guess of the op ids used so far (for checkpoints)
        self.tables = ["t", "u", "\u00e9", "\U0001f600", "x" * MAX_TABLE]
        self.ids = ["r1", "r2", "r3", "", "\u00e9", "\U0010ffff", "x" * MAX_REPLICA]
        self.buckets = ["b[]", "c[\"1\"]", "d", "\u65e5[]", "\U00010000", "q" * MAX_BUCKET]
        self.users = ["u1", "u2", "u1/c1", "", "\u00e9", "\U0001f600", "w" * MAX_USER]
        self.lookups = []  # keys saved so far: reads and later saves draw them again
        self.open = {}  # "stream" or "snapshot" by the name of each writer opened since the last reopen, stream or lifecycle change

    def r(self):
        return self.rng.random()

    def choice(self, xs):
        return self.rng.choice(xs)

    def next_lsn(self):
        self.lsn += self.rng.choice([0, 1, 1, 2])
        return self.fmt_lsn(self.lsn)

    def fmt_lsn(self, n):
        return "00000000/%08X" % max(n, 0)

    def some_lsn(self):
        x = self.r()
        if x < 0.01:  # the longest LSN (above every other), or one byte over
            return "00000000/" + "F" * (MAX_LSN - 9 + (x < 0.003))
        return self.fmt_lsn(self.lsn + self.rng.randint(-2, 2))

    def op_id(self, hi):
        """An op id argument in [0, hi], or now and then an edge (OP_ID_EDGES)."""
        if self.r() < 0.04:
            return self.choice(OP_ID_EDGES)
        return str(self.rng.randint(0, hi))

    def cp(self):
        return self.op_id(self.ops + 2)

    def event(self, user=""):
        """A write checkpoint event: mostly an edge string; now and then the longest (255 bytes)
        or one over, or one that makes user and event together exactly the 504 bytes allowed, or
        one over (BS_ETOOBIG)."""
        x = self.r()
        if x < 0.1:
            return "e" * (MAX_EVENT + (x < 0.03))
        if x < 0.2:
            n = MAX_USER_EVENT - len(user.encode("utf-8", "surrogatepass")) + (x < 0.13)
            return "e" * max(min(n, MAX_EVENT + 1), 0)
        return edge(self.rng)

    def bucket(self):
        if self.r() < 0.03:
            return self.choice(["", "q" * (MAX_BUCKET + 1), edge(self.rng)])
        return self.choice(self.buckets)

    def lookup(self):
        """A lookup key's values: half the time one drawn before (so that saves replace and
        tombstone each other's entries and reads find rows), else new ones, remembered."""
        if self.lookups and self.r() < 0.5:
            return self.choice(self.lookups)
        n = self.rng.randint(0, 3)
        vals = [self.choice(LOOKUP_VALUES) for _ in range(n)]
        if n and self.r() < 0.05:  # a long string: keys of about BS_MAX_LOOKUP_KEY, 480 among them
            vals[-1] = "k" * self.rng.randint(MAX_LOOKUP - 20, MAX_LOOKUP)
        if len(self.lookups) < 12:
            self.lookups.append(vals)
        return vals

    def data(self):
        x = self.r()
        if x < 0.02:  # about the LMDB backend's chunk of ops (lmdb_ops.c CHUNK_CAP, 4080 bytes)
            return "z" * self.rng.randint(3900, 4100)
        if x < 0.05:  # op data is text kept as given: 1 and 1.0 are two rows, two checksums
            return self.choice(NUMBER_TEXTS)
        if x < 0.1:
            return ""
        if x < 0.2:
            return edge(self.rng)
        return json.dumps({"v": self.rng.randint(0, 9), "s": edge(self.rng)})

    def object_name(self, plain):
        """An output's object type or id: now and then the longest (BS_MAX_OBJECT_NAME bytes, of
        two-byte characters too) or one byte over (BS_ETOOBIG)."""
        x = self.r()
        if x < 0.01:
            return "o" * (MAX_OBJECT + (x < 0.003))
        if x < 0.015:
            return "\u00e9" * (MAX_OBJECT // 2)
        return self.choice(plain)

    def param_row(self):
        """A bucket-parameter row: an edge string, or numbers whose kind a row keeps (1, 1.0,
        1e0 (the double 1.0), -0.0, 2^53 + 1)."""
        if self.r() < 0.4:
            return {"p": self.choice(PARAM_NUMBERS)}
        return {"p": edge(self.rng)}

    def writer(self, cmd):
        """cmd for "main" mostly; for "snap", a snapshot writer, once it was opened as one (the
        first time a writer.open of it in snapshot mode instead of cmd); and now and then for "b",
        a second streaming writer beside the open "main": BS_EBUSY, on purpose (contract.md 4.3),
        as is now and then a second snapshot writer (c_writer_open). Writers drawn blindly (a
        fifth "b", a fifth "snap" opened as a second streaming writer) had 26% of all commands
        answer BS_EBUSY."""
        x = self.r()
        if x < 0.06 and self.open.get("main") != "snapshot":
            if "snap" not in self.open:
                self.open["snap"] = "snapshot"
                return {"cmd": "writer.open", "writer": "snap", "snapshot": True}
            cmd["writer"] = "snap"
        elif x < 0.08 and self.open.get("main") == "stream":
            cmd["writer"] = "b"
        else:
            self.open.setdefault("main", "stream")
            if self.r() < 0.2:
                cmd["writer"] = "main"
        return cmd

    def stream(self, cmd):
        if self.streams and self.r() < 0.1:
            cmd["stream"] = self.rng.randint(1, self.streams + 1)
        return cmd

    # ---- commands --------------------------------------------------------------------------
    def c_stream_create(self):
        self.streams += 1
        self.open.clear()
        c = {"cmd": "stream.create",
             "name": sized(self.rng, ["s", "v%d" % self.streams, "\u00e9"], MAX_STREAM)}
        if self.r() < 0.4:
            c["checksum"] = self.choice(["xxh3", "sha256", "md5"])
        return c

    def c_save(self):
        tag = self.choice(["insert", "update", "update", "delete"])
        c = {"cmd": "save", "table": sized(self.rng, self.tables, MAX_TABLE), "tag": tag,
             "id": sized(self.rng, self.ids, MAX_REPLICA)}
        if self.r() < 0.15:
            c["old_id"] = sized(self.rng, self.ids, MAX_REPLICA)
        if tag != "delete" or self.r() < 0.1:
            rows = []
            for _ in range(self.rng.randint(0, 3)):
                rows.append({"bucket": self.bucket(), "type": self.object_name(["t", "", "\u00e9"]),
                             "id": self.object_name(self.ids + ["o1"]), "data": self.data()})
            c["rows"] = rows
            self.ops += len(rows) + 2
            if self.r() < 0.5:
                c["lookups"] = [{"lookup": self.lookup(),
                                 "params": [self.param_row()
                                            for _ in range(self.rng.randint(0, 2))]}
                                for _ in range(self.rng.randint(0, 2))]
                self.ops += 2
        if self.r() < 0.2:
            c["store"] = edge(self.rng)
        out = self.writer(c)
        if self.open.get(out.get("writer", "main")) == "snapshot" and self.r() < 0.95:
            c["tag"] = "insert"  # a snapshot writer refuses the others (BS_ESTATE), kept rare
        return out

    def c_writer_open(self):
        """Reopens "main", in snapshot mode now and then, and then only rarely beside the open
        "snap" (BS_EBUSY, and "main" stays closed)."""
        c = {"cmd": "writer.open"}
        if self.r() < 0.5:
            c["snapshot"] = self.r() < (0.5 if "snap" not in self.open else 0.05)
        if self.r() < 0.3:
            c["create_empty"] = self.r() < 0.5
        if c.get("snapshot") and "snap" in self.open:
            self.open.pop("main", None)
        else:
            self.open["main"] = "snapshot" if c.get("snapshot") else "stream"
        if self.r() < 0.2:
            c["writer"] = "main"
        return c

    def c_commit(self):
        c = {"cmd": self.choice(["commit", "commit", "keepalive"]),
             "lsn": self.next_lsn() if self.r() < 0.8 else self.some_lsn()}
        if self.r() < 0.2:
            c["create_empty"] = self.r() < 0.5
        return self.writer(c)

    def c_lsn_cmd(self):
        return self.writer({"cmd": self.choice(["snapshot_done", "resume_lsn"]),
                            "lsn": self.some_lsn() if self.r() < 0.5 else self.next_lsn()})

    def c_misc_writer(self):
        x = self.r()
        if x < 0.5:
            return self.writer({"cmd": "flush"})
        if x < 0.7:
            return self.writer({"cmd": "truncate", "table": self.choice(self.tables)})
        return self.writer({"cmd": "source_row", "table": self.choice(self.tables),
                            "id": self.choice(self.ids)})

    def c_bucket_data(self):
        bs = {}
        for _ in range(self.rng.randint(0, 3)):
            bs[self.bucket()] = self.op_id(self.ops)
        c = {"cmd": "bucket_data", "checkpoint": self.cp(), "buckets": bs}
        if self.r() < 0.5:
            c["limit"] = self.choice([0, 1, 2, 5, 1000])
        if self.r() < 0.5:
            c["chunk_bytes"] = self.choice([0, 1, 40, 100, 1 << 20])
        return self.stream(c)

    def c_checksums(self):
        return self.stream({"cmd": "checksums", "checkpoint": self.cp(),
                            "buckets": [self.bucket() for _ in range(self.rng.randint(0, 3))]})

    def c_parameter_sets(self):
        c = {"cmd": "parameter_sets", "checkpoint": self.cp(),
             "lookups": [self.lookup() for _ in range(self.rng.randint(0, 3))]}
        if self.r() < 0.3:
            c["limit"] = self.choice([0, 1, 2, 1000])
        return self.stream(c)

    def c_changes(self):
        a = self.rng.randint(0, self.ops + 1)
        if self.r() < 0.1:  # edges, from above to among them
            return self.stream({"cmd": "checkpoint_changes", "from": self.op_id(a),
                                "to": self.op_id(a)})
        return self.stream({"cmd": "checkpoint_changes", "from": str(a),
                            "to": str(a + self.rng.randint(0, 10))})

    def c_compact(self):
        if self.r() < 0.25:
            c = {"cmd": "compact_initial_replication"}
            if self.r() < 0.3:
                c["max_op_id"] = self.cp()
            if self.r() < 0.3:
                c["min_bucket_changes"] = self.rng.randint(0, 5)
            return self.stream(c)
        c = {"cmd": "compact"}
        opts = {"max_op_id": lambda: self.cp(),
                "buckets": lambda: [self.bucket() for _ in range(self.rng.randint(0, 2))],
                "min_bucket_changes": lambda: self.rng.randint(0, 12),
                "min_change_ratio": lambda: self.choice([0, 0.1, 0.5, 1]),
                "memory_limit_mb": lambda: self.choice([1, 64]),
                "incremental_only": lambda: self.r() < 0.5,
                "compact_parameters": lambda: self.r() < 0.5,
                "delete_checkpoint_requests_before": lambda: self.rng.randint(0, 2000),
                "min_age_ms": lambda: self.choice([-1, 0]),
                "max_ops_per_txn": lambda: self.choice([1, 3, 1000])}
        for k, f in opts.items():
            if self.r() < 0.3:
                c[k] = f()
        if "incremental_only" in c and "min_age_ms" not in c:
            c["min_age_ms"] = 0  # the default age would depend on the clock
        return self.stream(c)

    def heads(self):
        return {self.choice(["1", "2"]): self.some_lsn() for _ in range(self.rng.randint(1, 2))}

    def c_wcp(self):
        x = self.r()
        if x < 0.1:
            c = {"cmd": "write_checkpoint.mode", "mode": self.choice(["managed", "custom"])}
            if self.r() < 0.3:
                c["event"] = self.event()
            return self.stream(c)
        if x < 0.4:
            items = []
            for _ in range(self.rng.randint(1, 3)):
                it = {"user_id": self.choice(self.users), "heads": self.heads()}
                if self.r() < 0.4:
                    it["request_id"] = str(self.rng.randint(1, 12))
                # absent would be "now" (the clock); an explicit 0 is refused
                it["requested_at"] = 0 if self.r() < 0.05 else self.rng.randint(1, 2000)
                items.append(it)
            return self.stream({"cmd": "write_checkpoint.create_managed", "items": items})
        if x < 0.6:
            c = {"cmd": "write_checkpoint.custom", "user_id": sized(self.rng, self.users, MAX_USER),
                 "checkpoint": self.op_id(20)}
            if self.r() < 0.3:
                c["event"] = self.event(c["user_id"])
            if self.r() < 0.5:
                c["requested_at"] = self.rng.randint(0, 2000)
            return self.writer(c)
        if x < 0.85:
            c = {"cmd": "write_checkpoint.last", "user_id": self.choice(self.users)}
            y = self.r()
            if y < 0.4:
                c["lsn"] = self.some_lsn()
            elif y < 0.8:
                c["heads"] = self.heads()
            return self.stream(c)
        return self.stream({"cmd": "write_checkpoint.delete_before",
                            "before": self.rng.randint(0, 2000)})

    def c_read_misc(self):
        return self.stream({"cmd": self.choice(["checkpoint", "stream.list", "stream.status",
                                                "stat", "verify"])})

    def c_lifecycle(self):
        self.open.clear()
        x = self.r()
        if x < 0.4:
            return {"cmd": "reopen"}
        if x < 0.7:
            return self.stream({"cmd": "clear"})
        c = {"cmd": "terminate"}
        if self.r() < 0.5:
            c["clear"] = self.r() < 0.5
        return self.stream(c)

    def c_malformed(self):
        return self.choice(['garbage {', '[1,2]', '"cmd"', '{"cmd":"nope"}', '{"cmd":7}',
                            '{"cmd":"save","table":"t","tag":"insert"}',
                            '{"cmd":"commit","lsn":1}',
                            '{"cmd":"bucket_data","checkpoint":"-1","buckets":{}}',
                            '{"cmd":"bucket_data","checkpoint":"9223372036854775808",'
                            '"buckets":{}}',
                            '{"cmd":"checksums","checkpoint":"1","buckets":"b"}',
                            '{"cmd":"flush","echo":{"a":[1,"\\u00e9"]}}'])

    def line(self):
        if self.streams == 0 or self.r() < 0.01:
            return json.dumps(self.c_stream_create())
        table = [(30, self.c_save), (4, self.c_writer_open), (8, self.c_commit),
                 (5, self.c_lsn_cmd), (6, self.c_misc_writer), (8, self.c_bucket_data),
                 (6, self.c_checksums), (4, self.c_parameter_sets), (3, self.c_changes),
                 (3, self.c_compact), (7, self.c_wcp), (4, self.c_read_misc),
                 (1, self.c_lifecycle), (1, self.c_malformed)]
        x = self.rng.uniform(0, sum(w for w, _ in table))
        for w, f in table:
            x -= w
            if x <= 0:
                out = f()
                break
        else:
            out = table[-1][1]()
        if isinstance(out, str):
            return out
        if self.r() < 0.03:
            out["echo"] = self.choice([1, "e", None, [True]])
        try:  # a lone surrogate has no UTF-8: only its \u escape writes it
            line = json.dumps(out, ensure_ascii=self.r() < 0.5)
            line.encode("utf-8")
        except UnicodeEncodeError:
            line = json.dumps(out)
        return RAW.sub(r"\1", line)


def sequence(seed, steps):
    g = Gen(seed)
    return [g.line() for _ in range(steps)]


def run(binary, args, lines):
    p = subprocess.run([binary, "drive"] + args, input=("\n".join(lines) + "\n").encode(),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
    return p.returncode, p.stdout.decode("utf-8", "replace").splitlines(), p.stderr.decode(
        "utf-8", "replace")


COMPARE_MESSAGES = False

# Known disagreements not yet settled, each skipped unless --strict NAME (or --strict all) turns
# its comparison on. Keep this list short: an entry is a bug to fix, not a rule.
KNOWN = {
    "changes_users": "checkpoint_changes updated_write_checkpoint_users with a `from` that "
                     "was never a checkpoint: LMDB files a user under the flush that persisted "
                     "its write checkpoint, memory under the commit that made it visible; for a "
                     "`from` that was a checkpoint (what sync clients pass) and below `to` "
                     "memory's users must be among LMDB's, always compared; from == to is "
                     "compared only with --strict (memory then reports the users of every "
                     "checkpoint at that op id, an allowed extra)",
}
STRICT = set()

# checkpoint_changes may report extra entries, never miss one (contract.md 5.1). The memory backend
# is exact; LMDB keeps one change record per flush/commit ([first, last] op ids), so it reports
# every bucket, lookup and user of a record that meets the range. So the rule compared is:
# memory's lists are subsets of LMDB's, and memory invalidates only when LMDB does.
CHANGE_LISTS = [("updated_buckets", "invalidate_data_buckets"),
                ("updated_lookups", "invalidate_parameter_buckets"),
                ("updated_write_checkpoint_users", None)]


def changes_agree(mem, lmdb, users_exact):
    if not (isinstance(mem, dict) and isinstance(lmdb, dict)) or not mem.get("ok") or \
            not lmdb.get("ok"):
        return mem == lmdb
    for lst, flag in CHANGE_LISTS:
        if lst == "updated_write_checkpoint_users" and not users_exact and \
                "changes_users" not in STRICT:
            continue
        if flag and mem.get(flag) and not lmdb.get(flag):
            return False
        if flag and lmdb.get(flag):
            continue
        have = [json.dumps(x, sort_keys=True) for x in lmdb.get(lst, [])]
        if any(json.dumps(x, sort_keys=True) not in have for x in mem.get(lst, [])):
            return False
    return True


def _int(x):
    try:
        return int(x)
    except (TypeError, ValueError):
        return -1


def agree(cmd, a, b, checkpoints=()):
    """checkpoints: a Checkpoints of the replies so far."""
    name = cmd.get("cmd") if isinstance(cmd, dict) else None
    a, b = normalise(cmd, a), normalise(cmd, b)
    if name == "checkpoint_changes":
        # from == to (an empty checkpoint at the same op id): memory reports the users of every
        # checkpoint at that op id, an allowed extra, so only from < to is compared
        users_exact = cmd.get("from") in checkpoints and _int(cmd.get("from")) < _int(
            cmd.get("to"))
        return changes_agree(a, b, users_exact)
    return a == b


class Checkpoints:
    """The checkpoints a client can have read before a commit acknowledged write checkpoints:
    every checkpoint that a newer one replaced (and "0"). A `from` among them is what a sync
    client passes to checkpoint_changes."""

    def __init__(self):
        self.current, self.older = "0", {"0"}

    def __contains__(self, op_id):
        return op_id in self.older

    def seen(self, reply):
        try:
            v = json.loads(reply)
        except ValueError:
            return
        if isinstance(v, dict) and v.get("checkpoint_created") and \
                isinstance(v.get("checkpoint"), str):
            self.older.add(self.current)
            self.current = v["checkpoint"]


def normalise(cmd, reply):
    """The reply as a value, with IGNORED fields dropped."""
    try:
        v = json.loads(reply)
    except ValueError:
        return ("not json", reply)
    name = cmd.get("cmd") if isinstance(cmd, dict) else None
    if isinstance(v, dict):
        for k in IGNORED.get(name, {}):
            v.pop(k, None)
        if not COMPARE_MESSAGES and isinstance(v.get("error"), dict):
            v["error"].pop("message", None)
    return v


POSTGRES = None  # --postgres URL


def psql(sql):
    subprocess.run(["psql", "-q", "-v", "ON_ERROR_STOP=1", POSTGRES, "-c",
                    "SET client_min_messages = warning; " + sql], check=True)


def run_postgres(binary, seed, lines):
    """The sequence on the PostgreSQL backend, in a schema of its own (dropped after)."""
    schema = "bs_ddiff_%d_%d" % (os.getpid(), seed)
    psql("DROP SCHEMA IF EXISTS %s CASCADE; CREATE SCHEMA %s" % (schema, schema))
    url = "%s%coptions=-csearch_path%%3D%s" % (POSTGRES, "&" if "?" in POSTGRES else "?", schema)
    try:
        return run(binary, ["--nosync", "--postgres", url], lines)
    finally:
        psql("DROP SCHEMA %s CASCADE" % schema)


def limit_lines():
    """Op data and stored data of exactly MAX_OP_DATA bytes, and one byte over, with what each
    reply must hold: (line, check), check(reply) returning what is wrong or None. The bytes vary
    (no two neighbours alike, distinct ends), so a truncated or shifted copy cannot match."""
    period = "".join(chr(97 + (i * 7 + i // 26) % 26) for i in range(26 * 27))
    big = "<" + (period * (MAX_OP_DATA // len(period) + 1))[1:MAX_OP_DATA - 1] + ">"
    assert len(big.encode()) == MAX_OP_DATA

    def ok(r):
        return None if r.get("ok") is True else "not ok"

    def too_big(r):
        err = r.get("error") or {}
        return None if err.get("code") == "BS_ETOOBIG" else "not BS_ETOOBIG"

    def data(r):
        ops = [op for c in r.get("chunks", []) for op in c.get("data", [])]
        if len(ops) != 1 or ops[0].get("op") != "PUT":
            return "%d ops, expected the one PUT" % len(ops)
        return None if ops[0].get("data") == big else "the data read back differs (%d bytes)" % (
            len((ops[0].get("data") or "").encode()))

    def count(r):
        got = r.get("checksums", {}).get("b", {}).get("count")
        return None if got == 1 else "count %r, expected 1" % got

    def stored(r):
        return None if r.get("data") == big else "the stored data read back differs"

    def save(data, store):
        return {"cmd": "save", "table": "t", "tag": "insert", "id": "big", "store": store,
                "rows": [{"bucket": "b", "type": "t", "id": "big", "data": data}]}

    cmds = [({"cmd": "stream.create", "name": "big"}, ok),
            (save(big + "!", big), too_big),
            (save(big, big + "!"), too_big),
            (save(big, big), ok),
            ({"cmd": "snapshot_done", "lsn": "1"}, ok),
            ({"cmd": "commit", "lsn": "1"}, lambda r: ok(r) or (
                None if r.get("checkpoint") == "1" else "checkpoint %r, not 1 (one op)" %
                r.get("checkpoint"))),
            ({"cmd": "bucket_data", "checkpoint": "1", "buckets": {"b": "0"}}, data),
            ({"cmd": "bucket_data", "checkpoint": "1", "buckets": {"b": "0"}, "limit": 1,
              "chunk_bytes": 0}, data),
            ({"cmd": "checksums", "checkpoint": "1", "buckets": ["b"]}, count),
            ({"cmd": "source_row", "table": "t", "id": "big"}, stored)]
    return [(json.dumps(c), check) for c, check in cmds]


def check_limits(binary, tmp):
    """limit_lines on both sides: the replies agree and each holds what it must."""
    other = "postgres" if POSTGRES else "lmdb"
    cases = limit_lines()
    lines = [line for line, _ in cases]
    db = os.path.join(tmp, "limits.db")
    rc_m, out_m, err_m = run(binary, ["--memory"], lines)
    if POSTGRES:
        rc_l, out_l, err_l = run_postgres(binary, 0, lines)
    else:
        rc_l, out_l, err_l = run(binary, ["--nosync", "--db", db], lines)
    if rc_m != 0 or rc_l != 0:
        print("limits: exit status memory %d, %s %d\n  memory stderr: %s\n  %s stderr: %s"
              % (rc_m, other, rc_l, err_m[-300:], other, err_l[-300:]))
        return False
    for side, out in (("memory", out_m), (other, out_l)):
        for i, (line, check) in enumerate(cases):
            reply = out[i] if i < len(out) else "{}"
            wrong = check(json.loads(reply))
            if wrong:
                print("limits, %s: command %d (%s...): %s; reply %s..." % (
                    side, i + 1, line[:120], wrong, reply[:300]))
                return False
    for i, line in enumerate(lines):
        if not agree(json.loads(line), out_m[i], out_l[i]):
            print("limits: replies differ at command %d (%s...)" % (i + 1, line[:120]))
            return False
    print("driver limits (memory/%s): op and stored data of %d bytes kept whole, one byte "
          "over refused" % (other, MAX_OP_DATA))
    return True


def check_seed(binary, seed, steps, tmp):
    lines = sequence(seed, steps)
    other = "postgres" if POSTGRES else "lmdb"
    db = os.path.join(tmp, "db")
    for f in (db, db + "-lock"):
        if os.path.exists(f):
            os.unlink(f)
    rc_m, out_m, err_m = run(binary, ["--memory"], lines)
    if POSTGRES:
        rc_l, out_l, err_l = run_postgres(binary, seed, lines)
    else:
        rc_l, out_l, err_l = run(binary, ["--nosync", "--db", db], lines)
    strict = "".join(" --strict " + k for k in sorted(STRICT))
    strict += " --postgres URL" if POSTGRES else ""
    repro = "%s %s --print --seed %d --steps %d%s | %s drive --memory" % (
        sys.executable, sys.argv[0], seed, steps, strict, binary)
    if rc_m != 0 or rc_l != 0:
        print("seed %d: exit status memory %d, %s %d\n  memory stderr: %s\n  %s stderr: %s"
              % (seed, rc_m, other, rc_l, err_m[-300:], other, err_l[-300:]))
        print("  reproduce: " + repro)
        return False
    checkpoints = Checkpoints()
    for i, line in enumerate(lines):
        try:
            cmd = json.loads(line)
        except ValueError:
            cmd = None
        a = out_m[i] if i < len(out_m) else "<no reply>"
        b = out_l[i] if i < len(out_l) else "<no reply>"
        if not agree(cmd, a, b, checkpoints):
            print("seed %d: replies differ at command %d of %d\n  command: %s\n  memory:  %s\n"
                  "  %-8s %s" % (seed, i + 1, len(lines), line, a, other + ":", b))
            print("  reproduce: %s | head -%d | %s drive --memory" % (
                repro.rsplit(" | ", 1)[0], i + 1, binary))
            return False
        checkpoints.seen(a)
    if len(out_m) != len(lines) or len(out_l) != len(lines):
        print("seed %d: %d commands, %d memory replies, %d %s replies"
              % (seed, len(lines), len(out_m), len(out_l), other))
        return False
    for side, out in (("memory", out_m), (other, out_l)):
        if not check_model(seed, lines, out, side, repro):
            return False
    return True


def check_model(seed, lines, out, side, repro):
    """Every reply of one backend against the naive model (tests/driver_model.py): the rules the
    backends share are written once in the engine, so agreeing with each other no longer shows
    them right."""
    model = driver_model.Model()
    for i, line in enumerate(lines):
        try:
            cmd, reply = json.loads(line), json.loads(out[i])
        except ValueError:
            continue
        wrong = model.step(cmd, reply)
        if wrong:
            print("seed %d: %s disagrees with the model at command %d of %d\n  command: %s\n"
                  "  reply:   %s\n  wrong:   %s" % (seed, side, i + 1, len(lines), line[:2000],
                                                    out[i][:2000], wrong[:2000]))
            print("  reproduce: %s | head -%d | %s" % (
                repro.rsplit(" | ", 1)[0], i + 1, repro.rsplit(" | ", 1)[1]))
            return False
    return True


def main():
    argv = sys.argv[1:]
    if not argv or argv[0].startswith("-"):
        binary = None
    else:
        binary = argv.pop(0)
    opts = {"--seed": None, "--seeds": 5, "--steps": 300}
    printing = False
    while argv:
        a = argv.pop(0)
        if a == "--print":
            printing = True
        elif a == "--strict" and argv:
            name = argv.pop(0)
            if name != "all" and name not in KNOWN:
                print("--strict: one of %s or all" % ", ".join(KNOWN), file=sys.stderr)
                return 2
            STRICT.update(KNOWN if name == "all" else [name])
        elif a == "--messages":
            global COMPARE_MESSAGES
            COMPARE_MESSAGES = True
        elif a == "--postgres" and argv:
            global POSTGRES
            POSTGRES = argv.pop(0)
        elif a in opts and argv:
            opts[a] = int(argv.pop(0))
        else:
            print(__doc__, file=sys.stderr)
            return 2
    other = "postgres" if POSTGRES else "lmdb"
    if opts["--seed"] is None:
        opts["--seed"] = (int(os.environ.get("BS_SEED_BASE") or 1)
                          + SEED_BLOCKS[other] * SEED_BLOCK)
    if printing:
        print("\n".join(sequence(opts["--seed"], opts["--steps"])))
        return 0
    if not binary:
        print(__doc__, file=sys.stderr)
        return 2
    failed = 0
    with tempfile.TemporaryDirectory(prefix="bs-ddiff-") as tmp:
        if not check_limits(binary, tmp):
            failed += 1
        for seed in range(opts["--seed"], opts["--seed"] + opts["--seeds"]):
            if os.environ.get("BS_SEED_LOG"):
                with open(os.environ["BS_SEED_LOG"], "a") as log:
                    log.write("driver_diff memory/%s %d\n" % (other, seed))
            if not check_seed(binary, seed, opts["--steps"], tmp):
                failed += 1
                if failed >= 3:
                    break
    print("driver diff (memory/%s): seeds %d..%d, %d steps each: %s" % (
        other, opts["--seed"], opts["--seed"] + opts["--seeds"] - 1,
        opts["--steps"],
        "%d failed" % failed if failed else "all agree"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
