'use strict';
// Every value index.d.ts declares is importable at run time, by name, from both entry points:
// `import { name } from 'bucketstore'` (index.mjs) and `require('bucketstore').name` (index.js),
// the same value from both; the default export (ESM) and .default (CommonJS) hold them all.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawnSync } = require('node:child_process');

const pkg = path.join(__dirname, '..');
const dts = fs.readFileSync(path.join(pkg, 'index.d.ts'), 'utf8');
const names = [...dts.matchAll(/^export declare (?:class|const|function) (\w+)/gm)].map((m) => m[1]);

test('index.d.ts declares the values of the module', () => {
  for (const n of ['Database', 'BucketStorage', 'Writer', 'Checkpoint', 'RawOplog', 'open', 'openMemory', 'openPostgres',
    'load', 'checksumPut', 'version', 'liveHandles'])
    assert.ok(names.includes(n), n);
  assert.match(dts, /^export default bucketstore;$/m);
});

test('every declared name imports from the ESM and the CommonJS entry', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'bs-entry-'));
  try {
    fs.mkdirSync(path.join(dir, 'node_modules'));
    fs.symlinkSync(pkg, path.join(dir, 'node_modules', 'bucketstore'), 'dir');
    fs.writeFileSync(path.join(dir, 'esm.mjs'), `
      import { ${names.join(', ')} } from 'bucketstore';
      import bs from 'bucketstore';
      import { createRequire } from 'node:module';
      const cjs = createRequire(import.meta.url)('bucketstore');
      const esm = { ${names.join(', ')} };
      for (const n of ${JSON.stringify(names)}) {
        if (esm[n] === undefined) throw new Error('ESM: ' + n + ' is undefined');
        if (esm[n] !== cjs[n]) throw new Error(n + ': ESM and CommonJS differ');
        if (bs[n] !== cjs[n] || cjs.default[n] !== cjs[n]) throw new Error(n + ': not in the default export');
      }
      const db = await openMemory();
      await db.close();
      console.log(typeof version, ${names.length});
    `);
    const r = spawnSync(process.execPath, ['esm.mjs'], { cwd: dir, encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.stdout, `string ${names.length}\n`);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
