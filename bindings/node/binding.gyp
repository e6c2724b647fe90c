{
  "variables": {
    # The PostgreSQL backend (openPostgres) when pkg-config finds libpq (Debian libpq-dev), as
    # the library's Makefile decides; without it the addon has LMDB and memory only.
    "bs_pg%": "<!(pkg-config --exists libpq 2>/dev/null && echo 1 || echo 0)"
  },
  "targets": [{
    "target_name": "bucketstore",
    "sources": ["src/bucketstore_node.c", "deps/bucketstore.c"],
    "include_dirs": ["deps"],
    "cflags_c": ["-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
    # -O2, the level the library is built at everywhere else (Makefile, setup.py), instead of
    # node-gyp's -O3. At -O3, GCC 12 reports six "may be used uninitialized" in the one-file
    # library: each is a failure path returning bs__fail()'s code, which it does not see is
    # non-zero; none is real.
    "configurations": {"Release": {"cflags!": ["-O3"], "cflags": ["-O2"]}},
    "defines": ["NAPI_VERSION=8"],
    "libraries": ["-llmdb", "-lnettle", "-lpthread"],
    "conditions": [["bs_pg==1", {
      "defines": ["BS_HAVE_PG"],
      "cflags_c": ["<!@(pkg-config --cflags libpq)"],
      "libraries": ["<!@(pkg-config --libs libpq)"]
    }, {
      # What bs_open says to a postgresql:// URL in an addon without libpq: advice for a package
      # user, where the library's own builds say "make PG=1".
      "defines": ["BS_NO_PG_ADVICE=\"the bucketstore addon was built without libpq: install libpq-dev (Debian), then npm rebuild bucketstore\""]
    }]]
  }]
}
