import { defineEventsSuite } from '../suites/events.suite.js';
import { postgresFixture } from '../support/dialects.js';

defineEventsSuite(postgresFixture);
