# bucketstore: see README.md. `make test` (quick suite), `make check` (ASan+UBSan),
# `make demo` (the main job on a temporary database), `make bench`.
CC      ?= cc
OPT     ?= -O2 -g
BUILD   ?= build
SAN     ?=
PKGS    := liblmdb-dev libxxhash-dev libcmocka-dev nettle-dev libjansson-dev g++ pkg-config

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

.PHONY: all deps test check demo bench bench-quick clean
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

$(BUILD)/tests/%: tests/%.c $(TEST_UTIL_OBJS) $(BUILD)/libbucketstore.a $(wildcard tests/*.h) storage.h internal.h | deps
	@mkdir -p $(dir $@)
	$(CC) $(BSCFLAGS) -I. -o $@ $< $(TEST_UTIL_OBJS) $(BUILD)/libbucketstore.a $(LIBDEPS) -lcmocka

# keep the test helpers' objects: they are shared by every test binary
.SECONDARY: $(TEST_UTIL_OBJS)

tests: $(TEST_BINS)

# Quick suite: every test binary, then the driver smoke.
test: deps tests bucketstore $(BUILD)/bench/bsbench
	@set -e; for t in $(TEST_BINS); do echo "== $$t"; BS_TEST_QUICK=1 $$t; done
	@if [ -x tests/driver_smoke.sh ]; then tests/driver_smoke.sh ./bucketstore; fi
	@echo "== bench smoke (no timing assertions)"
	$(BUILD)/bench/bsbench --quick >/dev/null
	@$(MAKE) --no-print-directory headertest examples
	@set -e; for e in $(EXAMPLE_BINS); do echo "== $$e"; $$e >/dev/null; done
	@tests/cli_check.sh ./bucketstore
	@if [ -z "$(SAN)" ]; then tests/install_check.sh && tests/amalgamate_check.sh; fi
	@echo "all tests passed"

check:
	$(MAKE) BUILD=build-asan SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" OPT="-O1 -g" test

demo: deps bucketstore
	./bucketstore demo

$(BUILD)/bench/bsbench: $(BENCH_SRCS) $(wildcard bench/*.h) $(BUILD)/libbucketstore.a storage.h | deps
	@mkdir -p $(dir $@)
	$(CC) $(BSCFLAGS) -I. -o $@ $(BENCH_SRCS) $(BUILD)/libbucketstore.a $(LIBDEPS)

# Default sizes (a few minutes on 2 cores); `make bench-quick` is the smoke run (seconds).
bench: deps $(BUILD)/bench/bsbench
	$(BUILD)/bench/bsbench $(BENCH_ARGS)

bench-quick: deps $(BUILD)/bench/bsbench
	$(BUILD)/bench/bsbench --quick $(BENCH_ARGS)

clean:
	rm -rf build build-asan bucketstore

# ---- Embedding (issue 8): install / uninstall, amalgamation, header test, examples ----------
# GNU conventions: `make install PREFIX=/opt/bs DESTDIR=/tmp/stage`. The shared library gets a
# real name with the full version, the soname libbucketstore.so.0 and the dev symlink.
.PHONY: install uninstall amalgamate headertest examples
VERSION    := $(shell sed -n 's/^\#define BS_VERSION_STRING "\(.*\)"/\1/p' storage.h)
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
INSTALL    ?= install
EXAMPLE_SRCS := $(sort $(wildcard examples/*.c))
EXAMPLE_BINS := $(EXAMPLE_SRCS:examples/%.c=$(BUILD)/examples/%)

# Rebuilt every time: PREFIX/LIBDIR are baked in and may differ between two `make install`s.
.PHONY: $(BUILD)/bucketstore.pc
$(BUILD)/bucketstore.pc: bucketstore.pc.in storage.h
	@mkdir -p $(dir $@)
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' \
	    -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' -e 's|@VERSION@|$(VERSION)|g' $< > $@

# Only storage.h is public: internal.h never leaves the tree.
install: $(BUILD)/libbucketstore.a $(BUILD)/libbucketstore.so bucketstore $(BUILD)/bucketstore.pc
	$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR) \
	  $(DESTDIR)$(PKGCONFIGDIR)
	$(INSTALL) -m 644 storage.h $(DESTDIR)$(INCLUDEDIR)/storage.h
	$(INSTALL) -m 644 $(BUILD)/libbucketstore.a $(DESTDIR)$(LIBDIR)/libbucketstore.a
	$(INSTALL) -m 755 $(BUILD)/libbucketstore.so $(DESTDIR)$(LIBDIR)/libbucketstore.so.$(VERSION)
	ln -sf libbucketstore.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libbucketstore.so
	$(INSTALL) -m 755 bucketstore $(DESTDIR)$(BINDIR)/bucketstore
	$(INSTALL) -m 644 $(BUILD)/bucketstore.pc $(DESTDIR)$(PKGCONFIGDIR)/bucketstore.pc
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && command -v ldconfig >/dev/null; then \
	  ldconfig; fi

uninstall:
	rm -f $(DESTDIR)$(INCLUDEDIR)/storage.h $(DESTDIR)$(LIBDIR)/libbucketstore.a \
	  $(DESTDIR)$(LIBDIR)/libbucketstore.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME) \
	  $(DESTDIR)$(LIBDIR)/libbucketstore.so $(DESTDIR)$(BINDIR)/bucketstore \
	  $(DESTDIR)$(PKGCONFIGDIR)/bucketstore.pc

# One bucketstore.c (every library .c with internal.h inlined, internals static) beside a copy
# of storage.h: vendor those two files and link -llmdb -lnettle -lpthread.
amalgamate: $(LIB_SRCS) internal.h storage.h tools/amalgamate.sh
	tools/amalgamate.sh $(BUILD)/amalgamation $(LIB_SRCS)

# storage.h alone, as C99 -pedantic and as C++11 -pedantic, every *_INIT macro expanded.
headertest: tests/headertest.c storage.h
	@mkdir -p $(BUILD)/headertest
	$(CC) -std=c99 -pedantic -Wall -Wextra -Werror -I. -o $(BUILD)/headertest/c99.o -c $<
	$(CXX) -x c++ -std=c++11 -pedantic -Wall -Wextra -Werror -I. \
	  -o $(BUILD)/headertest/cxx.o -c $<
	@echo "headertest: storage.h compiles alone as C99 and C++11"

$(BUILD)/examples/%: examples/%.c $(BUILD)/libbucketstore.a storage.h | deps
	@mkdir -p $(dir $@)
	$(CC) $(BSCFLAGS) -I. -o $@ $< $(BUILD)/libbucketstore.a $(LIBDEPS)

examples: $(EXAMPLE_BINS)

# Soak: `make soak SEEDS=N [SEED=first] [STEPS=n]` runs N seeds of each randomized suite
# (test_sync, test_property; every backend) at the quick size per seed. Logs in $(BUILD)/soak-*.log;
# a failure prints the failing seed and how to reproduce it.
SEEDS ?= 1000
SEED ?= 1
.PHONY: soak
soak: deps $(BUILD)/tests/test_sync $(BUILD)/tests/test_property
	@for t in test_sync test_property; do \
	  echo "== soak $$t: $(SEEDS) seeds from $(SEED) (log: $(BUILD)/soak-$$t.log)"; \
	  BS_TEST_QUICK=1 BS_SEED=$(SEED) BS_SEEDS=$(SEEDS) $(if $(STEPS),BS_STEPS=$(STEPS)) \
	    $(BUILD)/tests/$$t >$(BUILD)/soak-$$t.log 2>&1 || \
	    { grep -a -B2 -A3 'ERROR\|FAILED' $(BUILD)/soak-$$t.log | tail -40; exit 1; }; \
	done; echo "soak passed: $(SEEDS) seeds"
