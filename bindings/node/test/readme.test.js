'use strict';
// The README's example is examples/quickstart.mjs, and it runs as an application that installed
// the package would run it (import 'bucketstore' through node_modules), twice on one file: the
// second run reads what the first wrote. (types.test.js type-checks it.)
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawnSync } = require('node:child_process');

const pkg = path.join(__dirname, '..');
const example = path.join(pkg, 'examples', 'quickstart.mjs');

test("the README's example is examples/quickstart.mjs", () => {
  const readme = fs.readFileSync(path.join(pkg, 'README.md'), 'utf8');
  const blocks = [...readme.matchAll(/^```js\n(.*?)^```$/gms)].map((m) => m[1]);
  assert.deepEqual(blocks, [fs.readFileSync(example, 'utf8')]);
});

test('examples/quickstart.mjs runs, and runs again on its file', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'bs-quickstart-'));
  try {
    fs.mkdirSync(path.join(dir, 'node_modules'));
    fs.symlinkSync(pkg, path.join(dir, 'node_modules', 'bucketstore'), 'dir');
    fs.copyFileSync(example, path.join(dir, 'quickstart.mjs'));
    for (let run = 0; run < 2; run++) {
      const r = spawnSync(process.execPath, ['quickstart.mjs'], { cwd: dir, encoding: 'utf8' });
      assert.equal(r.status, 0, r.stderr);
      const lines = r.stdout.trim().split('\n');
      assert.equal(lines.length, 2, r.stdout);
      assert.equal(lines[0], `1n PUT t1 {"id":"t1","done":false}`);
      assert.match(lines[1], /^\{ bucket: 'todos\["u1"\]', checksum: -?\d+, count: 1 \} \[ \{ list: 'u1' \} \]$/);
    }
    // the second run found the first's stream and committed nothing: one stream, one op
    const db = await require('..').open(path.join(dir, 'quickstart.bsdb'));
    try {
      assert.deepEqual((await db.listStreams()).map((s) => s.name), ['rules-v1']);
      const s = await db.stat();
      assert.deepEqual([s.streams, s.opsPut, s.sourceRecords], [1, 1, 1]);
    } finally {
      await db.close();
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
