'use strict';
// index.d.ts type-checks the calls of test/types.ts (skipped where tsc is not installed: Debian's
// node-typescript provides it). --skipDefaultLibCheck leaves TypeScript's own lib files unchecked
// (half of tsc's time) but still checks index.d.ts.
const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const { spawnSync } = require('node:child_process');

const tsc = spawnSync('tsc', ['--version']);
test('index.d.ts type-checks its usage', { skip: tsc.error ? 'tsc not installed' : false }, () => {
  const r = spawnSync('tsc', ['--noEmit', '--strict', '--target', 'es2020', '--lib', 'es2020,dom',
    '--moduleResolution', 'node', '--skipDefaultLibCheck', path.join(__dirname, 'types.ts')],
  { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stdout + r.stderr);
});
