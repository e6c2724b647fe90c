/*
 * cli_main.c: the bucketstore command-line tool's entry point, at the top of the CLI: dispatches
 * subcommands from a table (name, handler, usage, help) and holds the small ones (verify,
 * migrate, ack-rewind, version, help). What the subcommands share is cli_common.c's.
 */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* The library's defaults in the help text, as storage.h defines them. */
#define STR_(x)          #x
#define STR(x)           STR_(x)
#define MIN_CHANGES_TEXT STR(BS_COMPACT_MIN_BUCKET_CHANGES)
#define MIN_RATIO_TEXT   STR(BS_COMPACT_MIN_CHANGE_RATIO)
#define MIN_AGE_TEXT     STR(BS_COMPACT_MIN_AGE_MS)
#define TXN_OPS_TEXT     STR(BS_COMPACT_MAX_OPS_PER_TXN)

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
     "buckets due (at least --min-changes [" MIN_CHANGES_TEXT "] ops, and a share of at least\n"
     "[" MIN_RATIO_TEXT "] of the bucket, since their last compaction), or of each --bucket NAME\n"
     "given, up to --max-op-id [the current checkpoint].\n"
     "  --incremental  only the ops the writer logged as superseded, at a horizon at least\n"
     "                 --min-age-ms [" MIN_AGE_TEXT "] old; --budget N stops after N ops\n"
     "  --txn-ops N    ops changed per write transaction [" TXN_OPS_TEXT "]\n"
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
  fprintf(f, "\nDB is a database file, given as the first operand or as --db DB; a\n"
             "postgresql:// or postgres:// URL or a libpq key=value string (\"host=h dbname=d\")\n"
             "names a PostgreSQL database instead (a file of such a name: ./name).\n"
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
