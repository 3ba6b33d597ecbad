import { describe } from 'vitest';
import { defineOwnershipSuite } from '../suites/ownership.suite.js';
import { defineRunSuite } from '../suites/runs.suite.js';
import { defineTaskSuite } from '../suites/tasks.suite.js';
import { postgresFixture } from '../support/dialects.js';

// The race suites of coordinator runs, tasks and ownership on databases that default to
// REPEATABLE READ (ALTER DATABASE on each fixture's own random database, never the server): the
// guarantees hold because taskfence's write transactions state READ COMMITTED. A file of its own
// beside isolation-repeatable-read.test.ts and isolation-repeatable-read-leases.test.ts, so they run in parallel.
const fixture = () => postgresFixture({ defaultIsolation: 'repeatable read' });

describe('default_transaction_isolation = repeatable read', () => {
  describe('coordinator runs', () => defineRunSuite(fixture));
  describe('tasks', () => defineTaskSuite(fixture));
  describe('ownership', () => defineOwnershipSuite(fixture));
});
