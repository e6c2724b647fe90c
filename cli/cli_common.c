/*
 * cli_common.c: what the bucketstore command-line tool's subcommands share, at the bottom of the
 * CLI (it uses no other CLI file): error-code and name spellings, opening a database from --db /
 * --memory / --postgres / --nosync (a temporary file when none), the file commands' arguments,
 * and bytes as JSON.
 */
#include "cli.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- Error codes ---------------------------------------------------------------------------- */

const char *cli_code_name(int code) {
  static const struct {
    int code;
    const char *name;
  } names[] = {
      {BS_OK, "BS_OK"},
      {BS_EINVAL, "BS_EINVAL"},
      {BS_ENOTFOUND, "BS_ENOTFOUND"},
      {BS_ETOOBIG, "BS_ETOOBIG"},
      {BS_ELIMIT, "BS_ELIMIT"},
      {BS_ESTATE, "BS_ESTATE"},
      {BS_EINVALIDATED, "BS_EINVALIDATED"},
      {BS_ESTALE, "BS_ESTALE"},
      {BS_ECORRUPT, "BS_ECORRUPT"},
      {BS_ENOMEM, "BS_ENOMEM"},
      {BS_EIO, "BS_EIO"},
      {BS_EBUSY, "BS_EBUSY"},
      {BS_EUNSUPPORTED, "BS_UNSUPPORTED"} /* driver.md's fixed spelling */,
      {BS_ECANCELED, "BS_ECANCELED"},
      {BS_EUSER, "BS_EUSER"},
  };
  size_t i;
  for (i = 0; i < sizeof names / sizeof names[0]; i++)
    if (names[i].code == code) return names[i].name;
  return "BS_EUNKNOWN";
}

const char *cli_state_name(bs_stream_state s) {
  switch (s) {
  case BS_STREAM_PROCESSING:
    return "PROCESSING";
  case BS_STREAM_ACTIVE:
    return "ACTIVE";
  case BS_STREAM_ERRORED:
    return "ERRORED";
  case BS_STREAM_STOPPED:
    return "STOPPED";
  case BS_STREAM_TERMINATED:
    return "TERMINATED";
  }
  return "UNKNOWN";
}

const char *cli_op_name(bs_op_type t) {
  switch (t) {
  case BS_OP_PUT:
    return "PUT";
  case BS_OP_REMOVE:
    return "REMOVE";
  case BS_OP_MOVE:
    return "MOVE";
  case BS_OP_CLEAR:
    return "CLEAR";
  }
  return "UNKNOWN";
}

const char *cli_error_text(int code, const bs_error *err) {
  const char *s;
  if (err && err->msg[0]) return err->msg;
  s = strstr(bs_strerror(code), ": ");
  return s ? s + 2 : bs_strerror(code);
}

const char *cli_s(uint64_t n) {
  return n == 1 ? "" : "s";
}

int cli_fail(bs_error *err, int code, const char *fmt, ...) {
  va_list ap;
  if (!err) return code;
  err->code = code;
  va_start(ap, fmt);
  vsnprintf(err->msg, sizeof err->msg, fmt, ap);
  va_end(ap);
  return code;
}

/* ---- Opening a database --------------------------------------------------------------------- */

int cli_db_option(cli_db *c, int argc, char **argv, int *i) {
  const char *a = argv[*i];
  if (strcmp(a, "--memory") == 0) {
    c->memory = 1;
  } else if (strcmp(a, "--nosync") == 0) {
    c->flags |= BS_OPEN_NOSYNC;
  } else if (strcmp(a, "--db") == 0 || strncmp(a, "--db=", 5) == 0 ||
             strcmp(a, "--postgres") == 0 || strncmp(a, "--postgres=", 11) == 0) {
    /* --postgres CONNINFO: the PostgreSQL backend, by URL or key=value (cli_is_postgres) */
    size_t n = a[2] == 'd' ? 4 : 10;
    const char *p = a[n] == '=' ? a + n + 1 : (*i + 1 < argc ? argv[++*i] : NULL);
    if (!p || !*p) {
      fprintf(stderr, "bucketstore: %.*s needs a %s\n", (int)n, a, n == 4 ? "path" : "URL");
      return -1;
    }
    free(c->path);
    free(c->shown);
    c->shown = NULL;
    c->path = strdup(p);
    c->postgres = n == 10;
    if (!c->path) return -1;
  } else {
    return 0;
  }
  if (c->memory && c->path) {
    fprintf(stderr, "bucketstore: --db/--postgres and --memory exclude each other\n");
    return -1;
  }
  return 1;
}

/* A fresh database in a new private directory of $TMPDIR (an existing empty file would be
 * refused as "empty file", and a bare name in /tmp could be raced). */
static int make_temporary(cli_db *c, bs_error *err) {
  const char *dir = getenv("TMPDIR");
  size_t n;
  if (!dir || !*dir) dir = "/tmp";
  n = strlen(dir) + sizeof "/bucketstore-XXXXXX/db";
  c->path = malloc(n);
  if (!c->path) return cli_fail(err, BS_ENOMEM, "out of memory naming a temporary file");
  snprintf(c->path, n, "%s/bucketstore-XXXXXX", dir);
  if (!mkdtemp(c->path)) {
    free(c->path);
    c->path = NULL;
    return cli_fail(err, BS_EIO, "cannot create a temporary directory in %s", dir);
  }
  strcat(c->path, "/db");
  c->temporary = 1;
  return BS_OK;
}

