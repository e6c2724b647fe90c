#!/usr/bin/env python3
"""py_read_loop.py: bench_py.py's reads through the Python binding alone, for counting
instructions, which the machine's load does not move (bench/README.md, the Python section).

    /usr/bin/python3 bench/bench_py.py --only c,py --runs 1 --keep DIR   # files, bench_c, site/
    valgrind --tool=callgrind /usr/bin/python3 bench/py_read_loop.py HOW DIR/site DIR/py1000.bsdb P
    valgrind --tool=callgrind --toggle-collect=bs_get_bucket_data \\
        DIR/bench_c DIR/c.bsdb 200000 100 10000 120 10000 P read

Per op: (instructions with P = 3 - with P = 1) / (2 * 200k): startup, import and opening cancel
out. HOW: ops (every bucket read whole from 0 through Storage.bucket_data in calls of 10k ops,
as bench_py.py does: the Op objects made, none of their fields read), touch (the same, and each
op's op_id, op, object_id and data read, as bench_node.mjs's readers do), batch (one
bucket_data_batch call a bucket, no generator; the read loop of a client that keeps its own
positions); raw (as ops, through Storage.bucket_data_raw: each chunk's ops one RawOps, none
read), rawtouch (raw, the four fields read through its accessors, object_id and data as str),
rawbytes (raw, op_id and op read, object_id's and data's byte_start/byte_end: no str made).
"""

import sys


def main():
    hows = ("ops", "touch", "batch", "raw", "rawtouch", "rawbytes")
    if len(sys.argv) != 5 or sys.argv[1] not in hows:
        raise SystemExit(f"usage: py_read_loop.py {'|'.join(hows)} SITE FILE PASSES")
    how, site, file, passes = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    sys.path.insert(0, site)
    import bucketstore as bs

    PUT = bs.OpType.PUT
    buckets = ['by_list["l%05d"]' % b for b in range(100)]
    total = 0
    with bs.open(file, readonly=True) as db:
        with db.storage() as st:
            cp = st.checkpoint().op_id
            for _ in range(passes):
                for b in buckets:
                    if how == "batch":
                        after, more = 0, True
                        while more:
                            got = st.bucket_data_batch(cp, {b: after}, limit=10000)
                            for ch in got.chunks:
                                total += len(ch.ops)
                                after = ch.next_after
                            more = got.has_more
                        continue
                    if how.startswith("raw"):
                        for ch in st.bucket_data_raw(cp, {b: 0}, limit=10000):
                            ops = ch.ops
                            if how == "raw":
                                total += len(ops)
                            elif how == "rawtouch":
                                for i in range(len(ops)):
                                    total += (ops.op_id(i) & 1) + (ops.op(i) == PUT) + \
                                        len(ops.object_id(i) or "") + len(ops.data(i) or "")
                            else:
                                for i in range(len(ops)):
                                    total += (ops.op_id(i) & 1) + (ops.op(i) == PUT) + \
                                        ops.byte_end(i, "object_id") - \
                                        ops.byte_start(i, "object_id") + \
                                        ops.byte_end(i, "data") - ops.byte_start(i, "data")
                        continue
                    for ch in st.bucket_data(cp, {b: 0}, limit=10000):
                        if how == "ops":
                            total += len(ch.ops)
                        else:
                            for op in ch.ops:
                                total += (op.op_id & 1) + (op.op == PUT) + \
                                    len(op.object_id or "") + len(op.data or "")
    print(total)


if __name__ == "__main__":
    main()
