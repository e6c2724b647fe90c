/*
 * cli.h: the pieces of the bucketstore command-line tool (cli/) that its files share. Not part of
 * the library: the CLI programs against storage.h only, like any other host. Its files sit on
 * one another one way (make layercheck): cli_common.c at the bottom (the helpers declared first
 * below), cli_buckets.c on it, then the subcommands (cli_tools.c, cli_driver.c, cli_demo.c), and
 * cli_main.c, the entry point, on top.
 */
#ifndef BUCKETSTORE_CLI_H
#define BUCKETSTORE_CLI_H

#include "storage.h"

/* The symbol of a status code ("BS_EINVAL"), derived from the BS_* values. */
const char *cli_code_name(int code);

/* The text of an error: err->msg when the library filled it, else bs_strerror's text without
 * its "BS_X: " prefix. */
/* PROCESSING, ACTIVE, ... as driver.md spells stream states. */
const char *cli_state_name(bs_stream_state s);
/* PUT, REMOVE, MOVE, CLEAR as driver.md spells op types. */
const char *cli_op_name(bs_op_type t);
const char *cli_error_text(int code, const bs_error *err);
/* "" for 1, else "s": "1 bucket", "2 buckets". */
const char *cli_s(uint64_t n);

/* Fills err (code and formatted message; err may be NULL) and returns code, like the library's
 * errors, so cli_error_text shows the message. */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 3, 4)))
#endif
int cli_fail(bs_error *err, int code, const char *fmt, ...);

/* Bytes as a JSON string (jansson; data NULL = JSON null, NULL on allocation failure). Bytes
 * that are not UTF-8 become U+FFFD, so a reply or dump line is always produced. */
struct json_t;
struct json_t *cli_json_bytes(bs_val v);

/* A database opened for a subcommand: --db PATH, --memory, or a temporary file deleted by
 * cli_db_close. */
typedef struct cli_db {
  bs_db *db;
  char *path;  /* NULL for memory */
  char *shown; /* path as messages show it (cli_db_name), made at the first use */
  int memory;
  int postgres;   /* path came with --postgres: a URL or a key=value conninfo (cli_is_postgres) */
  int temporary;  /* path is ours: unlink it (and its -lock) at close */
  unsigned flags; /* BS_OPEN_* */
  /* operands after the database (cli_parse_args): at most max_operands, set by the caller */
  int max_operands, n_operands;
  const char *operands[2];
} cli_db;

/* Parses the common options --db PATH, --memory, --nosync from argv[*i]; returns 1 when it
 * consumed one (advancing *i), 0 when argv[*i] is not one of them, -1 on a usage error. */
int cli_db_option(cli_db *c, int argc, char **argv, int *i);
int cli_db_open(cli_db *c, bs_error *err);
/* Whether c names a PostgreSQL database, not a file: given with --postgres, or a path that is
 * a postgresql:// or postgres:// URL or a key=value conninfo ("host=h dbname=d"), as libpq
 * takes them (a file of such a name is given as ./name). */
int cli_is_postgres(const cli_db *c);
/* The database as every message names it: the path, a PostgreSQL URL without its password
 * (bs_redact_conninfo), or "the memory backend". */
const char *cli_db_name(cli_db *c);
/* Closes the handle only (reopen keeps path and temporary). */
void cli_db_close_handle(cli_db *c);
void cli_db_close(cli_db *c);

/* A file command's arguments: the database as --db PATH or as the first operand, the
 * subcommand's own options through opt (returns 1 when it consumed argv[*i], 0 when unknown,
 * -1 on a usage error; may be NULL), then up to c->max_operands (<= 2) further operands into
 * c->operands. Returns 0, or the exit code (2) after printing the error. */
int cli_parse_args(cli_db *c, int argc, char **argv,
                   int (*opt)(int argc, char **argv, int *i, void *payload), void *payload);
/* Opens the existing file c->path (read-only when rdonly). Returns 0, or the exit code after
 * printing the error. */
int cli_open_existing(cli_db *c, const char *cmd, int rdonly);
/* cli_parse_args, then cli_open_existing. */
int cli_open_file(cli_db *c, int argc, char **argv, int rdonly,
                  int (*opt)(int argc, char **argv, int *i, void *payload), void *payload);

/* One bucket of a stream, with the figures bs_list_buckets gives (cli_buckets.c). */
typedef struct cli_bucket {
  char *name; /* NUL-terminated copy; bucket names may contain NUL: use name_size */
  size_t name_size;
  uint64_t ops, bytes; /* persisted ops and their bytes (bs_bucket_info count, bytes) */
  uint64_t last_op, changes;
  int due; /* scratch for the caller */
} cli_bucket;

/* Every bucket of st's stream, in ascending name order (any backend). Free with
 * cli_buckets_free. */
int cli_buckets_list(bs_storage *st, cli_bucket **out, size_t *n_out, bs_error *err);
void cli_buckets_free(cli_bucket *b, size_t n);
/* 1 when full compaction with these thresholds (0 / < 0 = defaults) would select b. */
int cli_bucket_due(const cli_bucket *b, uint64_t min_changes);

int cli_drive(int argc, char **argv);
/* (r) runs the driver over buf's lines on a fresh memory database (the fuzz target's hook) */
int cli_drive_buffer(const char *buf, size_t len);
int cli_demo(int argc, char **argv);
int cli_stat(int argc, char **argv);
int cli_dump(int argc, char **argv);
int cli_load(int argc, char **argv);
int cli_backup(int argc, char **argv);
int cli_compact(int argc, char **argv);
int cli_checkpoint(int argc, char **argv);

#endif
