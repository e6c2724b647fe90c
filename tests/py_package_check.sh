#!/bin/sh
# py_package_check.sh: the Python package as its users get it. From a clean copy of the tree
# (git archive of HEAD, plus the tracked files' uncommitted changes when there are some: `git
# stash create`), nothing built:
#  1. `pip install --no-build-isolation <copy>/bindings/python` into a fresh venv
#     (--system-site-packages: Debian's pytest and mypy) compiles the C library into the
#     package, and `mypy --strict` checks the examples and the package as installed;
#  2. where pkg-config finds no libpq, pip install builds the package without the PostgreSQL
#     backend (no libpq linked), and tests/test_without_libpq.py and test_api.py run against it
#     (a URL raises UnsupportedError saying what a package user does; the rest works);
#     setup.py where <lmdb.h> is missing stops, naming the Debian package to install;
#  3. `setup.py sdist` of the copy, moved to another unrelated folder, builds a platform-tagged
#     wheel there (`pip wheel`), which installs into a second venv; the binding's own tests,
#     copied to an unrelated folder, run there against that installed wheel.
# Offline: no index is consulted. Run from the project root (make py-test does).
set -eu
PYTHON=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bs-pypkg.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "py_package_check: FAIL: $*" >&2; exit 1; }
pip() { py=$1; shift; "$py" -m pip --disable-pip-version-check -q "${PIPCMD:-install}" \
  --no-index --no-build-isolation --no-deps "$@"; }

step=$(pwd)/tests/step.sh
rev=$(git stash create 2>/dev/null || true)
mkdir "$tmp/src"
git archive "${rev:-HEAD}" | tar -x -C "$tmp/src"
[ -z "$(find "$tmp/src" -name '*.so*' -o -name '*.o' | head -n 1)" ] || fail "the copy has build outputs"

echo "== py-package: pip install bindings/python (a clean copy) into a fresh venv"
"$PYTHON" -m venv --system-site-packages "$tmp/venv"
pip "$tmp/venv/bin/python" "$tmp/src/bindings/python" >"$tmp/pip.log" 2>&1 || \
  { tail -30 "$tmp/pip.log"; fail "pip install"; }
mkdir "$tmp/run"
cp -r "$tmp/src/bindings/python/tests" "$tmp/src/bindings/python/examples" \
  "$tmp/src/bindings/python/README.md" "$tmp/run/"
cd "$tmp/run"
# bucketstore as the venv's python imports it (from its site-packages, not from a source tree)
imported() {
  where=$(env -u PYTHONPATH "$1/bin/python" -c 'import bucketstore; print(bucketstore.__file__)')
  case $where in "$1/"*) ;; *) fail "bucketstore imported from $where, not $1";; esac
}
imported "$tmp/venv"
echo "== py-package: mypy --strict examples and the installed package"
env -u PYTHONPATH "$tmp/venv/bin/python" -m mypy --strict --cache-dir "$tmp/mypy" examples
env -u PYTHONPATH "$tmp/venv/bin/python" -m mypy --strict --cache-dir "$tmp/mypy" -p bucketstore

echo "== py-package: built where pkg-config finds no libpq: no PostgreSQL backend"
# libpq only "when present", as make does: the package builds without it, links no libpq, and
# a PostgreSQL URL raises UnsupportedError (BS_EUNSUPPORTED).
# (from a copy without the first install's build/: pip builds a folder in place, and
# setuptools would link the objects it finds there again)
cp -r "$tmp/src/bindings/python" "$tmp/nopq-src" && rm -rf "$tmp/nopq-src/build"
"$PYTHON" -m venv --system-site-packages "$tmp/venv-nopq"
PKG_CONFIG_LIBDIR=/nonexistent pip "$tmp/venv-nopq/bin/python" "$tmp/nopq-src" \
  >"$tmp/nopq.log" 2>&1 || { tail -30 "$tmp/nopq.log"; fail "pip install without libpq"; }
