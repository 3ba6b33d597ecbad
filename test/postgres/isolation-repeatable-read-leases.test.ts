import { describe } from 'vitest';
import { defineFenceSuite } from '../suites/fence.suite.js';
import { defineSemaphoreSuite } from '../suites/semaphores.suite.js';
import { postgresFixture } from '../support/dialects.js';

// The lease races of issue 21 (counting semaphores, fenced host writes) on databases that default
// to REPEATABLE READ (ALTER DATABASE on each fixture's own random database, never the server): the
// guarantees hold because taskfence's write transactions state READ COMMITTED. A file of its own
// beside isolation-repeatable-read.test.ts, so the two run in parallel.
const fixture = () => postgresFixture({ defaultIsolation: 'repeatable read' });

describe('default_transaction_isolation = repeatable read', () => {
  describe('counting semaphores', () => defineSemaphoreSuite(fixture, 8));
  describe('fenced host writes', () => defineFenceSuite(fixture));
});
