import { defineConfig } from 'vitest/config';

const slow = { testTimeout: 180_000, hookTimeout: 180_000, setupFiles: ['test/support/fast-check-setup.ts'] };

export default defineConfig({
  test: {
    // Two cores: race tests spawn their own processes, so keep vitest's own parallelism small.
    maxWorkers: 2,
    projects: [
      { test: { name: 'unit', include: ['test/unit/**/*.test.ts'], ...slow } },
      { test: { name: 'sqlite', include: ['test/sqlite/**/*.test.ts'], ...slow } },
      {
        test: {
          name: 'postgres',
          include: ['test/postgres/**/*.test.ts'],
          globalSetup: ['test/support/postgres-global-setup.ts'],
          ...slow,
        },
      },
    ],
  },
});
