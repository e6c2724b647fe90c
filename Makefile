# bucketstore: see README.md. `make test` (quick suite), `make check` (ASan+UBSan),
# `make demo` (the main job on a temporary database), `make bench`.
CC      ?= cc
OPT     ?= -O2 -g
BUILD   ?= build
SAN     ?=
PKGS    := liblmdb-dev libxxhash-dev libcmocka-dev nettle-dev libjansson-dev g++ pkg-config \
           python3-dev python3-venv python3-pip python3-setuptools python3-wheel \
           python3-pytest python3-mypy abigail-tools

# The library is built with every -Wextra warning; the CLI and test objects keep unused parameters
# quiet (cmocka's and the driver's handler signatures would make that warning noise there).
WARN    := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes
APPWARN := -Wno-unused-parameter
BSCFLAGS := -std=c11 -D_GNU_SOURCE -fPIC -fvisibility=hidden $(WARN) $(OPT) $(SAN) $(CFLAGS)
LIBDEPS := -llmdb -lnettle -lpthread
SONAME  := libbucketstore.so.0
# DEBUG=1 (the default of the tree's builds: make, make test, make check) compiles BS_ASSERT in,
# the front/backend contract (docs/backends.md); DEBUG=0 compiles it out: build a release or a
# package with `make DEBUG=0` (and `make install DEBUG=0`). The amalgamation never has it.
DEBUG   ?= 1
ifeq ($(DEBUG),1)
BSCFLAGS += -DBS_DEBUG
endif

