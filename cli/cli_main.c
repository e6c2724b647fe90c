/*
 * cli_main.c: the bucketstore command-line tool's entry point. Dispatches subcommands from a
 * table (name, handler, usage, help), and holds what the subcommands share: error-code names
 * and opening a database from --db / --memory / --nosync (a temporary file when neither).
 */
#include "cli.h"

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
  return c->path && (c->postgres || !strncmp(c->path, "postgresql://", 13) ||
                     !strncmp(c->path, "postgres://", 11));
}

int cli_db_open(cli_db *c, bs_error *err) {
  bs_open_options opts = BS_OPEN_OPTIONS_INIT;
  int rc;
  opts.flags = c->flags;
  if (c->memory) return bs_open_memory(&c->db, &opts, err);
  if (cli_is_postgres(c)) return bs_open_postgres(&c->db, c->path, &opts, err);
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

static void print_problem(const char *problem, void *payload) {
  (void)payload;
  printf("problem: %s\n", problem);
}

static int cmd_verify(int argc, char **argv) {
  cli_db c = {0};
  bs_error err = {0, ""};
  uint64_t problems = 0;
  int rc = cli_open_file(&c, argc, argv, 1, NULL, NULL);
  if (rc) goto done;
  if ((rc = bs_db_verify(&problems, c.db, print_problem, NULL, &err)) != BS_OK) {
    fprintf(stderr, "bucketstore verify: %s: %s\n", cli_code_name(rc), cli_error_text(rc, &err));
    rc = 1;
    goto done;
  }
  printf("%llu problem%s\n", (unsigned long long)problems, problems == 1 ? "" : "s");
  rc = problems ? 1 : 0;
done:
  cli_db_close(&c);
  return rc;
}

/* A read-write open of a PostgreSQL URL with flags: 0 creates or migrates the schema,
 * BS_OPEN_ACK_REWIND (with BS_OPEN_NOMIGRATE) records the server's history. */
static int open_url(int argc, char **argv, unsigned flags, const char *done) {
  cli_db c = {0};
  int rc = cli_parse_args(&c, argc, argv, NULL, NULL);
  if (!rc && !cli_is_postgres(&c)) {
    fprintf(stderr, "bucketstore %s: %s is not a postgresql:// URL (or give --postgres)\n", argv[1],
            cli_db_name(&c));
    rc = 2;
  }
  c.flags |= flags;
  if (!rc) rc = cli_open_existing(&c, argv[1], 0);
  if (!rc) printf("%s (bucketstore %s)\n", done, bs_version(NULL, NULL, NULL));
  cli_db_close(&c);
  return rc;
}

static int cmd_migrate(int argc, char **argv) {
  return open_url(argc, argv, 0, "the schema is at this build's version");
}

static int cmd_ack_rewind(int argc, char **argv) {
  return open_url(argc, argv, BS_OPEN_NOMIGRATE | BS_OPEN_ACK_REWIND,
                  "the server's history is recorded: writers may write again");
}

/* ---- Dispatch ------------------------------------------------------------------------------- */

static int cmd_help(int argc, char **argv);
static int cmd_version(int argc, char **argv) {
  printf("bucketstore %s (format %d)\n", bs_version(NULL, NULL, NULL), BS_FORMAT_VERSION);
  return 0;
}

static const struct command {
  const char *name;
  int (*fn)(int argc, char **argv);
  const char *usage;
  const char *help;
} commands[] = {
    {"drive", cli_drive, "drive [--db PATH | --memory | --postgres CONNINFO] [--nosync]",
     "Speaks the JSON-lines driver protocol (docs/driver.md) on stdin/stdout: one command\n"
     "object per input line, one reply object per output line, flushed after each. Without\n"
     "--db or --memory it uses a temporary file, deleted at exit. Exits 0 at end of input,\n"
     "1 if the database could not be opened.\n"},
    {"demo", cli_demo, "demo [--db PATH | --memory] [--nosync] [--rows N] [--seed N]",
     "Replicates a synthetic workload (a snapshot of N rows [20000] in three tables over ~100\n"
     "buckets, then rounds of updates, deletes and bucket moves, each committed as a\n"
     "checkpoint), downloads every bucket as clients do, checks every bucket's checksum and\n"
     "contents against what was written, compacts, checks again, and prints a summary.\n"
     "Exits non-zero on any mismatch. Without --db: a temporary file, deleted at exit.\n"},
    {"stat", cli_stat, "stat DB [--stream ID] [--top N] [--no-buckets]",
     "Prints database-wide counts (streams, buckets, ops by type, parameter entries, source\n"
     "records, write checkpoints, file size, and the bytes on free pages: space the file keeps\n"
     "but a backup does not copy), then per stream: its state and checkpoint, ops by type and\n"
     "live rows (read through the API at the last persisted op), and the N [10] most\n"
     "fragmented buckets, worst first. Fragmentation is ops per live row: a bucket whose rows\n"
     "were updated many times holds many ops per row still present, and is what compaction\n"
     "shrinks. --no-buckets skips the per-bucket reads (fast on a large file). Opens the file\n"
     "read-only; safe while a writer runs. Exit 0, or 1 on an error.\n"},
    {"verify", cmd_verify, "verify DB",
     "Recomputes every bucket's running checksum and count from its ops and checks key\n"
     "encodings and source records (docs/contract.md section 8); prints each problem on\n"
     "stdout, then the number of problems. Exit 0 when consistent, 1 when a problem was found\n"
     "or on an error. Opens the file read-only.\n"},
    {"migrate", cmd_migrate, "migrate URL",
     "Creates the bucketstore schema in the PostgreSQL database URL names, or migrates it to\n"
     "this build's version, in one transaction; each step waits at most lock_timeout (10 s\n"
     "unless the URL sets one) for a table's lock. Hosts that open with BS_OPEN_NOMIGRATE\n"
     "then never migrate on their own. Exit 0 when the schema is at this build's version.\n"},
    {"ack-rewind", cmd_ack_rewind, "ack-rewind URL",
     "After a failover or a restore rewound the PostgreSQL database URL names (writers refuse\n"
     "with \"history rewound\"), and once every client is made to sync again: records the\n"
     "server's history and lets the writers of every process write again (BS_OPEN_ACK_REWIND).\n"
     "Exit 0 when done.\n"},
    {"dump", cli_dump, "dump DB [--stream ID | --all] [--bucket NAME] [--checkpoint N]",
     "Writes one stream (every bucket, in name order) or one bucket as JSON lines: first\n"
     "{\"stream\",\"state\",\"checkpoint\",\"last_op\",\"read_at\"}, then one line per op\n"
     "{\"bucket\",\"op_id\",\"op\",\"object_type\",\"object_id\",\"subkey\",\"checksum\""
     "[,\"target_op\"],\n"
     "\"data\"} (op ids as decimal strings, data as the stored JSON text, fields an op does not\n"
     "carry are null), and after each bucket {\"bucket\",\"checksum\",\"count\"} at read_at\n"
     "(checksum signed 32-bit, as the sync protocol has it). Reads at --checkpoint N, else the\n"
     "stream's checkpoint, else (no checkpoint yet) the last persisted op. --stream ID: default\n"
     "the active stream, else the newest; --all: every stream, one after the other.\n"
     "Without --bucket and --checkpoint, the stored records follow, one line each\n"
     "{\"record\",\"stream\",\"key\",\"value\"} (the table, the stream it belongs to or 0 for\n"
     "the whole database, key and value in hex): the stream's (or, with --all, every) record\n"
     "and the database-wide ones, from one snapshot. 'bucketstore load' rebuilds a file from "
     "them.\n"
     "Read-only. Exit 1 on an error (e.g. BS_EINVALIDATED when N lies inside a compacted span).\n"},
    {"load", cli_load, "load NEW [DUMPFILE] [--stream ID]",
     "Creates the database file NEW from the record lines of 'bucketstore dump' output read from\n"
     "DUMPFILE (default, or '-': stdin); the other dump lines are skipped. --stream ID loads that\n"
     "stream's records and the database-wide ones only. The result has every record as dumped\n"
     "(so every checksum at every checkpoint is the original's, and dump of it prints the same\n"
     "lines); it is written beside NEW, verified, and only then renamed to NEW. Refuses an\n"
     "existing NEW; leaves nothing behind on failure. Exit 1 on an error (a dump made with\n"
     "--bucket or --checkpoint has no records).\n"},
    {"backup", cli_backup, "backup DB OUT [--force]",
     "Writes a consistent copy of DB (every stream, as of one snapshot) to OUT while writers\n"
     "keep running. The copy leaves out free pages: compaction frees pages inside the file but\n"
     "the file never shrinks, and a backup is how to get that space back (stop the writers,\n"
     "back up, move OUT over DB). The copy is written beside OUT, reopened and verified\n"
     "(0 problems), and only then renamed to OUT. Refuses an existing OUT unless --force.\n"
     "Opens DB read-only. Exit 1 on an error.\n"},
    {"compact", cli_compact,
     "compact DB [--stream ID] [--incremental | --initial] [--bucket NAME]...\n"
     "          [--max-op-id N] [--min-changes N] [--min-age-ms N] [--budget N] [--txn-ops N]\n"
     "          [--parameters]\n"
     "          [--quiet]",
     "Compacts one stream (docs/contract.md section 6) in short write transactions, so a\n"
     "replicating writer in another process keeps going. Default: full compaction of the\n"
     "buckets due (at least --min-changes [10] ops and 10% of the bucket since their last\n"
     "compaction), or of each --bucket NAME given, up to --max-op-id [the current checkpoint].\n"
     "  --incremental  only the ops the writer logged as superseded, at a horizon at least\n"
     "                 --min-age-ms [300000] old; --budget N stops after N ops\n"
     "  --txn-ops N    ops changed per write transaction [10000]\n"
     "  --initial      initial-replication compaction: before the first checkpoint only;\n"
     "                 deletes superseded ops outright (--max-op-id: default the last op)\n"
     "  --parameters   also compact parameter-lookup entries\n"
     "Progress goes to stderr: a bar on a terminal, a plain line per second otherwise; --quiet\n"
     "drops it. The summary goes to stdout. Ctrl-C stops between transactions with nothing\n"
     "half-done (exit 130); a second Ctrl-C kills. Exit 1 on an error.\n"},
    {"checkpoint", cli_checkpoint,
     "checkpoint DB [--stream ID] [--watch [--count N] [--timeout-ms N]]",
     "Prints the stream's checkpoint as a JSON line "
     "{\"stream\",\"checkpoint\",\"lsn\",\"time_ms\"}\n"
     "(time_ms: this machine's clock when the line was printed, ms since the epoch).\n"
     "--watch then prints one more line each time a new checkpoint commits, including commits\n"
     "by another process (which it polls every 50 ms, so commits closer together than that\n"
     "show as one line, the latest), until Ctrl-C, --count N new checkpoints, or --timeout-ms N\n"
     "milliseconds (with --count, reaching the timeout first is exit 1); without --watch they\n"
     "are a usage error. Lines are flushed as they are written. Read-only.\n"},
    {"version", cmd_version, "version", "Prints the library version and on-disk format.\n"},
    {"help", cmd_help, "help [COMMAND]", "Prints the usage of COMMAND, or of everything.\n"},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f) {
  size_t i;
  fprintf(f, "usage: bucketstore COMMAND [OPTIONS]\n\ncommands:\n");
  for (i = 0; i < N_COMMANDS; i++) fprintf(f, "  %s\n", commands[i].usage);
  fprintf(f, "\nDB is a database file, given as the first operand or as --db DB.\n"
             "'bucketstore help COMMAND' describes one.\n");
}

static const struct command *find_command(const char *name) {
  size_t i;
  for (i = 0; i < N_COMMANDS; i++)
    if (strcmp(commands[i].name, name) == 0) return &commands[i];
  return NULL;
}

static int cmd_help(int argc, char **argv) {
  const struct command *c;
  if (argc < 3) {
    usage(stdout);
    return 0;
  }
  if (!(c = find_command(argv[2]))) {
    fprintf(stderr, "bucketstore: unknown command '%s'\n", argv[2]);
    return 2;
  }
  printf("usage: bucketstore %s\n\n%s", c->usage, c->help);
  return 0;
}

int main(int argc, char **argv) {
  const struct command *c;
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    usage(stdout);
    return 0;
  }
  if (strcmp(argv[1], "--version") == 0) return cmd_version(argc, argv);
  if (!(c = find_command(argv[1]))) {
    fprintf(stderr, "bucketstore: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
  }
  if (argc == 3 && strcmp(c->name, "help") != 0 &&
      (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0)) {
    printf("usage: bucketstore %s\n\n%s", c->usage, c->help);
    return 0;
  }
  return c->fn(argc, argv);
}
