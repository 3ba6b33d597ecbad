// CommonJS smoke test: `require('taskfence')` loads the ESM build through require(esm)
// (Node ≥ 20.19 / ≥ 22.12) and the `default` exports condition, then opens, migrates and uses a
// store. Run with the package resolvable as `taskfence` (this repository itself, by
// self-reference, after `npm run build`; or an app that installed the tarball).
'use strict';
const assert = require('node:assert/strict');
const { mkdtempSync, rmSync } = require('node:fs');
const { tmpdir } = require('node:os');
const { join } = require('node:path');

const taskfence = require('taskfence');
assert.equal(typeof taskfence.openStore, 'function', 'openStore is exported');
assert.equal(typeof taskfence.LATEST_VERSION, 'number', 'LATEST_VERSION is exported');

(async () => {
  const dir = mkdtempSync(join(tmpdir(), 'taskfence-cjs-'));
  try {
    const store = await taskfence.openStore(`sqlite:${join(dir, 'app.sqlite')}`);
    try {
      await store.migrate();
      const status = await store.migrationStatus();
      assert.equal(status.currentVersion, taskfence.LATEST_VERSION);
      const company = await store.org.createCompany({ name: 'Acme' });
      const row = await store.db
        .selectFrom('companies')
        .select('name')
        .where('id', '=', company.id)
        .executeTakeFirstOrThrow();
      assert.equal(row.name, 'Acme');
      console.log(`require('taskfence') on Node ${process.version}: ok (schema version ${status.currentVersion})`);
    } finally {
      await store.close();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
})().catch((error) => {
  console.error(error);
  process.exit(1);
});