# The PostgreSQL backend (pg*.c) is built when libpq is found (`make PG=0` leaves it
# out: the library then links no libpq and bs_open_postgres answers BS_EUNSUPPORTED).
PG ?= $(shell pkg-config --exists libpq 2>/dev/null && echo 1 || echo 0)
ALL_LIB_SRCS := $(sort $(wildcard *.c))
ifeq ($(PG),1)
LIB_SRCS := $(ALL_LIB_SRCS)
PG_CFLAGS := -DBS_HAVE_PG $(shell pkg-config --cflags libpq)
BSCFLAGS += $(PG_CFLAGS)
LIBDEPS += $(shell pkg-config --libs libpq)
else
LIB_SRCS := $(filter-out pg%.c,$(ALL_LIB_SRCS))
endif
CLI_SRCS := $(sort $(wildcard cli/*.c))
TEST_SRCS := $(sort $(wildcard tests/test_*.c))
TEST_UTIL := $(sort $(wildcard tests/util_*.c))
BENCH_SRCS := $(filter-out bench/bench_migrate.c bench/bench_clear.c bench/bench_ab.c,$(sort $(wildcard bench/*.c)))

LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/%.o)
# Every object depends on the flags it was built with: $(BUILD)/cflags changes, and the objects
# rebuild, when they do (e.g. `make DEBUG=0` after `make`).
FLAGS_ID := $(CC) $(BSCFLAGS)
# `make` with no target builds `all` (the rule below would otherwise be the first one).
.DEFAULT_GOAL := all
.PHONY: FORCE
$(BUILD)/cflags: FORCE
	@mkdir -p $(BUILD); echo '$(FLAGS_ID)' | cmp -s - $@ || echo '$(FLAGS_ID)' > $@
CLI_OBJS := $(CLI_SRCS:%.c=$(BUILD)/%.o)
TEST_BINS := $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%)
TEST_UTIL_OBJS := $(TEST_UTIL:%.c=$(BUILD)/%.o)

.PHONY: all deps test run-examples check demo bench bench-quick clean
all: deps $(BUILD)/libbucketstore.a $(BUILD)/libbucketstore.so bucketstore tests

deps:
	@missing=""; for p in $(PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else echo "missing packages; run: sudo apt-get install -y$$missing"; exit 1; fi; fi

$(BUILD)/%.o: %.c storage.h storage_backend.h internal.h lmdb_internal.h $(BUILD)/cflags | deps
	@mkdir -p $(dir $@)
	$(CC) $(BSCFLAGS) -c $< -o $@

$(CLI_OBJS): cli/cli.h
$(CLI_OBJS): BSCFLAGS += -I.
$(filter $(BUILD)/mem%.o,$(LIB_OBJS)): mem_internal.h
$(filter $(BUILD)/pg%.o,$(LIB_OBJS)): pg_internal.h
$(CLI_OBJS) $(TEST_UTIL_OBJS): BSCFLAGS += $(APPWARN)

$(BUILD)/libbucketstore.a: $(LIB_OBJS)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/libbucketstore.so: $(LIB_OBJS)
	$(CC) -shared -Wl,-soname,$(SONAME) $(SAN) -o $@ $^ $(LIBDEPS)

# The CLI of each build lives in its build directory (so `make check` never replaces the plain
# one); ./bucketstore at the top is the default build's.
$(BUILD)/bucketstore: $(CLI_OBJS) $(BUILD)/libbucketstore.a
	$(CC) $(SAN) -o $@ $(CLI_OBJS) $(BUILD)/libbucketstore.a $(LIBDEPS) -ljansson

bucketstore: build/bucketstore
	cp $< $@

$(BUILD)/tests/%: tests/%.c $(TEST_UTIL_OBJS) $(BUILD)/libbucketstore.a $(wildcard tests/*.h) storage.h \
		internal.h lmdb_internal.h | deps
	@mkdir -p $(dir $@)
	$(CC) $(BSCFLAGS) $(APPWARN) -I. -o $@ $< $(TEST_UTIL_OBJS) $(BUILD)/libbucketstore.a $(LIBDEPS) \
	  -lcmocka

# keep the test helpers' objects: they are shared by every test binary
.SECONDARY: $(TEST_UTIL_OBJS)

tests: $(TEST_BINS)

# Quick suite: every test binary, then the driver smoke, ... Each step runs, the next ones after a
# failure too, and records pass, fail or skip (tests/step.sh) in $(TEST_RESULTS); the run ends
# with "N passed, M failed, K skipped" naming what failed and what was skipped, and fails on a
# failure, and with STRICT=1 (CI) on a skip too. A new step: a line `@$(STEP) name command`.
# $(call skip,why): what a recipe cannot run here, said and recorded (the step is then skipped).
TEST_RESULTS = $(BUILD)/test-results
STEP = tests/step.sh $(TEST_RESULTS)
# Seeds: every randomized run of make test draws them from SEED (default 1; `make test SEED=n`
# runs other ones), each pair of suite and backend in a block of 1000000 of its own
# (every block in one registry, tests/util_contract.c seed_blocks: the C suites', driver_diff.py's
# 21-22, the crash tests' 23-25 below, pg_crash's 46 in pg-test), and appends them to SEED_LOG;
# the step `seeds` fails if two runs share one.
SEED ?= 1
SEED_LOG = $(BUILD)/test-seeds
seed_block = $$(( $(SEED) + $(1) * 1000000 ))
test pg-test crashtest-quick powercut-quick: export BS_SEED_BASE = $(SEED)
test: export BS_SEED_LOG = $(abspath $(SEED_LOG))
STRICT ?= 0
skip = { echo "== skipped: $(1)"; if [ -n "$$BS_SKIP_NOTE" ]; then echo "$(1)" >>"$$BS_SKIP_NOTE"; fi; }
test: deps tests $(BUILD)/bucketstore $(BUILD)/bench/bsbench $(BUILD)/bench/bench_clear \
		$(BUILD)/bench/bench_migrate
	@rm -f $(TEST_RESULTS) $(SEED_LOG)
	@for t in $(filter-out $(PG_TEST_BINS),$(TEST_BINS)); do echo "== $$t"; \
	  $(STEP) $$t env BS_TEST_QUICK=1 $$t; done
	@$(STEP) pg-test $(MAKE) --no-print-directory pg-test
	@$(STEP) driver_smoke tests/driver_smoke.sh $(BUILD)/bucketstore
	@$(STEP) driver_diff $(PYTHON) tests/driver_diff.py $(BUILD)/bucketstore --seeds 80
	@echo "== bench smoke (no timing assertions)"
	@$(STEP) bench-smoke sh -c '$(BUILD)/bench/bsbench --quick >/dev/null && $(BUILD)/bench/bsbench --quick --proto --read-limit 37 >/dev/null && \
	  $(BUILD)/bench/bsbench --quick --proto=ops --read-limit 37 >/dev/null && \
	  $(BUILD)/bench/bsbench --quick --defrag --buckets 20 >/dev/null && d=$$(mktemp -d) && \
	  $(BUILD)/bench/bench_clear $$d 2000 10 >/dev/null && \
	  $(BUILD)/bench/bench_migrate --rows 2000 --reps 1 --batches 500 --dir $$d >/dev/null && rmdir $$d'
	@$(STEP) headertest $(MAKE) --no-print-directory headertest
	@$(STEP) examples $(MAKE) --no-print-directory run-examples
	@$(STEP) cli_check tests/cli_check.sh $(BUILD)/bucketstore
	@$(STEP) format_check tests/format_check.sh $(BUILD)/bucketstore
	@$(STEP) readme_check tests/readme_check.sh $(BUILD)/bucketstore
	@$(STEP) layercheck $(MAKE) --no-print-directory layercheck
	@$(STEP) install_check sh -c 'if [ -n "$(SAN)" ]; then $(call skip,install_check under sanitizers); \
	  else tests/install_check.sh; fi'
	@$(STEP) amalgamate_check sh -c 'if [ -n "$(SAN)" ]; then \
	  $(call skip,amalgamate_check under sanitizers); else tests/amalgamate_check.sh; fi'
	@$(STEP) abi-check sh -c 'if [ -n "$(SAN)" ]; then $(call skip,abi-check under sanitizers); \
	  else $(MAKE) --no-print-directory abi-check; fi'
	@$(STEP) contract_own_check sh -c 'if [ -n "$(SAN)" ]; then \
	  $(call skip,contract_own_check under sanitizers: the documented cc command links no sanitizer); \
	  else tests/contract_own_check.sh $(BUILD); fi'
	@$(STEP) fuzz-replay $(MAKE) --no-print-directory fuzz-replay
	@$(STEP) crashtest-quick $(MAKE) --no-print-directory crashtest-quick
	@$(STEP) powercut-quick $(MAKE) --no-print-directory powercut-quick
	@$(STEP) migratekill $(MAKE) --no-print-directory migratekill
	@$(STEP) clearkill $(MAKE) --no-print-directory clearkill
	@$(STEP) py-test sh -c 'if [ -n "$(SAN)" ]; then \
	  $(call skip,py-test under sanitizers: the package compiles a plain library of its own); \
	elif command -v $(PYTHON) >/dev/null; then $(MAKE) --no-print-directory py-test; \
	else $(call skip,py-test: no $(PYTHON)); fi'
	@$(STEP) node-test $(MAKE) --no-print-directory node-test
	@$(STEP) seeds tests/step.sh --seeds $(SEED_LOG)
	@tests/step.sh --summary $(TEST_RESULTS) $(STRICT)

run-examples: examples
	@set -e; d=$$(mktemp -d); for e in $(EXAMPLE_BINS); do echo "== $$e"; \
	  (cd $$d && $(CURDIR)/$$e >/dev/null); done; rm -rf $$d

# The PostgreSQL slice: its suites against a server of their own (tests/pg_server.sh
# run: initdb in /tmp, 127.0.0.1 on a free port, removed after), or against the server that
# BS_TEST_PG_URL names. Skipped, saying so, when no PostgreSQL binaries are installed; in a build
# without the backend (PG=0) test_pg checks that bs_open_postgres says BS_EUNSUPPORTED.
# The shared suites (contract, property, sync-client, differential, torn, compact) run there again
# on the "postgres" backend alone (BS_BACKEND=postgres, tests/util_contract.h).
PG_TEST_BINS := $(BUILD)/tests/test_pg $(BUILD)/tests/test_pg_compact $(BUILD)/tests/test_pg_verify \
	$(BUILD)/tests/test_pg_fault $(BUILD)/tests/test_pg_deploy
PG_SUITE_BINS := $(addprefix $(BUILD)/tests/,test_contract test_property test_sync test_diff test_torn \
	test_compact)
.PHONY: pg-test
PG_CRASH_BINS := $(addprefix $(BUILD)/tests/crash/,crash_writer crash_check pg_crash)
pg-test: deps $(PG_TEST_BINS) $(PG_SUITE_BINS) $(BUILD)/bucketstore $(BUILD)/bench/bsbench \
		$(PG_CRASH_BINS)
	@if [ "$(PG)" != 1 ]; then $(call skip,pg-test: built without the PostgreSQL backend (no libpq)); \
	  $(BUILD)/tests/test_pg; \
	else rc=0; tests/pg_server.sh run sh -c 'set -e; for t in $(PG_TEST_BINS); do \
	    echo "== $$t (PostgreSQL)"; BS_TEST_QUICK=1 $$t; done; \
	    for t in $(PG_SUITE_BINS); do echo "== $$t (postgres backend)"; \
	      BS_BACKEND=postgres BS_TEST_QUICK=1 $$t; done; \
	    if command -v psql >/dev/null; then BS_DRIVER_PG=1 tests/driver_smoke.sh \
	      $(BUILD)/bucketstore; $(PYTHON) tests/driver_diff.py $(BUILD)/bucketstore --seeds 16 \
	      --postgres "$$BS_TEST_PG_URL"; else $(call skip,driver scenarios on PostgreSQL: no psql); fi; \
	    echo "== pg_crash: 10 kills of the client (tests/crash/pg_crash.c)"; \
	    $(BUILD)/tests/crash/pg_crash $(BUILD)/tests/crash 10 $(call seed_block,46); \
	    echo "== bench smoke on PostgreSQL"; $(BUILD)/bench/bsbench --quick --pg "$$BS_TEST_PG_URL" >/dev/null; \
	    $(BUILD)/bench/bsbench --quick --pg "$$BS_TEST_PG_URL" --pg-proto --pg-rows 1000 --buckets 10 \
	      --read-limit 37 >/dev/null' \
	  || rc=$$?; \
	  if [ $$rc = 77 ]; then $(call skip,pg-test: no PostgreSQL server binaries (apt-get install \
	    postgresql-15 or set BS_TEST_PG_URL)); elif [ $$rc != 0 ]; then exit $$rc; fi; fi

check:
	$(MAKE) BUILD=build-asan SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" OPT="-O1 -g" test

# tsan: the suites that run threads (writers, compactors, readers, the PostgreSQL pool's waiters
# and racing opens) under ThreadSanitizer, in a build of its own; the PostgreSQL ones beside a
# server of their own (as pg-test). A report fails the run (halt_on_error).
TSAN_TESTS := test_concurrency test_cache test_compact test_backup test_front test_sharedenv
TSAN_PG_TESTS := test_pg test_pg_fault
TSAN_RUN = set -e; for t in $(1); do echo "== tsan $$t"; \
	  BS_TEST_QUICK=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" build-tsan/tests/$$t; done
.PHONY: tsan
tsan: deps
	@$(MAKE) --no-print-directory BUILD=build-tsan SAN="-fsanitize=thread" OPT="-O1 -g" \
	  $(addprefix build-tsan/tests/,$(TSAN_TESTS) $(if $(filter 1,$(PG)),$(TSAN_PG_TESTS)))
	@$(call TSAN_RUN,$(TSAN_TESTS))
	@if [ "$(PG)" = 1 ]; then tests/pg_server.sh run sh -c '$(call TSAN_RUN,$(TSAN_PG_TESTS))'; fi
	@echo "tsan: clean"

demo: deps bucketstore
	./bucketstore demo

# bsbench --proto=ops's layout e (bench/proto_layout.c) compresses chunks with zstd when pkg-config
# finds libzstd (Debian: libzstd-dev); without it that layout is left out. The library links no zstd.
BENCH_ZSTD ?= $(shell pkg-config --exists libzstd 2>/dev/null && echo 1 || echo 0)
ifeq ($(BENCH_ZSTD),1)
BENCH_FLAGS := -DBS_BENCH_ZSTD $(shell pkg-config --cflags libzstd)
BENCH_LIBS := $(shell pkg-config --libs libzstd)
endif
$(BUILD)/bench/bsbench: $(BENCH_SRCS) $(wildcard bench/*.h) $(BUILD)/libbucketstore.a storage.h | deps
	@mkdir -p $(dir $@)
	$(CC) $(BSCFLAGS) $(BENCH_FLAGS) -I. -o $@ $(BENCH_SRCS) $(BUILD)/libbucketstore.a $(LIBDEPS) \
	  $(BENCH_LIBS)

# Default sizes (a few minutes on 2 cores); `make bench-quick` is the smoke run (seconds).
bench: deps $(BUILD)/bench/bsbench
	$(BUILD)/bench/bsbench $(BENCH_ARGS)

bench-quick: deps $(BUILD)/bench/bsbench
	$(BUILD)/bench/bsbench --quick $(BENCH_ARGS)

# bench_migrate: the LMDB format migration at several transaction sizes (bench/README.md).
$(BUILD)/bench/bench_migrate: bench/bench_migrate.c tests/util_format1.h $(BUILD)/libbucketstore.a \
		storage.h lmdb_internal.h | deps
	@mkdir -p $(dir $@)
	$(CC) $(BSCFLAGS) -I. -o $@ $< $(BUILD)/libbucketstore.a $(LIBDEPS)

# bench_ab: warm whole-bucket reads of several builds' libraries, interleaved in one process
# (docs/format.md 4.3, "Reads and the cache").
$(BUILD)/bench/bench_ab: bench/bench_ab.c storage.h | deps
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE $(OPT) -I. -o $@ $< -ldl

# bench_clear: what an LMDB clear costs, and when readers see it (bench/README.md).
$(BUILD)/bench/bench_clear: bench/bench_clear.c $(BUILD)/libbucketstore.a storage.h lmdb_internal.h | deps
	@mkdir -p $(dir $@)
	$(CC) $(BSCFLAGS) -I. -o $@ $< $(BUILD)/libbucketstore.a $(LIBDEPS)

clean:
	rm -rf build build-asan build-fuzz build-tsan build-abi bucketstore

# ---- Embedding: install / uninstall, amalgamation, header test, examples ---------------------
# GNU conventions: `make install PREFIX=/opt/bs DESTDIR=/tmp/stage`. The shared library gets a
# real name with the full version, the soname libbucketstore.so.0 and the dev symlink.
.PHONY: install uninstall amalgamate headertest examples
VERSION    := $(shell sed -n 's/^\#define BS_VERSION_STRING "\(.*\)"/\1/p' storage.h)
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
MANDIR     ?= $(PREFIX)/share/man
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
INSTALL    ?= install
EXAMPLE_SRCS := $(sort $(wildcard examples/*.c))
EXAMPLE_BINS := $(EXAMPLE_SRCS:examples/%.c=$(BUILD)/examples/%)

# Rebuilt every time: PREFIX/LIBDIR are baked in and may differ between two `make install`s.
.PHONY: $(BUILD)/bucketstore.pc
$(BUILD)/bucketstore.pc: bucketstore.pc.in storage.h
	@mkdir -p $(dir $@)
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' \
	    -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' -e 's|@VERSION@|$(VERSION)|g' \
	    -e 's|@PG_LIBS@|$(if $(filter 1,$(PG)), -lpq)|g' $< > $@

# storage.h is the user's header, storage_backend.h the implementer's (a host that supplies a
# backend); internal.h never leaves the tree. They go into a directory of their own
# (bucketstore/storage.h cannot clash with another project's storage.h); the .pc file's
# Cflags point into it, so hosts keep writing #include "storage.h" or <storage.h>.
install: $(BUILD)/libbucketstore.a $(BUILD)/libbucketstore.so $(BUILD)/bucketstore $(BUILD)/bucketstore.pc
	$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR)/bucketstore \
	  $(DESTDIR)$(PKGCONFIGDIR) $(DESTDIR)$(MANDIR)/man1
	$(INSTALL) -m 644 storage.h $(DESTDIR)$(INCLUDEDIR)/bucketstore/storage.h
	$(INSTALL) -m 644 storage_backend.h $(DESTDIR)$(INCLUDEDIR)/bucketstore/storage_backend.h
	$(INSTALL) -m 644 bucketstore.1 $(DESTDIR)$(MANDIR)/man1/bucketstore.1
	$(INSTALL) -m 644 $(BUILD)/libbucketstore.a $(DESTDIR)$(LIBDIR)/libbucketstore.a
	$(INSTALL) -m 755 $(BUILD)/libbucketstore.so $(DESTDIR)$(LIBDIR)/libbucketstore.so.$(VERSION)
	ln -sf libbucketstore.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libbucketstore.so
	$(INSTALL) -m 755 $(BUILD)/bucketstore $(DESTDIR)$(BINDIR)/bucketstore
	$(INSTALL) -m 644 $(BUILD)/bucketstore.pc $(DESTDIR)$(PKGCONFIGDIR)/bucketstore.pc
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && command -v ldconfig >/dev/null; then \
	  ldconfig; fi

uninstall:
	rm -f $(DESTDIR)$(INCLUDEDIR)/bucketstore/storage.h \
	  $(DESTDIR)$(INCLUDEDIR)/bucketstore/storage_backend.h $(DESTDIR)$(MANDIR)/man1/bucketstore.1 \
	  $(DESTDIR)$(LIBDIR)/libbucketstore.a \
	  $(DESTDIR)$(LIBDIR)/libbucketstore.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME) \
	  $(DESTDIR)$(LIBDIR)/libbucketstore.so $(DESTDIR)$(BINDIR)/bucketstore \
	  $(DESTDIR)$(PKGCONFIGDIR)/bucketstore.pc
	rmdir $(DESTDIR)$(INCLUDEDIR)/bucketstore 2>/dev/null || true

# One bucketstore.c (every library .c with internal.h inlined, internals static) beside copies
# of storage.h and storage_backend.h: vendor them and link -llmdb -lnettle -lpthread; the
# PostgreSQL backend's files are in it, compiled with -DBS_HAVE_PG (then link -lpq too).
AMALG_SRCS := $(ALL_LIB_SRCS)
AMALG_DEPS := $(AMALG_SRCS) internal.h lmdb_internal.h mem_internal.h pg_internal.h storage.h \
		storage_backend.h tools/amalgamate.sh
amalgamate: $(AMALG_DEPS)
	tools/amalgamate.sh $(BUILD)/amalgamation $(AMALG_SRCS)

# storage.h and storage_backend.h alone, as C99 -pedantic and as C++11 -pedantic, every *_INIT
# macro expanded. The slots are listed only in storage_backend.h (BS_*_SLOTS), no document copies
# them, so there is no list to check against them.
headertest: tests/headertest.c tests/headertest_backend.c storage.h storage_backend.h
	@mkdir -p $(BUILD)/headertest
	@set -e; for t in headertest headertest_backend; do \
	  $(CC) -std=c99 -pedantic -Wall -Wextra -Werror -I. -o $(BUILD)/headertest/$$t.c99.o \
	    -c tests/$$t.c; \
	  $(CXX) -x c++ -std=c++11 -pedantic -Wall -Wextra -Werror -I. \
	    -o $(BUILD)/headertest/$$t.cxx.o -c tests/$$t.c; done
	@echo "headertest: storage.h and storage_backend.h compile alone as C99 and C++11"

# <lmdb.h> only in LMDB files: every library file but lmdb*.c compiles with an include
# path whose first lmdb.h is an #error, and only lmdb_internal.h names it.
# tools/layercheck.sh: the layers of internal.h on the object files (nm): the common layer uses
# nothing, the rules only it, a backend never the front (storage.o) nor another backend; and no
# two files use each other, directly or round a cycle (it prints each cycle it finds).
.PHONY: layercheck
layercheck: $(BUILD)/libbucketstore.a $(CLI_OBJS)
	@mkdir -p $(BUILD)/layercheck/include
	@echo '#error "<lmdb.h> outside the LMDB backend (include lmdb_internal.h from lmdb*.c only)"' \
	  > $(BUILD)/layercheck/include/lmdb.h
	@set -e; for f in $(filter-out lmdb%.c,$(LIB_SRCS)); do \
	  $(CC) $(BSCFLAGS) -I$(BUILD)/layercheck/include -fsyntax-only $$f; done
	@bad=$$(grep -l '[<"]lmdb\.h[>"]' $(filter-out lmdb_internal.h,$(wildcard *.c *.h cli/*.c cli/*.h))); \
	  if [ -n "$$bad" ]; then echo "layercheck: lmdb.h named in $$bad"; exit 1; fi
	@bad=$$(grep -l '[<"]libpq-fe\.h[>"]' $(filter-out pg_internal.h,$(wildcard *.c *.h cli/*.c cli/*.h))); \
	  if [ -n "$$bad" ]; then echo "layercheck: libpq-fe.h named in $$bad"; exit 1; fi
	@echo "layercheck: $(words $(filter-out lmdb%.c,$(LIB_SRCS))) library files compile without lmdb.h"
	@pub=$$(grep -ho '\bbs_[a-z0-9_]*' storage.h storage_backend.h | sort -u); \
	  bad=$$(nm -g --defined-only $(BUILD)/libbucketstore.a | awk '$$2 ~ /[TDBR]/ {print $$3}' | \
	    grep '^bs_' | grep -v '^bs__' | sort -u | grep -vxF "$$pub" || true); \
	  if [ -n "$$bad" ]; then echo "layercheck: internal symbols without the bs__ prefix: $$bad"; exit 1; fi
	@echo "layercheck: every exported bs_ symbol is declared in storage.h or storage_backend.h;" \
	  "internal ones are bs__"
	@tools/layercheck.sh $(LIB_OBJS)
	@tools/layercheck.sh $(CLI_OBJS)

# ABI: libbucketstore.so's ABI (abidw, libabigail) against the baseline kept in
# abi/libbucketstore.abi, for the version in abi/version. abi-check (in `make test`) fails on any
# change, also an addition: a program built against one 0.x header must run with the next
# library. A deliberate change: bump BS_VERSION_* in storage.h (minor for an addition, major for
# an incompatible change), then `make abi-update`, which refuses an ABI change without a bump
# once the version is released (CHANGELOG.md has its "## X.Y.Z" section): an unreleased version
# takes further changes under the same number.
# Both read a release build (DEBUG=0, -O2 -g: abidw needs the debug info) of their own.
ABI_BUILD := build-abi
ABIDW_FLAGS := --no-corpus-path --no-show-locs --no-comp-dir-path --drop-private-types \
	--header-file storage.h --header-file storage_backend.h
.PHONY: abi-check abi-update $(ABI_BUILD)/libbucketstore.abi
$(ABI_BUILD)/libbucketstore.abi: | deps
	@$(MAKE) --no-print-directory BUILD=$(ABI_BUILD) DEBUG=0 SAN= OPT="-O2 -g" CFLAGS= \
	  $(ABI_BUILD)/libbucketstore.so >/dev/null
	abidw $(ABIDW_FLAGS) --out-file $@ $(ABI_BUILD)/libbucketstore.so

abi-check: $(ABI_BUILD)/libbucketstore.abi
	@rc=0; abidiff abi/libbucketstore.abi $< > $(ABI_BUILD)/abidiff.txt 2>&1 || rc=$$?; \
	if [ $$rc != 0 ]; then cat $(ABI_BUILD)/abidiff.txt; \
	  echo "abi-check: the ABI of libbucketstore.so is not abi/libbucketstore.abi's (abidiff" \
	    "exit $$rc: 4 = a change it deems compatible, 12 = an incompatible one). If you meant it:" \
	    "bump BS_VERSION_* in storage.h, then make abi-update"; exit 1; fi
	@echo "abi-check: libbucketstore.so has the ABI of abi/libbucketstore.abi ($$(cat abi/version))"

abi-update: $(ABI_BUILD)/libbucketstore.abi
	@if [ -f abi/libbucketstore.abi ] && abidiff abi/libbucketstore.abi $< >/dev/null 2>&1; then \
	  echo "abi-update: no ABI change"; exit 0; fi; \
	if [ "$$(cat abi/version 2>/dev/null)" = "$(VERSION)" ] && \
	  grep -q '^## $(VERSION)$$' CHANGELOG.md; then \
	  echo "abi-update: the ABI changed, the version did not ($(VERSION), released):" \
	    "bump BS_VERSION_* in storage.h first"; exit 1; fi; \
	mkdir -p abi && cp $< abi/libbucketstore.abi && echo "$(VERSION)" > abi/version && \
	echo "abi-update: abi/libbucketstore.abi is version $(VERSION)'s ABI"

$(BUILD)/examples/%: examples/%.c $(BUILD)/libbucketstore.a storage.h | deps
	@mkdir -p $(dir $@)
	$(CC) $(BSCFLAGS) -I. -o $@ $< $(BUILD)/libbucketstore.a $(LIBDEPS)

examples: $(EXAMPLE_BINS)

# Soak: `make soak SEEDS=N [SEED=base] [STEPS=n]` runs N seeds of each randomized suite
# (test_sync, test_property: every backend; test_diff: lmdb against memory) at the quick size per
# seed, then tests/driver_diff.py (the driver's replies, memory against lmdb), each run in its seed
# block from SEED (as make test; N up to 1000000 keeps the blocks apart). Logs in $(BUILD)/soak-*.log; a failure prints the failing seed and how to reproduce it.
SEEDS ?= 1000
SOAK_TESTS := test_sync test_property test_diff
.PHONY: soak
soak: deps $(SOAK_TESTS:%=$(BUILD)/tests/%) $(BUILD)/bucketstore
	@for t in $(SOAK_TESTS); do \
	  echo "== soak $$t: $(SEEDS) seeds from $(SEED) (log: $(BUILD)/soak-$$t.log)"; \
	  BS_TEST_QUICK=1 BS_SEED_BASE=$(SEED) BS_SEEDS=$(SEEDS) $(if $(STEPS),BS_STEPS=$(STEPS)) \
	    $(BUILD)/tests/$$t >$(BUILD)/soak-$$t.log 2>&1 || \
	    { grep -a -B2 -A3 'ERROR\|FAILED' $(BUILD)/soak-$$t.log | tail -40; exit 1; }; \
	done; echo "== soak driver_diff: $(SEEDS) seeds from $(SEED)"; \
	BS_SEED_BASE=$(SEED) $(PYTHON) tests/driver_diff.py $(BUILD)/bucketstore --seeds $(SEEDS) \
	  $(if $(STEPS),--steps $(STEPS)) || exit 1; echo "soak passed: $(SEEDS) seeds"
	@$(MAKE) --no-print-directory mutate

# Mutation check (tests/mutate.py): each one-line mutant of a rule operator in tests/mutants.txt
# is built in a copy of the tree, and a quick suite must fail on it; lists every survivor. Run
# by hand and by soak, not by test (minutes: a rebuild per mutant).
.PHONY: mutate
mutate: deps
	@$(PYTHON) tests/mutate.py

# ==== Reliability: crash test, fuzzing, valgrind ===============================================
# crashtest: SIGKILL a durable writer CRASH_KILLS times at random moments, checking the file
# after each kill (tests/crash/). crashtest-quick (in `make test`): 10 kills.
CRASH_KILLS ?= 300
CRASH_BINS := $(BUILD)/tests/crash/crash_writer $(BUILD)/tests/crash/crash_check
.PHONY: crashtest crashtest-quick fuzz fuzz-replay valgrind
$(BUILD)/tests/crash/%: tests/crash/%.c tests/crash/crash_workload.h tests/crash/kill_files.h tests/util_fault.h \
		$(BUILD)/tests/util_fault.o $(BUILD)/libbucketstore.a storage.h | deps
	@mkdir -p $(dir $@)
	$(CC) $(BSCFLAGS) -I. -o $@ $< $(BUILD)/tests/util_fault.o $(BUILD)/libbucketstore.a $(LIBDEPS)

crashtest: deps $(CRASH_BINS)
	tests/crash/crashtest.sh $(BUILD)/tests/crash $(CRASH_KILLS)

crashtest-quick: deps $(CRASH_BINS)
	@BS_SEED=$(call seed_block,23) BS_CRASH_MAXMS=150 tests/crash/crashtest.sh $(BUILD)/tests/crash 10

# pgcrash: the crash test on PostgreSQL (tests/crash/pg_crash.c): the client SIGKILLed
# PG_CRASH_KILLS times at counted points of its flushes, commits and compactions, beside a server
# of its own (as pg-test; its 10-kill slice runs in pg-test, seed block 46).
PG_CRASH_KILLS ?= 100
.PHONY: pgcrash
pgcrash: deps $(PG_CRASH_BINS)
	@tests/pg_server.sh run $(BUILD)/tests/crash/pg_crash $(BUILD)/tests/crash $(PG_CRASH_KILLS) \
	  $(call seed_block,46)

# migratekill (in `make test`): SIGKILL inside the migration of a copy of each older format's
# tests/data file that has records to convert (format1.mdb migrates 1 -> 2 -> 3 -> 4 -> 5 -> 6;
# format 3's step only stamps the version, test_format stops it; format4.mdb's ops regrouped into
# chunks; format5.mdb's chunks recoded), at each transaction and each record
# (tests/crash/migrate_kill.c); each next open finishes it.
.PHONY: migratekill
migratekill: deps $(BUILD)/tests/crash/migrate_kill
	@dir=$$(mktemp -d "$${TMPDIR:-/tmp}/bs_migratekill_XXXXXX") && \
	  for f in tests/data/format1.mdb tests/data/format2.mdb tests/data/format4.mdb \
	    tests/data/format5.mdb; do \
	    $(BUILD)/tests/crash/migrate_kill $$f "$$dir" || { rc=1; break; }; rc=0; done; \
	  rm -rf "$$dir"; exit $$rc

# clearkill (in `make test`): SIGKILL between the transactions of a clear's deletion, at each of
# them (tests/crash/clear_kill.c); every reader sees the clear complete, the next open finishes it.
.PHONY: clearkill
clearkill: deps $(BUILD)/tests/crash/clear_kill
	@dir=$$(mktemp -d "$${TMPDIR:-/tmp}/bs_clearkill_XXXXXX") && \
	  $(BUILD)/tests/crash/clear_kill "$$dir"; rc=$$?; rm -rf "$$dir"; exit $$rc

# powercut: POWERCUT_CUTS power cuts under the crash writer (tests/crash/powercut.sh: an
# LD_PRELOAD shim leaves the file with what was synced plus a random subset of the unsynced
# pages, torn at 512-byte sectors; it must verify clean with every returned commit).
# powercut-quick (in `make test`): 10 cuts, then the same under the writer opened with
# BS_OPEN_NOSYNC, which must fail (else the test could not tell durable from not). Not under
# sanitizers: their runtime must come before any preloaded library.
POWERCUT_CUTS ?= 200
POWERCUT_BINS := $(CRASH_BINS) $(BUILD)/tests/crash/crash_writer_nosync $(BUILD)/tests/crash/powercut.so
.PHONY: powercut powercut-quick
$(BUILD)/tests/crash/powercut.so: tests/crash/powercut.c | deps
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE -fPIC -shared $(WARN) $(OPT) -o $@ $< -ldl

$(BUILD)/tests/crash/crash_writer_nosync: tests/crash/crash_writer.c tests/crash/crash_workload.h \
		tests/util_fault.h $(BUILD)/tests/util_fault.o $(BUILD)/libbucketstore.a storage.h | deps
	$(CC) $(BSCFLAGS) -DCRASH_NOSYNC -I. -o $@ $< $(BUILD)/tests/util_fault.o \
	  $(BUILD)/libbucketstore.a $(LIBDEPS)

powercut: deps $(POWERCUT_BINS)
	tests/crash/powercut.sh $(BUILD)/tests/crash $(POWERCUT_CUTS)

powercut-quick: deps $(POWERCUT_BINS)
	@if [ -n "$(SAN)" ]; then $(call skip,powercut under sanitizers: a preloaded shim cannot come first); \
	else BS_SEED=$(call seed_block,24) tests/crash/powercut.sh $(BUILD)/tests/crash 10 && \
	  if BS_SEED=$(call seed_block,25) BS_CRASH_KEEP=0 tests/crash/powercut.sh $(BUILD)/tests/crash 10 \
	      crash_writer_nosync >/dev/null 2>&1; then \
	    echo "powercut: the writer without fsync survived: the test cannot tell durable from not"; \
	    exit 1; \
	  else echo "powercut: the writer without fsync fails it, as it must"; fi; fi

# fuzz: each libFuzzer target (clang, ASan+UBSan) for FUZZ_TIME seconds; new inputs go to
# build-fuzz/corpus-*, the seed corpus fuzz/corpus/* is only read. fuzz-replay (in `make test`):
# the seed corpus through the normal build (plain, or ASan under `make check`).
FUZZ_CC ?= clang
FUZZ_TIME ?= 60
FUZZ_TARGETS := fuzz_driver fuzz_lookup fuzz_op fuzz_records fuzz_api
FUZZ_FLAGS := -std=c11 -D_GNU_SOURCE -g -O1 -I. -fno-sanitize-recover=all $(PG_CFLAGS)
fuzz_cli = $(if $(filter fuzz_driver,$(1)),$(2) -ljansson)
build-fuzz/%: fuzz/%.c $(LIB_SRCS) $(CLI_SRCS) storage.h internal.h lmdb_internal.h cli/cli.h | deps
	@mkdir -p build-fuzz
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer,address,undefined -o $@ $< $(LIB_SRCS) \
	  $(call fuzz_cli,$*,$(CLI_SRCS) -Dmain=bs_cli_main) $(LIBDEPS)

fuzz: deps $(FUZZ_TARGETS:%=build-fuzz/%)
	@set -e; for t in $(FUZZ_TARGETS); do mkdir -p build-fuzz/corpus-$$t; \
	  echo "== fuzz $$t for $(FUZZ_TIME)s"; \
	  build-fuzz/$$t -max_total_time=$(FUZZ_TIME) -timeout=10 -rss_limit_mb=2048 \
	    -print_final_stats=1 build-fuzz/corpus-$$t fuzz/corpus/$$t 2>build-fuzz/$$t.log || \
	    { tail -60 build-fuzz/$$t.log; exit 1; }; \
	  grep -E '^stat::number_of_executed_units|^stat::average_exec_per_sec' build-fuzz/$$t.log; \
	done

# The CLI's main() renamed, so that the replay program can link the driver.
$(BUILD)/fuzz/cli_main_nomain.o: cli/cli_main.c cli/cli.h storage.h | deps
	@mkdir -p $(dir $@)
	$(CC) $(BSCFLAGS) $(APPWARN) -I. -Dmain=bs_cli_main -c $< -o $@

$(BUILD)/fuzz/replay_%: fuzz/%.c fuzz/replay.c $(BUILD)/libbucketstore.a $(CLI_OBJS) \
		$(BUILD)/fuzz/cli_main_nomain.o storage.h internal.h lmdb_internal.h cli/cli.h | deps
	@mkdir -p $(dir $@)
	$(CC) $(BSCFLAGS) -I. -o $@ $< fuzz/replay.c $(call fuzz_cli,$*,$(filter-out \
	  $(BUILD)/cli/cli_main.o,$(CLI_OBJS)) $(BUILD)/fuzz/cli_main_nomain.o) \
	  $(BUILD)/libbucketstore.a $(LIBDEPS)

fuzz-replay: deps $(FUZZ_TARGETS:%=$(BUILD)/fuzz/replay_%)
	@set -e; for t in $(FUZZ_TARGETS); do $(BUILD)/fuzz/replay_$$t fuzz/corpus/$$t; done

# valgrind: the quick unit tests under memcheck (leaks and invalid accesses fail the run), three
# seeds of each randomized suite (make test and make check run more).
# VALGRIND_TESTS selects binaries (default: all but the slowest).
VALGRIND_TESTS ?= $(filter-out $(BUILD)/tests/test_compact,$(TEST_BINS))
# With the PostgreSQL backend the loop runs beside a server of its own (as pg-test does), so the
# test_pg* binaries run their cases under valgrind instead of skipping them.
VALGRIND_RUN = set -e; for t in $(VALGRIND_TESTS); do echo "== valgrind $$t"; \
	  BS_TEST_QUICK=1 BS_FAULT_STRIDE=16 BS_SEEDS=3 valgrind -q --error-exitcode=99 --leak-check=full \
	    --errors-for-leak-kinds=definite,indirect $$t >$$t.valgrind.log 2>&1 || \
	    { tail -60 $$t.valgrind.log; exit 1; }; done; echo "valgrind: clean"
valgrind: deps $(VALGRIND_TESTS) $(BUILD)/bucketstore
	@if [ "$(PG)" = 1 ]; then rc=0; tests/pg_server.sh run sh -c '$(VALGRIND_RUN)' || rc=$$?; \
	  if [ $$rc = 77 ]; then sh -c '$(VALGRIND_RUN)'; elif [ $$rc != 0 ]; then exit $$rc; fi; \
	else sh -c '$(VALGRIND_RUN)'; fi
# ==== end of reliability block ================================================================

# ==== Lint (helper v): cppcheck + clang-tidy, both must be silent ================================
# cppcheck: warning/performance/portability on the library, CLI and tests. clang-tidy: bugprone-*
# without the checks that only flagged this code base's idioms (memcmp as a truth value,
# `sizeof *p` of a pointer array, byte-buffer memcpy, %llu casts of uint64_t sums, swappable
# same-type parameters). clang-analyzer-* is not run here: its path checks report uninitialised
# reads the callee rules out; run it by hand (LINT_TIDY_CHECKS=...) when reviewing.
CPPCHECK ?= cppcheck
CLANG_TIDY ?= clang-tidy
LINT_TIDY_CHECKS ?= -*,bugprone-*,-bugprone-easily-swappable-parameters,\
-bugprone-reserved-identifier,-bugprone-implicit-widening-of-multiplication-result,\
-bugprone-suspicious-string-compare,-bugprone-sizeof-expression,\
-bugprone-not-null-terminated-result,-bugprone-misplaced-widening-cast,\
-bugprone-narrowing-conversions
.PHONY: lint
# One formatting style (.clang-format): `make format` applies it; lint fails on a difference.
FORMAT_FILES = $(shell git ls-files '*.c' '*.h' 2>/dev/null)
.PHONY: format format-check
format:
	clang-format -i $(FORMAT_FILES)
format-check:
	@clang-format --dry-run --Werror $(FORMAT_FILES) && echo "format: clean"

lint: format-check
	$(CPPCHECK) -j2 --quiet --error-exitcode=1 --enable=warning,performance,portability \
	  --std=c11 --inline-suppr -D_GNU_SOURCE -I. -Itests $(LIB_SRCS) $(CLI_SRCS) $(TEST_SRCS) \
	  $(TEST_UTIL)
	$(CLANG_TIDY) --quiet --warnings-as-errors='*' -checks='$(LINT_TIDY_CHECKS)' \
	  $(LIB_SRCS) $(CLI_SRCS) -- -std=c11 -D_GNU_SOURCE -I. $(PG_CFLAGS)
	@echo "lint: clean"

# ==== Python binding: bindings/python, the C library compiled into the package ======
# py-test: tests/py_package_check.sh, the package as a user installs it: pip install of a clean
# copy of the tree into a fresh venv and mypy --strict on its examples and the package there, then
# an sdist built into a wheel elsewhere, installed into another venv, and the binding's pytest
# suite against it from an unrelated folder (in `make test` when python3 is present; not under
# sanitizers). Debian's pytest
# lives in /usr/bin/python3. With the PostgreSQL backend, all of it runs beside a server of its
# own (tests/pg_server.sh run, as pg-test), which the binding's PostgreSQL tests use; without
# server binaries they are skipped, saying so.
# Then bench/bench_py.py on a tiny workload (no timing asserted; it checks that every client
# reads every row back), so that the benchmark, its C client and its driver client cannot rot.
PYTHON ?= $(firstword $(wildcard /usr/bin/python3) python3)
PY_BENCH_SMOKE = --rows 400 --buckets 4 --commit 100 --batch 50 --read-limit 37 --runs 1 \
  --read-passes 1
# Both bindings' tests of op ids above 2^53 (test_opids.py, opids.test.js) prepare their LMDB
# store with tests/op_head_set.c: no public call moves a stream's op head.
OP_HEAD_SET := $(BUILD)/tests/op_head_set
py-test node-test: export BS_TEST_OP_HEAD_SET = $(abspath $(OP_HEAD_SET))
.PHONY: py-test
py-test: deps $(BUILD)/bucketstore $(OP_HEAD_SET)
	@rc=77; if [ "$(PG)" = 1 ]; then rc=0; PYTHON=$(PYTHON) tests/pg_server.sh run \
	  tests/py_package_check.sh || rc=$$?; fi; \
	if [ $$rc = 77 ]; then PYTHON=$(PYTHON) tests/py_package_check.sh || exit $$?; \
	elif [ $$rc != 0 ]; then exit $$rc; fi; \
	echo "== bench/bench_py.py smoke (no timing assertions)"; \
	MAKEFLAGS= MAKELEVEL= $(PYTHON) bench/bench_py.py $(PY_BENCH_SMOKE) --build $(BUILD) >/dev/null

# ==== Node.js binding: bindings/node, a Node-API addon built by npm/node-gyp against
# the installed headers (/usr/include/node, bindings/node/.npmrc: nothing is downloaded) from
# bindings/node/deps, the amalgamation (node-sources; what `npm pack` ships, made by its
# prepack), so the tree builds the addon as an installed package does. node-test (in `make
# test`): its `node --test` suite, then tests/node_package_check.sh (npm pack of a clean copy,
# npm install of the tarball elsewhere, the package's tests there); skipped when node is missing
# and under sanitizers (node itself is not instrumented). With the PostgreSQL backend, both run
# beside a server of their own (tests/pg_server.sh run, as py-test), which the binding's
# PostgreSQL tests use (BS_TEST_PG_URL); without server binaries they skip, saying so.
NODE ?= node
NPM ?= npm
NODE_ADDON := bindings/node/build/Release/bucketstore.node
NODE_DEPS := bindings/node/deps/bucketstore.c
.PHONY: node node-sources node-test
$(NODE_DEPS): $(AMALG_DEPS)
	tools/amalgamate.sh bindings/node/deps $(AMALG_SRCS)
node-sources: $(NODE_DEPS)
# -Werror here only: an install elsewhere must not fail on a newer compiler's warning.
$(NODE_ADDON): bindings/node/src/bucketstore_node.c bindings/node/binding.gyp \
		bindings/node/package.json bindings/node/scripts/check-system.js $(NODE_DEPS)
	cd bindings/node && CFLAGS=-Werror $(NPM) install --no-audit --no-fund --loglevel=error
node: $(NODE_ADDON)
node-test: $(OP_HEAD_SET)
	@if [ -n "$(SAN)" ]; then $(call skip,node-test under sanitizers); \
	elif ! command -v $(NODE) >/dev/null 2>&1 || ! command -v $(NPM) >/dev/null 2>&1; then \
	  $(call skip,node-test: no node/npm); \
	else $(MAKE) --no-print-directory BUILD=build node build/bucketstore && \
	  if [ "$(PG)" = 1 ]; then rc=0; tests/pg_server.sh run sh -c '$(NODE_RUN)' || rc=$$?; \
	    [ $$rc = 77 ] || exit $$rc; fi; $(NODE_RUN); fi
NODE_RUN = echo "== node --test bindings/node" && (cd bindings/node && ../../tests/step.sh --scan \
	  "\# SKIP" $(NODE) --test --test-reporter=tap test/*.test.js) && tests/node_package_check.sh && \
	  echo "== bench/bench_node.mjs smoke (no timing assertions)" && \
	  $(NODE) bench/bench_node.mjs $(NODE_BENCH_SMOKE) >/dev/null
# bench/bench_node.mjs on a tiny workload (no timing asserted; it checks that every path reads
# every row back, with the C API's sum), so that the benchmark and its C client cannot rot.
NODE_BENCH_SMOKE = --rows 400 --buckets 4 --commit-rows 100 --read-limit 37 --runs 1
