import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';

/**
 * `npm run test:failover`: the host-list and failover tests on private servers and a Patroni
 * cluster of their own (Debian's patroni, etcd-server; PostgreSQL 15 in /usr/lib/postgresql/15/bin).
 * Kept out of `npm test`: they need those packages and take minutes. One file at a time.
 */
export default defineConfig({
  test: {
    root: fileURLToPath(new URL('../..', import.meta.url)),
    include: ['test/failover/**/*.test.ts'],
    fileParallelism: false,
    testTimeout: 300_000,
    hookTimeout: 180_000,
  },
});
