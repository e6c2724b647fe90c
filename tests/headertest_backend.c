/*
 * headertest_backend.c: storage_backend.h (the implementer's header) must compile on its own, as
 * C99 -pedantic and as C++11 -pedantic (make headertest). A table is spelled as a backend author
 * writes it, with designated initialisers in C (C++11 has none: it value-initialises).
 */
#include "storage_backend.h"

int bs_headertest_backend_main(void);

static void ht_destroy(bs_storage *st) {
  (void)st;
}

int bs_headertest_backend_main(void) {
#ifdef __cplusplus
  bs_storage_vtable vt = bs_storage_vtable();
  vt.version = BS_STORAGE_VTABLE_VERSION;
  vt.destroy = ht_destroy;
#else
  bs_storage_vtable vt = {.version = BS_STORAGE_VTABLE_VERSION, .destroy = ht_destroy};
#endif
  bs_storage st;
  st.vt = &vt;
  st.db = 0;
  st.stream_id = 1;
  return (int)(st.vt->version + BS_DB_VTABLE_VERSION + BS_WRITER_VTABLE_VERSION) > 0 ? 0 : 1;
}
