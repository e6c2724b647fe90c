'use strict';
// npm install's first step (package.json "install"), before node-gyp compiles the addon and the
// C library (deps/bucketstore.c, the amalgamation `npm pack` puts there): the C compiler and
// each system header and library the library needs, with the Debian package that provides it.
// Nothing is installed here; a missing one stops the install with a message saying what to do.
// libpq is optional: binding.gyp compiles the PostgreSQL backend in when pkg-config finds it,
// and this says how to get it when it does not.
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const NEEDS = [
  { what: "LMDB's header and library", header: 'lmdb.h', lib: 'lmdb', pkg: 'liblmdb-dev' },
  { what: "Nettle's header and library (SHA-256)", header: 'nettle/sha2.h', lib: 'nettle', pkg: 'nettle-dev' },
  { what: "xxHash's header", header: 'xxhash.h', pkg: 'libxxhash-dev' },
];

function fail(lines) {
  process.stderr.write(`bucketstore: cannot build the native addon:\n${lines.map((l) => `  ${l}\n`).join('')}`);
  process.exit(1);
}

const sources = path.join(__dirname, '..', 'deps', 'bucketstore.c');
if (!fs.existsSync(sources))
  fail([`${sources} is missing: it comes with the package that \`npm pack\` makes;`,
    'in the bucketstore repository, `make node` builds the addon (or `make node-sources` makes it)']);

const cc = (process.env.CC || 'cc').split(/\s+/).filter(Boolean);
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'bucketstore-check-'));
try {
  const compile = (source, args) => spawnSync(cc[0], [...cc.slice(1), '-x', 'c', '-', '-o',
    path.join(dir, 'a.out'), ...args], { input: source, encoding: 'utf8' });
  const probe = compile('int main(void) { return 0; }\n', []);
  if (probe.error || probe.status !== 0)
    fail([`no working C compiler (${cc.join(' ')}${probe.error ? `: ${probe.error.code}` : ''}):`,
      'apt-get install build-essential (node-gyp also needs make, g++ and python3)']);
  const missing = NEEDS.filter((n) => compile(`#include <${n.header}>\nint main(void) { return 0; }\n`,
    n.lib ? [`-l${n.lib}`] : []).status !== 0);
  if (missing.length)
    fail([...missing.map((n) => `${n.what} not found (<${n.header}>${n.lib ? `, -l${n.lib}` : ''})`),
      `install them: apt-get install ${missing.map((n) => n.pkg).join(' ')}`]);
} finally {
  fs.rmSync(dir, { recursive: true, force: true });
}
if (spawnSync('pkg-config', ['--exists', 'libpq']).status !== 0)
  process.stderr.write('bucketstore: libpq not found (pkg-config libpq): the addon is built without ' +
    'PostgreSQL (openPostgres rejects); to have it: apt-get install libpq-dev pkg-config, then ' +
    'npm rebuild bucketstore\n');
