/*
 * util_passthrough.c: a wrapper storage whose vtable forwards every slot to an inner storage.
 * Running the whole contract suite through it proves that a host can wrap a backend (tracing,
 * fault injection) without changing any answer: the front (argument checks, the checksum cache)
 * sits above the wrapper exactly as above a real backend.
 *
 * Writers are wrapped too (a writer table of their own), so every writer call goes through it.
 * The forwarding functions and the tables are made from storage_backend.h's slot lists: a new
 * slot needs nothing here. One slot does more than forward: bucket_data hands the caller the
 * chunks the inner backend cut, through a callback of its own (as a tracing wrapper would), so
 * the front sees a backend that cuts its own chunks: bs_get_bucket_columns then lays them out
 * through its fallback (columns.c bs__cols_chunk), which no built-in backend takes.
 */
#include "util_contract.h"

#include "../storage_backend.h"

#include <stdlib.h>
#include <string.h>

unsigned long ct_passthrough_calls;

/* Each wrapper has a table of its own: exactly the slots its inner handle's table has (a NULL
 * slot stays NULL, so the front answers or falls back as it would without the wrapper). */
typedef struct pt_storage {
  bs_storage base;
  bs_storage *inner;
  bs_storage_vtable vt;
} pt_storage;

typedef struct pt_writer {
  bs_writer base;
  bs_writer *inner;
  bs_writer_vtable vt;
} pt_writer;

#define PT_FWD(name, since, params, args)                                                          \
  static int pt_##name params {                                                                    \
    ct_passthrough_calls++;                                                                        \
    st = ((pt_storage *)st)->inner;                                                                \
    return st->vt->name args;                                                                      \
  }
#define PT_WFWD(name, since, params, args)                                                         \
  static int pt_w_##name params {                                                                  \
    ct_passthrough_calls++;                                                                        \
    w = ((pt_writer *)w)->inner;                                                                   \
    return w->vt->name args;                                                                       \
  }
BS_STORAGE_SLOTS(PT_FWD)
BS_WRITER_SLOTS(PT_WFWD)

/* The caller's on_chunk and payload, behind the wrapper's own callback. */
typedef struct pt_relay {
  int (*on_chunk)(const bs_chunk *chunk, void *payload);
  void *payload;
} pt_relay;

static int pt_relay_chunk(const bs_chunk *chunk, void *payload) {
  const pt_relay *r = payload;
  return r->on_chunk(chunk, r->payload);
}

static int pt_bucket_data_relay(int *has_more_out, bs_storage *st, uint64_t checkpoint,
                                const bs_bucket_request *req, size_t n_req,
                                const bs_batch_options *opts,
                                int (*on_chunk)(const bs_chunk *chunk, void *payload),
                                void *payload, bs_error *err) {
  pt_relay r = {on_chunk, payload};
  ct_passthrough_calls++;
  st = ((pt_storage *)st)->inner;
  return st->vt->bucket_data(has_more_out, st, checkpoint, req, n_req, opts, pt_relay_chunk, &r,
                             err);
}
/* The slot when the inner table (in, of version in->version) has it set. */
#define PT_SET(name, since, params, args)                                                          \
  t->name = in->version >= (since) && in->name ? pt_##name : NULL;
#define PT_WSET(name, since, params, args)                                                         \
  t->name = in->version >= (since) && in->name ? pt_w_##name : NULL;

static void pt_writer_close(bs_writer *w) {
  bs_writer *iw = ((pt_writer *)w)->inner;
  ct_passthrough_calls++;
  if (iw) iw->vt->destroy(iw);
  free(w);
}

/* The inner storage's writer_open, its writer wrapped. */
static int pt_open_writer(bs_writer **out, bs_storage *st, const bs_writer_options *opts,
                          bs_error *err) {
  pt_writer *w = calloc(1, sizeof *w);
  bs_writer_vtable *t;
  const bs_writer_vtable *in;
  bs_writer *iw = NULL;
  int rc;
  if (!w) return BS_ENOMEM;
  if ((rc = pt_writer_open(&iw, st, opts, err))) {
    free(w);
    return rc;
  }
  if (!iw->st) iw->st = ((pt_storage *)st)->inner;
  t = &w->vt, in = iw->vt;
  t->version = BS_WRITER_VTABLE_VERSION;
  t->destroy = pt_writer_close;
  BS_WRITER_SLOTS(PT_WSET)
  w->base.vt = t;
  w->base.st = st;
  w->inner = iw;
  *out = &w->base;
  return BS_OK;
}

static void pt_destroy(bs_storage *st) {
  pt_storage *p = (pt_storage *)st;
  ct_passthrough_calls++;
  bs_storage_close(p->inner);
  free(p);
}

int ct_passthrough_wrap(bs_storage **out, bs_storage *inner) {
  pt_storage *p = calloc(1, sizeof *p);
  bs_storage_vtable *t;
  const bs_storage_vtable *in = inner->vt;
  if (!p) return BS_ENOMEM;
  t = &p->vt;
  t->version = BS_STORAGE_VTABLE_VERSION;
  t->destroy = pt_destroy;
  BS_STORAGE_SLOTS(PT_SET)
  if (t->writer_open) t->writer_open = pt_open_writer;
  if (t->bucket_data) t->bucket_data = pt_bucket_data_relay;
  p->base.vt = t;
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
