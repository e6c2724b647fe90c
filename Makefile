# bucketstore: see README.md. `make test` (quick suite), `make check` (ASan+UBSan),
# `make demo` (the main job on a temporary database), `make bench`.
CC      ?= cc
OPT     ?= -O2 -g
BUILD   ?= build
SAN     ?=
PKGS    := liblmdb-dev libxxhash-dev libcmocka-dev nettle-dev libjansson-dev

WARN    := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wno-unused-parameter
BSCFLAGS := -std=c11 -D_GNU_SOURCE -fPIC $(WARN) $(OPT) $(SAN) $(CFLAGS)
LIBDEPS := -llmdb -lnettle -lpthread
SONAME  := libbucketstore.so.0

LIB_SRCS := $(sort $(filter-out cli_%.c,$(wildcard *.c)))
CLI_SRCS := $(sort $(wildcard cli_*.c))
TEST_SRCS := $(sort $(wildcard tests/test_*.c))
TEST_UTIL := $(sort $(wildcard tests/util_*.c))
BENCH_SRCS := $(sort $(wildcard bench/*.c))

LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/%.o)
CLI_OBJS := $(CLI_SRCS:%.c=$(BUILD)/%.o)
TEST_BINS := $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%)
TEST_UTIL_OBJS := $(TEST_UTIL:%.c=$(BUILD)/%.o)

.PHONY: all deps test check demo bench clean
all: deps $(BUILD)/libbucketstore.a $(BUILD)/libbucketstore.so bucketstore tests

deps:
	@missing=""; for p in $(PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else echo "missing packages; run: sudo apt-get install -y$$missing"; exit 1; fi; fi

$(BUILD)/%.o: %.c storage.h internal.h | deps
	@mkdir -p $(dir $@)
	$(CC) $(BSCFLAGS) -c $< -o $@

$(BUILD)/libbucketstore.a: $(LIB_OBJS)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/libbucketstore.so: $(LIB_OBJS)
	$(CC) -shared -Wl,-soname,$(SONAME) $(SAN) -o $@ $^ $(LIBDEPS)

bucketstore: $(CLI_OBJS) $(BUILD)/libbucketstore.a
	$(CC) $(SAN) -o $@ $(CLI_OBJS) $(BUILD)/libbucketstore.a $(LIBDEPS) -ljansson

$(BUILD)/tests/%: tests/%.c $(TEST_UTIL_OBJS) $(BUILD)/libbucketstore.a tests/*.h storage.h internal.h | deps
	@mkdir -p $(dir $@)
	$(CC) $(BSCFLAGS) -I. -o $@ $< $(TEST_UTIL_OBJS) $(BUILD)/libbucketstore.a $(LIBDEPS) -lcmocka

tests: $(TEST_BINS)

# Quick suite: every test binary, then the driver smoke.
test: deps tests bucketstore
	@set -e; for t in $(TEST_BINS); do echo "== $$t"; BS_TEST_QUICK=1 $$t; done
	@if [ -x tests/driver_smoke.sh ]; then tests/driver_smoke.sh ./bucketstore; fi
	@echo "all tests passed"

check:
	$(MAKE) BUILD=build-asan SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" OPT="-O1 -g" test

demo: deps bucketstore
	./bucketstore demo

$(BUILD)/bench/bsbench: $(BENCH_SRCS) $(BUILD)/libbucketstore.a storage.h
	@mkdir -p $(dir $@)
	$(CC) $(BSCFLAGS) -I. -o $@ $(BENCH_SRCS) $(BUILD)/libbucketstore.a $(LIBDEPS)

bench: deps $(BUILD)/bench/bsbench
	$(BUILD)/bench/bsbench $(BENCH_ARGS)

clean:
	rm -rf build build-asan bucketstore
