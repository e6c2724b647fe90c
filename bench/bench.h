/*
 * bench.h: what the benchmark's files share. bsbench.c runs workloads (each phase in its own
 * forked child, so peak RSS and a crash belong to that phase only) and prints the results;
 * bench_bs.c drives the library through storage.h; bench_raw.c writes the same key pattern and
 * value sizes straight into LMDB (the baseline: what the bytes alone cost).
 */
#ifndef BSBENCH_H
#define BSBENCH_H

#include <stddef.h>
#include <stdint.h>

#include "storage.h"

/* ---- Configuration ---- */
typedef struct bench_cfg {
  uint64_t rows;            /* W1 initial snapshot rows */
  unsigned buckets_small;   /* W1/W2/W3 bucket count (100) */
  unsigned buckets_large;   /* W1 second run (10000) */
  uint64_t commit_rows;     /* W1 commit cadence (10000) */
  uint64_t updates;         /* W2 changes per sync mode */
  uint64_t commit_changes;  /* W2 commit cadence (1000) */
  size_t data_size;         /* JSON row size in bytes */
  uint64_t read_limit;      /* W3 ops per get_bucket_data call */
  double read_secs;         /* W3 seconds per concurrent-reader run */
  uint64_t catchup_commits; /* W3: the client is this many commits behind */
  uint64_t ck_requests;     /* W4 buckets per measurement (10000) */
  uint64_t ck_small_ops;    /* W4 ops per small bucket (10) */
  uint64_t ck_big_ops;      /* W4 ops per big bucket (100000) */
  uint64_t ck_big_buckets;  /* W4 big buckets (10) */
  uint64_t params;          /* W5 index entries */
  uint64_t param_queries;   /* W5 lookups */
  uint64_t compact_rows;    /* W6 rows (each updated once: 2x ops, 50% superseded) */
  size_t compact_memory_mb; /* every compaction's memory_limit_mb (0 = library default) */
  uint64_t seed;
  uint64_t map_mb; /* initial map size of bucketstore files (0 = library default) */
  int quick, nofork, keep, proto, pg_proto, defrag, proto_source; /* proto 2: --proto=ops */
  const char *only, *json, *dir;
  char tmp[512];       /* the run's temporary directory */
  const char *pg_url;  /* --pg: the PostgreSQL workloads (bench_pg.c) on this server */
  long pg_tag;         /* names the run's schemas (the parent's pid) */
  uint64_t pg_rows;    /* --pg: inserts into the one bucket (then half as many updates) */
  uint64_t pg_changes; /* --pg: checkpoints of the changes workload (records in bs_changes) */
} bench_cfg;

/* ---- Results (in shared memory: children append, the parent prints) ---- */
#define BR_OK          0
#define BR_UNSUPPORTED 1
#define BR_FAILED      2

typedef struct bres {
  char workload[16];
  char name[72];
  char engine[8];   /* "bs" or "lmdb" */
  int status;       /* BR_* */
  int lower_better; /* value is a cost (us/bucket), not a rate */
  double value;     /* main figure */
  char unit[16];
  double count, secs, mbps;
  double p50_us, p99_us; /* < 0: not measured */
  double maxrss_mb, anon_peak_mb;
  double bytes_per_op; /* < 0: n/a */
  int timed;           /* count is what a fixed time gave: the engines' counts may differ */
  char note[400];
} bres;

#define BR_MAX 256
extern bres *g_res; /* shared array */
extern int *g_nres; /* shared count */
extern const bench_cfg *g_cfg;

/* Shared state between phases (lives in MAP_SHARED memory). */
typedef struct bench_shared {
  uint64_t hist_bs[256], hist_raw[256]; /* checkpoints after recent commits (ring) */
  uint64_t nhist_bs, nhist_raw;
  uint64_t change_seq_bs, change_seq_raw; /* how many W2 changes each engine has applied */
  int built[32];                          /* store flags, see bsbench.c */
  uint64_t ck_cp[2][2][2];  /* [raw][big][0 = latest, 1 = older] checkpoints of W4 stores */
  uint64_t ck_sum[2][2][2]; /* [raw][big][cp]: sum of checksums and counts read (cross-check) */
  uint64_t param_rows[2];   /* [raw]: parameter rows returned (cross-check) */
  uint64_t pg_read_sum[2];  /* [raw]: --pg reads, sum of op checksums + ops (cross-check) */
  uint64_t pg_ck_sum[2][2]; /* [raw][big]: --pg checksum + count (cross-check) */
  /* [raw]: --pg checksums, the plans of the statements: plan_cache_mode (1 = force_generic_plan,
   * 2 = force_custom_plan, 3 = auto) and custom plans made (cross-check) */
  int pg_plan_mode[2];
  uint64_t pg_custom_plans[2];
  double lmdb_bytes_per_op; /* --pg: the same ingest on the LMDB backend */
} bench_shared;
extern bench_shared *g_sh;
extern int32_t *g_state_bs, *g_state_raw; /* per row: bucket index, -1 = deleted */

