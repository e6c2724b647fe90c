/*
 * util_passthrough.c: a wrapper storage whose vtable forwards every slot to an inner storage.
 * Running the whole contract suite through it proves that a host can wrap a backend (tracing,
 * fault injection) without changing any answer: the front (argument checks, the checksum cache)
 * sits above the wrapper exactly as above a real backend.
 *
 * Writers are wrapped too (a writer table of their own), so every writer call goes through it.
 */
#include "util_contract.h"

#include "../storage_backend.h"

#include <stdlib.h>
#include <string.h>

unsigned long ct_passthrough_calls;

typedef struct pt_storage {
  bs_storage base;
  bs_storage *inner;
} pt_storage;

typedef struct pt_writer {
  bs_writer base;
  bs_writer *inner;
} pt_writer;

#define IN(st) (((pt_storage *)(st))->inner)
#define WIN(w) (((pt_writer *)(w))->inner)
static const bs_writer_vtable pt_writer_vt;
/* The inner slot, or BS_EUNSUPPORTED like the front does for a NULL slot. */
#define FWD(inner, slot, ...)                                                                      \
  do {                                                                                             \
    ct_passthrough_calls++;                                                                        \
    if (!(inner)->vt->slot) return BS_EUNSUPPORTED;                                                \
    return (inner)->vt->slot(__VA_ARGS__);                                                         \
  } while (0)

static void pt_destroy(bs_storage *st) {
  pt_storage *p = (pt_storage *)st;
  ct_passthrough_calls++;
  bs_storage_close(p->inner);
  free(p);
}

static int pt_writer_open(bs_writer **out, bs_storage *st, const bs_writer_options *opts,
                          bs_error *err) {
  bs_storage *in = IN(st);
  bs_writer *iw = NULL;
  pt_writer *w;
  int rc;
  ct_passthrough_calls++;
  if (!in->vt->writer_open) return BS_EUNSUPPORTED;
  w = calloc(1, sizeof *w);
  if (!w) return BS_ENOMEM;
  rc = in->vt->writer_open(&iw, in, opts, err);
  if (rc) {
    free(w);
    return rc;
  }
  if (!iw->st) iw->st = in;
  w->base.vt = &pt_writer_vt;
  w->base.st = st;
  w->inner = iw;
  *out = &w->base;
  return BS_OK;
}

static void pt_writer_close(bs_writer *w) {
  bs_writer *iw = WIN(w);
  ct_passthrough_calls++;
  if (iw) iw->vt->destroy(iw);
  free(w);
}

static int pt_writer_truncate(bs_writer *w, bs_val table, int drop, bs_error *err) {
  FWD(WIN(w), truncate, WIN(w), table, drop, err);
}
static int pt_writer_flush(uint64_t *last, bs_writer *w, const bs_write_batch *b, bs_error *err) {
  FWD(WIN(w), flush, last, WIN(w), b, err);
}
static int pt_writer_commit(bs_commit_result *out, bs_writer *w, const bs_write_batch *b,
                            bs_val lsn, int ce, bs_error *err) {
  FWD(WIN(w), commit, out, WIN(w), b, lsn, ce, err);
}
static int pt_writer_snapshot_done(bs_writer *w, bs_val lsn, bs_error *err) {
  FWD(WIN(w), snapshot_done, WIN(w), lsn, err);
}
static int pt_writer_resume_lsn(bs_writer *w, bs_val lsn, bs_error *err) {
  FWD(WIN(w), resume_lsn, WIN(w), lsn, err);
}
static int pt_writer_source_row(bs_writer *w, const bs_write_batch *b, bs_val table, bs_val id,
                                int (*fn)(const bs_val *, void *), void *payload, bs_error *err) {
  FWD(WIN(w), source_row, WIN(w), b, table, id, fn, payload, err);
}

