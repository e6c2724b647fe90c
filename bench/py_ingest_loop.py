#!/usr/bin/env python3
"""py_ingest_loop.py: bench_py.py's ingest through the Python binding alone, for counting
instructions, which the machine's load does not move (bench/README.md, the Python section).

    /usr/bin/python3 bench/bench_py.py --only c,py --runs 1 --keep DIR   # bench_c, site/
    valgrind --tool=callgrind /usr/bin/python3 bench/py_ingest_loop.py HOW DIR/site DIR/ingest P
    valgrind --tool=callgrind --toggle-collect=bs_writer_save --toggle-collect=bs_writer_commit \\
        --toggle-collect=bs_writer_snapshot_done DIR/bench_c DIR/c.bsdb 20000 100 10000 120 0 0

Per row: (instructions with P = 3 - with P = 1) / (2 * ROWS): startup, import, making the rows
and opening the file cancel out. Each pass ingests bench_py.py's workload (ROWS = 20000 rows of
120 B into 100 buckets, a commit every 10000, nosync) into a new stream of one file in the folder
DIR/ingest. HOW: save (one
Writer.save per row, as bench_py.py's "python save"), many (Writer.save_many of 1000 rows a
call, as "python save_many"). The C client's count is its ingest's library calls, per row
(instructions / ROWS): the loop around them is a few instructions a row.
"""

import os
import pathlib
import shutil
import sys

ROWS, BUCKETS, COMMIT, DATA_SIZE, BATCH = 20000, 100, 10000, 120, 1000


def main():
    hows = ("save", "many")
    if len(sys.argv) != 5 or sys.argv[1] not in hows:
        raise SystemExit(f"usage: py_ingest_loop.py {'|'.join(hows)} SITE DIR PASSES")
    how, site, d, passes = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3]), int(sys.argv[4])
    sys.path.insert(0, site)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bucketstore as bs
    from bench_py import gen_data

    buckets = ['by_list["l%05d"]' % b for b in range(BUCKETS)]
    rows = [("r%08d" % i, buckets[i % BUCKETS], gen_data(i, DATA_SIZE)) for i in range(ROWS)]
    lsn = "0000000000000001"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    # One file, a new stream a pass: opening a file is not per row, and the C client's count
    # leaves it out too.
    with bs.open(d / "ingest.bsdb", nosync=True) as db:
        for p in range(passes):
            with db.storage(db.create_stream(f"bench{p}")) as st:
                with st.writer(snapshot=True) as w:
                    save, commit = w.save, w.commit
                    if how == "many":
                        for i in range(0, ROWS, BATCH):
                            w.save_many([("todos", "insert", rid, [(b, "todos", rid, data)])
                                         for rid, b, data in rows[i:i + BATCH]])
                            if (i + BATCH) % COMMIT == 0:
                                commit(lsn)
                    else:
                        for i, (rid, b, data) in enumerate(rows, 1):
                            save("todos", "insert", rid, [(b, "todos", rid, data)])
                            if i % COMMIT == 0:
                                commit(lsn)
                    w.snapshot_done(lsn)
                    commit(lsn)
    shutil.rmtree(d)


if __name__ == "__main__":
    main()
