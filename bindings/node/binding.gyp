{
  "targets": [{
    "target_name": "bucketstore",
    "sources": ["src/bucketstore_node.c", "deps/bucketstore.c"],
    "include_dirs": ["deps"],
    # -Wno-maybe-uninitialized: GCC's flow analysis at node-gyp's -O3 across the one-file
    # library reports false positives; the library's own build (-O2 -Werror) checks it.
    "cflags_c": ["-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-maybe-uninitialized"],
    "defines": ["NAPI_VERSION=8"],
    "libraries": ["-llmdb", "-lnettle", "-lpthread"]
  }]
}
