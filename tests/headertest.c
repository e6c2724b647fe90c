/*
 * headertest.c: storage.h must compile on its own, as C99 -pedantic and as C++11 -pedantic
 * (make headertest builds this file both ways). Every *_INIT macro is expanded, so an options
 * struct that grows without its initialiser breaks this build (-Wmissing-field-initializers).
 */
#include "storage.h"

#ifdef __cplusplus
#define HT_LANG "C++"
#else
#define HT_LANG "C"
#endif

int bs_headertest_main(void);

/* Callback types as a host would write them. */
static int on_chunk(const bs_chunk *chunk, void *payload) {
  (void)payload;
  return chunk->n_ops > 0 ? 0 : 0;
}
static int on_progress(const bs_compact_stats *so_far, void *payload) {
  (void)payload;
  return so_far->ops_moved > 0 ? 0 : 0;
}

int bs_headertest_main(void) {
  bs_open_options open_opts = BS_OPEN_OPTIONS_INIT;
  bs_stream_options stream_opts = BS_STREAM_OPTIONS_INIT;
  bs_save save = BS_SAVE_INIT;
  bs_writer_options writer_opts = BS_WRITER_OPTIONS_INIT;
  bs_commit_options commit_opts = BS_COMMIT_OPTIONS_INIT;
  bs_batch_options batch_opts = BS_BATCH_OPTIONS_INIT;
  bs_compact_options compact_opts = BS_COMPACT_OPTIONS_INIT;
  bs_backup_options backup_opts = BS_BACKUP_OPTIONS_INIT;
  int (*chunk_fn)(const bs_chunk *, void *) = on_chunk;
  int (*rd)(int *, bs_storage *, uint64_t, const bs_bucket_request *, size_t,
            const bs_batch_options *, int (*)(const bs_chunk *, void *), void *, bs_error *) =
      bs_get_bucket_data;
  compact_opts.progress = on_progress;
  (void)chunk_fn;
  (void)rd;
  return (int)(open_opts.version + stream_opts.version + save.version + writer_opts.version +
               commit_opts.version + batch_opts.version + compact_opts.version +
               backup_opts.version + BS_VERSION_NUMBER + BS_SUBKEY_SIZE + sizeof HT_LANG) > 0
             ? 0
             : 1;
}
