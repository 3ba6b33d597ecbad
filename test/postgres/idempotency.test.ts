import { defineIdempotencySuite } from '../suites/idempotency.suite.js';
import { postgresFixture } from '../support/dialects.js';

defineIdempotencySuite(postgresFixture);
