import { defineOtelSuite } from '../suites/otel.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineOtelSuite(sqliteFixture);
