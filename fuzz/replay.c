/*
 * replay: runs a fuzz target's LLVMFuzzerTestOneInput over files and directories without
 * libFuzzer (`make fuzz-replay`: the seed corpus as a regression test in the plain build).
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  uint8_t *buf = NULL;
  long n;
  if (!f) return -1;
  if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0 ||
      !(buf = malloc((size_t)n + 1)) || fread(buf, 1, (size_t)n, f) != (size_t)n) {
    fclose(f);
    free(buf);
    return -1;
  }
  fclose(f);
  LLVMFuzzerTestOneInput(buf, (size_t)n);
  free(buf);
  return 0;
}

int main(int argc, char **argv) {
  unsigned long files = 0;
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  for (int i = 1; i < argc; i++) {
    struct stat st;
    DIR *d;
    struct dirent *e;
    char path[4096];
    if (stat(argv[i], &st) != 0) {
      fprintf(stderr, "replay: %s: not found\n", argv[i]);
      return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
      if (run_file(argv[i]) != 0) return 1;
      files++;
      continue;
    }
    if (!(d = opendir(argv[i]))) return 1;
    while ((e = readdir(d)) != NULL) {
      if (e->d_name[0] == '.') continue;
      snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
      if (run_file(path) != 0) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        closedir(d);
        return 1;
      }
      files++;
    }
    closedir(d);
  }
  fprintf(stderr, "replay %s: %lu inputs ok\n", argc > 0 ? argv[0] : "", files);
  return 0;
}
