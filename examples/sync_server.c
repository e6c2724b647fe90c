/*
 * sync_server.c: embedding bucketstore in a sync server. A client asks for its buckets with
 * the op id it already has in each; the server answers with the protocol's lines (JSON, one
 * per line, here on stdout):
 *   {"checkpoint":{"last_op_id":..,"write_checkpoint":null,"buckets":[{bucket,checksum,count}]}}
 *   {"data":{"bucket":..,"after":..,"next_after":..,"has_more":..,"data":[ops]}}  per chunk
 *   {"checkpoint_complete":{"last_op_id":..}}
 * then the client checks each bucket's checksum against what it received, as the real client
 * does. The example plays both sides: a first sync from zero, more writes, then a second sync
 * that resumes from where the first ended. The data lives in the memory backend here; with a
 * file it is the same code after bs_open().
 * Exits non-zero when a checksum does not match or a call fails.
 */
#include "storage.h"

#include <stdio.h>
#include <string.h>

#define N_BUCKETS 3

static const char *const buckets[N_BUCKETS] = {"global[]", "user[\"alice\"]", "user[\"bob\"]"};

/* What the client holds per bucket: position, and the running checksum/count of what it got. */
typedef struct client_bucket {
  uint64_t after;
  uint32_t checksum;
  uint64_t count;
} client_bucket;

static client_bucket client[N_BUCKETS];

static bs_val str(const char *s) {
  bs_val v = {s, strlen(s)};
  return v;
}

/* JSON string of v, or null. Escapes what JSON requires; bytes >= 0x80 pass through (UTF-8). */
static void json_str(bs_val v) {
  const unsigned char *p = v.data;
  size_t i;
  if (!v.data) {
    fputs("null", stdout);
    return;
  }
  putchar('"');
  for (i = 0; i < v.size; i++) {
    if (p[i] == '"' || p[i] == '\\')
      printf("\\%c", p[i]);
    else if (p[i] < 0x20)
      printf("\\u%04x", p[i]);
    else
      putchar(p[i]);
  }
  putchar('"');
}

static int index_of(bs_val bucket) {
  int i;
  for (i = 0; i < N_BUCKETS; i++)
    if (bucket.size == strlen(buckets[i]) && memcmp(bucket.data, buckets[i], bucket.size) == 0)
      return i;
  return -1;
}

static const char *op_names[] = {"?", "PUT", "REMOVE", "MOVE", "CLEAR"};

/* One data line per chunk; the "client" applies it (here: checksum and position only). A real
 * client keeps the latest PUT per row; the checksum covers every op, MOVE and CLEAR included. */
static int send_chunk(const bs_chunk *c, void *payload) {
  int b = index_of(c->bucket);
  size_t i;
  (void)payload;
  if (b < 0) return BS_EINVAL;
  printf("{\"data\":{\"bucket\":");
  json_str(c->bucket);
  printf(",\"after\":\"%llu\",\"next_after\":\"%llu\",\"has_more\":%s,\"data\":[",
         (unsigned long long)c->after, (unsigned long long)c->next_after,
         c->has_more ? "true" : "false");
  for (i = 0; i < c->n_ops; i++) {
    const bs_op *op = &c->ops[i];
    printf("%s{\"op_id\":\"%llu\",\"op\":\"%s\",\"object_type\":", i ? "," : "",
           (unsigned long long)op->op_id, op_names[op->type]);
    json_str(op->object_type);
    fputs(",\"object_id\":", stdout);
    json_str(op->object_id);
    fputs(",\"subkey\":", stdout);
    json_str(op->subkey);
    fputs(",\"data\":", stdout);
    json_str(op->data);
    printf(",\"checksum\":%lu}", (unsigned long)op->checksum);
    client[b].checksum += op->checksum; /* wrapping 32-bit sum */
    client[b].count++;
  }
  printf("]}}\n");
  client[b].after = c->next_after;
  return 0;
}

/* Serves one sync round at the stream's current checkpoint; returns 0 when the client's
 * checksums match the checkpoint line's. */
