/*
 * writer.c: the writer's queue, owned by the front: what bs_writer_save and
 * bs_writer_custom_write_checkpoint* queue until the next flush, commit or truncate hands it to
 * the backend in ONE call, as a batch in queue order (storage_backend.h, bs_write_batch), which
 * the backend applies in one transaction. A backend never copies or queues a save.
 *
 * A save is deep-copied into ONE arena block: the bs_save, its row / lookup / parameter arrays,
 * then every byte string. Sizing first and copying second costs two passes over a few fields,
 * where an allocation per field cost ~8 arena calls per save. The copy keeps every field as the
 * caller gave it (a DELETE's after_id too: the backend's reading of it is the effects' rule);
 * absent stays absent and a present empty value points at a static byte, so "present" survives.
 */
#include "internal.h"

static const unsigned char q_empty[1] = {0}; /* data of the copies of present empty values */

/* Saturating size arithmetic: an absurd total becomes SIZE_MAX, which bs__arena_alloc refuses. */
static size_t sz_add(size_t a, size_t b) {
  return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}
static size_t sz_mul(size_t n, size_t size) {
  return size && n > SIZE_MAX / size ? SIZE_MAX : n * size;
}

/* Copies v to *p and advances it; absent stays absent, present-empty points at q_empty. */
static bs_val q_copy(unsigned char **p, bs_val v) {
  bs_val d = {v.data, v.size};
  if (v.data && v.size) {
    memcpy(*p, v.data, v.size);
    d.data = *p;
    *p += v.size;
  } else if (v.data) {
    d.data = q_empty;
  }
  return d;
}

/* The bytes of a save's values: the copy's size and the max_bytes measure of the queue. */
static size_t save_bytes(const bs_save *s) {
  size_t bytes = s->table.size + s->before_id.size + s->after_id.size; /* each is bounded */
  bytes = sz_add(bytes, s->stored_data.size);
  for (size_t i = 0; i < s->n_rows; i++) {
    const bs_row *r = &s->rows[i];
    bytes = sz_add(bytes, r->bucket.size + r->object_type.size);
    bytes = sz_add(bytes, r->object_id.size);
    bytes = sz_add(bytes, r->data.size);
  }
  for (size_t i = 0; i < s->n_lookups; i++) {
    const bs_lookup *l = &s->lookups[i];
    bytes = sz_add(bytes, l->key.size);
    for (size_t j = 0; j < l->n_params; j++) bytes = sz_add(bytes, l->params[j].size);
  }
  return bytes;
}

static int push_item(bs__queue *q, const bs_allocator *a, bs_write_item item) {
  if (BS_GROW(a, q->items, q->cap, q->n + 1)) return BS_ENOMEM;
  q->items[q->n++] = item;
  return BS_OK;
}

int bs__queue_save(bs__queue *q, const bs_allocator *a, const bs_save *s) {
  size_t n_params = 0, bytes = save_bytes(s), arrays;
  bs_write_item item = {NULL, NULL};
  bs_row *rows;
  bs_lookup *lookups;
  unsigned char *p;
  bs_save *c;
  bs_val *ps;

  for (size_t i = 0; i < s->n_lookups; i++) n_params = sz_add(n_params, s->lookups[i].n_params);
  /* The arrays hold pointers and size_t only: placed right after the bs_save they stay aligned. */
  arrays = sz_add(sz_mul(s->n_rows, sizeof(bs_row)), sz_mul(s->n_lookups, sizeof(bs_lookup)));
  arrays = sz_add(arrays, sz_mul(n_params, sizeof(bs_val)));
  /* On failure a partial block may stay in the arena until the next reset: harmless. */
  if (!(c = bs__arena_alloc(&q->ar, sz_add(sz_add(sizeof *c, arrays), bytes)))) return BS_ENOMEM;
  rows = (bs_row *)(c + 1);
  lookups = (bs_lookup *)(rows + s->n_rows);
  ps = (bs_val *)(lookups + s->n_lookups);
  p = (unsigned char *)(ps + n_params);

  c->version = BS_SAVE_VERSION;
  c->tag = s->tag;
  c->table = q_copy(&p, s->table);
  c->before_id = q_copy(&p, s->before_id);
  c->after_id = q_copy(&p, s->after_id);
  c->stored_data = q_copy(&p, s->stored_data);
  for (size_t i = 0; i < s->n_rows; i++) {
    const bs_row *r = &s->rows[i];
    rows[i].bucket = q_copy(&p, r->bucket);
    rows[i].object_type = q_copy(&p, r->object_type);
    rows[i].object_id = q_copy(&p, r->object_id);
    rows[i].data = q_copy(&p, r->data);
  }
  c->rows = s->n_rows ? rows : NULL;
  c->n_rows = s->n_rows;
  for (size_t i = 0; i < s->n_lookups; i++) {
    const bs_lookup *l = &s->lookups[i];
    lookups[i].key = q_copy(&p, l->key);
    lookups[i].params = l->n_params ? ps : NULL;
    lookups[i].n_params = l->n_params;
    for (size_t j = 0; j < l->n_params; j++) *ps++ = q_copy(&p, l->params[j]);
  }
  c->lookups = s->n_lookups ? lookups : NULL;
  c->n_lookups = s->n_lookups;
  item.save = c;
  if (push_item(q, a, item) != BS_OK) return BS_ENOMEM;
  q->records++;
  q->bytes = sz_add(q->bytes, bytes);
  return BS_OK;
}

int bs__queue_wcp(bs__queue *q, const bs_allocator *a, bs_val user_id, uint64_t checkpoint,
                  bs_val event, int64_t requested_at_ms) {
  bs_write_item item = {NULL, NULL};
  bs_queued_wcp *c = bs__arena_alloc(&q->ar, sz_add(sizeof *c, user_id.size + event.size));
  unsigned char *p;
  if (!c) return BS_ENOMEM;
  p = (unsigned char *)(c + 1);
  /* present: the event and user of a write checkpoint are values ({NULL, 0} reads as "") */
  c->user_id = q_copy(&p, user_id.data ? user_id : (bs_val){q_empty, 0});
  c->event = q_copy(&p, event.data ? event : (bs_val){q_empty, 0});
  c->checkpoint = checkpoint;
  c->requested_at_ms = requested_at_ms;
  item.wcp = c;
  return push_item(q, a, item);
}

bs_write_batch bs__queue_batch(const bs__queue *q) {
  bs_write_batch b = {q->items, q->n};
  return b;
}

void bs__queue_reset(bs__queue *q) {
  bs__arena_reset(&q->ar);
  q->n = q->records = q->bytes = 0;
}

void bs__queue_free(bs__queue *q, const bs_allocator *a) {
  bs__arena_free(&q->ar);
  bs__free(a, q->items);
  q->items = NULL;
  q->n = q->cap = q->records = q->bytes = 0;
}