int cli_is_postgres(const cli_db *c) {
  return c->path && (c->postgres || bs_names_postgres(c->path));
}

int cli_db_open(cli_db *c, bs_error *err) {
  bs_open_options opts = BS_OPEN_OPTIONS_INIT;
  int rc;
  opts.flags = c->flags;
  if (c->memory) return bs_open_memory(&c->db, &opts, err);
  if (c->postgres) return bs_open_postgres(&c->db, c->path, &opts, err);
  if (!c->path && (rc = make_temporary(c, err)) != BS_OK) return rc;
  return bs_open(&c->db, c->path, &opts, err);
}

void cli_db_close_handle(cli_db *c) {
  bs_close(c->db);
  c->db = NULL;
}

void cli_db_close(cli_db *c) {
  cli_db_close_handle(c);
  if (c->temporary && c->path) {
    size_t n = strlen(c->path) + sizeof "-lock";
    char *lock = malloc(n);
    unlink(c->path);
    if (lock) {
      snprintf(lock, n, "%s-lock", c->path);
      unlink(lock);
      free(lock);
    }
    *strrchr(c->path, '/') = '\0';
    rmdir(c->path);
  }
  free(c->path);
  free(c->shown);
  c->path = c->shown = NULL;
}

const char *cli_db_name(cli_db *c) {
  size_t n;
  if (!c->path) return "the memory backend";
  if (!c->shown) {
    n = bs_redact_conninfo(NULL, 0, c->path) + 1;
    if ((c->shown = malloc(n)) != NULL) bs_redact_conninfo(c->shown, n, c->path);
  }
  return c->shown ? c->shown : "the database";
}

/* ---- Inspection commands: an existing file given as DB or --db DB ---------------------------- */

int cli_parse_args(cli_db *c, int argc, char **argv,
                   int (*opt)(int argc, char **argv, int *i, void *payload), void *payload) {
  const char *pos[3];
  int i, n_pos = 0, k;
  for (i = 2; i < argc; i++) {
    int r = cli_db_option(c, argc, argv, &i);
    if (r == 0 && opt) r = opt(argc, argv, &i, payload);
    if (r == 0 && (argv[i][0] != '-' || strcmp(argv[i], "-") == 0) && n_pos < 3) {
      pos[n_pos++] = argv[i];
      r = 1;
    }
    if (r < 0) return 2;
    if (r == 0) {
      fprintf(stderr, "bucketstore %s: unknown option %s (see 'bucketstore help %s')\n", argv[1],
              argv[i], argv[1]);
      return 2;
    }
  }
  if (c->memory) {
    fprintf(stderr, "bucketstore %s: works on a database file, not --memory\n", argv[1]);
    return 2;
  }
  /* the database is --db PATH or the first operand (like mdb_stat and sqlite3) */
  k = 0;
  if (!c->path && n_pos > 0 && !(c->path = strdup(pos[k++]))) return 2;
  if (!c->path) {
    fprintf(stderr, "bucketstore %s: no database given (DB or --db DB)\n", argv[1]);
    return 2;
  }
  if (n_pos - k > c->max_operands) {
    fprintf(stderr, "bucketstore %s: unexpected argument %s (see 'bucketstore help %s')\n", argv[1],
            pos[k + c->max_operands], argv[1]);
    return 2;
  }
  for (c->n_operands = 0; k < n_pos; k++) c->operands[c->n_operands++] = pos[k];
  return 0;
}

int cli_open_existing(cli_db *c, const char *cmd, int rdonly) {
  bs_error err = {0, ""};
  int rc;
  if (!cli_is_postgres(c) && access(c->path, F_OK) != 0) {
    fprintf(stderr, "bucketstore %s: %s does not exist\n", cmd, cli_db_name(c));
    return 1;
  }
  if (rdonly) c->flags |= BS_OPEN_RDONLY;
  rc = cli_db_open(c, &err);
  if (rc != BS_OK) {
    /* bs_open's messages about the file begin with its path: name it once. */
    const char *msg = cli_error_text(rc, &err);
    size_t n = strlen(c->path);
    int named = strncmp(msg, c->path, n) == 0 && msg[n] == ':';
    fprintf(stderr, "bucketstore %s: cannot open%s%s: %s: %s\n", cmd, named ? "" : " ",
            named ? "" : cli_db_name(c), cli_code_name(rc), msg);
    return 1;
  }
  return 0;
}

int cli_open_file(cli_db *c, int argc, char **argv, int rdonly,
                  int (*opt)(int argc, char **argv, int *i, void *payload), void *payload) {
  int rc = cli_parse_args(c, argc, argv, opt, payload);
  return rc ? rc : cli_open_existing(c, argv[1], rdonly);
}

/* ---- JSON ------------------------------------------------------------------------------------ */

json_t *cli_json_bytes(bs_val v) {
  json_t *s;
  char *copy;
  size_t i, n = 0;
  if (!v.data) return json_null();
  if ((s = json_stringn(v.data, v.size))) return s;
  if (!(copy = malloc(v.size * 3 + 1))) return NULL;
  for (i = 0; i < v.size; i++) {
    unsigned char ch = ((const unsigned char *)v.data)[i];
    if (ch < 0x80) {
      copy[n++] = (char)ch;
    } else {
      memcpy(copy + n, "\xEF\xBF\xBD", 3);
      n += 3;
    }
  }
  s = json_stringn(copy, n);
  free(copy);
  return s;
}
