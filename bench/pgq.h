/*
 * pgq.h: the libpq helpers of bench_pg.c that proto_pg.c shares (connections to a schema,
 * statements run and failed into a result row, COPY and array fields in binary format).
 */
#ifndef BSBENCH_PGQ_H
#define BSBENCH_PGQ_H

#include <libpq-fe.h>

#include "bench.h"

/* url with search_path set to schema (a run's schema of its own) */
void schema_url(char *out, size_t cap, const char *schema);
/* r FAILED with res's (or c's) message; clears res; returns -1 */
int pq_fail(bres *r, PGconn *c, PGresult *res, const char *what);
/* Runs sql (no parameters, results discarded). */
int pq_run(bres *r, PGconn *c, const char *sql);
PGconn *pq_connect(bres *r, const char *url);
/* Bytes of every table of the connection's schema (heap, indexes, TOAST). */
double schema_bytes(PGconn *c);

/* A growing buffer of binary COPY rows or array parameters. */
typedef struct pbuf {
  char *p;
  size_t n, cap;
} pbuf;
char *pb_room(pbuf *b, size_t n); /* n more bytes at the end (die() when out of memory) */
void pb_be32(pbuf *b, uint32_t v);
void pb_be64(pbuf *b, uint64_t v);
void pb_bytes(pbuf *b, const void *v, size_t n);  /* a COPY field or array element */
void pb_int(pbuf *b, uint64_t v, int size);       /* the same, an integer of 2, 4 or 8 bytes */
void pb_array(pbuf *b, uint32_t oid, uint32_t n); /* a 1-D binary array's header, n elements */

#endif
