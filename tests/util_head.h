/*
 * util_head.h: starts a stream's op id sequence high, so that the suites' workloads reach op
 * ids near the contract's bound (contract.md 2: below 2^63; clients read them as signed 64-bit
 * integers, JavaScript's doubles lose them above 2^53). No public call moves the sequence: a
 * stream that wrote and cleared head ops is in this state (a clear keeps the op head, internal.h
 * bs__stream_row), but getting there by writing would take 2^63 ops. So this reaches into each
 * built-in backend's storage: memory's stream, LMDB's stream record, PostgreSQL's bs_streams row.
 */
#ifndef BS_TESTS_UTIL_HEAD_H
#define BS_TESTS_UTIL_HEAD_H

#include "util_contract.h"

/* Sets the op head (the last op id allocated) of stream `stream` of db, opened by backend be at
 * path (ct_env's be, db and path), to head. The stream must have written nothing yet and no
 * writer of it may be flushing. BS_EUNSUPPORTED for a backend this file does not know (another
 * program's). */
int ct_set_op_head(const ct_backend *be, bs_db *db, const char *path, uint32_t stream,
                   uint64_t head, bs_error *err);
/* A new stream's op head, drawn: 0 (ids from 1) in most runs; in some a little below 2^32, 2^53
 * (the last integer a JavaScript number holds exactly) or 2^63 (the bound), so that a run's ids
 * cross the first two and end near the last, whose room (2^24 ids and more) no run uses up. */
uint64_t ct_draw_start_head(ct_rng *r);

#endif /* BS_TESTS_UTIL_HEAD_H */
