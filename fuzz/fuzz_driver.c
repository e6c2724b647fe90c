/*
 * fuzz_driver: the JSON-lines driver (cli/cli_driver.c) on arbitrary input. Each input is a whole
 * session: its lines run against a fresh in-memory database through cli_drive_buffer(), the
 * driver's own loop. Replies go to /dev/null; the sanitizers judge.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cli/cli.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  if (!freopen("/dev/null", "w", stdout)) return 0;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 64 * 1024) return 0; /* whole sessions, not huge documents */
  cli_drive_buffer((const char *)data, size);
  return 0;
}
