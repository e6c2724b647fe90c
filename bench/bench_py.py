#!/usr/bin/env python3
"""bench_py.py: the Python binding against the C API and the JSON driver, same workload.

Five clients do the same two things on a fresh file each (nosync, so the interface is what is
measured, not the disk):
  ingest: ROWS snapshot rows (INSERT, snapshot writer), one output row each into bucket
          i % BUCKETS, DATA-byte JSON rows (bsbench's generator: replica id r%08d, bucket
          by_list["l%05d"], object type todos), a commit every COMMIT rows, then
          snapshot_done + a commit that makes the checkpoint;
  reads:  every bucket downloaded whole from op 0 at the checkpoint, READ_LIMIT ops per library
          call, a cold pass, then --read-passes passes (the warm map): the fastest is reported.
          Every op is materialised the way that client gets it (C: the borrowed bs_op; Python:
          an Op with str fields, or in raw mode the chunk's RawOps; driver: the parsed JSON
          reply); none reads the ops' fields but the C client (the sum of its data sizes).
Clients: "C API" (a small C program, below, linked with a release build of the library, `make
DEBUG=0 PG=0 BUILD=build-release`, as the Python package compiles it), "python save" and "python
save_many" (bindings/python, pip-installed into the run's temporary folder first; ingest with
one Writer.save per row, or Writer.save_many of BATCH rows per call; the same reads), "python
raw reads" (save_many's ingest again, its reads through Storage.bucket_data_raw: a chunk's ops
one RawOps, their fields in one bytes object, no Op made), "JSON
driver" (the Python process writing `bucketstore drive` commands: saves pipelined through a
writer thread, reads request/reply). Rows are generated before the clock starts (for the driver: as JSON lines).

Usage: /usr/bin/python3 bench/bench_py.py [--rows N] [--buckets N] [--commit N] [--data-size N]
                                 [--read-limit N] [--batch N] [--build DIR] [--c-build DIR]
                                 [--only c,py,driver] [--runs N] [--read-passes N]
                                 [--read-repeat N] [--keep DIR]
Each client runs --runs times (alternating), and the best run's figures are printed: wall-clock
rates and CPU time (process CPU time: less moved by a loaded machine than the rates); after a
cold pass, the reads' rate is the fastest of --read-passes warm passes, their CPU time the mean
of those passes. A pass of the C and Python clients reads every bucket --read-repeat times (20:
one read of the workload takes the C client a few milliseconds, whose fastest of a few runs was
a lucky one and moved the ratios by 2x between runs); the driver's pass reads it once. With
--runs above 1 it also prints each run's read cost against the C client's of the same run: the
spread. --keep DIR leaves the files, the C
client (bench_c) and the installed package (site/) in DIR, for bench/py_read_loop.py.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

C_SOURCE = r"""
#include "storage.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}
static void die(int rc, const char *what, const bs_error *e) {
  fprintf(stderr, "%s: %s (%s)\n", what, bs_strerror(rc), e->msg);
  exit(1);
}
#define TRY(call, what) do { int rc_ = (call); if (rc_) die(rc_, what, &err); } while (0)
typedef struct { unsigned long long ops, bytes, next; } acc;
static int on_chunk(const bs_chunk *c, void *p) {
  acc *a = p;
  for (size_t i = 0; i < c->n_ops; i++) a->bytes += c->ops[i].data.size;
  a->ops += c->n_ops;
  a->next = c->next_after;
  return 0;
}
static void gen_data(char *out, unsigned long long row, size_t size) {
  static const char fill[] = "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz";
  int n = snprintf(out, size + 1, "{\"id\":\"r%08llu\",\"v\":0,\"done\":false,\"d\":\"", row);
  for (size_t i = (size_t)n, off = row % 26; i < size - 2; i++) out[i] = fill[off + (i - n) % 26];
  out[size - 2] = '"', out[size - 1] = '}';
}
static double cpu(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}
/* bench_c FILE ROWS BUCKETS COMMIT DATA_SIZE READ_LIMIT PASSES [read|ingest [REPEAT]]: the
 * ingest (unless "read": FILE was written before, read at its checkpoint), then PASSES passes of
 * reads, each reading every bucket REPEAT times (default 1); prints the ingest's time, the
 * fastest pass after the first (the warm map) and the mean CPU time of those passes. */