bres *res_new(const char *workload, const char *name, const char *engine);
void res_fail(bres *r, int rc, const char *what, const bs_error *err);
void res_mem(bres *r); /* fills maxrss / anon peak from the current phase */
double now_s(void);
void mem_sampler_start(void);
void mem_sampler_stop(void);
double pct(double *v, size_t n, double p); /* sorts v in place */
double file_bytes(const char *path);
void bench_path(char *out, size_t cap, const char *name);
uint64_t rng_next(uint64_t *s);
void die(const char *fmt, ...);
int copy_file(const char *src, const char *dst);

/* ---- Data generation (identical for both engines) ---- */
#define TABLE        "todos" /* the rows' table (the source records' first type is its name) */
#define OBJ_TYPE     "todos"
#define OBJ_TYPE_LEN 5u
#define RID_LEN      9u /* "r" + 8 digits */
void gen_rid(char out[RID_LEN + 1], uint64_t i);
void gen_bucket(char *out, size_t cap, size_t *len, unsigned b);
/* JSON of exactly cfg->data_size bytes (at least 64) */
void gen_data(char *out, uint64_t row, uint64_t version, size_t size);
void gen_lsn(char out[17], uint64_t n);
/* Saves generated row `row` of table OBJ_TYPE through w: tag BS_DELETE by its id, else one output
 * row into bucket b (gen_bucket) with the row's data at version (gen_data). Every engine's
 * workload saves its rows through this one function, so they all save the same bytes. */
int save_generated(bs_writer *w, bs_tag tag, uint64_t row, unsigned b, uint64_t version,
                   bs_error *err);
/* Change k of the streaming sequence (deterministic in seed and k) applied to state[]. */
typedef enum { CH_UPDATE, CH_MOVE, CH_DELETE, CH_INSERT } ch_kind;
typedef struct change {
  ch_kind kind;
  uint64_t row;
  int32_t old_bucket, new_bucket;
} change;
void gen_change(change *c, uint64_t k, int32_t *state, uint64_t rows, unsigned nbuckets);

/* ---- Workloads: one per engine, each may append several results ---- */
/* Store names, passed between setup and measuring phases. */
enum { ST_S100, ST_S10K, ST_CK_SMALL, ST_CK_BIG, ST_PARAMS, ST_COMPACT, ST_STREAMED, ST_N };

/* bench_bs.c */
int bs_ingest(int mode);               /* W1: 0 = 100 buckets, 1 = 10k, 2 = 100 nosync */
int bs_stream(int nosync, int report); /* W2 */
int bs_reads(void);                    /* W3 single reader (cold, warm map) + catch-up */
int bs_concurrent(int threads);        /* W3 readers while the writer streams */
int bs_ck_build(int big);
int bs_checksums(int big); /* W4 */
int bs_params(void);       /* W5 (builds, then queries) */
int bs_compact_build(void);
int bs_compaction(int mode); /* W6: 0 full, 1 incremental, 2 full nosync */

/* bench_raw.c */
int raw_ingest(int large);
int raw_stream(int nosync, int report);
int raw_reads(void);
int raw_concurrent(int threads);
int raw_ck_build(int big);
int raw_checksums(int big);
int raw_params(void);
int raw_compact_build(void);
int raw_compaction(int incremental);

/* proto_layout.c (--proto): layout prototypes beside today's raw layout; returns failures */
int proto_layouts(void);
/* proto_pg.c (--pg-proto with --pg): PostgreSQL layout prototypes, raw libpq; returns failures */
int proto_pg(void);
/* proto_defrag.c (--defrag): defragmentation policies, fresh and existing clients' downloads */
int proto_defrag(void);
/* proto_source.c (--proto-source): source-record layouts beside format 2's; returns failures */
int proto_source(void);

/* bench_pg.c (--pg): bucketstore on PostgreSQL ("bs") and the raw libpq baseline ("libpq") */
int pg_prepare(void); /* creates the run's schemas (in the parent) */
void pg_cleanup(void);
int pg_bs_ingest(int lmdb); /* lmdb = 1: the same ingest on the LMDB backend (a note row) */
int pg_raw_ingest(int unused);
int pg_bs_reads(int unused);
int pg_raw_reads(int unused);
int pg_bs_checksums(int unused);
int pg_raw_checksums(int sum_history);
int pg_bs_compact(int lmdb);
int pg_bs_changes(int unused);
int pg_raw_changes(int unused);

#endif