static int pt_get_checkpoint(bs_checkpoint *out, bs_storage *st, bs_error *err) {
  FWD(IN(st), get_checkpoint, out, IN(st), err);
}
static int pt_bucket_data(int *more, bs_storage *st, uint64_t cp, const bs_bucket_request *req,
                          size_t n, const bs_batch_options *o, int (*fn)(const bs_chunk *, void *),
                          void *payload, bs_error *err) {
  FWD(IN(st), bucket_data, more, IN(st), cp, req, n, o, fn, payload, err);
}
static int pt_checksums(bs_checksum *out, uint64_t *gen, bs_storage *st, uint64_t cp,
                        const bs_val *b, size_t n, bs_error *err) {
  FWD(IN(st), checksums, out, gen, IN(st), cp, b, n, err);
}
static int pt_checksum_ranges(bs_checksum *out, int *cleared, uint64_t *gen, bs_storage *st,
                              uint64_t from, uint64_t to, const bs_val *b, size_t n,
                              bs_error *err) {
  FWD(IN(st), checksum_ranges, out, cleared, gen, IN(st), from, to, b, n, err);
}
static int pt_checkpoint_changes(bs_storage *st, uint64_t from, uint64_t to,
                                 int (*fn)(const bs_checkpoint_changes *, void *), void *payload,
                                 bs_error *err) {
  FWD(IN(st), checkpoint_changes, IN(st), from, to, fn, payload, err);
}
static int pt_parameter_sets(bs_storage *st, uint64_t cp, const bs_val *l, size_t n, size_t limit,
                             int (*fn)(const bs_val *, void *), void *payload, bs_error *err) {
  FWD(IN(st), parameter_sets, IN(st), cp, l, n, limit, fn, payload, err);
}
static int pt_set_wcp_mode(bs_storage *st, bs_write_checkpoint_mode m, bs_val ev, bs_error *err) {
  FWD(IN(st), set_write_checkpoint_mode, IN(st), m, ev, err);
}
static int pt_create_managed(uint64_t *ids, int *adv, bs_storage *st, const bs_managed_request *r,
                             size_t n, bs_error *err) {
  FWD(IN(st), create_managed_write_checkpoints, ids, adv, IN(st), r, n, err);
}
static int pt_last_wcp(uint64_t *id, int *found, bs_storage *st, bs_val user, const bs_head *h,
                       size_t nh, bs_error *err) {
  FWD(IN(st), last_write_checkpoint, id, found, IN(st), user, h, nh, err);
}
static int pt_delete_wcp(uint64_t *deleted, bs_storage *st, int64_t before, bs_error *err) {
  FWD(IN(st), delete_checkpoint_requests_before, deleted, IN(st), before, err);
}
static int pt_compact(bs_compact_stats *s, bs_storage *st, const bs_compact_options *o,
                      bs_error *err) {
  FWD(IN(st), compact, s, IN(st), o, err);
}
static int pt_compact_initial(uint64_t *buckets, bs_storage *st, uint64_t max_op,
                              uint64_t min_changes, bs_error *err) {
  FWD(IN(st), compact_initial_replication, buckets, IN(st), max_op, min_changes, err);
}
static int pt_get_status(bs_status *out, bs_storage *st, bs_error *err) {
  FWD(IN(st), get_status, out, IN(st), err);
}
static int pt_report_error(bs_storage *st, const char *msg, bs_error *err) {
  FWD(IN(st), report_error, IN(st), msg, err);
}
static int pt_clear(bs_storage *st, bs_error *err) {
  FWD(IN(st), clear, IN(st), err);
}
static int pt_terminate(bs_storage *st, int clear, bs_error *err) {
  FWD(IN(st), terminate, IN(st), clear, err);
}

static int pt_list_buckets(bs_storage *st, bs_val after,
                           int (*fn)(const bs_bucket_info *info, void *payload), void *payload,
                           bs_error *err) {
  FWD(IN(st), list_buckets, IN(st), after, fn, payload, err);
}

/* A NULL inner slot excludes nothing, as the front reads a NULL slot. */
static int pt_writer_lock(bs_storage *st, int snapshot, int lock, bs_error *err) {
  ct_passthrough_calls++;
  return IN(st)->vt->writer_lock ? IN(st)->vt->writer_lock(IN(st), snapshot, lock, err) : BS_OK;
}

static const bs_writer_vtable pt_writer_vt = {
    .version = BS_WRITER_VTABLE_VERSION,
    .destroy = pt_writer_close,
    .truncate = pt_writer_truncate,
    .flush = pt_writer_flush,
    .commit = pt_writer_commit,
    .snapshot_done = pt_writer_snapshot_done,
    .resume_lsn = pt_writer_resume_lsn,
    .source_row = pt_writer_source_row,
};

static const bs_storage_vtable pt_vtable = {
    .version = BS_STORAGE_VTABLE_VERSION,
    .destroy = pt_destroy,
    .writer_open = pt_writer_open,
    .get_checkpoint = pt_get_checkpoint,
    .bucket_data = pt_bucket_data,
    .checksums = pt_checksums,
    .checksum_ranges = pt_checksum_ranges,
    .checkpoint_changes = pt_checkpoint_changes,
    .parameter_sets = pt_parameter_sets,
    .set_write_checkpoint_mode = pt_set_wcp_mode,
    .create_managed_write_checkpoints = pt_create_managed,
    .last_write_checkpoint = pt_last_wcp,
    .delete_checkpoint_requests_before = pt_delete_wcp,
    .compact = pt_compact,
    .compact_initial_replication = pt_compact_initial,
    .get_status = pt_get_status,
    .report_error = pt_report_error,
    .clear = pt_clear,
    .terminate = pt_terminate,
    .list_buckets = pt_list_buckets,
    .writer_lock = pt_writer_lock,
};

int ct_passthrough_wrap(bs_storage **out, bs_storage *inner) {
  pt_storage *p = calloc(1, sizeof *p);
  if (!p) return BS_ENOMEM;
  p->base.vt = &pt_vtable;
  /* The same database, so the front finds its checksum cache (and read-only flag) above this
   * table as above the inner one. */
  p->base.db = inner->db;
  p->base.stream_id = inner->stream_id;
  p->inner = inner;
  *out = &p->base;
  return BS_OK;
}

int ct_passthrough_wrap_uncached(bs_storage **out, bs_storage *inner) {
  int rc = ct_passthrough_wrap(out, inner);
  /* Free-standing (no db): the front has no cache for it and asks the backend for every
   * checksum (storage_backend.h, struct bs_storage). */
  if (rc == BS_OK) (*out)->db = NULL;
  return rc;
}
