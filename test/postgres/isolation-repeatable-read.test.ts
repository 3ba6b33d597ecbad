import { describe } from 'vitest';
import { defineIsolationSuite } from '../suites/isolation.suite.js';
import { defineLockSuite } from '../suites/locks.suite.js';
import { definePathLeaseSuite } from '../suites/paths.suite.js';
import { postgresFixture } from '../support/dialects.js';

// Every database of this file defaults to REPEATABLE READ (ALTER DATABASE on its own random database,
// never the server): the guarantees hold because taskfence's write transactions state READ COMMITTED.
const fixture = () => postgresFixture({ defaultIsolation: 'repeatable read' });

describe('default_transaction_isolation = repeatable read', () => {
  describe('isolation', () => defineIsolationSuite(fixture, 'repeatable read'));
  describe('path leases', () => definePathLeaseSuite(fixture));
  describe('workspace locks and task leases', () => defineLockSuite(fixture));
});
