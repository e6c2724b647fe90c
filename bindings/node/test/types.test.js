'use strict';
// index.d.ts type-checks with tsc (the typescript dev dependency, `npm install` in this folder;
// the repository's tests/node_package_check.sh installs it beside the package): test/types.ts,
// every call shape, and examples/quickstart.mjs, the README's example (--checkJs, importing
// 'bucketstore' as an application does). --skipDefaultLibCheck leaves TypeScript's own lib files
// unchecked (half of tsc's time) but still checks index.d.ts.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawnSync } = require('node:child_process');

const pkg = path.join(__dirname, '..');

function tsc(args, cwd) {
  let bin;
  try {
    bin = require.resolve('typescript/bin/tsc', { paths: [pkg] });
  } catch {
    assert.fail('typescript is not installed: `npm install` in the package folder (a dev dependency)');
  }
  const r = spawnSync(process.execPath, [bin, '--noEmit', '--strict', '--skipDefaultLibCheck', ...args],
    { cwd, encoding: 'utf8' });
  assert.equal(r.status, 0, r.stdout + r.stderr);
}

test('index.d.ts type-checks its usage', () => {
  tsc(['--target', 'es2020', '--lib', 'es2020,dom', '--moduleResolution', 'node',
    path.join(__dirname, 'types.ts')]);
});

test("the README's example type-checks as an application's ES module", () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'bs-tsc-'));
  try {
    fs.mkdirSync(path.join(dir, 'node_modules'));
    fs.symlinkSync(pkg, path.join(dir, 'node_modules', 'bucketstore'), 'dir');
    fs.copyFileSync(path.join(pkg, 'examples', 'quickstart.mjs'), path.join(dir, 'quickstart.mjs'));
    tsc(['--allowJs', '--checkJs', '--target', 'es2022', '--module', 'nodenext',
      '--moduleResolution', 'nodenext', '--lib', 'es2022,dom', 'quickstart.mjs'], dir);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