int main(int argc, char **argv) {
  unsigned long long rows = strtoull(argv[2], 0, 10), nb = strtoull(argv[3], 0, 10),
                     every = strtoull(argv[4], 0, 10), dsize = strtoull(argv[5], 0, 10),
                     limit = strtoull(argv[6], 0, 10), passes = strtoull(argv[7], 0, 10);
  int read_only = argc > 8 && !strcmp(argv[8], "read");
  unsigned long long repeat = argc > 9 ? strtoull(argv[9], 0, 10) : 1;
  bs_db *db; bs_storage *st; bs_writer *w; bs_error err = {0};
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  bs_writer_options wo = BS_WRITER_OPTIONS_INIT;
  bs_batch_options bo = BS_BATCH_OPTIONS_INIT;
  bs_commit_result cr;
  uint32_t sid;
  char (*rid)[16] = malloc(rows * 16), (*bk)[24] = malloc(nb * 24), *data = malloc(rows * dsize);
  bs_val lsn = {"0000000000000001", 16};
  double t0, c0, t_ingest = 0, c_ingest = 0, t_read = 0, c_read = 0;
  acc a = {0, 0, 0};
  for (unsigned long long i = 0; i < rows; i++) {
    snprintf(rid[i], 16, "r%08llu", i % 100000000ull);
    gen_data(data + i * dsize, i, dsize);
  }
  for (unsigned long long b = 0; b < nb; b++) snprintf(bk[b], 24, "by_list[\"l%05llu\"]", b);
  oo.flags = BS_OPEN_NOSYNC;
  TRY(bs_open(&db, argv[1], &oo, &err), "bs_open");
  if (read_only) {
    bs_checkpoint cp;
    TRY(bs_storage_open(&st, db, 0, &err), "bs_storage_open"); /* the file's one stream */
    TRY(bs_get_checkpoint(&cp, st, &err), "bs_get_checkpoint");
    cr.checkpoint = cp.op_id;
  } else {
    TRY(bs_stream_create(&sid, db, "bench", NULL, &err), "bs_stream_create");
    TRY(bs_storage_open(&st, db, sid, &err), "bs_storage_open");
    wo.snapshot = 1;
    TRY(bs_writer_open(&w, st, &wo, &err), "bs_writer_open");
    t0 = now(), c0 = cpu();
    for (unsigned long long i = 0; i < rows; i++) {
      bs_save s = BS_SAVE_INIT;
      bs_row r;
      r.bucket = (bs_val){bk[i % nb], strlen(bk[i % nb])};
      r.object_type = (bs_val){"todos", 5};
      r.object_id = (bs_val){rid[i], 9};
      r.data = (bs_val){data + i * dsize, dsize};
      s.table = (bs_val){"todos", 5}, s.tag = BS_INSERT, s.after_id = r.object_id;
      s.rows = &r, s.n_rows = 1;
      TRY(bs_writer_save(w, &s, &err), "bs_writer_save");
      if ((i + 1) % every == 0) TRY(bs_writer_commit(&cr, w, lsn, NULL, &err), "commit");
    }
    TRY(bs_writer_snapshot_done(w, lsn, &err), "snapshot_done");
    TRY(bs_writer_commit(&cr, w, lsn, NULL, &err), "commit");
    t_ingest = now() - t0, c_ingest = cpu() - c0;
    bs_writer_close(w);
  }
  for (unsigned long long pass = 0; pass < passes; pass++) {
    a.ops = a.bytes = 0;
    t0 = now(), c0 = cpu();
    for (unsigned long long k = 0; k < repeat * nb; k++) {
      unsigned long long b = k % nb;
      bs_bucket_request req = {{bk[b], strlen(bk[b])}, 0};
      int more = 1;
      bo.limit = limit;
      while (more) {
        TRY(bs_get_bucket_data(&more, st, cr.checkpoint, &req, 1, &bo, on_chunk, &a, &err),
            "bs_get_bucket_data");
        req.after = a.next;
      }
    }
    if (pass == 1 || (pass > 1 && now() - t0 < t_read)) t_read = now() - t0;
    if (pass) c_read += (cpu() - c0) / (double)(passes - 1);
  }
  printf("{\"ingest_s\": %.6f, \"ingest_cpu\": %.6f, \"read_s\": %.6f, \"read_cpu\": %.6f, "
         "\"ops\": %llu, \"bytes\": %llu}\n",
         t_ingest, c_ingest, t_read, c_read, a.ops, a.bytes);
  bs_storage_close(st), bs_close(db);
  free(rid), free(bk), free(data);
  return 0;
}
"""


def gen_data(row, size):
    fill = "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz"
    head = '{"id":"r%08d","v":0,"done":false,"d":"' % row
    off = row % 26
    body = "".join(fill[off + i % 26] for i in range(size - 2 - len(head)))
    return head + body + '"}'


def workload(a):
    buckets = ['by_list["l%05d"]' % b for b in range(a.buckets)]
    rows = [("r%08d" % (i % 100000000), buckets[i % a.buckets], gen_data(i, a.data_size))
            for i in range(a.rows)]
    return buckets, rows


def build_c(a, d):
    # The library as the package compiles it: a release build (DEBUG=0: no BS_ASSERT).
    subprocess.run(["make", "-s", "-C", str(ROOT), "-j2", "DEBUG=0", "PG=0",
                    f"BUILD={a.c_build}", f"{a.c_build}/libbucketstore.a"], check=True)
    exe = d / "bench_c"
    (d / "bench_c.c").write_text(C_SOURCE)
    subprocess.run(["cc", "-O2", "-std=c11", "-D_GNU_SOURCE", "-I", str(ROOT), "-o", str(exe),
                    str(d / "bench_c.c"), str(a.c_build / "libbucketstore.a"), "-llmdb", "-lnettle",
                    "-lpthread"], check=True)


def run_c(a, d):
    exe = d / "bench_c"
    out = subprocess.run([str(exe), str(d / "c.bsdb"), str(a.rows), str(a.buckets),
                          str(a.commit), str(a.data_size), str(a.read_limit),
                          str(a.read_passes + 1), "ingest", str(a.read_repeat)],
                         check=True, capture_output=True, text=True).stdout
    r = json.loads(out)
    return r["ingest_s"], r["ingest_cpu"], r["read_s"], r["read_cpu"], r["ops"]


def install_py(d):
    """The binding as a user gets it: pip install of bindings/python (the C library compiled
    into its extension module), here into a folder of this run."""
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "install",
                    "--no-index", "--no-build-isolation", "--no-deps", "--target",
                    str(d / "site"), str(ROOT / "bindings" / "python")], check=True)
    sys.path.insert(0, str(d / "site"))


def run_py(a, d, buckets, rows, batch=0, raw=False):
    """batch 0: one Writer.save per row; else Writer.save_many of batch rows. raw: the reads
    through Storage.bucket_data_raw (each chunk's ops one RawOps, no Op made)."""
    import bucketstore as bs

    lsn = "0000000000000001"
    with bs.open(d / f"py{'raw' if raw else ''}{batch}.bsdb", nosync=True) as db:
        with db.storage(db.create_stream("bench")) as st:
            with st.writer(snapshot=True) as w:
                save, commit, every = w.save, w.commit, a.commit
                t0, c0 = time.perf_counter(), time.process_time()
                if batch:
                    step = min(batch, every)
                    for i in range(0, len(rows), step):
                        w.save_many([("todos", "insert", rid, [(b, "todos", rid, data)])
                                     for rid, b, data in rows[i:i + step]])
                        if (i + step) // every > i // every:
                            commit(lsn)
                else:
                    for i, (rid, b, data) in enumerate(rows, 1):
                        save("todos", "insert", rid, [(b, "todos", rid, data)])
                        if i % every == 0:
                            commit(lsn)
                w.snapshot_done(lsn)
                cp = commit(lsn).checkpoint
                t_ingest, c_ingest = time.perf_counter() - t0, time.process_time() - c0
            ops, t_read, c_read = read_py(st, cp, buckets, a.read_limit, a.read_passes, raw,
                                          a.read_repeat)
    return t_ingest, c_ingest, t_read, c_read, ops


def read_py(st, cp, buckets, limit, passes, raw, repeat=1):
    """A cold pass, then `passes` warm ones: (ops a pass, the fastest warm pass's wall-clock
    seconds, the warm passes' mean CPU seconds). A pass reads every bucket whole from 0, limit
    ops a library call, repeat times over (as the C client's pass does)."""
    best, cpu = None, 0.0
    read = st.bucket_data_raw if raw else st.bucket_data
    for p in range(passes + 1):
        ops = 0
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(repeat):
            for b in buckets:
                for chunk in read(cp, {b: 0}, limit=limit):
                    ops += len(chunk.ops)
        t, c = time.perf_counter() - t0, time.process_time() - c0
        if p:
            best, cpu = t if best is None else min(best, t), cpu + c / passes
    return ops, best, cpu


def run_driver(a, d, buckets, rows):
    exe = a.build / "bucketstore"
    p = subprocess.Popen([str(exe), "drive", "--db", str(d / "drv.bsdb"), "--nosync"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=1 << 20)
    lsn = "0000000000000001"
    lines = [b'{"cmd":"stream.create","name":"bench"}\n',
             b'{"cmd":"writer.open","snapshot":true}\n']
    for i, (rid, b, data) in enumerate(rows, 1):
        lines.append(json.dumps({"cmd": "save", "table": "todos", "tag": "insert", "id": rid,
                                 "rows": [{"bucket": b, "type": "todos", "id": rid,
                                           "data": data}]}).encode() + b"\n")
        if i % a.commit == 0:
            lines.append(b'{"cmd":"commit","lsn":"%s"}\n' % lsn.encode())
    lines.append(b'{"cmd":"snapshot_done","lsn":"%s"}\n' % lsn.encode())
    lines.append(b'{"cmd":"commit","lsn":"%s"}\n' % lsn.encode())

    def feed():
        for line in lines:
            p.stdin.write(line)
        p.stdin.flush()

    t0 = time.perf_counter()
    t = threading.Thread(target=feed)
    t.start()
    last = None
    for _ in lines:
        last = json.loads(p.stdout.readline())
        if not last.get("ok"):
            raise SystemExit(f"driver: {last}")
    t.join()
    t_ingest = time.perf_counter() - t0
    cp = last["checkpoint"]

    def ask(cmd):
        p.stdin.write(json.dumps(cmd).encode() + b"\n")
        p.stdin.flush()
        r = json.loads(p.stdout.readline())
        if not r.get("ok"):
            raise SystemExit(f"driver: {r}")
        return r

    for _ in range(2):
        ops = 0
        t0 = time.perf_counter()
        for b in buckets:
            after, more = "0", True
            while more:
                r = ask({"cmd": "bucket_data", "checkpoint": cp, "buckets": {b: after},
                         "limit": a.read_limit})
                for c in r["chunks"]:
                    ops += len(c["data"])
                    after = c["next_after"]
                more = r["has_more"]
        t_read = time.perf_counter() - t0
    p.stdin.close()
    p.wait()
    return t_ingest, None, t_read, None, ops


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200000)
    ap.add_argument("--buckets", type=int, default=100)
    ap.add_argument("--commit", type=int, default=10000)
    ap.add_argument("--data-size", type=int, default=120)
    ap.add_argument("--read-limit", type=int, default=10000)
    ap.add_argument("--batch", type=int, default=1000)  # rows per save_many
    ap.add_argument("--build", type=pathlib.Path, default=ROOT / "build")  # the driver's CLI
    ap.add_argument("--c-build", type=pathlib.Path, default=ROOT / "build-release")
    ap.add_argument("--only", default="c,py,driver")
    ap.add_argument("--runs", type=int, default=3)  # the workload this many times: the best
    ap.add_argument("--read-passes", type=int, default=5)  # warm passes a run: the fastest
    # every bucket read this many times a pass (C and Python; the driver once): one read of the
    # workload takes the C client a few milliseconds, too short to time robustly
    ap.add_argument("--read-repeat", type=int, default=20)
    ap.add_argument("--keep", type=pathlib.Path)  # leave the files, bench_c and site/ here
    a = ap.parse_args()
    if a.data_size < 64 or a.rows < a.buckets or a.commit < 1 or a.runs < 1 or a.read_passes < 1 \
            or a.read_repeat < 1:
        ap.error("need --data-size >= 64, --rows >= --buckets, --commit >= 1, --runs >= 1, "
                 "--read-passes >= 1, --read-repeat >= 1")
    only = a.only.split(",")
    print(f"bench_py: {a.rows} rows of {a.data_size} B -> {a.buckets} buckets, commit every "
          f"{a.commit}, nosync; reads {a.read_limit} ops/call, {a.read_passes} warm passes of every "
          f"bucket {a.read_repeat} times (driver: once) (rate: the fastest, CPU: their mean); best of {a.runs} runs; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    buckets, rows = workload(a)
    clients = [("C API", "c", "c.bsdb"), ("python save", "py", "py0.bsdb"),
               ("python save_many", "py", f"py{a.batch}.bsdb"),
               ("python raw reads", "py", f"pyraw{a.batch}.bsdb"),
               ("JSON driver", "driver", "drv.bsdb")]
    clients = [c for c in clients if c[1] in only]
    res, runs = {}, {}
    with tempfile.TemporaryDirectory(prefix="bench_py.") as tmp:
        d = a.keep or pathlib.Path(tmp)
        d.mkdir(parents=True, exist_ok=True)
        if "c" in only:
            build_c(a, d)
        if "py" in only:
            install_py(d)
        # Runs alternate the clients (C, python, ..., C, python, ...), so that a change of the
        # machine's load falls on each; every run writes fresh files.
        for run in range(a.runs):
            for name, _, file in clients:
                for f in (d / file, d / (file + "-lock")):
                    f.unlink(missing_ok=True)
                if name == "C API":
                    r = run_c(a, d)
                elif name == "python save":
                    r = run_py(a, d, buckets, rows)
                elif name == "python save_many":
                    r = run_py(a, d, buckets, rows, a.batch)
                elif name == "python raw reads":
                    r = run_py(a, d, buckets, rows, a.batch, raw=True)
                else:
                    r = run_driver(a, d, buckets, rows)
                want = a.rows * (1 if name == "JSON driver" else a.read_repeat)
                if r[4] != want:
                    raise SystemExit(f"{name}: read {r[4]} ops, expected {want}")
                # seconds per row (ingest) and per op (reads)
                r = tuple(x / n if x is not None else None
                          for x, n in zip(r[:4], (a.rows, a.rows, r[4], r[4])))
                runs.setdefault(name, []).append(r)
                old = res.get(name)
                res[name] = r if old is None else tuple(
                    min(x, y) if x is not None else None for x, y in zip(old, r))
    base = res.get("C API")

    def cost(x, i):
        return f"{x[i] / base[i]:.1f}x" if base and x[i] is not None else "-"

    def ns(x, i):
        return f"{x[i] * 1e9:,.0f}" if x[i] is not None else "-"

    print(f"{'client':<18} {'ingest rows/s':>14} {'cost':>6} {'CPU ns/row':>11} {'cost':>6}"
          f" {'read ops/s':>13} {'cost':>6} {'CPU ns/op':>10} {'cost':>6}")
    for name, x in res.items():
        print(f"{name:<18} {1 / x[0]:>14,.0f} {cost(x, 0):>6} {ns(x, 1):>11} {cost(x, 1):>6}"
              f" {1 / x[2]:>13,.0f} {cost(x, 2):>6} {ns(x, 3):>10} {cost(x, 3):>6}")
    print("cost = time / the C API's (wall clock, then CPU time); load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    if base and a.runs > 1:
        # the spread: each run's reads against the C client's reads of the same run
        print("reads, each run against the C API's of the same run (wall clock / CPU time):")
        for name, rs in runs.items():
            if name in ("C API", "JSON driver"):
                continue
            print(f"  {name:<18} " + "  ".join(
                f"{r[2] / c[2]:.2f}x/{r[3] / c[3]:.2f}x" for r, c in zip(rs, runs["C API"])))
        print(f"  {'C API ns/op':<18} " + "  ".join(
            f"{c[2] * 1e9:.1f}/{c[3] * 1e9:.1f}" for c in runs["C API"]))

if __name__ == "__main__":
    main()