imported "$tmp/venv-nopq"
native=$(env -u PYTHONPATH "$tmp/venv-nopq/bin/python" -c 'import bucketstore._native as n; print(n.__file__)')
if ldd "$native" | grep -q libpq; then fail "built without libpq, the package links it"; fi
echo "== py-package: the tests of a package without the PostgreSQL backend, against it"
env -u PYTHONPATH BUCKETSTORE_REPO="$tmp/src" BUCKETSTORE_EXPECT_PG=0 PYTHONDONTWRITEBYTECODE=1 \
  BS_TEST_QUICK=1 "$step" --scan '^SKIPPED' "$tmp/venv-nopq/bin/python" -m pytest -q -rs \
  -p no:cacheprovider tests/test_without_libpq.py tests/test_api.py

echo "== py-package: a missing system header is a message naming its Debian package"
# setup.py run where <lmdb.h> is not found (os.path.exists says so): it stops before compiling.
if (cd "$tmp/src/bindings/python" && "$PYTHON" -c 'import os, runpy, sys
real = os.path.exists
os.path.exists = lambda p: False if str(p).endswith("/lmdb.h") else real(p)
sys.argv = ["setup.py", "-q", "build_ext", "--build-temp", sys.argv[1]]
runpy.run_path("setup.py", run_name="__main__")' "$tmp/nolmdb" >"$tmp/nolmdb.log" 2>&1); then
  fail "setup.py built without <lmdb.h>"
fi
grep -q 'apt-get install liblmdb-dev$' "$tmp/nolmdb.log" || fail "no Debian package named: $(cat "$tmp/nolmdb.log")"
[ ! -e "$tmp/nolmdb" ] || fail "setup.py compiled before it found <lmdb.h> missing"

echo "== py-package: setup.py sdist, built and installed from an unrelated folder"
(cd "$tmp/src/bindings/python" && "$PYTHON" setup.py -q sdist -d "$tmp/sdist" >"$tmp/sdist.log" 2>&1) || \
  { tail -30 "$tmp/sdist.log"; fail "sdist"; }
mkdir "$tmp/elsewhere"
mv "$tmp"/sdist/bucketstore-*.tar.gz "$tmp/elsewhere/"
tar -tzf "$tmp"/elsewhere/bucketstore-*.tar.gz | grep -q '/csrc/storage.h$' || fail "the sdist has no C sources"
cd "$tmp/elsewhere"
PIPCMD=wheel pip "$PYTHON" -w "$tmp/elsewhere" ./bucketstore-*.tar.gz >"$tmp/wheel.log" 2>&1 || \
  { tail -30 "$tmp/wheel.log"; fail "pip wheel of the sdist"; }
whl=$(ls "$tmp"/elsewhere/bucketstore-*.whl)
case $whl in *-linux_*.whl|*manylinux*.whl) ;; *) fail "$whl is not platform-tagged";; esac
"$PYTHON" -m venv --system-site-packages "$tmp/venv2"
pip "$tmp/venv2/bin/python" "$whl"
cd "$tmp/run"
imported "$tmp/venv2"
echo "== py-package: the binding's tests against the wheel installed from the sdist"
# (setup.py compiled the PostgreSQL backend in when pkg-config found libpq: test_without_libpq.py)
if pkg-config --exists libpq 2>/dev/null; then with_pg=1; else with_pg=0; fi
env -u PYTHONPATH BUCKETSTORE_REPO="$tmp/src" BUCKETSTORE_EXPECT_PG=$with_pg \
  PYTHONDONTWRITEBYTECODE=1 BS_TEST_QUICK=1 \
  "$step" --scan '^SKIPPED' "$tmp/venv2/bin/python" -m pytest -q -rs -p no:cacheprovider tests
echo "py_package_check: pip install, mypy, sdist -> wheel -> install, the tests: ok"
