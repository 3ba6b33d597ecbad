import { defineIdempotencyKeySuite } from '../suites/idempotency-keys.suite.js';
import { defineIdempotencySuite } from '../suites/idempotency.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineIdempotencySuite(sqliteFixture);
defineIdempotencyKeySuite(sqliteFixture);