static int serve(bs_storage *st, bs_error *err) {
  bs_checkpoint cp;
  bs_val names[N_BUCKETS];
  bs_checksum sums[N_BUCKETS];
  bs_bucket_request req[N_BUCKETS];
  int rc, i, more = 1;
  if ((rc = bs_get_checkpoint(&cp, st, err))) return rc;
  for (i = 0; i < N_BUCKETS; i++) names[i] = str(buckets[i]);
  if ((rc = bs_get_checksums(sums, st, cp.op_id, names, N_BUCKETS, err))) return rc;
  printf("{\"checkpoint\":{\"last_op_id\":\"%llu\",\"write_checkpoint\":null,\"buckets\":[",
         (unsigned long long)cp.op_id);
  for (i = 0; i < N_BUCKETS; i++) {
    printf("%s{\"bucket\":", i ? "," : "");
    json_str(names[i]);
    printf(",\"checksum\":%ld,\"count\":%llu}", (long)(int32_t)sums[i].checksum,
           (unsigned long long)sums[i].count);
  }
  printf("]}}\n");
  /* Batches until nothing is left; each call resumes every bucket at its next_after. */
  while (more) {
    bs_batch_options o = BS_BATCH_OPTIONS_INIT;
    o.limit = 50; /* small, to show several chunks per bucket */
    for (i = 0; i < N_BUCKETS; i++) {
      req[i].bucket = names[i];
      req[i].after = client[i].after;
    }
    if ((rc = bs_get_bucket_data(&more, st, cp.op_id, req, N_BUCKETS, &o, send_chunk, NULL, err)))
      return rc;
  }
  printf("{\"checkpoint_complete\":{\"last_op_id\":\"%llu\"}}\n", (unsigned long long)cp.op_id);
  for (i = 0; i < N_BUCKETS; i++)
    if (client[i].checksum != sums[i].checksum || client[i].count != sums[i].count) {
      fprintf(stderr, "sync_server: bucket %s: client has %u/%llu, checkpoint says %u/%llu\n",
              buckets[i], client[i].checksum, (unsigned long long)client[i].count, sums[i].checksum,
              (unsigned long long)sums[i].count);
      return BS_ECORRUPT;
    }
  return BS_OK;
}

/* The replication side: n rows, each into one bucket, committed at lsn. */
static int write_rows(bs_writer *w, int from, int n, int version, const char *lsn, bs_error *err) {
  int i, rc;
  for (i = from; i < from + n; i++) {
    char id[16], data[64];
    bs_save s = BS_SAVE_INIT;
    bs_row row;
    snprintf(id, sizeof id, "t%d", i % 40);
    snprintf(data, sizeof data, "{\"id\":\"t%d\",\"v\":%d}", i % 40, version);
    row.bucket = str(buckets[i % N_BUCKETS]);
    row.object_type = str("todos");
    row.object_id = str(id);
    row.data = str(data);
    s.table = str("todos");
    s.tag = version ? BS_UPDATE : BS_INSERT;
    s.after_id = str(id);
    s.rows = &row;
    s.n_rows = 1;
    if ((rc = bs_writer_save(w, &s, err))) return rc;
  }
  return bs_writer_commit(NULL, w, str(lsn), NULL, err);
}

int main(void) {
  bs_db *db = NULL;
  bs_storage *st = NULL;
  bs_writer *w = NULL;
  bs_error err = {0, ""};
  uint32_t id;
  int rc;
  if ((rc = bs_open_memory(&db, NULL, &err)) || (rc = bs_stream_create(&id, db, "s", NULL, &err)) ||
      (rc = bs_storage_open(&st, db, id, &err)) || (rc = bs_writer_open(&w, st, NULL, &err)) ||
      (rc = bs_writer_snapshot_done(w, str("00000000"), &err)) ||
      (rc = write_rows(w, 0, 40, 0, "00000001", &err)) || (rc = serve(st, &err)) ||
      /* more writes (updates of the same rows), then the client resumes from its positions */
      (rc = write_rows(w, 0, 100, 1, "00000002", &err)) || (rc = serve(st, &err))) {
    fprintf(stderr, "sync_server: %s (%s)\n", bs_strerror(rc), err.msg);
    return 1;
  }
  bs_writer_close(w);
  bs_storage_close(st);
  bs_close(db);
  return 0;
}
