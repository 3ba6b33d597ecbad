import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';

/**
 * `npm run test:browser`: the dashboard in a real browser (Debian's Chromium at /usr/bin/chromium,
 * driven by playwright-core) against a live store on both dialects: a SQLite file and PostgreSQL
 * (TEST_PG_URL, else the tests' usual source). Kept out of `npm test`: it needs the browser.
 * Run `npm run build` first (the dashboard is the CLI's `taskfence ui`).
 */
export default defineConfig({
  test: {
    root: fileURLToPath(new URL('../..', import.meta.url)),
    include: ['test/browser/**/*.test.ts'],
    globalSetup: ['test/support/postgres-global-setup.ts'],
    fileParallelism: false,
    testTimeout: 120_000,
    hookTimeout: 120_000,
  },
});
