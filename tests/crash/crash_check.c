/*
 * crash_check: the judge of the crash test. Usage: crash_check DB LOG SEED
 *
 * After the writer was SIGKILLed: the file opens; bs_db_verify finds nothing; the checkpoint is
 * the last one LOG records, or the next one (its commit returned but the log line was not yet
 * written); and what a client sees at that checkpoint equals what the memory backend shows
 * after replaying commits 1..k of the same workload: every committed row, nothing else (the
 * reduced bucket contents and parameter sets), with every bucket checksum equal to the sum of
 * the ops read back. Prints "ok k=K inflight=0|1"; exit 1 on a failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util_fault.h"
#include "crash_workload.h"

static int fail(const char *fmt, const char *a, const char *b) {
  fprintf(stderr, "crash_check: ");
  fprintf(stderr, fmt, a, b);
  fprintf(stderr, "\n");
  return 1;
}

static void on_problem(const char *p, void *payload) {
  (void)payload;
  fprintf(stderr, "crash_check: verify: %s\n", p);
}

/* drops the "C=" line and every " ck=N": op ids and checksums depend on how often batches
 * were redone; the ft_fingerprint already checked checksum == sum of ops */
static void strip(char *s) {
  char *o = s, *p = s;
  if (!strncmp(p, "C=", 2)) p = strchr(p, '\n') + 1;
  while (*p) {
    if (!strncmp(p, " ck=", 4)) {
      p += 4;
      while (*p >= '0' && *p <= '9') p++;
      continue;
    }
    *o++ = *p++;
  }
  *o = 0;
}

static int fingerprint(bs_storage *st, uint64_t C, char **out, bs_error *err) {
  bs_val names[CW_BUCKETS], keys[CW_USERS];
  char nb[CW_BUCKETS][16];
  unsigned char kb[CW_USERS][64];
  for (int i = 0; i < CW_BUCKETS; i++) {
    snprintf(nb[i], sizeof nb[i], "b%d", i);
    names[i] = cw_v(nb[i]);
  }
  for (int i = 0; i < CW_USERS; i++) {
    keys[i].data = kb[i];
    keys[i].size = cw_lookup_key(kb[i], sizeof kb[i], i);
  }
  return ft_fingerprint(st, C, names, CW_BUCKETS, keys, CW_USERS, out, err);
}

/* The memory backend after commits 1..k. */
static int model(uint64_t seed, uint64_t k, char **out, bs_error *err) {
  bs_db *db = NULL;
  bs_storage *st = NULL;
  bs_writer *w = NULL;
  cw_state state = {0};
  bs_checkpoint cp;
  char lsn[32];
  int rc;
  if ((rc = bs_open_memory(&db, NULL, err))) return rc;
  if ((rc = bs_stream_create(NULL, db, "crash", NULL, err))) goto out;
  if ((rc = bs_storage_open(&st, db, 0, err))) goto out;
  if ((rc = bs_writer_open(&w, st, NULL, err))) goto out;
  if ((rc = bs_writer_snapshot_done(w, cw_v("00000000"), err))) goto out;
  for (uint64_t c = 1; c <= k; c++) {
    if ((rc = cw_commit_saves(&state, seed, c, w, err))) goto out;
    cw_lsn(lsn, sizeof lsn, c);
    if ((rc = bs_writer_commit(NULL, w, cw_v(lsn), NULL, err))) goto out;
  }
  if ((rc = bs_get_checkpoint(&cp, st, err))) goto out;
  rc = fingerprint(st, cp.op_id, out, err);
out:
  free(state.live);
  bs_writer_close(w);
  bs_storage_close(st);
  bs_close(db);
  return rc;
}

int main(int argc, char **argv) {
  bs_error err = {0, ""};
  bs_db *db = NULL;
  bs_storage *st = NULL;
  bs_checkpoint cp;
  uint64_t seed, k = 0, logged_k = 0, logged_op = 0, problems = 0;
  char line[128], *got = NULL, *want = NULL;
  FILE *log;
  int rc;
  if (argc != 4) {
    fprintf(stderr, "usage: crash_check DB LOG SEED\n");
    return 2;
  }
  seed = strtoull(argv[3], NULL, 10);
  if ((log = fopen(argv[2], "r")) != NULL) {
    while (fgets(line, sizeof line, log)) {
      unsigned long long a, b;
      if (sscanf(line, "%llu %llu", &a, &b) == 2) {
        logged_k = a;
        logged_op = b;
      }
    }
    fclose(log);
  }
  if ((rc = bs_open(&db, argv[1], NULL, &err)))
    return fail("open: %s (%s)", bs_strerror(rc), err.msg);
  if ((rc = bs_db_verify(&problems, db, on_problem, NULL, &err)))
    return fail("verify: %s (%s)", bs_strerror(rc), err.msg);
  if (problems) return fail("verify found problems%s%s", "", "");
  rc = bs_storage_open(&st, db, 0, &err);
  if (rc == BS_ENOTFOUND && logged_k == 0) { /* killed before the stream existed */
    bs_close(db);
    printf("ok k=0 inflight=0\n");
    return 0;
  }
  if (rc) return fail("storage_open: %s (%s)", bs_strerror(rc), err.msg);
  if ((rc = bs_get_checkpoint(&cp, st, &err)))
    return fail("checkpoint: %s (%s)", bs_strerror(rc), err.msg);
  if (cp.has_lsn) {
    char buf[32];
    size_t n = cp.lsn_size < sizeof buf - 1 ? cp.lsn_size : sizeof buf - 1;
    memcpy(buf, cp.lsn, n);
    buf[n] = 0;
    k = strtoull(buf, NULL, 10);
  }
  if (k != logged_k && k != logged_k + 1) {
    fprintf(stderr, "crash_check: checkpoint is commit %llu; the log's last commit is %llu\n",
            (unsigned long long)k, (unsigned long long)logged_k);
    return 1;
  }
  if (k == logged_k && k && cp.op_id != logged_op) {
    fprintf(stderr, "crash_check: commit %llu: checkpoint %llu, logged %llu\n",
            (unsigned long long)k, (unsigned long long)cp.op_id, (unsigned long long)logged_op);
    return 1;
  }
  if ((rc = fingerprint(st, cp.op_id, &got, &err)))
    return fail("reading the file at its checkpoint: %s (%s)", bs_strerror(rc), err.msg);
  if ((rc = model(seed, k, &want, &err))) return fail("model: %s (%s)", bs_strerror(rc), err.msg);
  strip(got);
  strip(want);
  if (strcmp(got, want) != 0) {
    fprintf(stderr, "crash_check: commit %llu: the file shows\n%s--- but the model\n%s",
            (unsigned long long)k, got, want);
    return 1;
  }
  printf("ok k=%llu inflight=%d op=%llu\n", (unsigned long long)k, k != logged_k,
         (unsigned long long)cp.op_id);
  free(got);
  free(want);
  bs_storage_close(st);
  bs_close(db);
  return 0;
}
