{
  "targets": [{
    "target_name": "bucketstore",
    "sources": ["src/bucketstore_node.c"],
    "include_dirs": ["../.."],
    "cflags_c": ["-std=c11", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter"],
    "defines": ["NAPI_VERSION=8"],
    "libraries": ["<(module_root_dir)/../../build/libbucketstore.a", "-llmdb", "-lnettle", "-lpthread",
                  "<!@(pkg-config --libs libpq 2>/dev/null || true)"]
  }]
}
