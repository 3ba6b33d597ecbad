import { defineEventsSuite } from '../suites/events.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineEventsSuite(sqliteFixture);
