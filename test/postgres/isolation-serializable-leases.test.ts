import { describe } from 'vitest';
import { defineFenceSuite } from '../suites/fence.suite.js';
import { defineSemaphoreSuite } from '../suites/semaphores.suite.js';
import { postgresFixture } from '../support/dialects.js';

// The lease races of issue 21 (counting semaphores, fenced host writes) on databases that default
// to SERIALIZABLE (ALTER DATABASE on each fixture's own random database, never the server): the
// guarantees hold because taskfence's write transactions state READ COMMITTED. A file of its own
// beside isolation-serializable.test.ts, so the two run in parallel.
const fixture = () => postgresFixture({ defaultIsolation: 'serializable' });

describe('default_transaction_isolation = serializable', () => {
  describe('counting semaphores', () => defineSemaphoreSuite(fixture, 8));
  describe('fenced host writes', () => defineFenceSuite(fixture));
});
