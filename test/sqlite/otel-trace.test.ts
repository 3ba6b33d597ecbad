import { defineOtelTraceSuite } from '../suites/otel-trace.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineOtelTraceSuite(sqliteFixture);
