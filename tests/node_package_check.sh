#!/bin/sh
# node_package_check.sh: the npm package as a user gets it. From a clean copy of the committed
# tree (git archive HEAD), `npm pack` in bindings/node (its prepack makes deps/, the amalgamation);
# the tarball must carry the C sources and no build output. `npm install <tarball>` in an
# unrelated folder then compiles them with node-gyp (against the installed Node headers:
# npm_config_nodedir, nothing is downloaded) and the package's own tests run against that
# installed copy (their PostgreSQL tests against the server BS_TEST_PG_URL names: make node-test
# starts one; without it they skip, recorded as make test's skips are). A compiler that finds no
# <lmdb.h> stops the install with a message naming the Debian package. With libpq installed the
# addon has the PostgreSQL backend; installed where pkg-config finds no libpq it builds without
# it, and openPostgres rejects naming libpq-dev. Run from the project root (make test's node
# slice does).
set -eu
unset MAKEFLAGS MFLAGS MAKELEVEL # the clean copy's make (prepack) is not a sub-make of ours
step=$(pwd)/tests/step.sh
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bs-npm.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "node_package_check: FAIL: $*" >&2; exit 1; }
export npm_config_nodedir=${npm_config_nodedir:-/usr} npm_config_audit=false npm_config_fund=false \
  npm_config_update_notifier=false npm_config_loglevel=error

mkdir "$tmp/src" "$tmp/app"
git archive HEAD | tar -x -C "$tmp/src"
(cd "$tmp/src/bindings/node" && npm pack --pack-destination "$tmp" >/dev/null)
tarball=$(ls "$tmp"/bucketstore-*.tgz)
tar -tzf "$tarball" | sed 's|^package/||' | sort > "$tmp/files"
for f in package.json index.js index.mjs index.d.ts binding.gyp README.md src/bucketstore_node.c \
    deps/bucketstore.c deps/storage.h deps/storage_backend.h scripts/check-system.js; do
  grep -qx "$f" "$tmp/files" || fail "the tarball lacks $f"
done
if grep -E '^(build|node_modules)/|\.(o|a|so|node)$' "$tmp/files"; then
  fail "the tarball carries build output (above)"
fi

# A missing system library: a clear message naming the Debian package, before any compiling.
mkdir "$tmp/unpacked" && tar -xzf "$tarball" -C "$tmp/unpacked"
printf '#!/bin/sh\nif grep -q lmdb.h; then exit 1; fi\n' > "$tmp/nolmdb-cc"
chmod +x "$tmp/nolmdb-cc"
if CC="$tmp/nolmdb-cc" node "$tmp/unpacked/package/scripts/check-system.js" 2> "$tmp/err"; then
  fail "check-system.js passed without <lmdb.h>"
fi
grep -q 'apt-get install liblmdb-dev' "$tmp/err" || fail "no Debian package named: $(cat "$tmp/err")"

# openPostgres on a closed port: BS_EIO from libpq when the addon has PostgreSQL, else
# BS_EUNSUPPORTED; prints the code and message.
pg_probe() {
  (cd "$1" && node -e "require('bucketstore').openPostgres('postgresql://127.0.0.1:1/x').then(
    () => console.log('opened'), (e) => console.log(e.code, e.message))")
}

# Where pkg-config finds no libpq: the addon builds without PostgreSQL, and says what to install.
mkdir "$tmp/nopq"
echo '{"name": "nopq", "private": true}' > "$tmp/nopq/package.json"
(cd "$tmp/nopq" && PKG_CONFIG_LIBDIR=/nonexistent npm install --no-save --prefer-offline "$tarball" >/dev/null)
pg_probe "$tmp/nopq" > "$tmp/probe"
grep -q '^BS_EUNSUPPORTED .*apt-get install libpq-dev' "$tmp/probe" ||
  fail "without libpq, openPostgres: $(cat "$tmp/probe")"
# open() of a postgresql:// URL reaches the library's own check: its advice is the package's.
(cd "$tmp/nopq" && node -e "require('bucketstore').open('postgresql://127.0.0.1:1/x').then(
  () => console.log('opened'), (e) => console.log(e.code, e.message))") > "$tmp/probe"
grep -q '^BS_EUNSUPPORTED .*install libpq-dev (Debian), then npm rebuild bucketstore' "$tmp/probe" ||
  fail "without libpq, open(url): $(cat "$tmp/probe")"
if ldd "$tmp/nopq/node_modules/bucketstore/build/Release/bucketstore.node" | grep -q libpq; then
  fail "built without libpq, the addon links it"
fi

cd "$tmp/app"
echo '{"name": "app", "private": true}' > package.json
typescript=$(node -p "require('$tmp/src/bindings/node/package.json').devDependencies.typescript")
# The install installs nothing of the system's: apt-get, apt and sudo are, for it, commands
# that only record that they ran.
mkdir "$tmp/bin"
for c in apt-get apt sudo; do
  printf '#!/bin/sh\necho "%s $*" >> "%s/system-installs"\nexit 1\n' "$c" "$tmp" > "$tmp/bin/$c"
  chmod +x "$tmp/bin/$c"
done
PATH="$tmp/bin:$PATH" npm install --no-save --prefer-offline "$tarball" "typescript@$typescript" >/dev/null
[ ! -e "$tmp/system-installs" ] || fail "the install ran: $(cat "$tmp/system-installs")"
[ -f node_modules/bucketstore/build/Release/bucketstore.node ] || fail "no addon built"
if pkg-config --exists libpq; then
  pg_probe "$tmp/app" > "$tmp/probe"
  grep -q '^BS_EIO ' "$tmp/probe" || fail "libpq is installed, yet openPostgres: $(cat "$tmp/probe")"
fi
cd node_modules/bucketstore
"$step" --scan '# SKIP' node --test --test-reporter=tap test/*.test.js > "$tmp/test.log" 2>&1 ||
  { cat "$tmp/test.log"; fail "the package's tests"; }
grep -E '^# (pass|fail|skipped)' "$tmp/test.log" | tr '\n' ' '
echo
grep -q '^# fail 0$' "$tmp/test.log" || fail "a test failed"
echo "node_package_check: npm pack -> npm install in $tmp/app -> the package's tests pass" \
  "($(grep -c '# SKIP' "$tmp/test.log") skipped)"
