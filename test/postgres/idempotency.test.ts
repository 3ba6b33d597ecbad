import { defineIdempotencyKeySuite } from '../suites/idempotency-keys.suite.js';
import { defineIdempotencySuite } from '../suites/idempotency.suite.js';
import { postgresFixture } from '../support/dialects.js';

defineIdempotencySuite(postgresFixture);
defineIdempotencyKeySuite(postgresFixture);
